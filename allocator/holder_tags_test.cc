// HolderTags: Hand against a block-at-a-time reading of its contract, over
// stretches of every length with holders mixed across and within them (and
// stretches all fresh, all the holder's own, or a mix of the two); Forget
// and Taint as they feed the next Hand.

#include "allocator/holder_tags.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

// The contract of Hand, one block at a time.
struct Reference {
  std::vector<uint32_t> last;
  void Hand(const std::vector<BlockId>& blocks, uint32_t holder,
            std::vector<BlockId>* to_zero) {
    if (holder == 0) return;
    for (BlockId b : blocks) {
      if (last[b] != 0 && last[b] != holder) to_zero->push_back(b);
      last[b] = holder;
    }
  }
};

// Distinct ids as an acquisition holds them.
Stretches Of(const std::vector<BlockId>& ids) {
  Stretches s;
  s.AppendIds(ids);
  return s;
}

TEST(HolderTagsTest, InternNamesHoldersFromOne) {
  HolderTags tags(8);
  EXPECT_EQ(tags.Intern(""), 0u);
  const uint32_t a = tags.Intern("engine-a");
  const uint32_t b = tags.Intern("engine-b");
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(tags.Intern("engine-a"), a);
}

TEST(HolderTagsTest, HandZeroesOnlyAnotherHoldersBlocks) {
  HolderTags tags(64);
  const uint32_t a = tags.Intern("a"), b = tags.Intern("b");
  std::vector<BlockId> to_zero;
  tags.Hand(Of({0, 1, 2, 3, 10}), a, &to_zero);
  EXPECT_TRUE(to_zero.empty());  // never held: nothing to zero
  tags.Hand(Of({2, 3, 4, 5, 10, 11}), b, &to_zero);
  EXPECT_EQ(to_zero, (std::vector<BlockId>{2, 3, 10}));
  to_zero.clear();
  tags.Hand(Of({4, 5, 6}), b, &to_zero);  // its own data
  EXPECT_TRUE(to_zero.empty());
  tags.Hand(Of({0, 1, 2}), 0, &to_zero);  // no holder: tags unchanged
  EXPECT_EQ(tags.last(2), b);
  tags.Forget(0, 4);
  tags.Taint(std::vector<BlockId>{5});
  tags.Hand(Of({0, 1, 2, 3, 4, 5}), a, &to_zero);
  EXPECT_EQ(to_zero, (std::vector<BlockId>{4, 5}));
  for (BlockId id = 0; id < 6; ++id) EXPECT_EQ(tags.last(id), a) << id;
}

TEST(HolderTagsTest, HandAgreesWithTheContractOnRandomLists) {
  constexpr int64_t kBlocks = 300;
  std::mt19937_64 rng(20261206);
  HolderTags tags(kBlocks);
  Reference ref{std::vector<uint32_t>(kBlocks, 0)};
  const uint32_t holders[] = {tags.Intern("h1"), tags.Intern("h2"),
                              tags.Intern("h3")};
  for (int round = 0; round < 2000; ++round) {
    // Distinct ids in stretches of random length, the stretches in random
    // order, as an Alloc takes a page's blocks and pages in its own order.
    std::vector<bool> used(kBlocks, false);
    std::vector<BlockId> blocks;
    const int stretches = 1 + static_cast<int>(rng() % 6);
    for (int s = 0; s < stretches; ++s) {
      BlockId b = static_cast<BlockId>(rng() % kBlocks);
      const int64_t len = 1 + static_cast<int64_t>(rng() % 40);
      for (int64_t k = 0; k < len && b < kBlocks && !used[b]; ++k, ++b) {
        used[b] = true;
        blocks.push_back(b);
      }
    }
    if (rng() % 5 == 0) {
      const BlockId b = static_cast<BlockId>(rng() % (kBlocks - 10));
      tags.Forget(b, b + 10);
      std::fill(ref.last.begin() + b, ref.last.begin() + b + 10, 0);
    }
    const uint32_t holder = rng() % 7 == 0 ? 0 : holders[rng() % 3];
    std::vector<BlockId> got, want;
    tags.Hand(Of(blocks), holder, &got);
    ref.Hand(blocks, holder, &want);
    ASSERT_EQ(got, want) << "round " << round;
    for (BlockId b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(tags.last(b), ref.last[b])
          << "round " << round << " block " << b;
    }
  }
}

}  // namespace
}  // namespace kvbroker
