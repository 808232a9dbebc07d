// ConsecutiveEnd against the plain definition at every break position (in
// and around its eight- and four-id steps) and across the largest id;
// WriteConsecutive against a loop of first + k for every count around its
// four-at-a-time steps, at both ends of int64.

#include "common/consecutive_ids.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
constexpr int64_t kBottom = std::numeric_limits<int64_t>::min();

TEST(ConsecutiveIdsTest, ConsecutiveEndAtEveryBreak) {
  for (size_t size = 1; size <= 40; ++size) {
    for (size_t brk = 0; brk <= size; ++brk) {
      std::vector<int64_t> ids(size);
      for (size_t j = 0; j < size; ++j) {
        ids[j] = 1000 + static_cast<int64_t>(j) + (j >= brk ? 5 : 0);
      }
      for (size_t i = 0; i < size; ++i) {
        size_t expected = i + 1;
        while (expected < size && ids[expected] == ids[expected - 1] + 1) {
          ++expected;
        }
        ASSERT_EQ(ConsecutiveEnd(ids, i), expected)
            << "size " << size << " break " << brk << " from " << i;
      }
    }
  }
}

// Consecutive in two's complement is not consecutive as numbers: a stretch
// ends at the largest id.
TEST(ConsecutiveIdsTest, NoStretchWrapsPastTheLargestId) {
  std::vector<int64_t> ids;
  for (int64_t k = 11; k >= 0; --k) ids.push_back(kTop - k);
  for (int64_t k = 0; k < 12; ++k) ids.push_back(kBottom + k);
  EXPECT_EQ(ConsecutiveEnd(ids, 0), 12u);
  EXPECT_EQ(ConsecutiveEnd(ids, 5), 12u);
  EXPECT_EQ(ConsecutiveEnd(ids, 11), 12u);
  EXPECT_EQ(ConsecutiveEnd(ids, 12), 24u);
}

TEST(ConsecutiveIdsTest, WriteConsecutiveWritesExactlyTheRun) {
  for (int64_t first : {int64_t{0}, int64_t{-3}, int64_t{1000}, kBottom,
                        kTop - 40}) {
    for (int64_t count = 0; count <= 40; ++count) {
      if (first > kTop - 40 && count > kTop - first + 1) continue;
      // Guards on both sides catch a store past either end.
      std::vector<int64_t> buf(count + 2, 77);
      WriteConsecutive(buf.data() + 1, first, count);
      ASSERT_EQ(buf.front(), 77) << first << " " << count;
      ASSERT_EQ(buf.back(), 77) << first << " " << count;
      for (int64_t k = 0; k < count; ++k) {
        ASSERT_EQ(buf[k + 1], first + k) << first << " " << count;
      }
    }
  }
}

// A run that ends at the largest id: every count whose last step of four
// would step past it.
TEST(ConsecutiveIdsTest, WriteConsecutiveEndsAtTheLargestId) {
  for (int64_t count = 1; count <= 12; ++count) {
    std::vector<int64_t> buf(count);
    WriteConsecutive(buf.data(), kTop - (count - 1), count);
    EXPECT_EQ(buf.back(), kTop) << count;
    EXPECT_EQ(buf.front(), kTop - (count - 1)) << count;
  }
}

}  // namespace
}  // namespace kvbroker
