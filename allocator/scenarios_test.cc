// The product's acceptance scenarios (rows C1.., R1.., ...), one test per row,
// driven through the allocator's C++ API.
//
// Every pool sits on the backend TestBackend gives (host memory by default,
// the GPUs with KVB_TEST_BACKEND=cuda: the same binary proves the same rows on
// an H200) wrapped in a FaultInjectingBackend, whose call counters prove that a
// refusal happened before any page was mapped ("refused" = the named reason
// and zero Create/Map/SetAccess calls during the call). Budgets are set only
// through the wrapper's OverrideMemory and held memory is counted only through
// its live_handles()/created_bytes(), so no row depends on a host-only knob;
// the target backend still creates and maps every page for real. A row that
// needs more devices than the backend has is skipped with the reason.
//
// Unless a row says otherwise: L = K = 1, one device, no null block,
// gpu_memory_utilization 1.0 over an 80 GiB device, and min_idle_pages =
// max_idle_pages = 0. Every mutation goes through a helper that runs
// PagePool::CheckInvariants() afterwards.
//
// GPU footprint: every row maps at most a few hundred MiB per device (the
// largest, C14, at most 24 pages of 14 MiB; P3 two 128 MiB bundles per
// device) and reserves at most a few GiB of virtual range, so the 80 GiB
// "device" the overrides describe never promises more than an H200 (about
// 140 GiB) can really map in any row. P1 and P2 are budget arithmetic only and
// map nothing.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "allocator/broker.h"
#include "allocator/clock.h"
#include "allocator/device_budget.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/geometry.h"
#include "allocator/page_pool.h"
#include "allocator/testing/test_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

#define KVB_CONCAT_INNER(a, b) a##b
#define KVB_CONCAT(a, b) KVB_CONCAT_INNER(a, b)
// ASSERT_OK_AND_ASSIGN(lhs, expr): asserts that the StatusOr `expr` is OK and
// moves its value into `lhs` (which may be a declaration).
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(KVB_CONCAT(status_or_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  ASSERT_TRUE(tmp.ok()) << tmp.status();          \
  lhs = *std::move(tmp)

#define ASSERT_INVARIANTS(pool)                   \
  do {                                            \
    absl::Status inv_ = (pool).CheckInvariants(); \
    ASSERT_TRUE(inv_.ok()) << inv_;               \
  } while (0)

// ---------------------------------------------------------------------------
// The rig: the test backend, the counting wrapper, budgets and a manual clock.

using testing_support::TestBackend;

// What every device of a rig reports until a row says otherwise: an 80 GiB
// device with nothing used by other processes.
const Bytes kDeviceTotal(80 * kGiB);

struct Rig {
  // A rig over the backend TestBackend gives for `devices` devices, or
  // nullptr with `why` set (the caller skips).
  static std::unique_ptr<Rig> Make(int devices, double utilization,
                                   std::string* why) {
    std::unique_ptr<TestBackend> target = TestBackend::Make(devices, why);
    if (target == nullptr) return nullptr;
    return std::unique_ptr<Rig>(new Rig(std::move(target), utilization));
  }

  Rig(std::unique_ptr<TestBackend> target, double utilization)
      : test_backend(std::move(target)),
        backend(test_backend->backend()),
        budgets(&backend, utilization) {
    // Every device the backend has (a GPU machine may have more than the row
    // asked for), so that DeviceBudgets never reads a real driver figure.
    for (int d = 0; d < backend.device_count(); ++d) {
      backend.OverrideMemory(d, MemoryInfo{kDeviceTotal, kDeviceTotal});
    }
    absl::Status s = budgets.Init();
    EXPECT_TRUE(s.ok()) << s;
  }

  // Leaves exactly `free` bytes of `device` unused by other processes and
  // refreshes the budgets' view of it. (The wrapper reports the override's
  // free minus what was created through it, so add back what is held now.)
  void LeaveFree(int device, Bytes free) {
    backend.OverrideMemory(
        device, MemoryInfo{free + backend.created_bytes(device), kDeviceTotal});
    absl::Status s = budgets.RefreshAll();
    EXPECT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<TestBackend> test_backend;
  FaultInjectingBackend backend;
  DeviceBudgets budgets;
  ManualClock clock;
};

// Declares `Rig& name` over `devices` devices with budgets at `utilization`,
// or skips the test with the reason there is no such backend (no GPU, or a
// one-GPU machine asked for two).
#define RIG_OR_SKIP_WITH(name, devices, utilization)       \
  std::string name##_why;                                  \
  std::unique_ptr<Rig> name##_owner =                      \
      Rig::Make((devices), (utilization), &name##_why);    \
  if (name##_owner == nullptr) GTEST_SKIP() << name##_why; \
  Rig& name = *name##_owner
// The default rig: one device, utilization 1.0.
#define RIG_OR_SKIP(name) RIG_OR_SKIP_WITH(name, 1, 1.0)

PoolConfig Geo(Bytes page, Bytes block, int64_t max_blocks) {
  PoolConfig c;
  c.name = "pool";
  c.page_size = page;
  c.block_bytes = block;
  c.max_blocks = max_blocks;
  return c;
}

// Prealloc idle: no page is mapped or kept mapped behind the test's back.
PoolOptions Quiet(int64_t min_idle = 0, int64_t max_idle = 0) {
  PoolOptions o;
  o.min_idle_pages = min_idle;
  o.max_idle_pages = max_idle;
  return o;
}

absl::StatusOr<std::unique_ptr<PagePool>> MakePool(
    Rig& rig, const PoolConfig& config, PoolOptions options = Quiet()) {
  return PagePool::Create(config, &rig.backend, &rig.budgets, &rig.clock,
                          std::move(options));
}

// ---------------------------------------------------------------------------
// Checked calls: each runs CheckInvariants() after the call.

template <typename T>
T Checked(PagePool& pool, T result) {
  absl::Status s = pool.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s;
  return result;
}

absl::StatusOr<AllocResult> Alloc(PagePool& pool, int64_t n,
                                  const std::string& request_id = "",
                                  const std::string& reservation_id = "") {
  AllocRequest r;
  r.num_blocks = n;
  r.request_id = request_id;
  r.reservation_id = reservation_id;
  return Checked(pool, pool.Alloc(r));
}

absl::StatusOr<FreeResult> Free(PagePool& pool, std::vector<BlockId> ids) {
  FreeRequest r;
  r.block_ids = std::move(ids);
  return Checked(pool, pool.Free(r));
}

absl::StatusOr<ReservationInfo> Reserve(
    PagePool& pool, int64_t n, absl::Duration ttl = absl::Seconds(30)) {
  ReserveRequest r;
  r.num_blocks = n;
  r.ttl = ttl;
  return Checked(pool, pool.Reserve(r));
}

absl::StatusOr<ReleaseResult> Release(PagePool& pool, const std::string& id) {
  return Checked(pool, pool.ReleaseReservation(id));
}

absl::StatusOr<LimitResult> Limit(PagePool& pool, Bytes bytes,
                                  int64_t revision) {
  return Checked(pool, pool.SetMemoryLimit(bytes, revision));
}

CapacitySnapshot Cap(PagePool& pool, int64_t max_pages = 0) {
  CapacityQuery q;
  q.max_pages = max_pages;
  absl::StatusOr<CapacitySnapshot> c = pool.Capacity(q);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : CapacitySnapshot{};
}

int64_t Available(PagePool& pool) { return Cap(pool).available_blocks.value(); }

std::vector<BlockId> Ids(const std::vector<PageBlocks>& pages) {
  std::vector<BlockId> out;
  for (const PageBlocks& pb : pages) {
    out.insert(out.end(), pb.block_ids.begin(), pb.block_ids.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}
std::vector<BlockId> Ids(const AllocResult& r) { return Ids(r.pages); }
std::vector<BlockId> Ids(const ReservationInfo& r) { return Ids(r.pages); }

// page id -> block ids, as the reply groups them.
std::map<PageId, std::vector<BlockId>> ByPage(const AllocResult& r) {
  std::map<PageId, std::vector<BlockId>> out;
  for (const PageBlocks& pb : r.pages) {
    EXPECT_EQ(out.count(pb.page_id), 0u) << "page listed twice";
    out[pb.page_id] = pb.block_ids;
  }
  return out;
}

std::string Meta(const absl::Status& s, const std::string& key) {
  std::optional<Failure> f = GetFailure(s);
  if (!f.has_value()) return "<no failure payload>";
  auto it = f->metadata.find(key);
  return it == f->metadata.end() ? "<no key " + key + ">" : it->second;
}

// Runs `call`, which must fail with `reason` without any backend map call
// (Create, Map or SetAccess) while it runs. Returns the failure.
template <typename F>
absl::Status RefusedBeforeMapping(Rig& rig, FailureReason reason, F call) {
  const int64_t maps = rig.backend.map_calls();
  auto result = call();
  EXPECT_FALSE(result.ok()) << "expected " << ReasonName(reason);
  EXPECT_EQ(ReasonName(GetReason(result.status())), ReasonName(reason))
      << result.status();
  EXPECT_EQ(rig.backend.map_calls() - maps, 0)
      << "backend map calls during a refusal";
  return result.status();
}

PageState StateOf(PagePool& pool, PageId p) {
  absl::StatusOr<std::vector<PageOccupancy>> o = pool.GetPageOccupancy({p});
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? (*o)[0].state : PageState::kFree;
}

// Everything a failed call must leave as it was: counts, pages in
// consumption order with their flags, the occupancy of every page, the limit
// and the generation. (Device budget snapshots are left out: a mapping
// failure refreshes the driver's view by design.)
std::string Observable(PagePool& pool) {
  const int64_t T = pool.geometry().page_count().value();
  CapacitySnapshot c = Cap(pool, T + 1);
  std::string s = absl::StrCat(
      "gen=", c.generation, " avail=", c.available_blocks.value(),
      " reserved=", c.reserved_blocks.value(),
      " allocated=", c.allocated_blocks.value(),
      " total=", c.total_blocks.value(), " free=", c.pages_free.value(),
      " mapping=", c.pages_mapping.value(), " idle=", c.pages_idle.value(),
      " open=", c.pages_open.value(), " full=", c.pages_full.value(),
      " reclaimed=", c.pages_reclaimed.value(),
      " empty=", c.pages_empty.value(), " mapped=", c.mapped_bytes.value(),
      " healthy=", c.healthy, " limit=", static_cast<int>(c.limit.state), "/",
      c.limit.target_pages.value(), "\norder:");
  for (const PageInfo& p : c.pages) {
    absl::StrAppend(&s, " ", p.page_id, ":", PageStateName(p.state), ":",
                    p.free_blocks.value(), p.counted ? "" : "(uncounted)");
  }
  std::vector<PageId> all(T);
  for (PageId p = 0; p < T; ++p) all[p] = p;
  absl::StatusOr<std::vector<PageOccupancy>> occ = pool.GetPageOccupancy(all);
  EXPECT_TRUE(occ.ok()) << occ.status();
  absl::StrAppend(&s, "\noccupancy:");
  if (occ.ok()) {
    for (const PageOccupancy& o : *occ) {
      absl::StrAppend(&s, " ", o.page_id, ":", PageStateName(o.state), ":",
                      o.allocated_blocks.value(), "/",
                      o.reserved_blocks.value());
    }
  }
  return s;
}

// Deltas of backend calls over a stretch of a test.
struct CallDelta {
  explicit CallDelta(const FaultInjectingBackend& b) : backend(b) {
    for (int i = 0; i < static_cast<int>(BackendOp::kCount); ++i) {
      calls0[i] = b.calls(static_cast<BackendOp>(i));
      injected0[i] = b.injected(static_cast<BackendOp>(i));
    }
  }
  int64_t calls(BackendOp op) const {
    return backend.calls(op) - calls0[static_cast<int>(op)];
  }
  // Calls that reached the target backend and succeeded there (the target
  // backend, host or GPU, does not fail these calls on its own in these
  // tests: every row maps far less than the device holds).
  int64_t done(BackendOp op) const {
    return calls(op) - (backend.injected(op) - injected0[static_cast<int>(op)]);
  }
  const FaultInjectingBackend& backend;
  std::array<int64_t, static_cast<int>(BackendOp::kCount)> calls0{};
  std::array<int64_t, static_cast<int>(BackendOp::kCount)> injected0{};
};

// Every page this stretch created was released and every mapping it made was
// unmapped: nothing it did is still held.
void ExpectFullyUnwound(const CallDelta& d) {
  EXPECT_EQ(d.calls(BackendOp::kUnmap), d.done(BackendOp::kMap));
  EXPECT_EQ(d.calls(BackendOp::kRelease), d.done(BackendOp::kCreate));
}

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

// What the C14 walks went through, so that the test can insist the walk
// reached every state it is meant to check.
struct WalkTally {
  std::map<std::string, int64_t> refusals;  // reason of Alloc(c + 1)
  int64_t probes = 0;
  int64_t deferred_probes = 0;
  int64_t nonzero_probes = 0;  // c > 0
  int64_t partly_counted = 0;  // some FREE pages not affordable
  int64_t reservation_allocs = 0;
  int64_t expired = 0;
  int64_t prealloc_pages = 0;
};

// C14: a seeded random walk over random geometries. After every step the
// pool's Capacity c must be exact: Alloc(c + 1) is refused with the right
// reason before any map call, and Alloc(c) succeeds and leaves nothing
// available.
class RandomWalk {
 public:
  RandomWalk(uint64_t seed, WalkTally* tally) : rng_(seed), tally_(tally) {}

  void Run(int steps) {
    ASSERT_NO_FATAL_FAILURE(Setup());
    SCOPED_TRACE(description_);
    for (step_ = 0; step_ < steps; ++step_) {
      SCOPED_TRACE(absl::StrCat("step ", step_, " op ", last_op_));
      ASSERT_NO_FATAL_FAILURE(Step());
      ASSERT_NO_FATAL_FAILURE(Probe());
    }
    const PoolStats stats = pool_->Stats();
    tally_->expired += stats.reservations_expired_total;
    tally_->prealloc_pages += stats.prealloc_pages_total;
  }

 private:
  struct Res {
    std::vector<BlockId> blocks;  // ascending
    absl::Time expires;
  };

  int64_t Uniform(int64_t lo, int64_t hi) {  // inclusive
    return lo +
           static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }

  void Setup() {
    const int64_t pages_mib[] = {2, 4, 6, 14};
    P_ = MiB(pages_mib[Uniform(0, 3)]);
    const int64_t unit = 64 * kKiB;
    const int64_t units = P_.value() / unit;
    B_ = Bytes(Uniform(std::max<int64_t>(1, units / 16), units) * unit);
    const int64_t pages = Uniform(2, 24);
    const int64_t n = Uniform(1, pages * P_.value() / B_.value());
    PoolConfig config = Geo(P_, B_, n);
    config.reserve_null_block = Uniform(0, 3) == 0;
    const int64_t min_idle = Uniform(0, 2);
    const int64_t max_idle = min_idle + Uniform(0, 2);
    description_ =
        absl::StrCat("P=", P_.value() / kKiB, "KiB B=", B_.value() / kKiB,
                     "KiB N=", n, " null=", config.reserve_null_block,
                     " idle=", min_idle, "..", max_idle);
    SCOPED_TRACE(description_);
    std::string why;
    rig_ = Rig::Make(/*devices=*/1, /*utilization=*/1.0, &why);
    ASSERT_TRUE(rig_ != nullptr) << why;
    T_ = 0;
    ASSERT_NO_FATAL_FAILURE(SetBudget(Uniform(1, pages + 2)));
    ASSERT_OK_AND_ASSIGN(pool_,
                         MakePool(*rig_, config, Quiet(min_idle, max_idle)));
    T_ = pool_->geometry().page_count().value();
    null_block_ = config.reserve_null_block;
    ASSERT_INVARIANTS(*pool_);
    ASSERT_NO_FATAL_FAILURE(Probe());
  }

  // Leaves room for `bundles` more bundles (plus a partial one).
  void SetBudget(int64_t bundles) {
    rig_->LeaveFree(0, P_ * bundles + Bytes(Uniform(0, P_.value() - 1)));
  }

  void ExpireModel() {
    const absl::Time now = rig_->clock.Now();
    for (auto it = res_.begin(); it != res_.end();) {
      // TTLs end on half seconds and the clock moves in whole seconds, so
      // no expiry ever coincides with "now".
      it = it->second.expires < now ? res_.erase(it) : std::next(it);
    }
  }

  int64_t ReservedInModel() const {
    int64_t n = 0;
    for (const auto& [id, r] : res_) n += r.blocks.size();
    return n;
  }

  bool Held(BlockId b) const {
    if (allocated_.count(b) > 0) return true;
    for (const auto& [id, r] : res_) {
      if (std::binary_search(r.blocks.begin(), r.blocks.end(), b)) return true;
    }
    return null_block_ && b == 0;
  }

  // New ids must be usable and held by nobody.
  void ExpectFresh(const std::vector<BlockId>& ids) {
    std::set<BlockId> seen;
    for (BlockId b : ids) {
      ASSERT_TRUE(pool_->geometry().is_usable_block(b)) << b;
      ASSERT_FALSE(Held(b)) << "block " << b << " handed out twice";
      ASSERT_TRUE(seen.insert(b).second) << "block " << b << " twice in a call";
    }
  }

  // The exactness contract, checked on the current state. Leaves the state
  // as Alloc(c) + Free(those) leaves it.
  void Probe() {
    ++tally_->probes;
    ExpireModel();
    ASSERT_INVARIANTS(*pool_);
    CapacitySnapshot c = Cap(*pool_, T_ + 1);
    ASSERT_TRUE(c.healthy) << c.failure;
    ASSERT_EQ(c.allocated_blocks.value(),
              static_cast<int64_t>(allocated_.size()));
    ASSERT_EQ(c.reserved_blocks.value(), ReservedInModel());
    ASSERT_EQ(c.mapped_bytes, rig_->backend.created_bytes(0));
    ASSERT_EQ(c.mapped_bytes.value(),
              rig_->backend.live_handles() * P_.value());
    // available = free blocks on mapped pages + usable of the counted FREE
    // pages, and the counted FREE pages are the first min(affordable, |FREE|).
    int64_t mapped_free = 0, free_usable = 0, counted_usable = 0;
    int64_t free_pages = 0, counted_pages = 0;
    for (const PageInfo& p : c.pages) {
      if (p.state == PageState::kFree) {
        free_usable += p.usable_blocks.value();
        ++free_pages;
        if (p.counted) {
          ASSERT_EQ(counted_pages, free_pages - 1)
              << "counted pages not a prefix";
          counted_usable += p.usable_blocks.value();
          ++counted_pages;
        }
      } else {
        mapped_free += p.free_blocks.value();
      }
    }
    ASSERT_EQ(free_pages, c.pages_free.value());
    ASSERT_EQ(counted_pages, std::min(c.affordable_bundles, free_pages));
    const int64_t available = c.available_blocks.value();
    ASSERT_EQ(available, mapped_free + counted_usable);
    tally_->nonzero_probes += available > 0;
    tally_->partly_counted += counted_pages < free_pages;

    // Alloc(c + 1): refused with the reason failure.h gives, before mapping.
    const bool deferred = c.limit.state == LimitState::kDeferred;
    tally_->deferred_probes += deferred;
    FailureReason want;
    if (available + 1 > c.total_blocks.value()) {
      want = FailureReason::kRequestTooLarge;
    } else if (deferred) {
      want = FailureReason::kShrinkPending;
    } else if (available + 1 - mapped_free > free_usable) {
      want = FailureReason::kPoolExhausted;
    } else {
      want = FailureReason::kGpuMemoryExhausted;
    }
    const uint64_t generation = c.generation;
    absl::Status s = RefusedBeforeMapping(
        *rig_, want, [&] { return Alloc(*pool_, available + 1); });
    ASSERT_EQ(GetReason(s), want) << s;
    ++tally_->refusals[std::string(ReasonName(want))];
    ASSERT_EQ(Meta(s, "requested_blocks"), Num(available + 1));
    ASSERT_EQ(Meta(s, "available_blocks"), Num(available));
    ASSERT_EQ(pool_->generation(), generation);

    // Alloc(c): succeeds, and nothing is left available.
    ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool_, available));
    ASSERT_EQ(r.num_blocks, available);
    const std::vector<BlockId> ids = Ids(r);
    ASSERT_NO_FATAL_FAILURE(ExpectFresh(ids));
    ASSERT_EQ(Available(*pool_), 0);
    if (!ids.empty()) {
      ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool_, ids));
      ASSERT_EQ(f.freed_blocks, available);
    }
  }

  void Step() {
    ExpireModel();
    const int64_t c = Available(*pool_);
    const int op = static_cast<int>(Uniform(0, 12));
    last_op_ = op;
    switch (op) {
      case 0:
      case 1:
      case 2: {  // Alloc, sometimes too many
        const int64_t n = Uniform(0, c + 1);
        const int64_t maps = rig_->backend.map_calls();
        absl::StatusOr<AllocResult> r = Alloc(*pool_, n);
        if (n > c) {
          ASSERT_FALSE(r.ok());
          ASSERT_EQ(rig_->backend.map_calls(), maps);
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status() << " n=" << n << " c=" << c;
        ASSERT_NO_FATAL_FAILURE(ExpectFresh(Ids(*r)));
        for (BlockId b : Ids(*r)) allocated_.insert(b);
        break;
      }
      case 3:
      case 4: {  // Free a random subset, sometimes with a bad id
        if (allocated_.empty()) break;
        std::vector<BlockId> ids;
        for (BlockId b : allocated_) {
          if (Uniform(0, 2) == 0) ids.push_back(b);
        }
        if (ids.empty()) ids.push_back(*allocated_.begin());
        if (Uniform(0, 5) == 0) {
          const BlockId bad = Uniform(-1, pool_->geometry().max_blocks());
          if (allocated_.count(bad) == 0) {
            ids.push_back(bad);
            const int64_t before = Cap(*pool_).allocated_blocks.value();
            absl::StatusOr<FreeResult> f = Free(*pool_, ids);
            ASSERT_FALSE(f.ok());
            const FailureReason why = GetReason(f.status());
            ASSERT_TRUE(why == FailureReason::kBlockNotAllocated ||
                        why == FailureReason::kBlockInReservation)
                << f.status();
            ASSERT_EQ(Cap(*pool_).allocated_blocks.value(), before);
            break;
          }
        }
        ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool_, ids));
        ASSERT_EQ(f.freed_blocks, static_cast<int64_t>(ids.size()));
        for (BlockId b : ids) allocated_.erase(b);
        break;
      }
      case 5: {  // Reserve
        const int64_t n = Uniform(1, c + 1);
        const absl::Duration ttl =
            absl::Seconds(Uniform(1, 6)) + absl::Milliseconds(500);
        const int64_t maps = rig_->backend.map_calls();
        absl::StatusOr<ReservationInfo> r = Reserve(*pool_, n, ttl);
        if (n > c) {
          ASSERT_FALSE(r.ok());
          ASSERT_EQ(rig_->backend.map_calls(), maps);
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->num_blocks, n);
        ASSERT_NO_FATAL_FAILURE(ExpectFresh(Ids(*r)));
        ASSERT_EQ(r->expires, rig_->clock.Now() + ttl);
        res_[r->reservation_id] = Res{Ids(*r), r->expires};
        break;
      }
      case 6: {  // Alloc from a reservation
        if (res_.empty()) break;
        auto it = std::next(res_.begin(), Uniform(0, res_.size() - 1));
        Res& res = it->second;
        const int64_t held = res.blocks.size();
        const int64_t n = Uniform(1, held + 2);
        absl::StatusOr<AllocResult> r = Alloc(*pool_, n, "", it->first);
        if (n - held > c) {
          ASSERT_EQ(GetReason(r.status()), FailureReason::kReservationTooSmall)
              << r.status();
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status() << " n=" << n << " held=" << held;
        const std::vector<BlockId> ids = Ids(*r);
        ASSERT_EQ(static_cast<int64_t>(ids.size()), n);
        const int64_t from_res = std::min(n, held);
        for (int64_t i = 0; i < from_res; ++i) {
          ASSERT_TRUE(std::binary_search(ids.begin(), ids.end(), res.blocks[i]))
              << "reservation block " << res.blocks[i] << " not used first";
        }
        res.blocks.erase(res.blocks.begin(), res.blocks.begin() + from_res);
        ++tally_->reservation_allocs;
        for (BlockId b : ids) allocated_.insert(b);
        break;
      }
      case 7: {  // Release a reservation
        if (res_.empty()) break;
        auto it = std::next(res_.begin(), Uniform(0, res_.size() - 1));
        ASSERT_OK_AND_ASSIGN(ReleaseResult r, Release(*pool_, it->first));
        ASSERT_EQ(r.released_blocks,
                  static_cast<int64_t>(it->second.blocks.size()));
        res_.erase(it);
        break;
      }
      case 8: {  // Memory limit, occasionally stale
        if (revision_ > 0 && Uniform(0, 4) == 0) {
          ASSERT_OK_AND_ASSIGN(
              LimitResult l, Limit(*pool_, P_ * Uniform(0, T_), revision_ - 1));
          ASSERT_EQ(l.outcome, LimitOutcome::kStale);
          ASSERT_EQ(l.limit.revision, revision_);
          break;
        }
        const int64_t pages = Uniform(0, T_ + 1);
        ++revision_;
        ASSERT_OK_AND_ASSIGN(
            LimitResult l,
            Limit(*pool_, P_ * pages + Bytes(Uniform(0, P_.value() - 1)),
                  revision_));
        ASSERT_TRUE(l.outcome == LimitOutcome::kApplied ||
                    l.outcome == LimitOutcome::kDeferred);
        ASSERT_EQ(l.limit.target_pages.value(), std::min(pages, T_));
        ASSERT_EQ(l.limit.revision, revision_);
        break;
      }
      case 9: {  // Trim
        ASSERT_TRUE(Checked(*pool_, pool_->Trim()).ok());
        ASSERT_EQ(Cap(*pool_).pages_idle, PageCount(0));
        break;
      }
      case 10: {  // The prealloc worker, after a trim left it work to do
        ASSERT_TRUE(Checked(*pool_, pool_->Trim(Uniform(0, 2))).ok());
        int guard = 0;
        while (Checked(*pool_, pool_->PreallocStep())) {
          ASSERT_LT(++guard, 100);
        }
        break;
      }
      case 11: {  // Other processes take or return memory
        ASSERT_NO_FATAL_FAILURE(SetBudget(Uniform(0, T_ + 1)));
        break;
      }
      case 12: {  // Time passes; reservations expire
        rig_->clock.Advance(absl::Seconds(Uniform(1, 3)));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  std::unique_ptr<Rig> rig_;
  std::unique_ptr<PagePool> pool_;
  Bytes P_, B_;
  int64_t T_ = 0;
  bool null_block_ = false;
  std::set<BlockId> allocated_;
  std::map<std::string, Res> res_;
  int64_t revision_ = 0;
  WalkTally* const tally_;
  int step_ = 0;
  int last_op_ = -1;
  std::string description_;
};

TEST(Scenarios, C14_CapacityIsExactAfterEveryStep) {
  std::string why;
  if (Rig::Make(/*devices=*/1, /*utilization=*/1.0, &why) == nullptr) {
    GTEST_SKIP() << why;
  }
  WalkTally tally;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RandomWalk walk(seed, &tally);
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    walk.Run(/*steps=*/120);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(tally.probes, 40 * 121);
  // The walks reached every kind of refusal and every state they check.
  for (const char* reason : {"REQUEST_TOO_LARGE", "POOL_EXHAUSTED",
                             "GPU_MEMORY_EXHAUSTED", "SHRINK_PENDING"}) {
    EXPECT_GE(tally.refusals[reason], 20) << reason;
  }
  EXPECT_GE(tally.nonzero_probes, tally.probes / 2);
  EXPECT_GE(tally.deferred_probes, 20);
  EXPECT_GE(tally.partly_counted, 100);
  EXPECT_GE(tally.reservation_allocs, 20);
  EXPECT_GE(tally.expired, 20);
  EXPECT_GE(tally.prealloc_pages, 20);
  for (const auto& [reason, n] : tally.refusals) {
    std::printf("C14: %s x%lld\n", reason.c_str(), static_cast<long long>(n));
  }
  std::printf(
      "C14: %lld probes, %lld with c > 0, %lld deferred, %lld partly "
      "counted, %lld reservation allocs, %lld expired, %lld prealloc pages\n",
      static_cast<long long>(tally.probes),
      static_cast<long long>(tally.nonzero_probes),
      static_cast<long long>(tally.deferred_probes),
      static_cast<long long>(tally.partly_counted),
      static_cast<long long>(tally.reservation_allocs),
      static_cast<long long>(tally.expired),
      static_cast<long long>(tally.prealloc_pages));
}

// ===========================================================================
// Physical budget (DeviceBudgets over the test backend, its memory set with
// OverrideMemory)

const Bytes kP1Bundle = MiB(2 * 32 * 2);  // P = 2 MiB, L = 32, K = 2

// P1 and P2 are arithmetic over DeviceBudgets: no pool, nothing mapped. The
// device reports total 80 GiB and the row's free memory from the first query.
#define BUDGET_BACKEND_OR_SKIP(backend, free)                     \
  std::string backend##_why;                                      \
  std::unique_ptr<TestBackend> backend##_target =                 \
      TestBackend::Make(1, &backend##_why);                       \
  if (backend##_target == nullptr) GTEST_SKIP() << backend##_why; \
  FaultInjectingBackend backend(backend##_target->backend());     \
  backend.OverrideMemory(0, MemoryInfo{(free), kDeviceTotal})

TEST(Scenarios, P1_FortyEightBundlesAffordable) {
  // 80 GiB, 70 GiB used by other processes.
  BUDGET_BACKEND_OR_SKIP(backend, Bytes(10 * kGiB));
  DeviceBudgets budgets(&backend, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.Snapshot(0).headroom, Bytes(4 * kGiB));
  EXPECT_EQ(budgets.AffordableBundles({0}, kP1Bundle), 48);
  EXPECT_EQ(backend.map_calls(), 0);
}

TEST(Scenarios, P2_NothingAffordableNeverNegative) {
  // 80 GiB, 77 GiB used by other processes.
  BUDGET_BACKEND_OR_SKIP(backend, Bytes(3 * kGiB));
  DeviceBudgets budgets(&backend, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, kP1Bundle), 0);
  EXPECT_EQ(budgets.Snapshot(0).budget, Bytes(0));
  EXPECT_EQ(backend.map_calls(), 0);
}

// Needs two real devices: the pool maps a bundle on each (2 x 128 MiB per
// device at most).
TEST(Scenarios, P3_TwoDevicesAffordTheMinimum) {
  RIG_OR_SKIP_WITH(rig, /*devices=*/2, /*utilization=*/0.95);
  const Bytes headroom(4 * kGiB);
  rig.LeaveFree(0, headroom + kP1Bundle * 10 + MiB(64));
  rig.LeaveFree(1, headroom + kP1Bundle * 2 + (kP1Bundle - Bytes(1)));
  EXPECT_EQ(rig.budgets.AffordableBundles({0, 1}, kP1Bundle), 2);
  EXPECT_EQ(rig.budgets.AffordableBundles({0}, kP1Bundle), 10);

  // A pool on both devices counts two pages' worth.
  PoolConfig config = Geo(MiB(2), MiB(2), 20);
  config.num_layers = 32;
  config.num_kv_buffers = 2;
  config.devices = {0, 1};
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, config));
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.affordable_bundles, 2);
  EXPECT_EQ(c.available_blocks, BlockCount(2));
  (void)RefusedBeforeMapping(rig, FailureReason::kGpuMemoryExhausted,
                             [&] { return Alloc(*pool, 3); });
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 2));
  EXPECT_EQ(rig.backend.created_bytes(0), kP1Bundle * 2);
  EXPECT_EQ(rig.backend.created_bytes(1), kP1Bundle * 2);
}

// ===========================================================================
// Failures and rollback

// R1's pool: 4 blocks per page, 16 pages, nothing mapped.
PoolConfig R1Pool() { return Geo(MiB(2), KiB(512), 64); }

TEST(Scenarios, R1_OutOfMemoryOnSecondPageRollsBack) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool()));
  const std::string before = Observable(*pool);
  rig.backend.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 2});
  const CallDelta d(rig.backend);
  absl::StatusOr<AllocResult> r = Alloc(*pool, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kGpuMemoryExhausted)
      << r.status();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  // The page this call mapped was unmapped and released.
  EXPECT_EQ(d.calls(BackendOp::kCreate), 2);
  EXPECT_EQ(d.done(BackendOp::kMap), 1);
  EXPECT_EQ(d.calls(BackendOp::kUnmap), 1);
  EXPECT_EQ(d.calls(BackendOp::kRelease), 1);
  ExpectFullyUnwound(d);
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(rig.backend.created_bytes(0), Bytes(0));
  EXPECT_EQ(rig.budgets.Snapshot(0).charged, Bytes(0));
  // Allocated blocks, page states and the generation are as before.
  EXPECT_EQ(Observable(*pool), before);
  EXPECT_TRUE(pool->healthy());
}

TEST(Scenarios, R2_AfterTheFaultClearsAllocSucceeds) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool()));
  rig.backend.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 2});
  ASSERT_FALSE(Alloc(*pool, 8).ok());
  rig.backend.ClearFaults();
  const CallDelta d(rig.backend);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 8));
  EXPECT_EQ(r.pages_mapped, 2);
  EXPECT_EQ(d.calls(BackendOp::kCreate), 2);
  EXPECT_EQ(ByPage(r), (std::map<PageId, std::vector<BlockId>>{
                           {0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}}));
  EXPECT_EQ(rig.backend.live_handles(), 2);
}

TEST(Scenarios, R3_DriverErrorOnThirdMapRollsBack) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool()));
  const std::string before = Observable(*pool);
  rig.backend.AddFault({BackendOp::kMap, FaultKind::kError, 3});
  const CallDelta d(rig.backend);
  absl::StatusOr<AllocResult> r = Alloc(*pool, 12);  // three pages
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kMappingFailed) << r.status();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.calls(BackendOp::kMap), 3);
  ExpectFullyUnwound(d);
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(Observable(*pool), before);
  CapacitySnapshot c = Cap(*pool);
  EXPECT_TRUE(c.healthy);
  EXPECT_EQ(c.available_blocks, BlockCount(64));
  ASSERT_OK_AND_ASSIGN(AllocResult again, Alloc(*pool, 12));
  EXPECT_EQ(again.pages_mapped, 3);
  EXPECT_EQ(rig.backend.live_handles(), 3);
}

TEST(Scenarios, R4_FailedRollbackFailsOnlyThatPool) {
  RIG_OR_SKIP(rig);
  BrokerOptions options;
  options.start_worker = false;
  options.min_idle_pages = 0;
  options.max_idle_pages = 0;
  options.gpu_memory_utilization = 1.0;
  options.clock = &rig.clock;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Broker> broker,
                       Broker::Create(&rig.backend, options));
  PoolConfig a_config = R1Pool();
  a_config.name = "a";
  PoolConfig b_config = R1Pool();
  b_config.name = "b";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<PagePool> a,
                       broker->CreatePool(a_config));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<PagePool> b,
                       broker->CreatePool(b_config));

  // The second page's map fails, and so does the unmap that would roll the
  // first page back.
  rig.backend.AddFault({BackendOp::kMap, FaultKind::kError, 2});
  rig.backend.AddFault({BackendOp::kUnmap, FaultKind::kError, 1});
  absl::StatusOr<AllocResult> r = Alloc(*a, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kPoolFailed) << r.status();
  EXPECT_EQ(rig.backend.injected(BackendOp::kUnmap), 1);

  CapacitySnapshot c = Cap(*a);
  EXPECT_FALSE(c.healthy);
  EXPECT_FALSE(c.failure.empty());
  EXPECT_EQ(c.available_blocks, BlockCount(0));
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kPoolFailed,
                                        [&] { return Alloc(*a, 1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // The pool failed on its own; the device was not lost.
  EXPECT_TRUE(broker->healthy());
  EXPECT_FALSE(a->device_lost());

  // The broker keeps serving its other pool.
  ASSERT_OK_AND_ASSIGN(AllocResult other, Alloc(*b, 1));
  EXPECT_EQ(Ids(other), (std::vector<BlockId>{0}));
  EXPECT_TRUE(Cap(*b).healthy);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<PagePool> looked_up,
                       broker->GetPool("b"));
  EXPECT_EQ(looked_up, b);
}

TEST(Scenarios, R5_PreallocFatalErrorVisibleInNextCapacity) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool(),
                                           Quiet(/*min_idle=*/1,
                                                 /*max_idle=*/1)));
  rig.backend.AddFault({BackendOp::kCreate, FaultKind::kFatal, 1});
  const CallDelta d(rig.backend);
  EXPECT_FALSE(Checked(*pool, pool->PreallocStep()));
  EXPECT_EQ(d.calls(BackendOp::kCreate), 1);
  EXPECT_EQ(rig.backend.injected(BackendOp::kCreate), 1);

  CapacitySnapshot c = Cap(*pool);
  EXPECT_FALSE(c.healthy);
  EXPECT_FALSE(c.failure.empty());
  EXPECT_FALSE(pool->healthy());
  EXPECT_TRUE(pool->device_lost());  // a fatal error: the backend failed
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kPoolFailed,
                                        [&] { return Alloc(*pool, 1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // The worker does not keep trying on a failed pool.
  EXPECT_FALSE(Checked(*pool, pool->PreallocStep()));
  EXPECT_EQ(d.calls(BackendOp::kCreate), 1);
}

// Needs two real devices: device 0 really maps before device 1 fails.
TEST(Scenarios, R6_SecondDeviceFailureUnmapsTheFirst) {
  RIG_OR_SKIP_WITH(rig, /*devices=*/2, /*utilization=*/1.0);
  PoolConfig config = R1Pool();
  config.devices = {0, 1};
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, config));
  const std::string before = Observable(*pool);

  // Map fails on device 1, after device 0's page was created, mapped and
  // made accessible.
  FaultRule rule{BackendOp::kMap, FaultKind::kError, 1, /*device=*/1};
  rig.backend.AddFault(rule);
  const CallDelta d(rig.backend);
  absl::StatusOr<AllocResult> r = Alloc(*pool, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kMappingFailed) << r.status();
  EXPECT_EQ(d.done(BackendOp::kMap), 1);  // device 0's
  ExpectFullyUnwound(d);
  EXPECT_EQ(rig.backend.created_bytes(0), Bytes(0));
  EXPECT_EQ(rig.backend.created_bytes(1), Bytes(0));
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(Observable(*pool), before);

  // Out of memory on device 1's Create: same outcome, GPU_MEMORY_EXHAUSTED.
  rig.backend.AddFault(
      FaultRule{BackendOp::kCreate, FaultKind::kOutOfMemory, 1, 1});
  const CallDelta d2(rig.backend);
  r = Alloc(*pool, 4);
  EXPECT_EQ(GetReason(r.status()), FailureReason::kGpuMemoryExhausted)
      << r.status();
  ExpectFullyUnwound(d2);
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(Observable(*pool), before);

  // Healthy throughout: both devices map on the next try.
  ASSERT_OK_AND_ASSIGN(AllocResult ok, Alloc(*pool, 4));
  EXPECT_EQ(rig.backend.created_bytes(0), MiB(2));
  EXPECT_EQ(rig.backend.created_bytes(1), MiB(2));
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
}  // namespace kvbroker
