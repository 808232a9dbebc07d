// The rig and checked calls shared by the product's acceptance scenarios
// (rows G1.., C1.., P1.., R1.., V1.., S1.., L1..: one test per row, driven
// through the allocator's C++ API), which live in allocator/scenarios_test.cc
// (geometry, capacity, arguments), scenarios_walk_test.cc (C14's random
// walks), scenarios_faults_test.cc (budget, rollback) and
// scenarios_limits_test.cc (memory limits): one binary, scenarios_test.
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

#ifndef KVBROKER_ALLOCATOR_SCENARIOS_RIG_H_
#define KVBROKER_ALLOCATOR_SCENARIOS_RIG_H_

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

namespace kvbroker::scenarios {

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
inline const Bytes kDeviceTotal(80 * kGiB);

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

inline PoolConfig Geo(Bytes page, Bytes block, int64_t max_blocks) {
  PoolConfig c;
  c.name = "pool";
  c.page_size = page;
  c.block_bytes = block;
  c.max_blocks = max_blocks;
  return c;
}

// Prealloc idle: no page is mapped or kept mapped behind the test's back.
inline PoolOptions Quiet(int64_t min_idle = 0, int64_t max_idle = 0) {
  PoolOptions o;
  o.min_idle_pages = min_idle;
  o.max_idle_pages = max_idle;
  return o;
}

inline absl::StatusOr<std::unique_ptr<PagePool>> MakePool(
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

inline absl::StatusOr<AllocResult> Alloc(
    PagePool& pool, int64_t n, const std::string& request_id = "",
    const std::string& reservation_id = "") {
  AllocRequest r;
  r.num_blocks = n;
  r.request_id = request_id;
  r.reservation_id = reservation_id;
  return Checked(pool, pool.Alloc(r));
}

inline absl::StatusOr<FreeResult> Free(PagePool& pool,
                                       std::vector<BlockId> ids) {
  FreeRequest r;
  r.block_ids = std::move(ids);
  return Checked(pool, pool.Free(r));
}

inline absl::StatusOr<ReservationInfo> Reserve(
    PagePool& pool, int64_t n, absl::Duration ttl = absl::Seconds(30)) {
  ReserveRequest r;
  r.num_blocks = n;
  r.ttl = ttl;
  return Checked(pool, pool.Reserve(r));
}

inline absl::StatusOr<ReleaseResult> Release(PagePool& pool,
                                             const std::string& id) {
  return Checked(pool, pool.ReleaseReservation(id));
}

inline absl::StatusOr<LimitResult> Limit(PagePool& pool, Bytes bytes,
                                         int64_t revision) {
  return Checked(pool, pool.SetMemoryLimit(bytes, revision));
}

inline CapacitySnapshot Cap(PagePool& pool, int64_t max_pages = 0) {
  CapacityQuery q;
  q.max_pages = max_pages;
  absl::StatusOr<CapacitySnapshot> c = pool.Capacity(q);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : CapacitySnapshot{};
}

inline int64_t Available(PagePool& pool) {
  return Cap(pool).available_blocks.value();
}

inline std::vector<BlockId> Ids(const std::vector<PageBlocks>& pages) {
  std::vector<BlockId> out;
  for (const PageBlocks& pb : pages) {
    out.insert(out.end(), pb.block_ids.begin(), pb.block_ids.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}
inline std::vector<BlockId> Ids(const AllocResult& r) { return Ids(r.pages); }
inline std::vector<BlockId> Ids(const ReservationInfo& r) {
  return Ids(r.pages);
}

// page id -> block ids, as the reply groups them.
inline std::map<PageId, std::vector<BlockId>> ByPage(const AllocResult& r) {
  std::map<PageId, std::vector<BlockId>> out;
  for (const PageBlocks& pb : r.pages) {
    EXPECT_EQ(out.count(pb.page_id), 0u) << "page listed twice";
    out[pb.page_id] = pb.block_ids;
  }
  return out;
}

inline std::string Meta(const absl::Status& s, const std::string& key) {
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

inline PageState StateOf(PagePool& pool, PageId p) {
  absl::StatusOr<std::vector<PageOccupancy>> o = pool.GetPageOccupancy({p});
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? (*o)[0].state : PageState::kFree;
}

// Everything a failed call must leave as it was: counts, pages in
// consumption order with their flags, the occupancy of every page, the limit
// and the generation. (Device budget snapshots are left out: a mapping
// failure refreshes the driver's view by design.)
inline std::string Observable(PagePool& pool) {
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
inline void ExpectFullyUnwound(const CallDelta& d) {
  EXPECT_EQ(d.calls(BackendOp::kUnmap), d.done(BackendOp::kMap));
  EXPECT_EQ(d.calls(BackendOp::kRelease), d.done(BackendOp::kCreate));
}

}  // namespace kvbroker::scenarios

#endif  // KVBROKER_ALLOCATOR_SCENARIOS_RIG_H_
