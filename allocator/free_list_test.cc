// Tests of the FREE list's prefix sums (docs/design.md, "Capacity": Capacity sums the
// usable blocks of the first A FREE pages without walking the list).

#include "allocator/free_list.h"

#include <cstdint>
#include <deque>
#include <random>
#include <utility>

#include "gtest/gtest.h"

namespace kvbroker {
namespace internal {
namespace {

// The obvious O(n) answers, over a plain deque of (page, usable).
using Model = std::deque<std::pair<PageId, int64_t>>;

int64_t ModelPrefix(const Model& m, int64_t a) {
  int64_t sum = 0;
  for (int64_t i = 0; i < a && i < static_cast<int64_t>(m.size()); ++i) {
    sum += m[i].second;
  }
  return sum;
}

int64_t ModelPagesToCover(const Model& m, int64_t blocks) {
  if (blocks <= 0) return 0;
  int64_t sum = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    sum += m[i].second;
    if (sum >= blocks) return static_cast<int64_t>(i) + 1;
  }
  return static_cast<int64_t>(m.size()) + 1;
}

// Checks every observable of `list` against `model`, and the documented
// chaining invariant of the `before` fields.
void ExpectMatches(const FreeList& list, const Model& model) {
  ASSERT_EQ(list.size(), model.size());
  ASSERT_EQ(list.empty(), model.empty());
  int64_t total = ModelPrefix(model, static_cast<int64_t>(model.size()));
  ASSERT_EQ(list.total(), total);
  for (size_t i = 0; i < model.size(); ++i) {
    ASSERT_EQ(list[i].page, model[i].first) << i;
    ASSERT_EQ(list[i].usable, model[i].second) << i;
    if (i + 1 < model.size()) {
      ASSERT_EQ(list[i + 1].before, list[i].before + list[i].usable) << i;
    }
  }
  if (!model.empty()) {
    ASSERT_EQ(list.front(), model.front().first);
    ASSERT_EQ(list.back(), model.back().first);
  }
  const int64_t n = static_cast<int64_t>(model.size());
  for (int64_t a = -1; a <= n + 2; ++a) {
    ASSERT_EQ(list.PrefixSum(a), ModelPrefix(model, a)) << "a=" << a;
  }
  for (int64_t b = -1; b <= total + 2; ++b) {
    ASSERT_EQ(list.PagesToCover(b), ModelPagesToCover(model, b)) << "b=" << b;
  }
}

TEST(FreeListTest, EmptyList) {
  FreeList list;
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(list.size(), 0u);
  EXPECT_EQ(list.total(), 0);
  EXPECT_EQ(list.PrefixSum(0), 0);
  EXPECT_EQ(list.PrefixSum(5), 0);
  EXPECT_EQ(list.PagesToCover(0), 0);
  EXPECT_EQ(list.PagesToCover(1), 1);  // size() + 1: not coverable
}

TEST(FreeListTest, PrefixSumsOfPushBack) {
  // The usable counts of pages 0..6 of P = 14 MiB, B = 6 MiB, N = 15.
  FreeList list;
  const int64_t usable[] = {2, 1, 2, 2, 1, 2, 1};
  for (PageId p = 0; p < 7; ++p) list.PushBack(p, usable[p]);
  EXPECT_EQ(list.size(), 7u);
  EXPECT_EQ(list.total(), 11);
  const int64_t prefix[] = {0, 2, 3, 5, 7, 8, 10, 11};
  for (int64_t a = 0; a <= 7; ++a) EXPECT_EQ(list.PrefixSum(a), prefix[a]);
  EXPECT_EQ(list.PrefixSum(8), 11);
  EXPECT_EQ(list.PrefixSum(1000), 11);
  EXPECT_EQ(list.PrefixSum(-3), 0);

  EXPECT_EQ(list.PagesToCover(-1), 0);
  EXPECT_EQ(list.PagesToCover(0), 0);
  EXPECT_EQ(list.PagesToCover(1), 1);
  EXPECT_EQ(list.PagesToCover(2), 1);
  EXPECT_EQ(list.PagesToCover(3), 2);
  EXPECT_EQ(list.PagesToCover(4), 3);
  EXPECT_EQ(list.PagesToCover(5), 3);
  EXPECT_EQ(list.PagesToCover(6), 4);
  EXPECT_EQ(list.PagesToCover(8), 5);
  EXPECT_EQ(list.PagesToCover(11), 7);
  EXPECT_EQ(list.PagesToCover(12), 8);  // size() + 1
}

TEST(FreeListTest, PopFrontShiftsThePrefix) {
  FreeList list;
  list.PushBack(0, 2);
  list.PushBack(1, 1);
  list.PushBack(2, 2);
  FreeList::Entry e = list.PopFront();
  EXPECT_EQ(e.page, 0);
  EXPECT_EQ(e.usable, 2);
  EXPECT_EQ(list.front(), 1);
  EXPECT_EQ(list.total(), 3);
  EXPECT_EQ(list.PrefixSum(1), 1);
  EXPECT_EQ(list.PrefixSum(2), 3);
  EXPECT_EQ(list.PagesToCover(2), 2);
}

TEST(FreeListTest, PushFrontPutsReturnedPagesFirst) {
  FreeList list;
  list.PushBack(3, 2);
  list.PushBack(4, 2);
  list.PushFront(1, 5);  // a rolled-back or reclaimed page comes back first
  list.PushFront(0, 1);
  EXPECT_EQ(list.front(), 0);
  EXPECT_EQ(list[1].page, 1);
  EXPECT_EQ(list.total(), 10);
  EXPECT_EQ(list.PrefixSum(1), 1);
  EXPECT_EQ(list.PrefixSum(2), 6);
  EXPECT_EQ(list.PrefixSum(3), 8);
  EXPECT_EQ(list.PagesToCover(6), 2);
  EXPECT_EQ(list.PagesToCover(7), 3);
}

TEST(FreeListTest, PushFrontOnEmptyList) {
  FreeList list;
  list.PushFront(7, 3);
  EXPECT_EQ(list.size(), 1u);
  EXPECT_EQ(list.front(), 7);
  EXPECT_EQ(list.back(), 7);
  EXPECT_EQ(list.total(), 3);
  EXPECT_EQ(list.PrefixSum(1), 3);
  list.PushBack(8, 4);
  EXPECT_EQ(list.total(), 7);
  EXPECT_EQ(list.PrefixSum(1), 3);
  EXPECT_EQ(list.PagesToCover(4), 2);
}

TEST(FreeListTest, PopBackTrimsTheTail) {
  FreeList list;
  list.PushBack(0, 2);
  list.PushBack(1, 1);
  list.PushBack(2, 4);
  FreeList::Entry e = list.PopBack();
  EXPECT_EQ(e.page, 2);
  EXPECT_EQ(e.usable, 4);
  EXPECT_EQ(list.back(), 1);
  EXPECT_EQ(list.total(), 3);
  // The next PushBack continues from the new end.
  list.PushBack(5, 6);
  EXPECT_EQ(list.total(), 9);
  EXPECT_EQ(list.PrefixSum(2), 3);
  EXPECT_EQ(list.PrefixSum(3), 9);
}

TEST(FreeListTest, DrainAndRefillBothEnds) {
  FreeList list;
  list.PushBack(0, 2);
  list.PushBack(1, 3);
  list.PopFront();
  list.PopBack();
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(list.total(), 0);
  list.PushBack(2, 4);
  list.PushFront(3, 1);
  EXPECT_EQ(list.total(), 5);
  EXPECT_EQ(list.PrefixSum(1), 1);
  EXPECT_EQ(list.front(), 3);
  EXPECT_EQ(list.back(), 2);
  list.PopBack();
  list.PopBack();
  EXPECT_TRUE(list.empty());
  list.PushFront(9, 2);
  EXPECT_EQ(list.total(), 2);
}

// Every operation, in a long seeded sequence, against the O(n) model.
TEST(FreeListTest, MatchesModelOverRandomOperations) {
  std::mt19937_64 rng(20240611);
  FreeList list;
  Model model;
  PageId next_page = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    const int64_t usable = 1 + static_cast<int64_t>(rng() % 200);
    if (op == 0) {
      list.PushBack(next_page, usable);
      model.emplace_back(next_page++, usable);
    } else if (op == 1) {
      list.PushFront(next_page, usable);
      model.emplace_front(next_page++, usable);
    } else if (op == 2 && !model.empty()) {
      FreeList::Entry e = list.PopFront();
      ASSERT_EQ(e.page, model.front().first);
      ASSERT_EQ(e.usable, model.front().second);
      model.pop_front();
    } else if (op == 3 && !model.empty()) {
      FreeList::Entry e = list.PopBack();
      ASSERT_EQ(e.page, model.back().first);
      ASSERT_EQ(e.usable, model.back().second);
      model.pop_back();
    }
    if (step % 50 == 0 || model.size() < 4) {
      ASSERT_NO_FATAL_FAILURE(ExpectMatches(list, model)) << "step " << step;
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatches(list, model));
}

}  // namespace
}  // namespace internal
}  // namespace kvbroker
