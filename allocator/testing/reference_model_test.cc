// Checks the reference model itself against the numbers of the acceptance
// scenarios (the product's acceptance scenarios), so that property tests compare the
// pool against a model that is known to follow the spec.

#include "allocator/testing/reference_model.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvbroker {
namespace reference {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

ModelConfig Config(int64_t P, int64_t B, int64_t N, int64_t budget = 1000) {
  ModelConfig c;
  c.page_size = P;
  c.block_bytes = B;
  c.max_blocks = N;
  c.budget_bundles = budget;
  return c;
}

std::vector<std::pair<int64_t, int64_t>> Ranges(const ReferenceModel& m,
                                                int64_t pages) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t p = 0; p < pages; ++p) {
    int64_t b = m.range_begin(p), e = m.range_end(p);
    out.push_back({b, std::max(b, e)});
  }
  return out;
}

using Ids = std::vector<int64_t>;
using R = std::vector<std::pair<int64_t, int64_t>>;

TEST(ReferenceModelTest, GeometryRows) {
  ReferenceModel g1(Config(14 * kMiB, 6 * kMiB, 15));
  EXPECT_EQ(Ranges(g1, 4), (R{{0, 2}, {3, 4}, {5, 7}, {7, 9}}));
  EXPECT_FALSE(g1.is_usable_block(2));
  EXPECT_FALSE(g1.is_usable_block(4));
  EXPECT_FALSE(g1.is_usable_block(9));
  ReferenceModel g2(Config(2 * kMiB, 768 * kKiB, 16));
  EXPECT_EQ(Ranges(g2, 4), (R{{0, 2}, {3, 5}, {6, 8}, {8, 10}}));
  ReferenceModel g3(Config(2 * kMiB, 1536 * kKiB, 8));
  EXPECT_EQ(Ranges(g3, 6), (R{{0, 1}, {2, 2}, {3, 4}, {4, 5}, {6, 6}, {7, 8}}));
  EXPECT_EQ(g3.PagesIn(MPage::kEmpty), 2);
  ReferenceModel g5(Config(2 * kMiB, 1 * kMiB, 5));
  EXPECT_EQ(g5.page_count(), 3);
  EXPECT_EQ(g5.AvailableBlocks(), 5);
  EXPECT_EQ(g5.SelfCheck(), "");
}

TEST(ReferenceModelTest, CapacityRows) {
  {  // C1-C3, C5
    ReferenceModel m(Config(14 * kMiB, 6 * kMiB, 5));
    EXPECT_EQ(m.page_count(), 3);
    EXPECT_EQ(m.AvailableBlocks(), 3);
    EXPECT_EQ(m.Alloc(4).reason, FailureReason::kRequestTooLarge);
    MOutcome a = m.Alloc(3);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a.ids, (Ids{0, 1, 3}));
    EXPECT_EQ(a.pages_mapped, 2);
    ASSERT_TRUE(m.Free({3}).ok());
    EXPECT_EQ(m.AvailableBlocks(), 1);
    EXPECT_EQ(m.Alloc(2).reason, FailureReason::kPoolExhausted);
    EXPECT_EQ(m.SelfCheck(), "");
  }
  {  // C4
    ModelConfig c = Config(14 * kMiB, 6 * kMiB, 5);
    c.reserve_null_block = true;
    ReferenceModel m(c);
    EXPECT_EQ(m.AvailableBlocks(), 2);
    EXPECT_EQ(m.Alloc(3).reason, FailureReason::kRequestTooLarge);
    EXPECT_EQ(m.Alloc(2).ids, (Ids{1, 3}));
    EXPECT_EQ(m.Free({0}).reason, FailureReason::kBlockNotAllocated);
  }
  {  // C6
    ReferenceModel m(Config(14 * kMiB, 6 * kMiB, 7));
    EXPECT_EQ(m.AvailableBlocks(), 5);
    EXPECT_EQ(m.Alloc(5).ids, (Ids{0, 1, 3, 5, 6}));
  }
  {  // C7, C8
    ReferenceModel m(Config(2 * kMiB, 1536 * kKiB, 8));
    EXPECT_EQ(m.AvailableBlocks(), 4);
    EXPECT_EQ(m.Alloc(5).reason, FailureReason::kRequestTooLarge);
    MOutcome a = m.Alloc(4);
    EXPECT_EQ(a.ids, (Ids{0, 3, 4, 7}));
    EXPECT_EQ(a.pages_mapped, 4);
    ASSERT_TRUE(m.Free(a.ids).ok());
    EXPECT_EQ(m.MappedPages(), 0);
    EXPECT_EQ(m.AllocatedBlocks(), 0);
  }
  {  // C9, C10
    ReferenceModel m9(Config(2 * kMiB, 768 * kKiB, 8));
    EXPECT_EQ(m9.AvailableBlocks(), 6);
    EXPECT_EQ(m9.Alloc(6).ids, (Ids{0, 1, 3, 4, 6, 7}));
    ReferenceModel m10(Config(8 * kMiB, 6 * kMiB, 6));
    EXPECT_EQ(m10.AvailableBlocks(), 3);
    EXPECT_EQ(m10.Alloc(3).ids, (Ids{0, 3, 4}));
  }
  {  // C12
    ReferenceModel m(Config(2 * kMiB, 1 * kMiB, 20, /*budget=*/3));
    EXPECT_EQ(m.AvailableBlocks(), 6);
    EXPECT_EQ(m.Alloc(7).reason, FailureReason::kGpuMemoryExhausted);
  }
  {  // C13
    ReferenceModel m(Config(2 * kMiB, 16 * kKiB, 65536));
    EXPECT_EQ(m.AvailableBlocks(), 65536);
    MOutcome a = m.Alloc(256);
    EXPECT_EQ(m.AvailableBlocks(), 65280);
    ASSERT_TRUE(m.Free(a.ids).ok());
    EXPECT_EQ(m.AvailableBlocks(), 65536);
  }
}

TEST(ReferenceModelTest, BestFitAndIdleOrder) {
  // 4 blocks per page, 4 pages; keep two pages idle.
  ModelConfig c = Config(2 * kMiB, 512 * kKiB, 16);
  c.max_idle_pages = 2;
  ReferenceModel m(c);
  ASSERT_EQ(m.Alloc(16).ids.size(), 16u);
  // Page 0: 1 free, page 1: 3 free, page 2: 2 free, page 3 full.
  ASSERT_TRUE(m.Free({0, 4, 5, 6, 8, 9}).ok());
  EXPECT_EQ(m.Alloc(2).ids, (Ids{8, 9}));  // fewest free covering 2: page 2
  EXPECT_EQ(m.Alloc(4).ids, (Ids{0, 4, 5, 6}));  // most free (p1), then p0
  ASSERT_TRUE(m.Free({12, 13, 14, 15}).ok());    // page 3 -> IDLE
  ASSERT_TRUE(m.Free({8, 9, 10, 11}).ok());      // page 2 -> IDLE
  EXPECT_EQ(m.idle_list(), (std::deque<int64_t>{3, 2}));
  ASSERT_TRUE(m.Free({0, 1, 2, 3}).ok());  // two idle already -> FREE
  EXPECT_EQ(m.free_list(), (std::deque<int64_t>{0}));
  EXPECT_EQ(m.Alloc(5).ids, (Ids{8, 12, 13, 14, 15}));
  EXPECT_EQ(m.SelfCheck(), "");
}

TEST(ReferenceModelTest, ReservationRows) {
  ReferenceModel m(Config(2 * kMiB, 1 * kMiB, 10));
  MOutcome r1 = m.Reserve(5, "a");
  MOutcome r2 = m.Reserve(5, "b");
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(m.AvailableBlocks(), 0);
  EXPECT_EQ(m.ReservedBlocks(), 10);
  MOutcome a = m.AllocFromReservation("a", 3);
  EXPECT_EQ(a.ids, (Ids{0, 1, 2}));
  EXPECT_EQ(m.Free({3}).reason, FailureReason::kBlockInReservation);
  MOutcome rel = m.Release("a");
  EXPECT_EQ(rel.ids, (Ids{3, 4}));
  EXPECT_EQ(m.AvailableBlocks(), 2);
  EXPECT_EQ(m.Release("a").reason, FailureReason::kReservationNotFound);
  EXPECT_EQ(m.SelfCheck(), "");
}

TEST(ReferenceModelTest, LimitRows) {
  const int64_t b = 2 * kMiB;
  {  // S1, S2
    ReferenceModel m(Config(2 * kMiB, 1 * kMiB, 20));
    ASSERT_TRUE(m.Alloc(8).ok());
    ASSERT_TRUE(m.Free({1, 3, 5, 7}).ok());
    EXPECT_EQ(m.MappedPages(), 4);
    MLimitResult r = m.SetMemoryLimit(2 * b, 1);
    EXPECT_EQ(r.outcome, MLimitOutcome::kDeferred);
    EXPECT_EQ(m.AvailableBlocks(), 4);  // only the OPEN pages' free blocks
    EXPECT_EQ(m.Alloc(5).reason, FailureReason::kShrinkPending);  // S4
    ASSERT_TRUE(m.Free({0}).ok());
    EXPECT_EQ(m.limit_state(), MLimitState::kDeferred);
    ASSERT_TRUE(m.Free({2}).ok());
    EXPECT_EQ(m.limit_state(), MLimitState::kApplied);
    EXPECT_EQ(m.MappedPages(), 2);
    ASSERT_TRUE(m.Free({4, 6}).ok());
    EXPECT_EQ(m.Admitted(), 2);
    EXPECT_EQ(m.SetMemoryLimit(6 * b, 2).outcome, MLimitOutcome::kApplied);
    EXPECT_EQ(m.Admitted(), 6);
    EXPECT_EQ(m.SetMemoryLimit(10 * b, 3).outcome, MLimitOutcome::kApplied);
    MOutcome all = m.Alloc(20);
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all.ids.size(), 20u);
    EXPECT_EQ(m.PagesIn(MPage::kFull), 10);
    EXPECT_EQ(m.SelfCheck(), "");
  }
  {  // S3
    ReferenceModel m(Config(14 * kMiB, 6 * kMiB, 15));
    ASSERT_EQ(m.page_count(), 7);
    MOutcome a = m.Alloc(5);  // pages 0, 1, 2
    ASSERT_EQ(m.MappedPages(), 3);
    EXPECT_EQ(m.SetMemoryLimit(2 * 14 * kMiB, 1).outcome,
              MLimitOutcome::kDeferred);
    ASSERT_TRUE(m.Free(a.ids).ok());
    EXPECT_EQ(m.limit_state(), MLimitState::kApplied);
    EXPECT_EQ(m.Admitted(), 2);
    EXPECT_EQ(m.SelfCheck(), "");
  }
  {  // L4: revisions
    ReferenceModel m(Config(2 * kMiB, 1 * kMiB, 32));
    EXPECT_EQ(m.SetMemoryLimit(32 * b, 9).outcome, MLimitOutcome::kApplied);
    EXPECT_EQ(m.target_pages(), 16);
    EXPECT_EQ(m.SetMemoryLimit(32 * b, 9).outcome, MLimitOutcome::kApplied);
    EXPECT_EQ(m.SetMemoryLimit(3 * b, 9).outcome, MLimitOutcome::kConflict);
    EXPECT_EQ(m.SetMemoryLimit(2 * b, 8).outcome, MLimitOutcome::kStale);
    EXPECT_EQ(m.limit_revision(), 9);
    EXPECT_EQ(m.target_pages(), 16);
  }
}

}  // namespace
}  // namespace reference
}  // namespace kvbroker
