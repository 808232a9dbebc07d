// Tests of the OPEN pages' best-fit index (docs/design.md, "Consumption
// order"): best fit against the obvious search over a std::set, and the
// sentinel never showing.

#include "allocator/open_index.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <new>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

// Every allocation of this test binary is counted, so that a test can say
// that a stretch of code made none.
std::atomic<int64_t> allocations{0};

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace kvbroker {
namespace internal {
namespace {

using Model = std::set<std::pair<int64_t, PageId>>;

// Fewest free blocks covering `need`, else most free; lowest id on ties.
PageId ModelBestFit(const Model& m, int64_t need) {
  for (const auto& [free, p] : m) {
    if (free >= need) return p;
  }
  const int64_t most = std::prev(m.end())->first;
  return m.lower_bound({most, PageId{-1}})->second;
}

std::vector<std::pair<int64_t, PageId>> Entries(const OpenIndex& index) {
  return {index.begin(), index.end()};
}

TEST(OpenIndexTest, StartsEmptyAndShowsNoSentinel) {
  OpenIndex index;
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.begin(), index.end());
}

TEST(OpenIndexTest, BestFitPrefersTheTightestPageThatCovers) {
  OpenIndex index;
  index.insert(5, 7);
  index.insert(3, 2);
  index.insert(5, 4);
  index.insert(9, 1);
  EXPECT_EQ(index.BestFit(1), 2);   // 3 free is the tightest
  EXPECT_EQ(index.BestFit(4), 4);   // 5 free, the lower id of two
  EXPECT_EQ(index.BestFit(9), 1);
  EXPECT_EQ(index.BestFit(10), 1);  // none covers: the most free
  index.insert(9, 0);
  EXPECT_EQ(index.BestFit(64), 0);  // most free, lowest id
  EXPECT_EQ(index.size(), 5u);
  EXPECT_EQ(Entries(index),
            (std::vector<std::pair<int64_t, PageId>>{
                {3, 2}, {5, 4}, {5, 7}, {9, 0}, {9, 1}}));
}

TEST(OpenIndexTest, GoingFromEmptyToOnePageAndBackAllocatesNothing) {
  OpenIndex index;
  // The first page grows the root node, which holds only the sentinel.
  index.insert(16, 0);
  index.erase(16, 0);
  const int64_t before = allocations.load();
  for (int round = 0; round < 3; ++round) {
    index.insert(16, 0);
    const size_t size = index.size();
    const PageId fit = index.BestFit(32);
    index.erase(16, 0);
    const bool empty = index.empty() && index.begin() == index.end();
    EXPECT_EQ(size, 1u);
    EXPECT_EQ(fit, 0);
    EXPECT_TRUE(empty);
  }
  EXPECT_EQ(allocations.load(), before);
}

TEST(OpenIndexTest, AgreesWithASetUnderRandomChanges) {
  std::mt19937_64 rng(7);
  OpenIndex index;
  Model model;
  std::vector<int64_t> free_of(512, -1);  // -1: page not in the index
  for (int step = 0; step < 200000; ++step) {
    const PageId p = static_cast<PageId>(rng() % free_of.size());
    if (free_of[p] < 0) {
      free_of[p] = static_cast<int64_t>(1 + rng() % 64);
      index.insert(free_of[p], p);
      model.insert({free_of[p], p});
    } else {
      index.erase(free_of[p], p);
      model.erase({free_of[p], p});
      free_of[p] = -1;
    }
    ASSERT_EQ(index.size(), model.size());
    if (!model.empty()) {
      const int64_t need = static_cast<int64_t>(1 + rng() % 70);
      ASSERT_EQ(index.BestFit(need), ModelBestFit(model, need))
          << "step " << step << " need " << need;
    }
    if (step % 1000 == 0) {
      ASSERT_EQ(Entries(index),
                (std::vector<std::pair<int64_t, PageId>>(model.begin(),
                                                         model.end())));
    }
  }
}

}  // namespace
}  // namespace internal
}  // namespace kvbroker
