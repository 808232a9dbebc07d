// Acceptance scenarios: geometry (G), capacity and refusal before mapping
// (C1..C13) and arguments and frees (V), over the rig of scenarios_rig.h.

#include "allocator/scenarios_rig.h"

namespace kvbroker::scenarios {
namespace {

// ===========================================================================
// Geometry

TEST(Scenarios, G1_RangesFourteenMiBPagesSixMiBBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(14), MiB(6), 15)));
  const Geometry& g = pool->geometry();
  EXPECT_EQ(g.range(0), (BlockRange{0, 2}));
  EXPECT_EQ(g.range(1), (BlockRange{3, 4}));
  EXPECT_EQ(g.range(2), (BlockRange{5, 7}));
  EXPECT_EQ(g.range(3), (BlockRange{7, 9}));
  for (BlockId b : {2, 4, 9}) EXPECT_FALSE(g.is_usable_block(b)) << b;

  // Taking every block the pool has never hands out 2, 4 or 9.
  const int64_t all = Available(*pool);
  EXPECT_EQ(all, 11);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, all));
  const std::vector<BlockId> ids = Ids(r);
  for (BlockId b : {2, 4, 9}) {
    EXPECT_EQ(std::count(ids.begin(), ids.end(), b), 0) << b;
  }
  EXPECT_EQ(ids, (std::vector<BlockId>{0, 1, 3, 5, 6, 7, 8, 10, 12, 13, 14}));
}

TEST(Scenarios, G2_RangesSevenHundredSixtyEightKiBBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(2), KiB(768), 16)));
  const Geometry& g = pool->geometry();
  EXPECT_EQ(g.range(0), (BlockRange{0, 2}));
  EXPECT_EQ(g.range(1), (BlockRange{3, 5}));
  EXPECT_EQ(g.range(2), (BlockRange{6, 8}));
  EXPECT_EQ(g.range(3), (BlockRange{8, 10}));
}

TEST(Scenarios, G3_RangesWithEmptyPages) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(2), KiB(1536), 8)));
  const Geometry& g = pool->geometry();
  const std::vector<BlockRange> expected = {{0, 1}, {2, 2}, {3, 4},
                                            {4, 5}, {6, 6}, {7, 8}};
  ASSERT_EQ(g.page_count(), PageCount(6));
  for (PageId p = 0; p < 6; ++p) EXPECT_EQ(g.range(p), expected[p]) << p;
  EXPECT_EQ(g.usable(1), BlockCount(0));
  EXPECT_EQ(g.usable(4), BlockCount(0));
  // Pages that hold no block are never counted.
  EXPECT_EQ(StateOf(*pool, 1), PageState::kEmpty);
  EXPECT_EQ(StateOf(*pool, 4), PageState::kEmpty);
  EXPECT_EQ(Cap(*pool).pages_empty, PageCount(2));
}

TEST(Scenarios, G4_BlockLargerThanPageNamesFourMiB) {
  RIG_OR_SKIP(rig);
  const CallDelta d(rig.backend);
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      MakePool(rig, Geo(MiB(2), MiB(3), 10));
  ASSERT_FALSE(pool.ok());
  const absl::Status& s = pool.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetReason(s), FailureReason::kInvalidGeometry) << s;
  EXPECT_NE(s.message().find("4 MiB"), absl::string_view::npos) << s;
  EXPECT_EQ(Meta(s, "min_page_size_bytes"), Num(4 * kMiB));
  EXPECT_EQ(d.calls(BackendOp::kReserveRange), 0);
  EXPECT_EQ(rig.backend.map_calls(), 0);
}

TEST(Scenarios, G5_LastPageClippedKeepsBlockFour) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(2), MiB(1), 5)));
  EXPECT_EQ(pool->geometry().page_count(), PageCount(3));
  EXPECT_EQ(Available(*pool), 5);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 5));
  EXPECT_EQ(ByPage(r), (std::map<PageId, std::vector<BlockId>>{
                           {0, {0, 1}}, {1, {2, 3}}, {2, {4}}}));
}

TEST(Scenarios, G6_PageNotMultipleOfGranularity) {
  RIG_OR_SKIP(rig);
  ASSERT_EQ(rig.backend.granularity(0), MiB(2));
  const CallDelta d(rig.backend);
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      MakePool(rig, Geo(MiB(3), MiB(1), 10));
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetReason(pool.status()), FailureReason::kInvalidGeometry)
      << pool.status();
  EXPECT_EQ(d.calls(BackendOp::kReserveRange), 0);
}

// ===========================================================================
// Capacity and refusal before mapping

// C1's pool: P = 14 MiB, B = 6 MiB, N = 5; T = 3, page 2 clipped to nothing.
PoolConfig C1Pool() { return Geo(MiB(14), MiB(6), 5); }

TEST(Scenarios, C1_CapacityCountsOnlyWholeBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C1Pool()));
  EXPECT_EQ(pool->geometry().page_count(), PageCount(3));
  CapacitySnapshot c = Cap(*pool, 10);
  EXPECT_EQ(c.available_blocks, BlockCount(3));
  EXPECT_EQ(c.total_blocks, BlockCount(3));
  EXPECT_EQ(c.pages_free, PageCount(2));
  EXPECT_EQ(c.pages_empty, PageCount(1));
  // The per-page list: the FREE pages 0 and 1, holding {0, 1} and {3}.
  ASSERT_EQ(c.pages.size(), 2u);
  EXPECT_EQ(c.pages[0].page_id, 0);
  EXPECT_EQ(c.pages[0].usable_blocks, BlockCount(2));
  EXPECT_EQ(c.pages[1].page_id, 1);
  EXPECT_EQ(c.pages[1].usable_blocks, BlockCount(1));
  EXPECT_EQ(rig.backend.map_calls(), 0);
}

TEST(Scenarios, C2_AllocFourRefusedRequestTooLarge) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C1Pool()));
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kRequestTooLarge,
                                        [&] { return Alloc(*pool, 4); });
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Meta(s, "requested_blocks"), "4");
  EXPECT_EQ(Meta(s, "pool_total_blocks"), "3");
  EXPECT_EQ(Available(*pool), 3);
}

TEST(Scenarios, C3_AllocThreeGroupsByPage) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C1Pool()));
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 3));
  EXPECT_EQ(r.num_blocks, 3);
  ASSERT_EQ(r.pages.size(), 2u);
  EXPECT_EQ(r.pages[0].page_id, 0);
  EXPECT_EQ(r.pages[0].block_ids, (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(r.pages[1].page_id, 1);
  EXPECT_EQ(r.pages[1].block_ids, (std::vector<BlockId>{3}));
  // Exactly 2 pages mapped.
  EXPECT_EQ(r.pages_mapped, 2);
  EXPECT_EQ(rig.backend.calls(BackendOp::kCreate), 2);
  EXPECT_EQ(rig.backend.calls(BackendOp::kMap), 2);
  EXPECT_EQ(rig.backend.live_handles(), 2);
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.pages_full, PageCount(2));
  EXPECT_EQ(c.mapped_bytes, MiB(28));
  EXPECT_EQ(c.allocated_blocks, BlockCount(3));
  EXPECT_EQ(c.available_blocks, BlockCount(0));
}

TEST(Scenarios, C4_NullBlockIsNeverHandedOut) {
  RIG_OR_SKIP(rig);
  PoolConfig config = C1Pool();
  config.reserve_null_block = true;
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, config));
  ASSERT_INVARIANTS(*pool);
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.available_blocks, BlockCount(2));
  EXPECT_EQ(c.allocated_blocks, BlockCount(0));  // the null block is not
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kRequestTooLarge,
                                        [&] { return Alloc(*pool, 3); });
  EXPECT_EQ(Meta(s, "requested_blocks"), "3");
  EXPECT_EQ(Meta(s, "pool_total_blocks"), "2");
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 2));
  EXPECT_EQ(Ids(r), (std::vector<BlockId>{1, 3}));
  // Block 0 cannot be freed: it was never allocated to anyone.
  absl::StatusOr<FreeResult> f = Free(*pool, {0});
  EXPECT_EQ(GetReason(f.status()), FailureReason::kBlockNotAllocated);
}

TEST(Scenarios, C5_FreedPageLeavesOneAvailable) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C1Pool()));
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 3));
  ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool, {3}));
  EXPECT_EQ(f.freed_blocks, 1);
  EXPECT_EQ(Available(*pool), 1);
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kPoolExhausted,
                                        [&] { return Alloc(*pool, 2); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Meta(s, "available_blocks"), "1");
  EXPECT_EQ(Meta(s, "requested_blocks"), "2");
}

TEST(Scenarios, C6_SevenBlocksCountFive) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(14), MiB(6), 7)));
  EXPECT_EQ(Available(*pool), 5);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 5));
  EXPECT_EQ(Ids(r), (std::vector<BlockId>{0, 1, 3, 5, 6}));
}

// C7's pool: P = 2 MiB, B = 1.5 MiB, N = 8; pages 1 and 4 hold no block.
PoolConfig C7Pool() { return Geo(MiB(2), KiB(1536), 8); }

TEST(Scenarios, C7_EmptyPagesAreNeverMapped) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C7Pool()));
  EXPECT_EQ(Available(*pool), 4);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 4));
  EXPECT_EQ(ByPage(r), (std::map<PageId, std::vector<BlockId>>{
                           {0, {0}}, {2, {3}}, {3, {4}}, {5, {7}}}));
  EXPECT_EQ(r.pages_mapped, 4);
  EXPECT_EQ(rig.backend.calls(BackendOp::kCreate), 4);
  EXPECT_EQ(rig.backend.live_handles(), 4);
  EXPECT_EQ(StateOf(*pool, 1), PageState::kEmpty);
  EXPECT_EQ(StateOf(*pool, 4), PageState::kEmpty);

  ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool, Ids(r)));
  EXPECT_EQ(f.freed_blocks, 4);
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.pages_open, PageCount(0));
  EXPECT_EQ(c.pages_full, PageCount(0));
  EXPECT_EQ(c.allocated_blocks, BlockCount(0));
  EXPECT_EQ(c.pages_idle, PageCount(0));  // max_idle_pages = 0
  EXPECT_EQ(c.mapped_bytes, Bytes(0));
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(c.available_blocks, BlockCount(4));
  EXPECT_EQ(rig.backend.calls(BackendOp::kCreate), 4);  // 1 and 4: never
}

TEST(Scenarios, C8_AllocFiveRefusedRequestTooLarge) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C7Pool()));
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kRequestTooLarge,
                                        [&] { return Alloc(*pool, 5); });
  EXPECT_EQ(Meta(s, "requested_blocks"), "5");
  EXPECT_EQ(Meta(s, "pool_total_blocks"), "4");
}

TEST(Scenarios, C9_SevenHundredSixtyEightKiBBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(2), KiB(768), 8)));
  EXPECT_EQ(Available(*pool), 6);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 6));
  EXPECT_EQ(ByPage(r), (std::map<PageId, std::vector<BlockId>>{
                           {0, {0, 1}}, {1, {3, 4}}, {2, {6, 7}}}));
}

TEST(Scenarios, C10_EightMiBPagesSixMiBBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(8), MiB(6), 6)));
  EXPECT_EQ(Available(*pool), 3);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 3));
  EXPECT_EQ(Ids(r), (std::vector<BlockId>{0, 3, 4}));
  EXPECT_EQ(r.pages_mapped, 3);
}

TEST(Scenarios, C11_CapacityFollowsConsumptionOrderAndBudget) {
  RIG_OR_SKIP(rig);
  // Two pages may stay IDLE after their blocks are freed.
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(14), MiB(6), 15),
                                           Quiet(/*min_idle=*/0,
                                                 /*max_idle=*/2)));
  ASSERT_EQ(pool->geometry().page_count(), PageCount(7));
  // Map every page, then free page 5, page 4, and the rest in id order:
  // IDLE [5, 4], FREE [0, 1, 2, 3, 6].
  ASSERT_OK_AND_ASSIGN(AllocResult all, Alloc(*pool, 11));
  ASSERT_EQ(all.pages_mapped, 7);
  ASSERT_TRUE(Free(*pool, {12, 13}).ok());  // page 5
  ASSERT_TRUE(Free(*pool, {10}).ok());      // page 4
  ASSERT_TRUE(Free(*pool, {0, 1, 3, 5, 6, 7, 8, 14}).ok());
  ASSERT_EQ(rig.backend.live_handles(), 2);
  // Budget: one more bundle of 14 MiB (and 13 MiB that buys nothing).
  rig.LeaveFree(0, MiB(14 + 13));

  CapacitySnapshot c = Cap(*pool, 10);
  EXPECT_EQ(c.affordable_bundles, 1);
  EXPECT_EQ(c.available_blocks, BlockCount(2 + 1 + 2));
  // The per-page list, in consumption order.
  std::vector<std::pair<PageId, PageState>> order;
  std::vector<bool> counted;
  for (const PageInfo& p : c.pages) {
    order.push_back({p.page_id, p.state});
    counted.push_back(p.counted);
  }
  EXPECT_EQ(order,
            (std::vector<std::pair<PageId, PageState>>{{5, PageState::kIdle},
                                                       {4, PageState::kIdle},
                                                       {0, PageState::kFree},
                                                       {1, PageState::kFree},
                                                       {2, PageState::kFree},
                                                       {3, PageState::kFree},
                                                       {6, PageState::kFree}}));
  EXPECT_EQ(counted,
            (std::vector<bool>{true, true, true, false, false, false, false}));

  // The exactness contract on this state: c + 1 refused before mapping, c
  // succeeds.
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kGpuMemoryExhausted,
                                        [&] { return Alloc(*pool, 6); });
  EXPECT_EQ(Meta(s, "available_blocks"), "5");
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 5));
  EXPECT_EQ(Ids(r), (std::vector<BlockId>{0, 1, 10, 12, 13}));
  EXPECT_EQ(r.pages_mapped, 1);
}

TEST(Scenarios, C12_BudgetOfThreeBundles) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(2), MiB(1), 20)));
  rig.LeaveFree(0, MiB(3 * 2 + 1));
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.affordable_bundles, 3);
  EXPECT_EQ(c.available_blocks, BlockCount(6));
  EXPECT_EQ(c.mapped_bytes, Bytes(0));
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kGpuMemoryExhausted,
                                        [&] { return Alloc(*pool, 7); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Meta(s, "available_blocks"), "6");
  EXPECT_EQ(Meta(s, "requested_blocks"), "7");
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 6));
  EXPECT_EQ(r.pages_mapped, 3);
}

TEST(Scenarios, C13_SixteenKiBBlocksSixtyFiveThousand) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(2), KiB(16), 65536)));
  EXPECT_EQ(pool->geometry().page_count(), PageCount(512));
  EXPECT_EQ(Available(*pool), 65536);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 256));
  EXPECT_EQ(r.num_blocks, 256);
  EXPECT_EQ(r.pages_mapped, 2);
  EXPECT_EQ(Available(*pool), 65280);
  ASSERT_TRUE(Free(*pool, Ids(r)).ok());
  EXPECT_EQ(Available(*pool), 65536);
}

// ===========================================================================
// Arguments and frees

TEST(Scenarios, V1_NegativeCountNamesNumBlocks) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C1Pool()));
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kInvalidArgument,
                                        [&] { return Alloc(*pool, -1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::optional<Failure> f = GetFailure(s);
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->violations.size(), 1u);
  EXPECT_EQ(f->violations[0].field, "num_blocks");
}

TEST(Scenarios, V2_AllocZeroSucceedsEmpty) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, C1Pool()));
  const uint64_t generation = pool->generation();
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 0));
  EXPECT_EQ(r.num_blocks, 0);
  EXPECT_TRUE(r.pages.empty());
  EXPECT_EQ(r.pages_mapped, 0);
  EXPECT_EQ(rig.backend.map_calls(), 0);
  EXPECT_EQ(pool->generation(), generation);
}

TEST(Scenarios, V3_FreeOfUnallocatedIdsFreesNothing) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(14), MiB(6), 15)));
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 3));
  ASSERT_EQ(Ids(r), (std::vector<BlockId>{0, 1, 3}));
  const std::string before = Observable(*pool);
  struct Bad {
    const char* what;
    std::vector<BlockId> ids;
    BlockId culprit;
  };
  const std::vector<Bad> cases = {
      {"never allocated", {0, 5}, 5},   {"straddling", {1, 2}, 2},
      {"id >= N", {3, 15}, 15},         {"negative", {-1, 0}, -1},
      {"all at once", {0, 1, 3, 2}, 2},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    absl::StatusOr<FreeResult> f = Free(*pool, bad.ids);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(GetReason(f.status()), FailureReason::kBlockNotAllocated)
        << f.status();
    EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Meta(f.status(), "block_id"), Num(bad.culprit));
    // The other ids stay allocated.
    EXPECT_EQ(Observable(*pool), before);
  }
  ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool, {0, 1, 3}));
  EXPECT_EQ(f.freed_blocks, 3);
}

TEST(Scenarios, V4_DuplicateAndDoubleFrees) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, Geo(MiB(14), MiB(6), 15)));
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 3));
  const std::string before = Observable(*pool);
  // The same id twice in one call.
  absl::StatusOr<FreeResult> dup = Free(*pool, {0, 1, 0});
  EXPECT_EQ(GetReason(dup.status()), FailureReason::kInvalidArgument)
      << dup.status();
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Observable(*pool), before);
  // The same id in two calls.
  ASSERT_OK_AND_ASSIGN(FreeResult first, Free(*pool, {0}));
  EXPECT_EQ(first.freed_blocks, 1);
  const std::string after_first = Observable(*pool);
  absl::StatusOr<FreeResult> again = Free(*pool, {1, 0});
  EXPECT_EQ(GetReason(again.status()), FailureReason::kBlockNotAllocated)
      << again.status();
  EXPECT_EQ(Observable(*pool), after_first);
  EXPECT_EQ(Cap(*pool).allocated_blocks, BlockCount(2));
}

// V5-V7: a pool with room for 10 (5 pages of 2 blocks).
PoolConfig TenBlocks() { return Geo(MiB(2), MiB(1), 10); }

TEST(Scenarios, V5_TwoReservationsOfFive) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, TenBlocks()));
  ASSERT_EQ(Available(*pool), 10);
  ASSERT_OK_AND_ASSIGN(ReservationInfo a, Reserve(*pool, 5));
  ASSERT_OK_AND_ASSIGN(ReservationInfo b, Reserve(*pool, 5));
  EXPECT_NE(a.reservation_id, b.reservation_id);
  EXPECT_EQ(a.num_blocks, 5);
  EXPECT_EQ(b.num_blocks, 5);
  std::set<BlockId> all;
  for (BlockId x : Ids(a)) all.insert(x);
  for (BlockId x : Ids(b)) all.insert(x);
  EXPECT_EQ(all.size(), 10u);
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.available_blocks, BlockCount(0));
  EXPECT_EQ(c.reserved_blocks, BlockCount(10));
  EXPECT_EQ(c.allocated_blocks, BlockCount(0));
  // Reserved blocks are mapped.
  EXPECT_EQ(c.mapped_bytes, MiB(10));
  (void)RefusedBeforeMapping(rig, FailureReason::kPoolExhausted,
                             [&] { return Reserve(*pool, 1); });
  // A reserved block cannot be freed by id.
  absl::StatusOr<FreeResult> f = Free(*pool, {Ids(a)[0]});
  EXPECT_EQ(GetReason(f.status()), FailureReason::kBlockInReservation)
      << f.status();
}

TEST(Scenarios, V6_AllocFromReservationThenRelease) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, TenBlocks()));
  ASSERT_OK_AND_ASSIGN(ReservationInfo res, Reserve(*pool, 5));
  const std::vector<BlockId> held = Ids(res);
  EXPECT_EQ(Available(*pool), 5);
  const int64_t maps = rig.backend.map_calls();
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 3, "", res.reservation_id));
  EXPECT_EQ(rig.backend.map_calls(), maps);
  const std::vector<BlockId> got = Ids(r);
  ASSERT_EQ(got.size(), 3u);
  for (BlockId b : got) {
    EXPECT_TRUE(std::binary_search(held.begin(), held.end(), b)) << b;
  }
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.available_blocks, BlockCount(5));
  EXPECT_EQ(c.reserved_blocks, BlockCount(2));
  EXPECT_EQ(c.allocated_blocks, BlockCount(3));

  ASSERT_OK_AND_ASSIGN(ReleaseResult rel, Release(*pool, res.reservation_id));
  EXPECT_EQ(rel.released_blocks, 2);
  c = Cap(*pool);
  EXPECT_EQ(c.available_blocks, BlockCount(7));
  EXPECT_EQ(c.reserved_blocks, BlockCount(0));
  EXPECT_EQ(c.allocated_blocks, BlockCount(3));
  // The reservation is gone.
  absl::StatusOr<AllocResult> after = Alloc(*pool, 1, "", res.reservation_id);
  EXPECT_EQ(GetReason(after.status()), FailureReason::kReservationNotFound)
      << after.status();
}

TEST(Scenarios, V7_ReservationExpiresAfterItsTtl) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, TenBlocks()));
  const absl::Duration ttl = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(ReservationInfo res, Reserve(*pool, 5, ttl));
  EXPECT_EQ(res.expires, rig.clock.Now() + ttl);
  rig.clock.Advance(ttl - absl::Nanoseconds(1));
  EXPECT_EQ(Cap(*pool).reserved_blocks, BlockCount(5));
  EXPECT_EQ(Available(*pool), 5);
  rig.clock.Advance(absl::Nanoseconds(2));
  // Its blocks are back, on the very next read.
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.reserved_blocks, BlockCount(0));
  EXPECT_EQ(c.available_blocks, BlockCount(10));
  ASSERT_INVARIANTS(*pool);
  absl::Status s = RefusedBeforeMapping(
      rig, FailureReason::kReservationExpired,
      [&] { return Alloc(*pool, 1, "", res.reservation_id); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetReason(Release(*pool, res.reservation_id).status()),
            FailureReason::kReservationExpired);
}

TEST(Scenarios, V8_RetriedAllocIsIdempotent) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, TenBlocks()));
  ASSERT_OK_AND_ASSIGN(AllocResult first, Alloc(*pool, 3, "req-1"));
  EXPECT_FALSE(first.replayed);
  const std::string before = Observable(*pool);
  const int64_t maps = rig.backend.map_calls();
  ASSERT_OK_AND_ASSIGN(AllocResult retry, Alloc(*pool, 3, "req-1"));
  EXPECT_TRUE(retry.replayed);
  EXPECT_EQ(Ids(retry), Ids(first));
  EXPECT_EQ(rig.backend.map_calls(), maps);
  EXPECT_EQ(Observable(*pool), before);
  EXPECT_EQ(Cap(*pool).allocated_blocks, BlockCount(3));

  absl::Status s =
      RefusedBeforeMapping(rig, FailureReason::kRequestIdReused,
                           [&] { return Alloc(*pool, 4, "req-1"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Observable(*pool), before);
}

}  // namespace
}  // namespace kvbroker::scenarios
