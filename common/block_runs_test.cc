// AppendBlockRuns: stretches of consecutive ids become one pair each, in
// the order given, so that expanding the pairs gives the ids back; a run
// that continues the last pair extends it. ExpandBlockRuns and
// WriteBlockRuns: what they refuse leaves the list or the room as it was.

#include "common/block_runs.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<int64_t> Runs(const std::vector<int64_t>& ids) {
  BlockRunList runs;
  AppendBlockRuns(ids, &runs);
  return {runs.begin(), runs.end()};
}

std::vector<int64_t> Expand(const std::vector<int64_t>& runs) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i + 1 < runs.size(); i += 2) {
    for (int64_t k = 0; k < runs[i + 1]; ++k) ids.push_back(runs[i] + k);
  }
  return ids;
}

TEST(BlockRunsTest, NoIdsNoPairs) { EXPECT_THAT(Runs({}), IsEmpty()); }

TEST(BlockRunsTest, OneStretchIsOnePair) {
  EXPECT_THAT(Runs({32, 33, 34, 35}), ElementsAre(32, 4));
  EXPECT_THAT(Runs({7}), ElementsAre(7, 1));
}

TEST(BlockRunsTest, GapsStartNewPairs) {
  // The 14 MiB page / 6 MiB block seed geometry: ids 0, 1 and 3.
  EXPECT_THAT(Runs({0, 1, 3}), ElementsAre(0, 2, 3, 1));
  EXPECT_THAT(Runs({0, 2, 4}), ElementsAre(0, 1, 2, 1, 4, 1));
}

TEST(BlockRunsTest, OrderIsKeptAndRepeatsSurvive) {
  const std::vector<int64_t> ids = {9, 10, 3, 4, 5, 5, 11, 2};
  EXPECT_THAT(Runs(ids), ElementsAre(9, 2, 3, 3, 5, 1, 11, 1, 2, 1));
  EXPECT_EQ(Expand(Runs(ids)), ids);
}

TEST(BlockRunsTest, RunsWhereShorterThanTheIds) {
  constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
  constexpr int64_t kBottom = std::numeric_limits<int64_t>::min();
  for (const std::vector<int64_t>& ids :
       std::vector<std::vector<int64_t>>{{},
                                         {4},
                                         {4, 5},
                                         {4, 5, 6},
                                         {0, 1, 3},
                                         {9, 10, 3, 4, 5, 5, 11, 2},
                                         {kTop - 1, kTop, kBottom, kBottom + 1},
                                         {-2, -1, 0, 1, 2}}) {
    BlockRunList runs;
    runs.Add(77);  // whatever was there goes
    const bool shorter = BlockRunsIfShorter(ids, &runs);
    EXPECT_EQ(shorter, Runs(ids).size() < ids.size())
        << testing::PrintToString(ids);
    if (shorter) {
      EXPECT_EQ(std::vector<int64_t>(runs.begin(), runs.end()), Runs(ids));
    } else {
      EXPECT_THAT(runs, IsEmpty());
    }
  }
}

// Pairs end at the largest int64 even where the ids go on from the
// smallest (consecutive in two's complement, not as numbers).
TEST(BlockRunsTest, NoPairWrapsPastTheLargestId) {
  constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
  constexpr int64_t kBottom = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> ids;
  for (int64_t k = 11; k >= 0; --k) ids.push_back(kTop - k);
  for (int64_t k = 0; k < 12; ++k) ids.push_back(kBottom + k);
  EXPECT_THAT(Runs(ids), ElementsAre(kTop - 11, 12, kBottom, 12));
  EXPECT_EQ(Expand(Runs(ids)), ids);
}

TEST(BlockRunsTest, ARunThatContinuesTheLastPairExtendsIt) {
  BlockRunList runs;
  // Three whole pages of 32 blocks, then one with a gap.
  for (int64_t page = 0; page < 3; ++page) {
    std::vector<int64_t> ids;
    for (int64_t b = 32 * page; b < 32 * (page + 1); ++b) ids.push_back(b);
    AppendBlockRuns(ids, &runs);
  }
  AppendBlockRuns({96, 97, 99}, &runs);
  AppendBlockRuns({}, &runs);
  AppendBlockRuns({100, 101}, &runs);
  EXPECT_THAT(runs, ElementsAre(0, 98, 99, 3));
  AppendBlockRun(200, 1, &runs);
  EXPECT_THAT(runs, ElementsAre(0, 98, 99, 3, 200, 1));
}

TEST(BlockRunsTest, LargestIdDoesNotOverflow) {
  const int64_t top = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(Runs({top - 1, top}), ElementsAre(top - 1, 2));
  EXPECT_THAT(Runs({top, std::numeric_limits<int64_t>::min()}),
              ElementsAre(top, 1, std::numeric_limits<int64_t>::min(), 1));
}

TEST(BlockRunsTest, ExpandAppendsWhatTheRunsName) {
  std::vector<int64_t> ids = {7};
  ASSERT_TRUE(
      ExpandBlockRuns(Runs({9, 10, 3, 4, 5, 5, 11, 2}), 100, &ids).ok());
  EXPECT_THAT(ids, ElementsAre(7, 9, 10, 3, 4, 5, 5, 11, 2));
  const int64_t top = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> at_top;
  ASSERT_TRUE(ExpandBlockRuns({top - 1, 2}, 2, &at_top).ok());
  EXPECT_THAT(at_top, ElementsAre(top - 1, top));
}

TEST(BlockRunsTest, WriteFillsTheFrontOfTheRoomGiven) {
  std::vector<int64_t> room(8, -1);
  size_t written = 1;
  ASSERT_TRUE(WriteBlockRuns(Runs({9, 10, 3, 4, 5}), absl::MakeSpan(room),
                             &written)
                  .ok());
  EXPECT_EQ(written, 6u);
  EXPECT_THAT(room, ElementsAre(9, 10, 3, 4, 5, -1, -1, -1));
  // Exactly the room: accepted; one id more: refused, nothing written.
  std::vector<int64_t> three(3, -1);
  written = 0;
  EXPECT_TRUE(WriteBlockRuns({20, 3}, absl::MakeSpan(three), &written).ok());
  EXPECT_THAT(three, ElementsAre(20, 21, 22));
  std::vector<int64_t> two(2, -1);
  written = 0;
  EXPECT_EQ(WriteBlockRuns({20, 3}, absl::MakeSpan(two), &written).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(written, 0u);
  EXPECT_THAT(two, ElementsAre(-1, -1));
  EXPECT_EQ(WriteBlockRuns({0, 1, 5}, absl::MakeSpan(room), &written).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockRunsTest, ExpandRefusesMalformedRunsAndChangesNothing) {
  const int64_t top = std::numeric_limits<int64_t>::max();
  const std::vector<std::vector<int64_t>> bad = {
      {0, 2, 4},      // odd
      {0, 0},         // names nothing
      {0, -1},        // names nothing
      {top, 2},       // past the largest id
      {0, 5, 10, 6},  // 12 with the 1 there, bound 10
  };
  for (const std::vector<int64_t>& runs : bad) {
    std::vector<int64_t> ids = {1};
    const absl::Status s = ExpandBlockRuns(runs, 10, &ids);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << runs.size();
    EXPECT_THAT(ids, ElementsAre(1));
    int64_t total = -7;
    EXPECT_EQ(CheckBlockRuns(runs, 10, 1, &total).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(total, -7);
  }
}

// What the daemon does with a Free's runs instead of expanding them.
TEST(BlockRunsTest, CheckCountsTheIdsWithinTheBound) {
  int64_t total = 0;
  ASSERT_TRUE(CheckBlockRuns({9, 10, 30, 4}, 14, 0, &total).ok());
  EXPECT_EQ(total, 14);
  EXPECT_EQ(CheckBlockRuns({9, 10, 30, 4}, 14, 1, &total).code(),
            absl::StatusCode::kInvalidArgument);  // 15 with the one named
  ASSERT_TRUE(CheckBlockRuns({}, 14, 3, &total).ok());
  EXPECT_EQ(total, 0);
}

}  // namespace
}  // namespace kvbroker
