// BlockSet: exact membership and size through inserts and erases across
// word boundaries, ids that were never held, and the ascending listing.

#include "attach/block_set.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvbroker::attach {
namespace {

TEST(BlockSet, InsertEraseAndListExactly) {
  BlockSet s;
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(s.contains(0));
  EXPECT_FALSE(s.contains(-1));
  EXPECT_FALSE(s.erase(-1));
  EXPECT_FALSE(s.erase(1000));
  const std::vector<int64_t> ids = {130, 0, 63, 64, 1};
  s.insert(ids.begin(), ids.end());
  EXPECT_EQ(s.size(), 5);
  EXPECT_FALSE(s.insert(64));
  EXPECT_EQ(s.size(), 5);
  EXPECT_TRUE(s.contains(63));
  EXPECT_TRUE(s.contains(130));
  EXPECT_FALSE(s.contains(129));
  EXPECT_EQ(s.Sorted(), (std::vector<int64_t>{0, 1, 63, 64, 130}));
  EXPECT_TRUE(s.erase(63));
  EXPECT_FALSE(s.erase(63));
  EXPECT_EQ(s.size(), 4);
  EXPECT_EQ(s.Sorted(), (std::vector<int64_t>{0, 1, 64, 130}));
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.Sorted(), std::vector<int64_t>{});
}

// Runs set and cleared a word at a time against the same ids one by one,
// across word boundaries; a run with an id missing changes nothing.
TEST(BlockSet, RangesAgreeWithSingleIds) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 0},   {0, 1},    {0, 64},    {5, 63},
      {63, 65}, {60, 200}, {128, 192}, {1, 300}};
  for (const auto& [begin, end] : ranges) {
    BlockSet ranged, single;
    const std::vector<int64_t> before = {3, 64, 190};
    ranged.insert(before.begin(), before.end());
    single.insert(before.begin(), before.end());
    ranged.InsertRange(begin, end);
    for (int64_t id = begin; id < end; ++id) single.insert(id);
    EXPECT_EQ(ranged.Sorted(), single.Sorted()) << begin << ".." << end;
    EXPECT_EQ(ranged.size(), single.size()) << begin << ".." << end;
    EXPECT_TRUE(ranged.EraseRange(begin, end)) << begin << ".." << end;
    for (int64_t id = begin; id < end; ++id) single.erase(id);
    EXPECT_EQ(ranged.Sorted(), single.Sorted()) << begin << ".." << end;
    EXPECT_EQ(ranged.size(), single.size()) << begin << ".." << end;
    if (end > begin) {
      // Now [begin, end) is (at least partly) gone: a second erase of the
      // whole run refuses and changes nothing.
      const std::vector<int64_t> held = ranged.Sorted();
      EXPECT_FALSE(ranged.EraseRange(begin, end));
      EXPECT_EQ(ranged.Sorted(), held);
    }
  }
  BlockSet s;
  EXPECT_FALSE(s.EraseRange(-1, 3));
  EXPECT_FALSE(s.EraseRange(0, 1000));
}

TEST(BlockSet, InsertCutsIdsIntoRuns) {
  BlockSet s;
  const std::vector<int64_t> ids = {10, 11, 12, 70, 71, 5, 127, 128};
  s.insert(ids.begin(), ids.end());
  EXPECT_EQ(s.Sorted(),
            (std::vector<int64_t>{5, 10, 11, 12, 70, 71, 127, 128}));
  EXPECT_EQ(s.size(), 8);
  s.insert(ids.begin(), ids.end());  // again: nothing new
  EXPECT_EQ(s.size(), 8);
}

// Ascending ids with no gap are set as one range, with gaps id by id; the
// same set either way.
TEST(BlockSet, InsertAscendingAgreesWithInsert) {
  for (const std::vector<int64_t>& ids : std::vector<std::vector<int64_t>>{
           {}, {7}, {60, 61, 62, 63, 64, 65}, {0, 1, 2, 64, 65}, {3, 5}}) {
    BlockSet ascending, one_by_one;
    ascending.InsertAscending(ids);
    one_by_one.insert(ids.begin(), ids.end());
    EXPECT_EQ(ascending.Sorted(), one_by_one.Sorted());
    EXPECT_EQ(ascending.size(), static_cast<int64_t>(ids.size()));
  }
}

}  // namespace
}  // namespace kvbroker::attach
