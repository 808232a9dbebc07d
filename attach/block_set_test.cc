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

}  // namespace
}  // namespace kvbroker::attach
