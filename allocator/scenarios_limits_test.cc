// Acceptance scenarios of memory limits (S, L), over the rig of
// scenarios_rig.h.

#include "allocator/scenarios_rig.h"

namespace kvbroker::scenarios {
namespace {

// ===========================================================================
// Memory limits

// S1's pool: P = 2 MiB, B = 1 MiB, N = 20 (10 pages); b = 2 MiB.
PoolConfig S1Pool() { return Geo(MiB(2), MiB(1), 20); }
const Bytes kS1Bundle = MiB(2);

// Pages 0..3 each hold one block (0, 2, 4, 6); the rest are unmapped.
void FourPagesOneBlockEach(PagePool& pool) {
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(pool, 8));
  ASSERT_EQ(Ids(r), (std::vector<BlockId>{0, 1, 2, 3, 4, 5, 6, 7}));
  ASSERT_TRUE(Free(pool, {1, 3, 5, 7}).ok());
  CapacitySnapshot c = Cap(pool);
  ASSERT_EQ(c.pages_open, PageCount(4));
  ASSERT_EQ(c.pages_free, PageCount(6));
}

// S1 through its last step: limit 2 pages APPLIED with blocks 4 and 6 held.
void RunS1(PagePool& pool) {
  ASSERT_NO_FATAL_FAILURE(FourPagesOneBlockEach(pool));
  ASSERT_OK_AND_ASSIGN(LimitResult l, Limit(pool, kS1Bundle * 2, 1));
  EXPECT_EQ(l.outcome, LimitOutcome::kDeferred);
  EXPECT_EQ(l.limit.state, LimitState::kDeferred);
  EXPECT_EQ(l.limit.target_pages, PageCount(2));
  EXPECT_EQ(l.mapped_bytes, kS1Bundle * 4);
  EXPECT_EQ(l.limit.overage_bytes, kS1Bundle * 2);

  ASSERT_TRUE(Free(pool, {0}).ok());
  CapacitySnapshot c = Cap(pool);
  EXPECT_EQ(c.limit.state, LimitState::kDeferred);
  EXPECT_EQ(c.pages_open.value() + c.pages_full.value(), 3);
  EXPECT_EQ(c.limit.overage_bytes, kS1Bundle * 1);

  ASSERT_TRUE(Free(pool, {2}).ok());
  c = Cap(pool);
  EXPECT_EQ(c.limit.state, LimitState::kApplied);
  EXPECT_EQ(c.limit.target_pages, PageCount(2));
  EXPECT_EQ(c.limit.effective_bytes, kS1Bundle * 2);
  EXPECT_EQ(c.limit.overage_bytes, Bytes(0));
  EXPECT_EQ(c.pages_open, PageCount(2));
  EXPECT_EQ(c.mapped_bytes, kS1Bundle * 2);
  EXPECT_EQ(c.total_blocks, BlockCount(4));
  EXPECT_EQ(c.available_blocks, BlockCount(2));
}

TEST(Scenarios, S1_DeferredShrinkCompletesOnFree) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, S1Pool()));
  ASSERT_NO_FATAL_FAILURE(RunS1(*pool));
  EXPECT_EQ(rig.backend.live_handles(), 2);
}

TEST(Scenarios, S2_RaisingTheLimitNeverHandsAPageOutTwice) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, S1Pool()));
  ASSERT_NO_FATAL_FAILURE(RunS1(*pool));
  ASSERT_TRUE(Free(*pool, {4, 6}).ok());  // S1's pool, idle
  ASSERT_EQ(Cap(*pool).allocated_blocks, BlockCount(0));

  ASSERT_OK_AND_ASSIGN(LimitResult six, Limit(*pool, kS1Bundle * 6, 2));
  EXPECT_EQ(six.outcome, LimitOutcome::kApplied);
  EXPECT_EQ(six.limit.target_pages, PageCount(6));
  EXPECT_EQ(Available(*pool), 12);
  ASSERT_OK_AND_ASSIGN(LimitResult ten, Limit(*pool, kS1Bundle * 10, 3));
  EXPECT_EQ(ten.outcome, LimitOutcome::kApplied);
  EXPECT_EQ(ten.limit.target_pages, PageCount(10));
  EXPECT_EQ(Available(*pool), 20);

  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 20));
  std::vector<BlockId> expected_ids(20);
  for (int i = 0; i < 20; ++i) expected_ids[i] = i;
  EXPECT_EQ(Ids(r), expected_ids);
  std::set<PageId> pages;
  for (const PageBlocks& pb : r.pages) {
    EXPECT_TRUE(pages.insert(pb.page_id).second) << pb.page_id;
    EXPECT_EQ(pb.block_ids.size(), 2u);
  }
  EXPECT_EQ(pages.size(), 10u);
  EXPECT_EQ(rig.backend.live_handles(), 10);
}

TEST(Scenarios, S3_TargetIsKeptInPagesNotBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(14), MiB(6), 15)));
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 5));  // pages 0, 1, 2
  ASSERT_EQ(r.pages_mapped, 3);
  const Bytes b = MiB(14);
  ASSERT_OK_AND_ASSIGN(LimitResult l, Limit(*pool, b * 2, 1));
  EXPECT_EQ(l.outcome, LimitOutcome::kDeferred);
  EXPECT_EQ(l.limit.overage_bytes, b);
  ASSERT_TRUE(Free(*pool, Ids(r)).ok());
  CapacitySnapshot c = Cap(*pool, 10);
  EXPECT_EQ(c.limit.state, LimitState::kApplied);
  EXPECT_EQ(c.limit.target_pages, PageCount(2));
  EXPECT_EQ(c.limit.effective_bytes, b * 2);
  // Two page ids are admitted (mapped or FREE), whatever blocks they hold.
  EXPECT_EQ(c.pages_free.value() + c.pages_idle.value() + c.pages_open.value() +
                c.pages_full.value(),
            2);
  EXPECT_EQ(c.pages_reclaimed, PageCount(5));
  int64_t usable = 0;
  for (const PageInfo& p : c.pages) usable += p.usable_blocks.value();
  EXPECT_EQ(c.available_blocks.value(), usable);
  EXPECT_EQ(c.total_blocks.value(), usable);
}

TEST(Scenarios, S4_DeferredRefusesNewPagesNotOpenBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, S1Pool()));
  ASSERT_NO_FATAL_FAILURE(FourPagesOneBlockEach(*pool));
  ASSERT_OK_AND_ASSIGN(LimitResult l, Limit(*pool, kS1Bundle * 3, 1));
  ASSERT_EQ(l.outcome, LimitOutcome::kDeferred);
  EXPECT_EQ(Available(*pool), 4);  // the free halves of the OPEN pages
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kShrinkPending,
                                        [&] { return Alloc(*pool, 5); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Meta(s, "available_blocks"), "4");
  const int64_t maps = rig.backend.map_calls();
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 4));
  EXPECT_EQ(Ids(r), (std::vector<BlockId>{1, 3, 5, 7}));
  EXPECT_EQ(rig.backend.map_calls(), maps);
  EXPECT_EQ(Cap(*pool).limit.state, LimitState::kDeferred);
}

// L1-L4: b = 8 MiB (P = 2 MiB, L = 2, K = 2), 16 pages of 2 blocks.
const Bytes kLBundle = MiB(8);
PoolConfig LPool() {
  PoolConfig c = Geo(MiB(2), MiB(1), 32);
  c.num_layers = 2;
  c.num_kv_buffers = 2;
  return c;
}

// Four pages in use, then SetMemoryLimit(2b, rev 8): L2.
void RunL2(Rig& rig, PagePool& pool) {
  ASSERT_EQ(pool.geometry().bundle_bytes(), kLBundle);
  ASSERT_EQ(pool.geometry().page_count(), PageCount(16));
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(pool, 8));
  ASSERT_EQ(r.pages_mapped, 4);
  ASSERT_OK_AND_ASSIGN(LimitResult l, Limit(pool, kLBundle * 2, 8));
  EXPECT_EQ(l.outcome, LimitOutcome::kDeferred);
  EXPECT_EQ(l.mapped_bytes, kLBundle * 4);
  EXPECT_EQ(l.limit.overage_bytes, kLBundle * 2);
  EXPECT_EQ(l.limit.effective_bytes, kLBundle * 2);
  EXPECT_EQ(l.limit.revision, 8);
  EXPECT_EQ(rig.backend.created_bytes(0), kLBundle * 4);
}

// L2, then SetMemoryLimit(32b, rev 9): L3.
void RunL3(Rig& rig, PagePool& pool) {
  ASSERT_NO_FATAL_FAILURE(RunL2(rig, pool));
  ASSERT_OK_AND_ASSIGN(LimitResult l, Limit(pool, kLBundle * 32, 9));
  EXPECT_EQ(l.outcome, LimitOutcome::kApplied);
  EXPECT_EQ(l.limit.target_pages, PageCount(16));
  EXPECT_EQ(l.limit.effective_bytes, kLBundle * 16);
  EXPECT_EQ(l.limit.limit_bytes, kLBundle * 32);
  EXPECT_EQ(l.limit.overage_bytes, Bytes(0));
  EXPECT_EQ(l.limit.revision, 9);
}

TEST(Scenarios, L1_LimitRoundsDownToWholeBundles) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, LPool(),
                                           Quiet(/*min_idle=*/0,
                                                 /*max_idle=*/2)));
  ASSERT_EQ(pool->geometry().bundle_bytes(), kLBundle);
  ASSERT_EQ(pool->geometry().page_count(), PageCount(16));
  // One page in use, two IDLE.
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 6));
  ASSERT_TRUE(Free(*pool, {2, 3, 4, 5}).ok());
  CapacitySnapshot c = Cap(*pool);
  ASSERT_EQ(c.pages_full, PageCount(1));
  ASSERT_EQ(c.pages_idle, PageCount(2));

  ASSERT_OK_AND_ASSIGN(LimitResult l,
                       Limit(*pool, kLBundle * 3 + Bytes(123), 7));
  EXPECT_EQ(l.outcome, LimitOutcome::kApplied);
  EXPECT_EQ(l.limit.state, LimitState::kApplied);
  EXPECT_EQ(l.limit.effective_bytes, kLBundle * 3);
  EXPECT_EQ(l.limit.target_pages, PageCount(3));
  EXPECT_EQ(l.limit.limit_bytes, kLBundle * 3 + Bytes(123));
  EXPECT_EQ(l.limit.revision, 7);
  EXPECT_EQ(l.mapped_bytes, kLBundle * 3);
  c = Cap(*pool);
  EXPECT_EQ(c.pages_free, PageCount(0));
  EXPECT_EQ(c.pages_reclaimed, PageCount(13));
  EXPECT_EQ(c.available_blocks, BlockCount(4));
}

TEST(Scenarios, L2_LowerThanInUseIsDeferredWithOverage) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, LPool()));
  ASSERT_NO_FATAL_FAILURE(RunL2(rig, *pool));
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.limit.state, LimitState::kDeferred);
  EXPECT_EQ(c.mapped_bytes, kLBundle * 4);
}

TEST(Scenarios, L3_LimitClampedToPageCount) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, LPool()));
  ASSERT_NO_FATAL_FAILURE(RunL3(rig, *pool));
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.limit.state, LimitState::kApplied);
  EXPECT_EQ(c.available_blocks, BlockCount(24));  // 12 FREE pages back
}

TEST(Scenarios, L4_RevisionsAreIdempotentConflictingOrStale) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, LPool()));
  ASSERT_NO_FATAL_FAILURE(RunL3(rig, *pool));
  const std::string before = Observable(*pool);
  const uint64_t generation = pool->generation();

  ASSERT_OK_AND_ASSIGN(LimitResult same, Limit(*pool, kLBundle * 32, 9));
  EXPECT_EQ(same.outcome, LimitOutcome::kApplied);
  EXPECT_EQ(same.limit.effective_bytes, kLBundle * 16);
  EXPECT_EQ(same.limit.limit_bytes, kLBundle * 32);
  EXPECT_EQ(same.limit.revision, 9);
  EXPECT_EQ(pool->generation(), generation);

  ASSERT_OK_AND_ASSIGN(LimitResult conflict, Limit(*pool, kLBundle * 3, 9));
  EXPECT_EQ(conflict.outcome, LimitOutcome::kConflict);
  EXPECT_EQ(conflict.limit.limit_bytes, kLBundle * 32);
  EXPECT_EQ(conflict.limit.revision, 9);

  ASSERT_OK_AND_ASSIGN(LimitResult stale, Limit(*pool, kLBundle * 2, 8));
  EXPECT_EQ(stale.outcome, LimitOutcome::kStale);
  EXPECT_EQ(stale.limit.revision, 9);
  EXPECT_EQ(stale.limit.limit_bytes, kLBundle * 32);
  EXPECT_EQ(stale.limit.effective_bytes, kLBundle * 16);
  EXPECT_EQ(Observable(*pool), before);
}

}  // namespace
}  // namespace kvbroker::scenarios
