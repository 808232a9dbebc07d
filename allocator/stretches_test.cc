// Stretches: merging on append, the ids in the order appended, and the
// ascending runs against a sort of the ids, over random acquisitions.

#include "allocator/stretches.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using ::testing::ElementsAreArray;

// AllocResult::block_runs by their definition: the ids sorted, one pair per
// stretch of consecutive ones.
std::vector<BlockId> RunsOfSorted(std::vector<BlockId> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<BlockId> runs;
  for (BlockId b : ids) {
    if (!runs.empty() && runs[runs.size() - 2] + runs.back() == b) {
      ++runs.back();
    } else {
      runs.push_back(b);
      runs.push_back(1);
    }
  }
  return runs;
}

TEST(StretchesTest, AppendMergesOnlyWhatContinues) {
  Stretches s;
  EXPECT_TRUE(s.empty());
  s.Append(32, 32);
  s.Append(64, 16);  // continues 32..63
  s.Append(0, 8);    // before, not continuing
  s.Append(8, 1);
  s.Append(100, 2);
  EXPECT_EQ(s.list(), (Stretches::List{{32, 48}, {0, 9}, {100, 2}}));
  EXPECT_EQ(s.blocks(), 59);
  std::vector<BlockId> ids = s.Ids();
  ASSERT_EQ(ids.size(), 59u);
  EXPECT_EQ(ids.front(), 32);
  EXPECT_EQ(ids[47], 79);
  EXPECT_EQ(ids[48], 0);
  EXPECT_EQ(ids.back(), 101);
  // 0..8 and 32..79 are not adjacent: three runs, ascending.
  EXPECT_EQ(s.AscendingRuns(), (BlockRuns{0, 9, 32, 48, 100, 2}));
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_TRUE(s.AscendingRuns().empty());
}

TEST(StretchesTest, AscendingRunsMergeAcrossTheOrderTaken) {
  Stretches s;
  s.Append(64, 32);  // a page taken after ...
  s.Append(10, 6);
  s.Append(32, 32);  // ... the one before it in id order
  EXPECT_EQ(s.AscendingRuns(), (BlockRuns{10, 6, 32, 64}));
}

TEST(StretchesTest, AppendIdsCutsAtEveryGap) {
  Stretches s;
  s.AppendIds({5, 6, 7, 9, 3, 4, 10});
  EXPECT_EQ(s.list(), (Stretches::List{{5, 3}, {9, 1}, {3, 2}, {10, 1}}));
  EXPECT_EQ(s.Ids(), (std::vector<BlockId>{5, 6, 7, 9, 3, 4, 10}));
}

TEST(StretchesTest, RandomAcquisitionsAgreeWithTheirIds) {
  constexpr int64_t kBlocks = 512;
  std::mt19937_64 rng(20261206);
  for (int round = 0; round < 3000; ++round) {
    // Distinct ids appended in stretches of random length and order, some
    // as ids (a reservation's part), as an acquisition appends them.
    std::vector<bool> used(kBlocks, false);
    std::vector<BlockId> ids;
    Stretches s;
    const int parts = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < parts; ++k) {
      BlockId b = static_cast<BlockId>(rng() % kBlocks);
      const int64_t len = 1 + static_cast<int64_t>(rng() % 70);
      std::vector<BlockId> part;
      for (; static_cast<int64_t>(part.size()) < len && b < kBlocks && !used[b];
           ++b) {
        used[b] = true;
        part.push_back(b);
      }
      if (part.empty()) continue;
      if (rng() % 3 == 0) {
        s.AppendIds(part);
      } else {
        s.Append(part.front(), static_cast<int64_t>(part.size()));
      }
      ids.insert(ids.end(), part.begin(), part.end());
    }
    ASSERT_EQ(s.Ids(), ids) << "round " << round;
    ASSERT_EQ(s.blocks(), static_cast<int64_t>(ids.size()));
    ASSERT_THAT(s.AscendingRuns(), ElementsAreArray(RunsOfSorted(ids)))
        << "round " << round;
    for (size_t i = 1; i < s.list().size(); ++i) {
      ASSERT_NE(s.list()[i - 1].end(), s.list()[i].first) << "not merged";
    }
  }
}

}  // namespace
}  // namespace kvbroker
