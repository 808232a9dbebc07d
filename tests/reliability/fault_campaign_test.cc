// Fault campaign: every backend call position fails once, and the pools
// recover as SPEC 6 says.
//
// A fixed workload over two pools of one Broker (host backend wrapped in
// FaultInjectingBackend; pool "a" on device 0 with nothing kept IDLE, pool
// "b" on devices 0 and 1 with a null block and two pages the background
// step keeps IDLE) is run once without faults to count the backend calls of
// each kind it makes: create, map, set access, unmap, release. Then, for
// every kind, every position n in 1..count and every failure (out of
// memory, a recoverable error, a fatal device error), the workload runs
// again on a fresh broker with the n-th call of that kind failing:
//
//   Sequential: before each call the pool's full Capacity snapshot (every
//   page in consumption order, counts, limit, mapped bytes) is taken; when
//   the fault fires inside a call, afterwards the pool is either exactly as
//   before (only its generation may differ) or FAILED, in which case
//   allocation is refused with POOL_FAILED; a fatal error also turns the
//   broker unhealthy. After every call the invariants hold and the backend
//   holds exactly the handles of the pools' mapped pages.
//
//   Concurrent: three threads run random calls on both pools while the
//   fault fires somewhere among them. Afterwards every pool passes
//   CheckInvariants, its allocated and reserved counts equal what the
//   threads' successful calls hold (a failed call changed nothing), those
//   blocks free cleanly unless the pool FAILED, and the backend's handles
//   are exactly the mapped pages'.
//
// Throughout, the backend's handles are exactly those the pools hold
// (PagePool::backend_handles) plus the broker's orphans.
//
// In both, deleting every pool with the faults cleared returns every handle.
// KVB_FAULT_CONCURRENT_EVERY=k runs the concurrent part at every k-th
// position (default 3); KVB_FAULT_ROUNDS repeats the concurrent part with
// other seeds (default 1).

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "allocator/broker.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

const BackendOp kOps[] = {BackendOp::kCreate, BackendOp::kMap,
                          BackendOp::kSetAccess, BackendOp::kUnmap,
                          BackendOp::kRelease};
const FaultKind kKinds[] = {FaultKind::kOutOfMemory, FaultKind::kError,
                            FaultKind::kFatal};

const char* OpName(BackendOp op) {
  switch (op) {
    case BackendOp::kCreate: return "create";
    case BackendOp::kMap: return "map";
    case BackendOp::kSetAccess: return "set_access";
    case BackendOp::kUnmap: return "unmap";
    case BackendOp::kRelease: return "release";
    default: return "other";
  }
}

const char* KindName(FaultKind k) {
  switch (k) {
    case FaultKind::kOutOfMemory: return "out_of_memory";
    case FaultKind::kError: return "error";
    case FaultKind::kFatal: return "fatal";
  }
  return "?";
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

// Everything a caller can observe of a pool but its generation.
std::string Observe(PagePool& pool) {
  CapacityQuery q;
  q.max_pages = 1 << 20;
  auto cap = pool.Capacity(q);
  if (!cap.ok()) return cap.status().ToString();
  const CapacitySnapshot& s = *cap;
  std::string out = absl::StrCat(
      "available ", s.available_blocks.value(), " reserved ",
      s.reserved_blocks.value(), " allocated ", s.allocated_blocks.value(),
      " total ", s.total_blocks.value(), " pages f/m/i/o/F/r/e ",
      s.pages_free.value(), "/", s.pages_mapping.value(), "/",
      s.pages_idle.value(), "/", s.pages_open.value(), "/",
      s.pages_full.value(), "/", s.pages_reclaimed.value(), "/",
      s.pages_empty.value(), " affordable ", s.affordable_bundles, " mapped ",
      s.mapped_bytes.value(), " limit ", static_cast<int>(s.limit.state), ",",
      s.limit.revision, ",", s.limit.target_pages.value(), " healthy ",
      s.healthy, "\n  pages");
  for (const PageInfo& p : s.pages) {
    absl::StrAppend(&out, " ", p.page_id, ":", PageStateName(p.state), ":",
                    p.free_blocks.value(), "/", p.allocated_blocks.value(), "/",
                    p.reserved_blocks.value(), p.counted ? "" : "u");
  }
  return out;
}

// A broker over host memory with two pools.
struct World {
  World() {
    HostBackendOptions o;
    o.device_count = 2;
    o.device_total = Bytes(512 * kMiB);
    host = std::make_unique<HostBackend>(o);
    backend = std::make_unique<FaultInjectingBackend>(host.get());
    BrokerOptions bo;
    bo.gpu_memory_utilization = 1.0;
    bo.min_idle_pages = 0;
    bo.max_idle_pages = 0;
    bo.start_worker = false;
    auto created = Broker::Create(backend.get(), bo);
    EXPECT_TRUE(created.ok()) << created.status();
    broker = *std::move(created);
    PoolConfig a;
    a.name = "a";
    a.page_size = Bytes(2 * kMiB);
    a.block_bytes = Bytes(kMiB);
    a.max_blocks = 24;
    a.min_idle_pages = 0;
    a.max_idle_pages = 1;
    PoolConfig b;
    b.name = "b";
    b.page_size = Bytes(4 * kMiB);
    b.block_bytes = Bytes(1536 * kKiB);
    b.devices = {0, 1};
    b.max_blocks = 20;
    b.reserve_null_block = true;
    b.min_idle_pages = 2;
    b.max_idle_pages = 2;
    for (const PoolConfig& c : {a, b}) {
      auto pool = broker->CreatePool(c);
      EXPECT_TRUE(pool.ok()) << pool.status();
      pools.push_back(*pool);
    }
  }

  // Handles the pools account for: mapped pages x devices.
  int64_t ExpectedHandles() {
    int64_t n = 0;
    for (const auto& pool : pools) {
      auto cap = pool->Capacity();
      if (!cap.ok()) continue;
      const int64_t mapped = cap->pages_idle.value() + cap->pages_open.value() +
                             cap->pages_full.value() +
                             cap->pages_mapping.value();
      n += mapped *
           static_cast<int64_t>(pool->geometry().config().devices.size());
    }
    return n;
  }

  // The backend holds exactly the handles of the pools' mapped pages while
  // every pool is healthy. A FAILED pool may count a page as mapped whose
  // unwinding released some of its handles before the failure, so then the
  // backend may hold fewer, never more: no handle a pool does not know.
  // (Teardown proves a FAILED pool still returns all it holds.)
  // And always exactly what the pools and the broker's orphans hold.
  std::string CheckHandles() {
    const int64_t expected = ExpectedHandles();
    bool all_healthy = true;
    int64_t held = broker->orphaned_handles();
    for (const auto& pool : pools) {
      all_healthy &= pool->healthy();
      held += pool->backend_handles();
    }
    const int64_t live = host->live_handles();
    if (live != held) {
      return absl::StrCat("backend holds ", live,
                          " handles; the pools and orphans hold ", held);
    }
    if (all_healthy ? live != expected : live > expected) {
      std::string pools_now;
      for (const auto& pool : pools) {
        absl::StrAppend(&pools_now, "\n ", pool->name(), ": ", Observe(*pool));
      }
      return absl::StrCat("backend holds ", host->live_handles(),
                          " handles; the pools' mapped pages account for ",
                          expected, pools_now);
    }
    return "";
  }

  // Deletes every pool with the faults cleared; "" when every handle and
  // every byte came back.
  std::string Teardown() {
    backend->ClearFaults();
    for (const auto& pool : pools) {
      absl::Status s = broker->DeletePool(pool->name(), /*force=*/true);
      if (!s.ok()) return "DeletePool: " + s.ToString();
    }
    pools.clear();
    if (host->live_handles() != 0) {
      return absl::StrCat(host->live_handles(),
                          " handles left after deleting every pool");
    }
    return "";
  }

  std::unique_ptr<HostBackend> host;
  std::unique_ptr<FaultInjectingBackend> backend;
  std::unique_ptr<Broker> broker;
  std::vector<std::shared_ptr<PagePool>> pools;
};

// What one actor holds in one pool.
struct Holdings {
  std::vector<int64_t> blocks;
  std::vector<std::pair<std::string, int64_t>> reservations;
};

// One random call on `pool`, updating `held` with what it returned.
// Returns a short description and the call's status.
absl::Status RandomCall(std::mt19937_64& rng, Broker& broker, PagePool& pool,
                        Holdings& held, std::string* what) {
  const int choice = static_cast<int>(rng() % 100);
  if (choice < 30) {
    AllocRequest r;
    r.num_blocks = 1 + rng() % 6;
    *what = absl::StrCat("Alloc(", r.num_blocks, ")");
    auto res = pool.Alloc(r);
    if (res.ok()) {
      for (const PageBlocks& pb : res->pages) {
        held.blocks.insert(held.blocks.end(), pb.block_ids.begin(),
                           pb.block_ids.end());
      }
    }
    return res.status();
  }
  if (choice < 55) {
    std::vector<int64_t> ids;
    const size_t k = held.blocks.empty() ? 0 : 1 + rng() % held.blocks.size();
    for (size_t i = 0; i < k; ++i) {
      const size_t at = rng() % held.blocks.size();
      ids.push_back(held.blocks[at]);
      held.blocks.erase(held.blocks.begin() + at);
    }
    *what = absl::StrCat("Free(", ids.size(), " blocks)");
    FreeRequest r;
    r.block_ids = ids;
    auto res = pool.Free(r);
    if (!res.ok())
      held.blocks.insert(held.blocks.end(), ids.begin(), ids.end());
    return res.status();
  }
  if (choice < 67) {
    ReserveRequest r;
    r.num_blocks = 1 + rng() % 4;
    r.ttl = absl::Hours(1);
    *what = absl::StrCat("Reserve(", r.num_blocks, ")");
    auto res = pool.Reserve(r);
    if (res.ok())
      held.reservations.push_back({res->reservation_id, r.num_blocks});
    return res.status();
  }
  if (choice < 75 && !held.reservations.empty()) {
    const auto [id, n] = held.reservations.back();
    held.reservations.pop_back();
    *what = "ReleaseReservation";
    auto res = pool.ReleaseReservation(id);
    if (!res.ok()) held.reservations.push_back({id, n});
    return res.status();
  }
  if (choice < 85) {
    const int64_t pages = rng() % 10;
    const int64_t bundle =
        pool.geometry().config().page_size.value() *
        static_cast<int64_t>(pool.geometry().config().devices.size());
    static std::atomic<int64_t> revision{0};
    *what = absl::StrCat("SetMemoryLimit(", pages, " pages)");
    return pool.SetMemoryLimit(Bytes(pages * bundle), ++revision).status();
  }
  if (choice < 92) {
    *what = "Trim";
    return pool.Trim(rng() % 3).status();
  }
  *what = "maintenance";
  broker.RunMaintenance();
  return absl::OkStatus();
}

// Frees everything `held` holds in a healthy pool; "" when it all came back.
std::string FreeAll(PagePool& pool, Holdings& held) {
  for (const auto& [id, n] : held.reservations) {
    auto res = pool.ReleaseReservation(id);
    if (!res.ok()) return "ReleaseReservation: " + res.status().ToString();
  }
  if (!held.blocks.empty()) {
    FreeRequest r;
    r.block_ids = held.blocks;
    auto res = pool.Free(r);
    if (!res.ok()) return "Free of held blocks: " + res.status().ToString();
  }
  held = {};
  return "";
}

constexpr int kSequentialCalls = 90;
constexpr uint64_t kSeed = 0x6661756c74;  // "fault"

struct SequentialOutcome {
  std::string error;  // "" on success
  bool fired = false;
  std::string fired_in;  // the call the fault fired in
  bool pool_failed = false;
  std::map<BackendOp, int64_t> calls;
};

// The workload, one call at a time, with `rule` armed (none when nth == 0).
SequentialOutcome RunSequential(const FaultRule* rule) {
  SequentialOutcome out;
  World w;
  if (rule != nullptr) w.backend->AddFault(*rule);
  std::mt19937_64 rng(kSeed);
  std::vector<Holdings> held(w.pools.size());
  for (int i = 0; i < kSequentialCalls && out.error.empty(); ++i) {
    const size_t p = rng() % w.pools.size();
    PagePool& pool = *w.pools[p];
    const std::string before = Observe(pool);
    const bool healthy_before = pool.healthy();
    const int64_t injected_before =
        rule == nullptr ? 0 : w.backend->injected(rule->op);
    std::string what;
    const absl::Status s = RandomCall(rng, *w.broker, pool, held[p], &what);
    const bool fired_now =
        rule != nullptr && w.backend->injected(rule->op) > injected_before;
    const std::string prefix =
        absl::StrCat("call ", i, " ", what, " on ", pool.name(), ": ");
    for (const auto& q : w.pools) {
      if (absl::Status inv = q->CheckInvariants(); !inv.ok()) {
        out.error =
            prefix + "invariants of " + q->name() + ": " + inv.ToString();
      }
    }
    if (out.error.empty()) out.error = w.CheckHandles();
    if (!out.error.empty()) {
      out.error = prefix + out.error;
      break;
    }
    if (!fired_now) continue;
    out.fired = true;
    out.fired_in = what;
    if (!pool.healthy()) {
      out.pool_failed = true;
      AllocRequest one;
      one.num_blocks = 1;
      const FailureReason r = GetReason(pool.Alloc(one).status());
      if (r != FailureReason::kPoolFailed) {
        out.error = prefix + "a FAILED pool answered Alloc with " +
                    std::string(ReasonName(r));
      }
    } else if (!s.ok()) {
      const std::string after = Observe(pool);
      if (healthy_before && after != before) {
        out.error = absl::StrCat(prefix, "failed (", s.ToString(),
                                 ") but changed the pool:\n before ", before,
                                 "\n after  ", after);
      }
    }
    if (rule->kind == FaultKind::kFatal && w.broker->healthy()) {
      out.error = prefix + "a fatal device error left the broker healthy";
    }
    if (!out.error.empty()) break;
  }
  for (BackendOp op : kOps) out.calls[op] = w.backend->calls(op);
  if (out.error.empty()) out.error = w.Teardown();
  return out;
}

TEST(FaultCampaign, EveryCallPositionSequential) {
  const SequentialOutcome clean = RunSequential(nullptr);
  ASSERT_EQ(clean.error, "");
  int64_t runs = 0, fired = 0, failed_pools = 0;
  std::map<std::string, int64_t> by_call;
  for (BackendOp op : kOps) {
    const int64_t count = clean.calls.at(op);
    ASSERT_GT(count, 0) << OpName(op) << ": the workload never makes this call";
    for (FaultKind kind : kKinds) {
      for (int64_t n = 1; n <= count; ++n) {
        FaultRule rule;
        rule.op = op;
        rule.kind = kind;
        rule.nth = n;
        const SequentialOutcome o = RunSequential(&rule);
        ASSERT_EQ(o.error, "")
            << OpName(op) << " #" << n << " " << KindName(kind);
        ++runs;
        if (o.fired) {
          ++fired;
          ++by_call[absl::StrCat(OpName(op), " in ", o.fired_in)];
        }
        if (o.pool_failed) ++failed_pools;
      }
    }
  }
  std::printf(
      "sequential: %lld runs, %lld faults fired, %lld left a pool "
      "FAILED\n",
      static_cast<long long>(runs), static_cast<long long>(fired),
      static_cast<long long>(failed_pools));
  for (BackendOp op : kOps) {
    std::printf("  %-10s %lld positions\n", OpName(op),
                static_cast<long long>(clean.calls.at(op)));
  }
  for (const auto& [what, n] : by_call) {
    std::printf("  fired: %-40s %lld\n", what.c_str(),
                static_cast<long long>(n));
  }
  // Faults armed on the same position of a deterministic workload fire
  // in every run whose earlier calls went the same way: at least the
  // first position of each kind always fires.
  EXPECT_GE(fired, static_cast<int64_t>(std::size(kOps) * std::size(kKinds)));
}

// The concurrent part: three threads, both pools, one fault somewhere.
std::string RunConcurrent(const FaultRule& rule, uint64_t seed, bool* fired) {
  World w;
  w.backend->AddFault(rule);
  constexpr int kThreads = 3;
  constexpr int kCallsPerThread = 40;
  std::vector<std::vector<Holdings>> held(
      kThreads, std::vector<Holdings>(w.pools.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 7 + t);
      for (int i = 0; i < kCallsPerThread; ++i) {
        const size_t p = rng() % w.pools.size();
        std::string what;
        (void)RandomCall(rng, *w.broker, *w.pools[p], held[t][p], &what);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  *fired = w.backend->injected(rule.op) > 0;
  for (size_t p = 0; p < w.pools.size(); ++p) {
    PagePool& pool = *w.pools[p];
    if (absl::Status s = pool.CheckInvariants(); !s.ok()) {
      return "invariants of " + pool.name() + ": " + s.ToString();
    }
    int64_t blocks = 0, reserved = 0;
    for (int t = 0; t < kThreads; ++t) {
      blocks += held[t][p].blocks.size();
      for (const auto& [id, n] : held[t][p].reservations) reserved += n;
    }
    auto cap = pool.Capacity();
    if (!cap.ok()) return "Capacity: " + cap.status().ToString();
    if (cap->allocated_blocks.value() != blocks ||
        cap->reserved_blocks.value() != reserved) {
      return absl::StrCat("pool ", pool.name(), " has ",
                          cap->allocated_blocks.value(), " allocated and ",
                          cap->reserved_blocks.value(),
                          " reserved; the callers' successful calls hold ",
                          blocks, " and ", reserved);
    }
  }
  if (std::string e = w.CheckHandles(); !e.empty()) return e;
  w.backend->ClearFaults();
  for (size_t p = 0; p < w.pools.size(); ++p) {
    if (!w.pools[p]->healthy()) continue;
    for (int t = 0; t < kThreads; ++t) {
      if (std::string e = FreeAll(*w.pools[p], held[t][p]); !e.empty()) {
        return w.pools[p]->name() + ": " + e;
      }
    }
  }
  if (std::string e = w.CheckHandles(); !e.empty()) return e;
  return w.Teardown();
}

TEST(FaultCampaign, EveryCallPositionUnderConcurrentLoad) {
  const int64_t every =
      std::max<int64_t>(1, EnvInt("KVB_FAULT_CONCURRENT_EVERY", 3));
  const int64_t rounds = std::max<int64_t>(1, EnvInt("KVB_FAULT_ROUNDS", 1));
  const SequentialOutcome clean = RunSequential(nullptr);
  ASSERT_EQ(clean.error, "");
  int64_t runs = 0, fired = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    for (BackendOp op : kOps) {
      for (FaultKind kind : kKinds) {
        for (int64_t n = 1; n <= clean.calls.at(op); n += every) {
          FaultRule rule;
          rule.op = op;
          rule.kind = kind;
          rule.nth = n;
          const uint64_t seed = kSeed + round * 1000003 + n;
          bool did_fire = false;
          const std::string error = RunConcurrent(rule, seed, &did_fire);
          ASSERT_EQ(error, "") << OpName(op) << " #" << n << " "
                               << KindName(kind) << " seed " << seed;
          ++runs;
          fired += did_fire;
        }
      }
    }
  }
  std::printf(
      "concurrent: %lld runs of 3 threads x 40 calls, %lld faults "
      "fired\n",
      static_cast<long long>(runs), static_cast<long long>(fired));
  EXPECT_GT(fired, 0);
}

// Deleting a pool while the backend fails an unmap or a release: the delete
// succeeds (the name is gone), and the pool's handles move to the broker's
// orphans, still charged to the device budget and counted by
// orphaned_handles(), until a maintenance pass releases them.
TEST(FaultCampaign, DeleteWithAFailingUnmapKeepsEveryHandle) {
  for (BackendOp op : {BackendOp::kUnmap, BackendOp::kRelease}) {
    for (FaultKind kind : kKinds) {
      SCOPED_TRACE(absl::StrCat(OpName(op), " ", KindName(kind)));
      World w;
      w.broker->RunMaintenance();  // pool b's IDLE pages, before counting
      AllocRequest r;
      r.num_blocks = 5;  // 3 pages of pool "a", one device
      ASSERT_TRUE(w.pools[0]->Alloc(r).ok());
      const int64_t a_handles = w.pools[0]->backend_handles();
      ASSERT_EQ(a_handles, 3);
      const int64_t b_handles = w.pools[1]->backend_handles();
      ASSERT_EQ(w.host->live_handles(), a_handles + b_handles);
      const Bytes charged_before = w.broker->budgets()->Snapshot(0).charged;
      FaultRule rule;
      rule.op = op;
      rule.kind = kind;
      w.backend->AddFault(rule);
      ASSERT_TRUE(w.broker->DeletePool("a", /*force=*/true).ok());
      EXPECT_EQ(GetReason(w.broker->GetPool("a").status()),
                FailureReason::kPoolNotFound);
      // One page (one handle) is still held, by the orphan, and charged.
      EXPECT_EQ(w.broker->orphaned_handles(), 1);
      EXPECT_EQ(w.host->live_handles(), b_handles + 1);
      EXPECT_EQ(w.broker->budgets()->Snapshot(0).charged.value(),
                charged_before.value() - 2 * 2 * kMiB);
      w.backend->ClearFaults();
      w.broker->RunMaintenance();
      EXPECT_EQ(w.broker->orphaned_handles(), 0);
      EXPECT_EQ(w.host->live_handles(), b_handles);
      EXPECT_EQ(w.broker->budgets()->Snapshot(0).charged.value(),
                charged_before.value() - 3 * 2 * kMiB);
      w.pools.erase(w.pools.begin());
      EXPECT_EQ(w.Teardown(), "");
    }
  }
}

// An Alloc whose mapping fails and whose rollback then fails to unmap a
// page it had mapped: the pool FAILS, keeps that page's handle (and its
// budget charge), and deleting the pool returns it.
TEST(FaultCampaign, RollbackWithAFailingUnmapKeepsEveryHandle) {
  for (BackendOp op : {BackendOp::kUnmap, BackendOp::kRelease}) {
    SCOPED_TRACE(OpName(op));
    World w;
    PagePool& a = *w.pools[0];
    const int64_t b_handles = w.pools[1]->backend_handles();
    const Bytes charged_before = w.broker->budgets()->Snapshot(0).charged;
    // 5 blocks: three fresh pages. The third page's create fails, so the
    // rollback unmaps the second and the first; the first of those fails.
    FaultRule create;
    create.op = BackendOp::kCreate;
    create.kind = FaultKind::kOutOfMemory;
    create.nth = 3;
    FaultRule undo;
    undo.op = op;
    undo.kind = FaultKind::kError;
    w.backend->AddFault(create);
    w.backend->AddFault(undo);
    AllocRequest r;
    r.num_blocks = 5;
    EXPECT_EQ(GetReason(a.Alloc(r).status()), FailureReason::kPoolFailed);
    EXPECT_FALSE(a.healthy());
    EXPECT_TRUE(a.CheckInvariants().ok());
    // The pool maps nothing, yet holds the page its rollback could not undo.
    EXPECT_EQ(a.backend_handles(), 1);
    EXPECT_EQ(w.host->live_handles(), b_handles + 1);
    EXPECT_EQ(w.broker->budgets()->Snapshot(0).charged.value(),
              charged_before.value() + 2 * kMiB);
    w.backend->ClearFaults();
    ASSERT_TRUE(w.broker->DeletePool("a", /*force=*/true).ok());
    EXPECT_EQ(w.broker->orphaned_handles(), 0);
    EXPECT_EQ(w.host->live_handles(), b_handles);
    EXPECT_EQ(w.broker->budgets()->Snapshot(0).charged.value(),
              charged_before.value());
    w.pools.erase(w.pools.begin());
    EXPECT_EQ(w.Teardown(), "");
  }
}

}  // namespace
}  // namespace kvbroker
