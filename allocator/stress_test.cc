// Multi-threaded stress test of the allocator core through a Broker with its
// background worker running (prealloc, reservation expiry, budget refresh).
//
// Eight threads allocate, free, reserve, allocate from their reservations,
// release, set memory limits, trim and read capacity at random, for a bounded
// number of iterations, over several pools that share two devices with a
// tight budget (so GPU_MEMORY_EXHAUSTED and deferred limits happen). Checks:
//   - no block id is ever held by two threads at once (a global set of held
//     (pool, block) pairs guarded by a mutex: ids are inserted after the call
//     that handed them out returns and removed before the call that gives
//     them back);
//   - every id handed out is usable in its pool's geometry;
//   - every Free / ReleaseReservation of held ids succeeds;
//   - every refusal carries a documented reason, never POOL_FAILED, an
//     untyped error, or MAPPING_FAILED;
//   - CheckInvariants() is OK whenever a thread checks it, and at the end;
//   - once quiet (everything given back, worker stopped), capacity is exact
//     for every pool: Alloc(c + 1) is refused with no backend map call, then
//     Alloc(c) succeeds;
//   - after the broker is gone the backend holds no physical allocation.
// There are no timed assertions. Runs under TSan:
//   bazel test --config=tsan //allocator:stress_test

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/broker.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

#if defined(__SANITIZE_THREAD__)
#define KVB_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVB_UNDER_TSAN 1
#endif
#endif

#ifdef KVB_UNDER_TSAN
constexpr int kIterations = 6000;
#else
constexpr int kIterations = 10000;
#endif
constexpr int kThreads = 8;

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

PoolConfig Pool(std::string name, int64_t page, int64_t block, int64_t n,
                std::vector<int> devices, bool null_block = false) {
  PoolConfig c;
  c.name = std::move(name);
  c.page_size = Bytes(page);
  c.block_bytes = Bytes(block);
  c.max_blocks = n;
  c.devices = std::move(devices);
  c.reserve_null_block = null_block;
  c.tokens_per_block = 16;
  return c;
}

// What every thread shares: the pools and the set of held ids.
class Shared {
 public:
  std::vector<std::shared_ptr<PagePool>> pools;
  std::vector<std::unique_ptr<std::atomic<int64_t>>> revisions;

  // Records that the calling thread now holds `ids` of pool `p`; an id
  // already held by someone is an error.
  void Take(int p, const std::vector<BlockId>& ids, const char* how)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (BlockId b : ids) {
      if (!held_.insert({p, b}).second) {
        AddErrorLocked(absl::StrCat(how, " handed out block ", b, " of pool ",
                                    pools[p]->name(),
                                    " which is already held"));
      }
    }
  }
  // Records that the calling thread is about to give `ids` back.
  void Give(int p, const std::vector<BlockId>& ids) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (BlockId b : ids) {
      if (held_.erase({p, b}) != 1) {
        AddErrorLocked(absl::StrCat("test bug: giving back unheld block ", b));
      }
    }
  }
  void AddError(std::string e) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    AddErrorLocked(std::move(e));
  }
  std::vector<std::string> errors() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  size_t held() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }

 private:
  void AddErrorLocked(std::string e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (errors_.size() < 50) errors_.push_back(std::move(e));
  }

  absl::Mutex mu_;
  std::set<std::pair<int, BlockId>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

// One thread's view: what it holds.
class Worker {
 public:
  Worker(Shared* shared, uint64_t seed)
      : s_(shared), rng_(seed), owned_(shared->pools.size()) {}

  void Run(int iterations) {
    for (int i = 0; i < iterations; ++i) Step();
  }

  // What happened, by operation and outcome (to show the paths were taken).
  const std::map<std::string, int64_t>& counts() const { return counts_; }

  // Gives everything back.
  void Drain() {
    for (int p = 0; p < static_cast<int>(owned_.size()); ++p) {
      FreeIds(p, owned_[p]);
      owned_[p].clear();
    }
    while (!reservations_.empty()) Release(reservations_.size() - 1);
  }

 private:
  struct Held {
    int pool;
    std::string id;
    std::vector<BlockId> blocks;  // ascending
  };

  PagePool& pool(int p) { return *s_->pools[p]; }

  void Check(bool ok, const std::string& what) {
    if (!ok) s_->AddError(what);
  }

  void Count(const std::string& op, const absl::Status& st) {
    ++counts_[absl::StrCat(op, "->",
                           st.ok() ? "OK" : ReasonName(GetReason(st)))];
  }

  void CheckRefusal(const absl::Status& st, const std::string& what,
                    bool reservation = false) {
    const FailureReason r = GetReason(st);
    const bool fine = IsCapacityReason(r) ||
                      (reservation && r == FailureReason::kReservationTooSmall);
    Check(fine, absl::StrCat(what, " refused with ", st.ToString()));
  }

  void CheckUsable(int p, const std::vector<BlockId>& ids,
                   const std::string& what) {
    for (BlockId b : ids) {
      Check(pool(p).geometry().is_usable_block(b),
            absl::StrCat(what, " handed out unusable block ", b));
    }
  }

  void Step() {
    const int p = static_cast<int>(Uniform(rng_, 0, s_->pools.size() - 1));
    const int64_t op = Uniform(rng_, 0, 99);
    if (op < 30) {
      Alloc(p, Uniform(rng_, 0, 12));
    } else if (op < 55) {
      if (owned_[p].empty()) return Alloc(p, Uniform(rng_, 1, 6));
      std::vector<BlockId> ids, keep;
      const bool all = Uniform(rng_, 0, 3) == 0;
      for (BlockId b : owned_[p]) {
        (all || Uniform(rng_, 0, 1) ? ids : keep).push_back(b);
      }
      std::shuffle(ids.begin(), ids.end(), rng_);
      FreeIds(p, ids);
      owned_[p] = keep;
    } else if (op < 63) {
      Reserve(p, Uniform(rng_, 1, 8));
    } else if (op < 70) {
      if (!reservations_.empty()) {
        AllocFromReservation(Uniform(rng_, 0, reservations_.size() - 1));
      }
    } else if (op < 76) {
      if (!reservations_.empty()) {
        Release(Uniform(rng_, 0, reservations_.size() - 1));
      }
    } else if (op < 82) {
      SetLimit(p);
    } else if (op < 86) {
      auto r = pool(p).Trim(Uniform(rng_, 0, 2));
      Check(r.ok(), "Trim failed: " + r.status().ToString());
    } else if (op < 98) {
      auto c = pool(p).Capacity();
      Check(c.ok() && c->available_blocks.value() >= 0 && c->healthy,
            "Capacity failed or pool unhealthy");
    } else {
      absl::Status inv = pool(p).CheckInvariants();
      Check(inv.ok(), "CheckInvariants: " + inv.ToString());
    }
  }

  void Alloc(int p, int64_t n) {
    AllocRequest req;
    req.num_blocks = n;
    auto r = pool(p).Alloc(req);
    Count("Alloc", r.status());
    if (!r.ok())
      return CheckRefusal(r.status(), absl::StrCat("Alloc(", n, ")"));
    std::vector<BlockId> ids = AllBlockIds(*r);
    Check(static_cast<int64_t>(ids.size()) == n, "Alloc returned wrong count");
    CheckUsable(p, ids, "Alloc");
    s_->Take(p, ids, "Alloc");
    owned_[p].insert(owned_[p].end(), ids.begin(), ids.end());
  }

  void FreeIds(int p, const std::vector<BlockId>& ids) {
    if (ids.empty()) return;
    s_->Give(p, ids);
    FreeRequest req;
    req.block_ids = ids;
    auto r = pool(p).Free(req);
    Check(r.ok() && r->freed_blocks == static_cast<int64_t>(ids.size()),
          absl::StrCat(
              "Free of ", ids.size(), " held blocks of pool ", pool(p).name(),
              " failed: ", r.ok() ? "wrong count" : r.status().ToString()));
  }

  void Reserve(int p, int64_t n) {
    ReserveRequest req;
    req.num_blocks = n;
    req.ttl = absl::Hours(1);  // nothing expires during the test
    auto r = pool(p).Reserve(req);
    Count("Reserve", r.status());
    if (!r.ok()) {
      return CheckRefusal(r.status(), absl::StrCat("Reserve(", n, ")"));
    }
    std::vector<BlockId> ids = AllBlockIds(r->pages);
    std::sort(ids.begin(), ids.end());
    Check(static_cast<int64_t>(ids.size()) == n, "Reserve: wrong count");
    CheckUsable(p, ids, "Reserve");
    s_->Take(p, ids, "Reserve");
    reservations_.push_back({p, r->reservation_id, ids});
  }

  void AllocFromReservation(size_t i) {
    Held& h = reservations_[i];
    const int64_t size = h.blocks.size();
    const int64_t n = Uniform(rng_, 0, 3) ? Uniform(rng_, 0, size)
                                          : Uniform(rng_, size + 1, size + 4);
    AllocRequest req;
    req.num_blocks = n;
    req.reservation_id = h.id;
    auto r = pool(h.pool).Alloc(req);
    Count("AllocFromReservation", r.status());
    if (!r.ok()) {
      return CheckRefusal(
          r.status(), absl::StrCat("Alloc(", n, ", reservation of ", size, ")"),
          /*reservation=*/true);
    }
    std::vector<BlockId> ids = AllBlockIds(*r);
    Check(static_cast<int64_t>(ids.size()) == n,
          "Alloc(reservation) returned wrong count");
    CheckUsable(h.pool, ids, "Alloc(reservation)");
    // Ids from the reservation are already ours; the rest are new.
    std::set<BlockId> mine(h.blocks.begin(), h.blocks.end());
    std::vector<BlockId> fresh;
    int64_t from_reservation = 0;
    for (BlockId b : ids) {
      if (mine.erase(b)) {
        ++from_reservation;
      } else {
        fresh.push_back(b);
      }
    }
    Check(from_reservation == std::min(n, size),
          absl::StrCat("Alloc(", n, ", reservation of ", size, ") took ",
                       from_reservation, " of the reservation's blocks"));
    s_->Take(h.pool, fresh, "Alloc(reservation)");
    owned_[h.pool].insert(owned_[h.pool].end(), ids.begin(), ids.end());
    h.blocks.assign(mine.begin(), mine.end());
    // An emptied reservation is forgotten (whether the pool keeps it is not
    // documented).
    if (h.blocks.empty()) reservations_.erase(reservations_.begin() + i);
  }

  void Release(size_t i) {
    Held h = std::move(reservations_[i]);
    reservations_.erase(reservations_.begin() + i);
    s_->Give(h.pool, h.blocks);
    auto r = pool(h.pool).ReleaseReservation(h.id);
    Check(r.ok() && r->released_blocks == static_cast<int64_t>(h.blocks.size()),
          absl::StrCat("ReleaseReservation(", h.id, ") of ", h.blocks.size(),
                       " blocks failed: ",
                       r.ok() ? absl::StrCat("released ", r->released_blocks)
                              : r.status().ToString()));
  }

  void SetLimit(int p) {
    const Geometry& g = pool(p).geometry();
    const int64_t T = g.page_count().value();
    const int64_t unit = g.bundle_bytes().value() * g.device_count();
    // Mostly generous limits so that pools do not stay shrunk for long.
    const int64_t pages = Uniform(rng_, 0, 9) < 6 ? T : Uniform(rng_, T / 4, T);
    const int64_t rev = s_->revisions[p]->fetch_add(1) + 1;
    auto r = pool(p).SetMemoryLimit(Bytes(pages * unit), rev);
    Check(r.ok(), "SetMemoryLimit failed: " + r.status().ToString());
    if (r.ok())
      ++counts_[absl::StrCat("Limit->", LimitOutcomeName(r->outcome))];
  }

  Shared* const s_;
  std::mt19937_64 rng_;
  std::vector<std::vector<BlockId>> owned_;  // per pool, allocated
  std::vector<Held> reservations_;
  std::map<std::string, int64_t> counts_;
};

TEST(StressTest, ConcurrentOperationsKeepOwnershipAndExactCapacity) {
  HostBackendOptions ho;
  ho.device_count = 2;
  ho.device_total = Bytes(256 * kMiB);  // tight: pools compete for pages
  HostBackend host(ho);
  FaultInjectingBackend backend(&host);
  {
    BrokerOptions bo;
    bo.gpu_memory_utilization = 1.0;
    bo.min_idle_pages = 1;
    bo.max_idle_pages = 2;
    bo.start_worker = true;
    bo.worker_interval = absl::Milliseconds(1);
    bo.budget_refresh_interval = absl::Milliseconds(5);
    auto broker_or = Broker::Create(&backend, bo);
    ASSERT_TRUE(broker_or.ok()) << broker_or.status();
    std::unique_ptr<Broker> broker = std::move(*broker_or);

    Shared shared;
    const std::vector<PoolConfig> configs = {
        Pool("a", 2 * kMiB, 512 * kKiB, 256, {0}),            // 4 per page
        Pool("b", 4 * kMiB, 1536 * kKiB, 200, {0, 1}, true),  // straddling
        Pool("c", 2 * kMiB, 16 * kKiB, 4096, {1}),            // 128 per page
        Pool("d", 14 * kMiB, 6 * kMiB, 60, {0}),              // C1's geometry
        Pool("e", 2 * kMiB, 768 * kKiB, 120, {1}, true),
    };
    for (const PoolConfig& c : configs) {
      auto pool = broker->CreatePool(c);
      ASSERT_TRUE(pool.ok()) << c.name << ": " << pool.status();
      shared.pools.push_back(*pool);
      shared.revisions.push_back(std::make_unique<std::atomic<int64_t>>(0));
    }

    std::vector<std::unique_ptr<Worker>> workers;
    for (int t = 0; t < kThreads; ++t) {
      workers.push_back(std::make_unique<Worker>(&shared, 1000 + t));
    }
    {
      std::vector<std::thread> threads;
      for (auto& w : workers) {
        threads.emplace_back([w = w.get()] { w->Run(kIterations); });
      }
      for (auto& t : threads) t.join();
    }
    // Drain concurrently too, while the worker still runs.
    {
      std::vector<std::thread> threads;
      for (auto& w : workers) {
        threads.emplace_back([w = w.get()] { w->Drain(); });
      }
      for (auto& t : threads) t.join();
    }
    EXPECT_EQ(shared.held(), 0u);
    broker->StopWorker();
    // The worker's last budget refresh may have read the driver while a
    // page was charged but not yet created, which leaves the budget one
    // bundle too generous until the next refresh (docs/design.md, "Device
    // budgets"). The exactness checked below is that of a quiet machine, so
    // the view is refreshed once everything has stopped.
    ASSERT_TRUE(broker->budgets()->RefreshAll().ok());
    std::map<std::string, int64_t> counts;
    for (auto& w : workers) {
      for (const auto& [k, v] : w->counts()) counts[k] += v;
    }
    std::string summary;
    for (const auto& [k, v] : counts) absl::StrAppend(&summary, " ", k, "=", v);
    int64_t prealloc = 0;
    for (auto& pool : shared.pools)
      prealloc += pool->Stats().prealloc_pages_total;
    std::cout << "outcomes:" << summary << " prealloc_pages=" << prealloc
              << "\n";

    for (const std::string& e : shared.errors()) ADD_FAILURE() << e;

    // Quiet: every pool is empty, its invariants hold, and capacity is exact.
    for (size_t p = 0; p < shared.pools.size(); ++p) {
      PagePool& pool = *shared.pools[p];
      SCOPED_TRACE(pool.name());
      // Lift any limit a thread left behind.
      auto lim = pool.SetMemoryLimit(Bytes(int64_t{1} << 50),
                                     shared.revisions[p]->fetch_add(1) + 1);
      ASSERT_TRUE(lim.ok()) << lim.status();
      EXPECT_EQ(lim->outcome, LimitOutcome::kApplied);
      EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
      auto cap = pool.Capacity();
      ASSERT_TRUE(cap.ok()) << cap.status();
      EXPECT_TRUE(cap->healthy) << cap->failure;
      EXPECT_EQ(cap->allocated_blocks.value(), 0);
      EXPECT_EQ(cap->reserved_blocks.value(), 0);
      EXPECT_EQ(cap->pages_open.value() + cap->pages_full.value(),
                pool.geometry().config().reserve_null_block ? 1 : 0);
    }
    for (size_t p = 0; p < shared.pools.size(); ++p) {
      PagePool& pool = *shared.pools[p];
      SCOPED_TRACE(pool.name());
      auto cap = pool.Capacity();
      ASSERT_TRUE(cap.ok());
      const int64_t c = cap->available_blocks.value();
      const int64_t maps = backend.map_calls();
      AllocRequest too_many;
      too_many.num_blocks = c + 1;
      auto refused = pool.Alloc(too_many);
      ASSERT_FALSE(refused.ok()) << "Alloc(c+1) with c=" << c << " succeeded";
      EXPECT_TRUE(IsCapacityReason(GetReason(refused.status())))
          << refused.status();
      EXPECT_EQ(backend.map_calls(), maps) << "Alloc(c+1) made map calls";
      AllocRequest exact;
      exact.num_blocks = c;
      auto got = pool.Alloc(exact);
      ASSERT_TRUE(got.ok()) << "Alloc(c) with c=" << c << ": " << got.status();
      std::vector<BlockId> ids = AllBlockIds(*got);
      EXPECT_EQ(static_cast<int64_t>(ids.size()), c);
      EXPECT_EQ(std::set<BlockId>(ids.begin(), ids.end()).size(), ids.size());
      EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
      FreeRequest fr;
      fr.block_ids = ids;
      auto freed = pool.Free(fr);
      EXPECT_TRUE(freed.ok()) << freed.status();
      EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
    }
    shared.pools.clear();
  }  // the broker shuts every pool down
  EXPECT_EQ(host.live_handles(), 0);
  EXPECT_EQ(host.created_bytes(0).value(), 0);
  EXPECT_EQ(host.created_bytes(1).value(), 0);
}

}  // namespace
}  // namespace kvbroker
