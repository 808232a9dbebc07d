// Unit tests of PagePool mechanics that the scenario rows do not pin down:
// the prealloc worker, the per-page list, generations, idempotency windows,
// null-block handling, shutdown and data integrity through the host backend.

#include "allocator/page_pool.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/testing/gated_backend.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

// Pool "p" of 2 MiB pages holding four 512 KiB blocks each.
PoolConfig FourBlockPages(int64_t max_blocks) {
  PoolConfig c;
  c.name = "p";
  c.page_size = MiB(2);
  c.block_bytes = KiB(512);
  c.max_blocks = max_blocks;
  return c;
}

class PagePoolTest : public ::testing::Test {
 protected:
  PagePoolTest()
      : host_(HostBackendOptions{1, Bytes(64 * kGiB), MiB(2)}),
        backend_(&host_),
        budgets_(&backend_, 1.0) {
    EXPECT_TRUE(budgets_.Init().ok());
  }

  std::unique_ptr<PagePool> MakePool(int64_t page_mib, int64_t block_kib,
                                     int64_t n, int64_t min_idle = 0,
                                     int64_t max_idle = 0,
                                     bool null_block = false) {
    PoolConfig c;
    c.name = "p";
    c.page_size = MiB(page_mib);
    c.block_bytes = KiB(block_kib);
    c.max_blocks = n;
    c.reserve_null_block = null_block;
    PoolOptions o;
    o.min_idle_pages = min_idle;
    o.max_idle_pages = max_idle;
    auto pool = PagePool::Create(c, &backend_, &budgets_, &clock_, o);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *std::move(pool) : nullptr;
  }

  // FourBlockPages(16) (4 pages, ids 0..15) with every kind of block a
  // Free may meet: block 0 the null block, 1..5 and 7..9 allocated, 6 free
  // again, 10 and 11 reserved, 12..15 never mapped. Null on a failure.
  std::unique_ptr<PagePool> MixedPool(int64_t step_pages,
                                      int64_t free_one_step_blocks) {
    PoolConfig c = FourBlockPages(16);
    c.reserve_null_block = true;
    PoolOptions o;
    o.max_idle_pages = 4;
    o.step_pages = step_pages;
    o.free_one_step_blocks = free_one_step_blocks;
    auto made = PagePool::Create(c, &backend_, &budgets_, &clock_, o);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return nullptr;
    std::unique_ptr<PagePool> pool = *std::move(made);
    const bool ready = pool->Alloc({9, "", "", {}}).ok() &&  // 1..9
                       pool->Reserve({2, absl::Seconds(5), ""}).ok() &&
                       pool->Free({{6}, ""}).ok();
    EXPECT_TRUE(ready);
    return ready ? std::move(pool) : nullptr;
  }

  // Pages of four 512 KiB blocks (FourBlockPages(blocks)), walked in steps
  // of one page with `between_steps` run between two steps; emptied pages
  // stay IDLE (up to max_idle).
  std::unique_ptr<PagePool> SteppedPool(int64_t blocks, int64_t max_idle,
                                        std::function<void()> between_steps) {
    PoolOptions o;
    o.min_idle_pages = 0;
    o.max_idle_pages = max_idle;
    o.step_pages = 1;
    o.free_one_step_blocks = 0;
    o.between_steps = std::move(between_steps);
    auto pool = PagePool::Create(FourBlockPages(blocks), &backend_, &budgets_,
                                 &clock_, o);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *std::move(pool) : nullptr;
  }

  HostBackend host_;
  FaultInjectingBackend backend_;
  DeviceBudgets budgets_;
  ManualClock clock_;
};

TEST_F(PagePoolTest, PreallocKeepsMinIdleWithoutChangingCapacity) {
  auto pool = MakePool(2, 512, 64, /*min_idle=*/3, /*max_idle=*/4);
  const int64_t before = pool->Capacity()->available_blocks.value();
  int steps = 0;
  while (pool->PreallocStep()) ++steps;
  EXPECT_EQ(steps, 2);  // the third mapping reports no more work
  auto c = pool->Capacity();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pages_idle.value(), 3);
  EXPECT_EQ(c->available_blocks.value(), before);
  EXPECT_FALSE(pool->PreallocStep());
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_EQ(host_.live_handles(), 3);
}

TEST_F(PagePoolTest, AllocUsesIdlePagesBeforeMapping) {
  auto pool = MakePool(2, 512, 64, 2, 4);
  while (pool->PreallocStep()) {
  }
  const int64_t maps = backend_.map_calls();
  auto r = pool->Alloc({8, "", "", {}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(backend_.map_calls(), maps);
  EXPECT_EQ(r->pages_mapped, 0);
  EXPECT_EQ(AllBlockIds(*r), (std::vector<BlockId>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST_F(PagePoolTest, PerPageListInConsumptionOrder) {
  auto pool = MakePool(2, 512, 64);
  ASSERT_TRUE(pool->Alloc({5, "", "", {}}).ok());  // page 0 FULL, page 1 OPEN
  auto c = pool->Capacity({100});
  ASSERT_TRUE(c.ok());
  ASSERT_GE(c->pages.size(), 2u);
  EXPECT_EQ(c->pages[0].page_id, 1);
  EXPECT_EQ(c->pages[0].state, PageState::kOpen);
  EXPECT_EQ(c->pages[0].free_blocks.value(), 3);
  EXPECT_EQ(c->pages[1].page_id, 2);
  EXPECT_EQ(c->pages[1].state, PageState::kFree);
  EXPECT_EQ(c->pages.size(), 15u);  // 16 pages, page 0 FULL not listed
  auto capped = pool->Capacity({3});
  EXPECT_EQ(capped->pages.size(), 3u);
}

TEST_F(PagePoolTest, GenerationMovesOnChangeOnly) {
  auto pool = MakePool(2, 512, 64);
  const uint64_t g0 = pool->Capacity()->generation;
  EXPECT_EQ(pool->Capacity()->generation, g0);
  auto r = pool->Alloc({1, "", "", g0});
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->generation, g0);
  auto stale = pool->Alloc({1, "", "", g0});
  EXPECT_EQ(GetReason(stale.status()), FailureReason::kGenerationMismatch);
  auto refused = pool->Alloc({1000, "", "", {}});
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(pool->Capacity()->generation, r->generation);
}

TEST_F(PagePoolTest, IdempotentFreeAndReserve) {
  auto pool = MakePool(2, 512, 64);
  auto r = pool->Alloc({4, "a1", "", {}});
  ASSERT_TRUE(r.ok());
  auto f = pool->Free({AllBlockIds(*r), "f1"});
  ASSERT_TRUE(f.ok());
  auto again = pool->Free({AllBlockIds(*r), "f1"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed);
  auto other = pool->Free({{0}, "f1"});
  EXPECT_EQ(GetReason(other.status()), FailureReason::kRequestIdReused);

  auto res = pool->Reserve({3, absl::Seconds(5), "r1"});
  ASSERT_TRUE(res.ok());
  auto res2 = pool->Reserve({3, absl::Seconds(5), "r1"});
  ASSERT_TRUE(res2.ok());
  EXPECT_EQ(res2->reservation_id, res->reservation_id);
  EXPECT_EQ(pool->Capacity()->reserved_blocks.value(), 3);
  // The window passes: the id is forgotten and the reservation expired.
  clock_.Advance(absl::Minutes(11));
  auto res3 = pool->Reserve({3, absl::Seconds(5), "r1"});
  ASSERT_TRUE(res3.ok());
  EXPECT_NE(res3->reservation_id, res->reservation_id);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// AllocRequest::as_runs: two pools driven alike, one answering pages and
// one runs, hand out the same blocks: whole pages, pages left with gaps by
// Frees, a reservation redeemed beside the pool's own blocks, and the seed
// geometry whose straddling blocks belong to no page. Runs come ascending,
// apart and merged. A retry gets its blocks in the form it asks for.
TEST_F(PagePoolTest, AllocAsRunsNamesTheSameBlocksAsPages) {
  for (const auto& [page_mib, block_kib, n] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 512, 64},
                                                          {14, 6144, 60}}) {
    SCOPED_TRACE(absl::StrCat(page_mib, " MiB pages, ", block_kib, " KiB"));
    auto as_pages = MakePool(page_mib, block_kib, n);
    auto as_runs = MakePool(page_mib, block_kib, n);
    auto alloc = [&](int64_t blocks, const std::string& reservation) {
      AllocRequest r{blocks, "", reservation, {}};
      absl::StatusOr<AllocResult> a = as_pages->Alloc(r);
      r.as_runs = true;
      absl::StatusOr<AllocResult> b = as_runs->Alloc(r);
      EXPECT_EQ(a.ok(), b.ok()) << a.status() << " / " << b.status();
      if (!a.ok() || !b.ok()) return std::vector<BlockId>{};
      EXPECT_TRUE(b->pages.empty());
      EXPECT_TRUE(a->block_runs.empty());
      EXPECT_EQ(AllBlockIds(*a), AllBlockIds(*b));
      const BlockRuns& runs = b->block_runs;
      for (size_t i = 0; i + 1 < runs.size(); i += 2) {
        EXPECT_GE(runs[i + 1], 1);
        if (i > 0) {
          EXPECT_GT(runs[i], runs[i - 2] + runs[i - 1]) << i;
        }
      }
      return AllBlockIds(*a);
    };
    auto free = [&](std::vector<BlockId> ids) {
      EXPECT_TRUE(as_pages->Free({ids, ""}).ok());
      EXPECT_TRUE(as_runs->Free({ids, ""}).ok());
    };
    std::vector<BlockId> first = alloc(9, "");
    ASSERT_FALSE(first.empty());
    // Every other block of the first Alloc back: pages with gaps.
    std::vector<BlockId> gaps;
    for (size_t i = 0; i < first.size(); i += 2) gaps.push_back(first[i]);
    free(gaps);
    alloc(7, "");
    auto held_a = as_pages->Reserve({3, absl::Seconds(30), "res"});
    auto held_b = as_runs->Reserve({3, absl::Seconds(30), "res"});
    ASSERT_TRUE(held_a.ok() && held_b.ok());
    EXPECT_EQ(held_a->pages.size(), held_b->pages.size());
    alloc(5, held_a->reservation_id);  // 3 reserved + 2 of the pool's
    alloc(11, "");
    EXPECT_TRUE(as_pages->CheckInvariants().ok());
    EXPECT_TRUE(as_runs->CheckInvariants().ok());

    // A retry in the other form.
    AllocRequest once{4, "once", "", {}};
    once.as_runs = true;
    absl::StatusOr<AllocResult> made = as_runs->Alloc(once);
    ASSERT_TRUE(made.ok()) << made.status();
    once.as_runs = false;
    absl::StatusOr<AllocResult> again = as_runs->Alloc(once);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->replayed);
    EXPECT_TRUE(again->block_runs.empty());
    EXPECT_EQ(AllBlockIds(*again), AllBlockIds(*made));
    once.as_runs = true;
    absl::StatusOr<AllocResult> third = as_runs->Alloc(once);
    ASSERT_TRUE(third.ok()) << third.status();
    EXPECT_TRUE(third->pages.empty());
    EXPECT_EQ(third->block_runs, made->block_runs);
  }
  // Pages taken out of id order: for an Alloc of 4 the OPEN page with the
  // most free blocks (page 2: 8, 9, 10) comes before the one with one
  // (page 0: 1). Runs come in id order all the same.
  auto pool = MakePool(2, 512, 64);
  ASSERT_TRUE(pool->Alloc({12, "", "", {}}).ok());  // pages 0..2
  ASSERT_TRUE(pool->Free({{1, 8, 9, 10}, ""}).ok());
  AllocRequest four{4, "", "", {}};
  four.as_runs = true;
  absl::StatusOr<AllocResult> taken = pool->Alloc(four);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->block_runs, (BlockRuns{1, 1, 8, 3}));
}

TEST_F(PagePoolTest, NullBlockNeverFreedOrTrimmed) {
  auto pool = MakePool(2, 512, 16, 0, 4, /*null_block=*/true);
  EXPECT_EQ(pool->Capacity()->available_blocks.value(), 15);
  auto f = pool->Free({{0}, ""});
  EXPECT_EQ(GetReason(f.status()), FailureReason::kBlockNotAllocated);
  auto t = pool->Trim();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->pages_unmapped, 0);
  EXPECT_EQ(host_.live_handles(), 1);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// A Free is cut into steps by the pages its ids span, not by their count:
// with steps of eight pages, ids on eight pages are one step (no pause
// between steps), ids on nine are validated in two (one pause) and
// returned in a step of their own (one pause before it).
TEST_F(PagePoolTest, FreeStepsFollowPagesSpanned) {
  const PoolConfig c = FourBlockPages(64);  // 16 pages
  PoolOptions o;
  o.step_pages = 8;
  o.free_one_step_blocks = 0;
  int pauses = 0;
  o.between_steps = [&pauses] { ++pauses; };
  auto made = PagePool::Create(c, &backend_, &budgets_, &clock_, o);
  ASSERT_TRUE(made.ok()) << made.status();
  PagePool& pool = **made;
  auto r = pool.Alloc({64, "", "", {}});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<BlockId> ids = AllBlockIds(*r);
  std::sort(ids.begin(), ids.end());
  ASSERT_EQ(ids.size(), 64u);
  ASSERT_EQ(ids.front(), 0);

  pauses = 0;  // blocks 0..31: 32 ids on pages 0..7
  ASSERT_TRUE(
      pool.Free({std::vector<BlockId>(ids.begin(), ids.begin() + 32), ""})
          .ok());
  EXPECT_EQ(pauses, 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());

  pauses = 0;  // nine ids on pages 8..15
  ASSERT_TRUE(pool.Free({{32, 33, 36, 40, 44, 48, 52, 56, 60}, ""}).ok());
  EXPECT_EQ(pauses, 0);

  auto again = pool.Alloc({32 + 9, "", "", {}});
  ASSERT_TRUE(again.ok()) << again.status();
  pauses = 0;  // one block on each of pages 0..8: nine pages
  ASSERT_TRUE(pool.Free({{0, 4, 8, 12, 16, 20, 24, 28, 32}, ""}).ok());
  EXPECT_EQ(pauses, 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// A Free that names the rest of a page as one run is checked a page at a
// time: one block of the run that is free, reserved, or the null block
// refuses the whole call and frees nothing, in one step or in several.
TEST_F(PagePoolTest, FreeOfWholePagesRefusesABlockNotAllocated) {
  for (const int64_t step_pages : {1, 8}) {
    SCOPED_TRACE(step_pages);
    std::unique_ptr<PagePool> made = MixedPool(step_pages, 0);
    ASSERT_NE(made, nullptr);
    PagePool& pool = *made;
    const CapacitySnapshot before = *pool.Capacity();
    ASSERT_EQ(before.allocated_blocks.value(), 8);
    const std::vector<std::pair<std::vector<BlockId>, FailureReason>> cases = {
        {{0, 1, 2, 3}, FailureReason::kBlockNotAllocated},  // null block
        {{4, 5, 6, 7}, FailureReason::kBlockNotAllocated},  // 6 is free
        {{8, 9, 10, 11}, FailureReason::kBlockInReservation},
        {{1, 2, 3, 4, 5, 6, 7}, FailureReason::kBlockNotAllocated},
        {{1, 2, 3, 4, 5, 7, 8, 9, 10, 11}, FailureReason::kBlockInReservation},
    };
    for (const auto& [ids, reason] : cases) {
      absl::StatusOr<FreeResult> r = pool.Free({ids, ""});
      EXPECT_EQ(GetReason(r.status()), reason) << r.status();
      const CapacitySnapshot after = *pool.Capacity();
      EXPECT_EQ(after.allocated_blocks, before.allocated_blocks);
      EXPECT_EQ(after.available_blocks, before.available_blocks);
      EXPECT_EQ(after.generation, before.generation);
      ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
    }
    auto freed = pool.Free({{1, 2, 3, 4, 5, 7, 8, 9}, ""});
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_EQ(freed->freed_blocks, 8);
    EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 0);
    ASSERT_TRUE(pool.Shutdown(/*force=*/true).ok());
  }
}

// A Free whose ids come with the caller's runs: ascending runs spare the
// pass over the ids; runs out of order or overlapping are checked through
// the ids as before (sorted, a repeat refused). The same outcome either way.
TEST_F(PagePoolTest, FreeWithRunsChecksOrderFromThemOrFromTheIds) {
  PoolOptions o;
  o.max_idle_pages = 4;
  o.step_pages = 1;
  o.free_one_step_blocks = 0;
  auto made =
      PagePool::Create(FourBlockPages(16), &backend_, &budgets_, &clock_, o);
  ASSERT_TRUE(made.ok()) << made.status();
  PagePool& pool = **made;
  ASSERT_TRUE(pool.Alloc({16, "", "", {}}).ok());  // 0..15
  auto free_runs = [&](std::vector<BlockId> ids, std::vector<int64_t> runs) {
    FreeRequest r;
    r.block_ids = ids;
    r.block_runs = runs;
    return pool.Free(r);
  };
  // Overlapping runs name block 2 twice: refused, nothing freed.
  absl::StatusOr<FreeResult> twice =
      free_runs({0, 1, 2, 3, 2, 3}, {0, 4, 2, 2});
  EXPECT_EQ(GetReason(twice.status()), FailureReason::kInvalidArgument);
  EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 16);
  // Descending runs: freed like their ids sorted.
  absl::StatusOr<FreeResult> down = free_runs({12, 13, 4, 5, 6}, {12, 2, 4, 3});
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(down->freed_blocks, 5);
  // Ascending runs over three pages (three steps).
  absl::StatusOr<FreeResult> up =
      free_runs({0, 1, 2, 3, 8, 9, 10, 11, 14}, {0, 4, 8, 4, 14, 1});
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->freed_blocks, 9);
  // Ascending runs naming a block freed already: refused whole.
  absl::StatusOr<FreeResult> stale = free_runs({7, 8, 15}, {7, 2, 15, 1});
  EXPECT_EQ(GetReason(stale.status()), FailureReason::kBlockNotAllocated);
  EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 2);  // 7 and 15
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  ASSERT_TRUE(free_runs({7, 15}, {7, 1, 15, 1}).ok());
  EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 0);
  ASSERT_TRUE(pool.Shutdown(/*force=*/true).ok());
}

// A Free named by runs alone is checked and returned run by run when the
// runs are ascending, within free_one_step_blocks and without a request id;
// otherwise it is read as the ids the runs name. Either way it is refused
// as its ids would be (the refusal names them), frees nothing then, and a
// retry may name the same blocks by ids.
TEST_F(PagePoolTest, FreeOfRunsAloneIsJudgedAsItsIds) {
  for (const int64_t one_step : {256, 2}) {
    SCOPED_TRACE(one_step);
    std::unique_ptr<PagePool> made = MixedPool(1, one_step);
    ASSERT_NE(made, nullptr);
    PagePool& pool = *made;
    auto free_runs = [&](std::vector<int64_t> runs, std::string id = "") {
      FreeRequest r;
      r.block_runs = runs;
      r.request_id = std::move(id);
      return pool.Free(r);
    };
    const CapacitySnapshot before = *pool.Capacity();
    ASSERT_EQ(before.allocated_blocks.value(), 8);
    const std::vector<std::tuple<std::vector<int64_t>, FailureReason,
                                 std::string>>
        cases = {
            {{0, 4}, FailureReason::kBlockNotAllocated, "first: 0"},
            {{4, 4}, FailureReason::kBlockNotAllocated, "first: 6"},
            {{1, 5, 7, 5}, FailureReason::kBlockInReservation, "first: 10"},
            {{-2, 3}, FailureReason::kBlockNotAllocated, "first: -2"},
            {{15, 2}, FailureReason::kBlockNotAllocated, "first: 15"},
            {{7, 1, 5, 2}, FailureReason::kBlockNotAllocated, "first: 6"},
        };
    for (const auto& [runs, reason, first] : cases) {
      absl::StatusOr<FreeResult> r = free_runs(runs);
      EXPECT_EQ(GetReason(r.status()), reason) << r.status();
      EXPECT_NE(r.status().message().find(first), std::string::npos)
          << r.status();
      const CapacitySnapshot after = *pool.Capacity();
      EXPECT_EQ(after.allocated_blocks, before.allocated_blocks);
      EXPECT_EQ(after.available_blocks, before.available_blocks);
      EXPECT_EQ(after.generation, before.generation);
      ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
    }
    // Runs out of order, then ascending runs with a request id whose retry
    // names the same blocks by ids.
    absl::StatusOr<FreeResult> down = free_runs({8, 2, 4, 1});
    ASSERT_TRUE(down.ok()) << down.status();
    EXPECT_EQ(down->freed_blocks, 3);
    absl::StatusOr<FreeResult> named = free_runs({1, 3, 5, 1, 7, 1}, "f1");
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(named->freed_blocks, 5);
    EXPECT_FALSE(named->replayed);
    absl::StatusOr<FreeResult> again = pool.Free({{1, 2, 3, 5, 7}, "f1"});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->replayed);
    EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 0);
    ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
    ASSERT_TRUE(pool.Shutdown(/*force=*/true).ok());
  }
}

// Blocks that straddle two pages belong to neither: a run over one is
// refused, naming it; runs around it are freed.
TEST_F(PagePoolTest, FreeOfRunsRefusesAStraddlingBlock) {
  PoolConfig c;
  c.name = "p";
  c.page_size = MiB(14);  // pages hold {0, 1} and {3}; block 2 straddles
  c.block_bytes = MiB(6);
  c.max_blocks = 4;
  auto made = PagePool::Create(c, &backend_, &budgets_, &clock_, {});
  ASSERT_TRUE(made.ok()) << made.status();
  PagePool& pool = **made;
  auto got = pool.Alloc({3, "", "", {}});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(AllBlockIds(*got), (std::vector<BlockId>{0, 1, 3}));
  FreeRequest over;
  const std::vector<int64_t> all = {0, 4};
  over.block_runs = all;
  absl::StatusOr<FreeResult> refused = pool.Free(over);
  EXPECT_EQ(GetReason(refused.status()), FailureReason::kBlockNotAllocated);
  EXPECT_NE(refused.status().message().find("first: 2"), std::string::npos)
      << refused.status();
  EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 3);
  FreeRequest around;
  const std::vector<int64_t> both = {0, 2, 3, 1};
  around.block_runs = both;
  absl::StatusOr<FreeResult> freed = pool.Free(around);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks, 3);
  EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 0);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  ASSERT_TRUE(pool.Shutdown(/*force=*/true).ok());
}

// PoolOptions::step_pages sets the walk's step: at one page a Free of ids
// on three pages pauses twice validating and once before returning them,
// and a mapping Alloc of three pages pauses twice committing them.
TEST_F(PagePoolTest, StepPagesSetsTheStep) {
  int pauses = 0;
  auto made = SteppedPool(64, 16, [&pauses] { ++pauses; });  // 16 pages
  ASSERT_NE(made, nullptr);
  PagePool& pool = *made;
  auto r = pool.Alloc({12, "", "", {}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pages_mapped, 3);
  EXPECT_EQ(pauses, 2);
  pauses = 0;
  ASSERT_TRUE(pool.Free({{0, 4, 8}, ""}).ok());
  EXPECT_EQ(pauses, 3);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// Between two steps of a call, Capacity shows the call either not started
// or done, never half done (docs/design.md, "Bounded lock hold"): an Alloc
// committing three fresh pages in steps of one is shown with its pages
// MAPPING and none of its blocks allocated until its last step, with the
// page list saying the same and a Free of a block it already committed
// refused; a stepped Free is shown with nothing returned until it returns
// everything in one step.
TEST_F(PagePoolTest, CapacityBetweenStepsShowsNoCallHalfDone) {
  PagePool* self = nullptr;
  std::vector<CapacitySnapshot> seen;
  std::vector<CapacitySnapshot> listed;
  std::vector<absl::Status> frees;
  std::vector<PageOccupancy> occupied;
  std::vector<absl::Status> page_frees;
  bool during_alloc = false;
  auto made = SteppedPool(64, 16, [&] {  // 16 pages
    auto k = self->Capacity({});
    ASSERT_TRUE(k.ok()) << k.status();
    seen.push_back(*k);
    CapacityQuery list;
    list.max_pages = 4;
    auto l = self->Capacity(list);
    ASSERT_TRUE(l.ok()) << l.status();
    listed.push_back(*l);
    frees.push_back(self->Free({{0}, ""}).status());
    if (during_alloc) {  // a whole page, checked a page at a time
      page_frees.push_back(self->Free({{0, 1, 2, 3}, ""}).status());
    }
    auto occupancy = self->GetPageOccupancy({0});
    ASSERT_TRUE(occupancy.ok()) << occupancy.status();
    occupied.push_back((*occupancy)[0]);
    EXPECT_TRUE(self->CheckInvariants().ok()) << self->CheckInvariants();
  });
  ASSERT_NE(made, nullptr);
  PagePool& pool = *made;
  self = &pool;

  during_alloc = true;
  auto r = pool.Alloc({12, "", "", {}});
  during_alloc = false;
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->pages_mapped, 3);
  ASSERT_EQ(seen.size(), 2u);
  ASSERT_EQ(page_frees.size(), 2u);
  for (size_t i = 0; i < seen.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(seen[i].allocated_blocks.value(), 0);
    EXPECT_EQ(seen[i].available_blocks.value(), 52);
    EXPECT_EQ(seen[i].pages_mapping.value(), 3);
    EXPECT_EQ(seen[i].pages_full.value(), 0);
    ASSERT_EQ(listed[i].pages.size(), 4u);
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(listed[i].pages[p].page_id, p);
      EXPECT_EQ(listed[i].pages[p].state, PageState::kMapping);
      EXPECT_EQ(listed[i].pages[p].allocated_blocks.value(), 0);
    }
    EXPECT_EQ(listed[i].pages[3].state, PageState::kFree);
    EXPECT_EQ(occupied[i].state, PageState::kMapping);
    EXPECT_EQ(occupied[i].allocated_blocks.value(), 0);
    EXPECT_EQ(GetReason(frees[i]), FailureReason::kBlockNotAllocated)
        << frees[i];
    EXPECT_EQ(GetReason(page_frees[i]), FailureReason::kBlockNotAllocated)
        << page_frees[i];
  }
  auto after = pool.Capacity({});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->allocated_blocks.value(), 12);
  EXPECT_EQ(after->pages_full.value(), 3);

  seen.clear();
  listed.clear();
  frees.clear();
  occupied.clear();
  ASSERT_TRUE(pool.Free({{1, 4, 8}, ""}).ok());
  ASSERT_EQ(seen.size(), 3u);
  for (size_t i = 0; i < seen.size(); ++i) {
    SCOPED_TRACE(i);
    // The Free of block 0 from inside the pause is what returned it.
    EXPECT_EQ(seen[i].allocated_blocks.value(), i == 0 ? 12 : 11);
    EXPECT_EQ(seen[i].available_blocks.value(), i == 0 ? 52 : 53);
  }
  EXPECT_TRUE(frees[0].ok()) << frees[0];
  auto end = pool.Capacity({});
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->allocated_blocks.value(), 8);
  EXPECT_EQ(end->available_blocks.value(), 56);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// Trim looks at the IDLE list again after every step: a call that takes the
// last IDLE page while Trim is between two steps leaves it nothing to take.
TEST_F(PagePoolTest, TrimRechecksIdlePagesAfterEachStep) {
  PagePool* self = nullptr;
  bool armed = false;
  absl::StatusOr<AllocResult> taken;
  auto made = SteppedPool(16, 4, [&] {  // 4 pages
    if (!armed) return;
    armed = false;
    taken = self->Alloc({4, "", "", {}});  // the one IDLE page left
  });
  ASSERT_NE(made, nullptr);
  PagePool& pool = *made;
  self = &pool;
  auto r = pool.Alloc({8, "", "", {}});  // two pages
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(pool.Free({AllBlockIds(*r), ""}).ok());  // both IDLE
  armed = true;
  auto t = pool.Trim(0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->pages_unmapped, 1);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->pages_mapped, 0);  // from the IDLE page Trim had not taken
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// The waiting rule, step by step: while a Free of three whole pages pauses
// between its steps, a second Free of the same ids finds them marked in its
// first step and waits; it never gets as far as a pause of its own, and
// once the first has returned them it is refused and frees nothing.
TEST_F(PagePoolTest, SecondFreeOfMarkedPagesWaitsForTheFirst) {
  std::atomic<bool> second_started{false};
  std::atomic<int> pauses_of_second{0};
  std::thread::id first_thread;
  PagePool* self = nullptr;
  std::vector<BlockId> ids;
  absl::StatusOr<FreeResult> second;
  std::thread other;
  auto made = SteppedPool(16, 4, [&] {  // 4 pages
    if (std::this_thread::get_id() != first_thread) {
      ++pauses_of_second;
      return;
    }
    if (second_started.exchange(true)) return;
    other = std::thread([&] { second = self->Free({ids, ""}); });
    // Long enough for the second Free to reach its first step; with the
    // marks seen it waits there, without them it would pause here too.
    absl::SleepFor(absl::Milliseconds(200));
  });
  ASSERT_NE(made, nullptr);
  PagePool& pool = *made;
  self = &pool;
  auto r = pool.Alloc({12, "", "", {}});  // pages 0..2, whole
  ASSERT_TRUE(r.ok()) << r.status();
  ids = AllBlockIds(*r);
  pauses_of_second = 0;  // the Alloc's commit paused too
  first_thread = std::this_thread::get_id();
  auto first = pool.Free({ids, ""});
  ASSERT_TRUE(other.joinable());
  other.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->freed_blocks, 12);
  EXPECT_EQ(GetReason(second.status()), FailureReason::kBlockNotAllocated)
      << second.status();
  EXPECT_EQ(pauses_of_second.load(), 0);
  EXPECT_EQ(pool.Capacity()->allocated_blocks.value(), 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST_F(PagePoolTest, DataSurvivesNeighbourMappingChurn) {
  auto pool = MakePool(2, 512, 64, 0, 0);
  auto keep = pool->Alloc({4, "", "", {}});  // page 0
  ASSERT_TRUE(keep.ok());
  const uint64_t base = pool->range_base(0);
  const int64_t B = 512 * kKiB;
  for (BlockId b : AllBlockIds(*keep)) {
    std::memset(reinterpret_cast<void*>(base + b * B), 0x40 + b, B);
  }
  for (int round = 0; round < 5; ++round) {
    auto churn = pool->Alloc({12, "", "", {}});  // pages 1..3
    ASSERT_TRUE(churn.ok());
    for (BlockId b : AllBlockIds(*churn)) {
      std::memset(reinterpret_cast<void*>(base + b * B), 0xee, B);
    }
    ASSERT_TRUE(pool->Free({AllBlockIds(*churn), ""}).ok());  // unmapped again
  }
  for (BlockId b : AllBlockIds(*keep)) {
    const auto* p = reinterpret_cast<const unsigned char*>(base + b * B);
    EXPECT_EQ(p[0], 0x40 + b);
    EXPECT_EQ(p[B - 1], 0x40 + b);
  }
}

TEST_F(PagePoolTest, ShutdownRefusesNonEmptyThenReleasesEverything) {
  auto pool = MakePool(2, 512, 64, 2, 4);
  while (pool->PreallocStep()) {
  }
  auto r = pool->Alloc({9, "", "", {}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(GetReason(pool->Shutdown(false)), FailureReason::kPoolNotEmpty);
  EXPECT_TRUE(pool->Shutdown(true).ok());
  EXPECT_EQ(host_.live_handles(), 0);
  EXPECT_EQ(budgets_.Snapshot(0).charged.value(), 0);
  EXPECT_EQ(GetReason(pool->Capacity().status()), FailureReason::kPoolNotFound);
}

TEST_F(PagePoolTest, MaxIdleKeepsFreedPagesMapped) {
  auto pool = MakePool(2, 512, 64, 0, 2);
  auto r = pool->Alloc({16, "", "", {}});  // 4 pages
  ASSERT_TRUE(r.ok());
  auto f = pool->Free({AllBlockIds(*r), ""});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->pages_unmapped, 2);
  auto c = pool->Capacity();
  EXPECT_EQ(c->pages_idle.value(), 2);
  EXPECT_EQ(host_.live_handles(), 2);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Every reason Alloc, Free and Reserve can return, each counted once where
// it was decided; refusals of other calls are not counted.
TEST_F(PagePoolTest, OutcomesAreCountedByReasonWhereRefused) {
  auto pool = MakePool(2, 512, 64);  // 16 pages of 4 blocks
  std::array<int64_t, kMaxFailureReason + 1> want = {};
  auto check = [&] {
    const PoolStats st = pool->Stats();
    for (int r = 0; r <= kMaxFailureReason; ++r) {
      EXPECT_EQ(st.outcomes[r], want[r])
          << "reason " << ReasonName(static_cast<FailureReason>(r));
    }
    EXPECT_TRUE(pool->CheckInvariants().ok());
  };
  auto expect = [&](const absl::Status& s, FailureReason reason) {
    EXPECT_EQ(GetReason(s), reason) << s;
    ++want[static_cast<int>(reason)];
    check();
  };
  // Blocks free on mapped pages: a request one larger must map a page.
  auto mapped_free = [&] {
    int64_t n = 0;
    const absl::StatusOr<CapacitySnapshot> c = pool->Capacity({1000});
    for (const PageInfo& p : c->pages) {
      if (p.state == PageState::kOpen || p.state == PageState::kIdle) {
        n += p.free_blocks.value();
      }
    }
    return n;
  };
  const FailureReason kOk = FailureReason::kUnspecified;

  expect(pool->Alloc({-1, "", "", {}}).status(),
         FailureReason::kInvalidArgument);
  expect(pool->Alloc({65, "", "", {}}).status(),
         FailureReason::kRequestTooLarge);
  absl::StatusOr<AllocResult> a = pool->Alloc({8, "", "", {}});
  expect(a.status(), kOk);
  expect(pool->Alloc({1, "", "", a->generation - 1}).status(),
         FailureReason::kGenerationMismatch);
  expect(pool->Alloc({1, "", "nope", {}}).status(),
         FailureReason::kReservationNotFound);
  absl::StatusOr<ReservationInfo> r1 = pool->Reserve({4, absl::Seconds(1), ""});
  expect(r1.status(), kOk);
  clock_.Advance(absl::Seconds(2));
  expect(pool->Alloc({1, "", r1->reservation_id, {}}).status(),
         FailureReason::kReservationExpired);
  absl::StatusOr<ReservationInfo> r2 =
      pool->Reserve({4, absl::Seconds(60), ""});
  expect(r2.status(), kOk);
  expect(pool->Alloc({60, "", r2->reservation_id, {}}).status(),
         FailureReason::kReservationTooSmall);
  expect(pool->Alloc({60, "", "", {}}).status(), FailureReason::kPoolExhausted);
  expect(pool->Reserve({0, absl::Seconds(1), ""}).status(),
         FailureReason::kInvalidArgument);
  expect(pool->Reserve({1, absl::ZeroDuration(), ""}).status(),
         FailureReason::kInvalidArgument);

  const std::vector<BlockId> ids = AllBlockIds(*a);
  const std::vector<BlockId> twice = {ids[0], ids[0]};
  expect(pool->Free({twice, ""}).status(), FailureReason::kInvalidArgument);
  const std::vector<BlockId> unowned = {63};
  expect(pool->Free({unowned, ""}).status(), FailureReason::kBlockNotAllocated);
  const std::vector<BlockId> reserved = {r2->pages[0].block_ids[0]};
  expect(pool->Free({reserved, ""}).status(),
         FailureReason::kBlockInReservation);

  expect(pool->Alloc({1, "x", "", {}}).status(), kOk);
  expect(pool->Alloc({2, "x", "", {}}).status(),
         FailureReason::kRequestIdReused);
  absl::StatusOr<AllocResult> replay = pool->Alloc({1, "x", "", {}});
  EXPECT_TRUE(replay.ok() && replay->replayed);
  expect(replay.status(), kOk);

  // Not counted: ReleaseReservation, SetMemoryLimit, Trim, occupancy.
  EXPECT_EQ(GetReason(pool->ReleaseReservation("nope").status()),
            FailureReason::kReservationNotFound);
  EXPECT_EQ(GetReason(pool->SetMemoryLimit(Bytes(-1), 0).status()),
            FailureReason::kInvalidArgument);
  EXPECT_EQ(GetReason(pool->GetPageOccupancy({99}).status()),
            FailureReason::kInvalidArgument);
  check();

  backend_.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 1});
  expect(pool->Alloc({mapped_free() + 1, "", "", {}}).status(),
         FailureReason::kGpuMemoryExhausted);
  backend_.AddFault({BackendOp::kMap, FaultKind::kError, 1});
  expect(pool->Alloc({mapped_free() + 1, "", "", {}}).status(),
         FailureReason::kMappingFailed);

  ASSERT_TRUE(pool->SetMemoryLimit(Bytes(0), 1).ok());
  const CapacitySnapshot c = *pool->Capacity();
  ASSERT_EQ(c.limit.state, LimitState::kDeferred);
  ASSERT_LE(c.available_blocks.value() + 1, c.total_blocks.value());
  expect(pool->Alloc({c.available_blocks.value() + 1, "", "", {}}).status(),
         FailureReason::kShrinkPending);
  ASSERT_TRUE(pool->SetMemoryLimit(Bytes(kGiB), 2).ok());

  backend_.AddFault({BackendOp::kCreate, FaultKind::kFatal, 1});
  expect(pool->Alloc({mapped_free() + 1, "", "", {}}).status(),
         FailureReason::kPoolFailed);
  expect(pool->Alloc({1, "", "", {}}).status(), FailureReason::kPoolFailed);
  expect(pool->Reserve({1, absl::Seconds(1), ""}).status(),
         FailureReason::kPoolFailed);

  ASSERT_TRUE(pool->Shutdown(/*force=*/true).ok());
  expect(pool->Alloc({1, "", "", {}}).status(), FailureReason::kPoolNotFound);
  expect(pool->Free({ids, ""}).status(), FailureReason::kPoolNotFound);

  const PoolStats st = pool->Stats();
  int64_t sum = 0;
  for (int64_t n : st.outcomes) sum += n;
  EXPECT_EQ(sum, st.alloc_calls + st.free_calls + st.reserve_calls);
  EXPECT_EQ(sum, 26);
}

// docs/design.md, "Device budgets": a refresh while an Alloc's pages are
// charged but not yet created, and again while the pool holds them. The
// budget never counts them as free.
// A pool of 8 pages of four blocks on a 40 MiB host device behind a
// GatedBackend, whose Create calls a test can hold; emptied pages stay IDLE.
struct GatedRig {
  GatedRig()
      : host(HostBackendOptions{1, MiB(40), MiB(2)}),
        gated(&host),
        budgets(&gated, 1.0) {
    if (absl::Status s = budgets.Init(); !s.ok()) {
      pool = s;
      return;
    }
    PoolOptions o;
    o.min_idle_pages = 0;
    o.max_idle_pages = 8;
    pool = PagePool::Create(FourBlockPages(32), &gated, &budgets, &clock, o);
  }
  HostBackend host;
  testing_support::GatedBackend gated;
  DeviceBudgets budgets;
  ManualClock clock;
  absl::StatusOr<std::unique_ptr<PagePool>> pool;
};

TEST(PagePoolBudgetTest, RefreshWhilePagesAreChargedButNotCreated) {
  GatedRig rig;
  ASSERT_TRUE(rig.pool.ok()) << rig.pool.status();
  auto& pool = rig.pool;
  testing_support::GatedBackend& gated = rig.gated;
  DeviceBudgets& budgets = rig.budgets;
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 20);

  gated.Arm();
  absl::StatusOr<AllocResult> r;
  std::thread alloc([&] { r = (*pool)->Alloc({8, "", "", {}}); });  // 2 pages
  gated.WaitUntilHeld();  // charged 2, created none
  ASSERT_TRUE(budgets.RefreshAll().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 18);
  EXPECT_EQ(budgets.Snapshot(0).external, Bytes(0));
  gated.Release(/*fail=*/false);
  alloc.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pages_mapped, 2);
  ASSERT_TRUE(budgets.RefreshAll().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 18);
  EXPECT_EQ(budgets.Snapshot(0).created, MiB(4));

  std::vector<BlockId> ids;
  for (const PageBlocks& pb : r->pages) {
    ids.insert(ids.end(), pb.block_ids.begin(), pb.block_ids.end());
  }
  ASSERT_TRUE((*pool)->Free({ids, ""}).ok());
  ASSERT_TRUE((*pool)->Trim().ok());
  ASSERT_TRUE(budgets.RefreshAll().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 20);
  EXPECT_EQ(budgets.Snapshot(0).created, Bytes(0));
  EXPECT_EQ(budgets.Snapshot(0).charged, Bytes(0));
  EXPECT_TRUE((*pool)->CheckInvariants().ok());
}

// A lowered limit's outcome is its own decision. Here it is DEFERRED (two
// pages in use against a target of one); a Free that runs while the limit
// unmaps its IDLE page without the lock settles it, and the limit still
// answers DEFERRED, with the limit in force after it APPLIED: as if the
// Free came after it. (Answering APPLIED, as the state read after its
// unmaps said, matched no order of the two calls: linearizability seed
// 81803, docs/reliability.md.)
TEST(PagePoolLimitTest, OutcomeIsDecidedBeforeTheUnmapsRun) {
  GatedRig rig;
  ASSERT_TRUE(rig.pool.ok()) << rig.pool.status();
  PagePool& pool = **rig.pool;
  auto two = pool.Alloc({8, "", "", {}});  // pages 0 and 1, FULL
  ASSERT_TRUE(two.ok()) << two.status();
  auto third = pool.Alloc({4, "", "", {}});  // page 2
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(pool.Free({AllBlockIds(*third), ""}).ok());  // page 2 IDLE
  rig.gated.Arm(testing_support::GatedBackend::Call::kUnmap);
  absl::StatusOr<LimitResult> limit;
  std::thread lower([&] { limit = pool.SetMemoryLimit(MiB(2), 1); });
  rig.gated.WaitUntilHeld();  // unmapping page 2, the lock released
  const std::vector<BlockId> page1 = {4, 5, 6, 7};
  auto freed = pool.Free({page1, ""});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->pages_unmapped, 1);  // over the target: page 1 leaves
  rig.gated.Release(/*fail=*/false);
  lower.join();
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->outcome, LimitOutcome::kDeferred);
  EXPECT_EQ(limit->limit.target_pages, PageCount(1));
  EXPECT_EQ(limit->limit.state, LimitState::kApplied);
  auto cap = pool.Capacity();
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(cap->allocated_blocks.value(), 4);  // page 0's
  EXPECT_EQ(cap->available_blocks.value(), 0);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

// A Shutdown that is not forced, asked while an Alloc maps into an empty
// pool, is refused with POOL_NOT_EMPTY once that Alloc is done: it counts
// the blocks after the calls in flight, not before them (when it found
// none and would have deleted a pool whose blocks the Alloc then handed
// out).
TEST(PagePoolShutdownTest, UnforcedShutdownDuringAnAllocIsRefused) {
  GatedRig rig;
  ASSERT_TRUE(rig.pool.ok()) << rig.pool.status();
  auto& pool = rig.pool;
  testing_support::GatedBackend& gated = rig.gated;

  gated.Arm();
  absl::StatusOr<AllocResult> r;
  std::thread alloc([&] { r = (*pool)->Alloc({8, "", "", {}}); });
  gated.WaitUntilHeld();  // the Alloc's pages are in flight
  absl::Status shut;
  std::thread shutdown([&] { shut = (*pool)->Shutdown(/*force=*/false); });
  // Gives the Shutdown time to reach the pool before the Alloc goes on;
  // its outcome does not depend on it.
  absl::SleepFor(absl::Milliseconds(20));
  gated.Release(/*fail=*/false);
  alloc.join();
  shutdown.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(GetReason(shut), FailureReason::kPoolNotEmpty) << shut;
  EXPECT_TRUE((*pool)->Free({AllBlockIds(*r), ""}).ok());
  EXPECT_TRUE((*pool)->Shutdown(/*force=*/false).ok());
}

}  // namespace
}  // namespace kvbroker
