// Concurrent property test: over random geometries, several threads call one
// pool at once (Alloc, Free, Reserve, Alloc from a reservation, Release,
// Trim, SetMemoryLimit, PreallocStep, Capacity), so that mappings and unmaps
// run without the pool lock beside every other call. Then, single-threaded:
//   - CheckInvariants() is OK and no page is left in flight;
//   - the pool's books match what the threads hold: allocated and reserved
//     blocks, per page and in total, exactly the ids they were handed
//     (no id was ever handed to two holders);
//   - available_blocks equals the sum over the consumption-order page list
//     (free blocks of OPEN pages, IDLE pages, counted FREE pages);
//   - once everything is given back, capacity is exact (C14): Alloc(c + 1)
//     is refused with a capacity reason and no map call, Alloc(c) succeeds;
//   - the backend holds exactly the mapped pages, and nothing after
//     Shutdown.
// While the threads run, every refusal must carry a capacity reason: the
// only effect of another call's pages in flight is that they are not
// available. No timed assertions. Deterministic seeds, nondeterministic
// interleavings; runs under TSan too:
//   bazel test --config=tsan //allocator:concurrent_property_test

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/clock.h"
#include "allocator/device_budget.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "allocator/stretches.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

constexpr int kThreads = 4;
constexpr int kOpsPerThread = 150;
constexpr int kSeeds = 40;

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Ids held by some thread, and what went wrong.
class Books {
 public:
  void Take(const std::vector<BlockId>& ids, const std::string& how)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (BlockId b : ids) {
      if (!held_.insert(b).second) {
        Error(absl::StrCat(how, " handed out block ", b, ", already held"));
      }
    }
  }
  void Give(const std::vector<BlockId>& ids) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (BlockId b : ids) held_.erase(b);
  }
  void AddError(std::string e) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Error(std::move(e));
  }
  std::vector<std::string> errors() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  void Error(std::string e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (errors_.size() < 20) errors_.push_back(std::move(e));
  }
  absl::Mutex mu_;
  std::set<BlockId> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

struct Reservation {
  std::string id;
  std::vector<BlockId> blocks;  // ascending
};

class Caller {
 public:
  Caller(PagePool* pool, Books* books, std::atomic<int64_t>* revision,
         uint64_t seed)
      : pool_(pool), books_(books), revision_(revision), rng_(seed) {}

  void Run(int ops) {
    for (int i = 0; i < ops; ++i) Step();
  }

  // Gives everything back.
  void Drain() {
    FreeIds(allocated_);
    allocated_.clear();
    while (!reservations_.empty()) Release(reservations_.size() - 1);
  }

  const std::vector<BlockId>& allocated() const { return allocated_; }
  const std::vector<Reservation>& reservations() const { return reservations_; }

 private:
  void Check(bool ok, const std::string& what) {
    if (!ok) books_->AddError(what);
  }
  void CheckRefusal(const absl::Status& s, const std::string& what,
                    bool reservation = false) {
    const FailureReason r = GetReason(s);
    Check(IsCapacityReason(r) ||
              (reservation && r == FailureReason::kReservationTooSmall),
          absl::StrCat(what, " refused with ", s.ToString()));
  }

  void Step() {
    const int64_t op = Uniform(rng_, 0, 99);
    const int64_t per_page =
        std::max<int64_t>(1, pool_->geometry().page_size().value() /
                                 pool_->geometry().block_bytes().value());
    if (op < 30) {
      Alloc(Uniform(rng_, 0, 2) == 0 ? Uniform(rng_, 1, 4 * per_page)
                                     : Uniform(rng_, 0, 4));
    } else if (op < 52) {
      std::vector<BlockId> ids, keep;
      for (BlockId b : allocated_) {
        (Uniform(rng_, 0, 1) ? ids : keep).push_back(b);
      }
      std::shuffle(ids.begin(), ids.end(), rng_);
      FreeIds(ids);
      allocated_ = keep;
    } else if (op < 60) {
      Reserve(Uniform(rng_, 1, 2 * per_page));
    } else if (op < 66) {
      if (!reservations_.empty()) {
        AllocFromReservation(Uniform(rng_, 0, reservations_.size() - 1));
      }
    } else if (op < 72) {
      if (!reservations_.empty()) {
        Release(Uniform(rng_, 0, reservations_.size() - 1));
      }
    } else if (op < 77) {
      auto r = pool_->Trim(Uniform(rng_, 0, 3));
      Check(r.ok(), "Trim: " + r.status().ToString());
    } else if (op < 82) {
      pool_->PreallocStep();
    } else if (op < 86) {
      SetLimit();
    } else {
      auto c = pool_->Capacity();
      Check(c.ok() && c->healthy && c->available_blocks.value() >= 0,
            "Capacity failed or unhealthy");
    }
  }

  void Alloc(int64_t n) {
    AllocRequest req;
    req.num_blocks = n;
    auto r = pool_->Alloc(req);
    if (!r.ok())
      return CheckRefusal(r.status(), absl::StrCat("Alloc(", n, ")"));
    std::vector<BlockId> ids = AllBlockIds(*r);
    Check(static_cast<int64_t>(ids.size()) == n, "Alloc: wrong count");
    books_->Take(ids, "Alloc");
    allocated_.insert(allocated_.end(), ids.begin(), ids.end());
  }

  void FreeIds(const std::vector<BlockId>& ids) {
    if (ids.empty()) return;
    books_->Give(ids);
    FreeRequest req;
    // Half the time by runs alone (the attach session's form).
    BlockRuns runs;
    if (Uniform(rng_, 0, 1) == 0) {
      std::vector<BlockId> sorted = ids;
      std::sort(sorted.begin(), sorted.end());
      Stretches s;
      s.AppendIds(sorted);
      runs = s.AscendingRuns();
      req.block_runs = runs;
    } else {
      req.block_ids = ids;
    }
    auto r = pool_->Free(req);
    Check(r.ok() && r->freed_blocks == static_cast<int64_t>(ids.size()),
          "Free of held blocks: " +
              (r.ok() ? std::string("wrong count") : r.status().ToString()));
  }

  void Reserve(int64_t n) {
    ReserveRequest req;
    req.num_blocks = n;
    req.ttl = absl::Hours(1);  // the manual clock never moves
    auto r = pool_->Reserve(req);
    if (!r.ok()) {
      return CheckRefusal(r.status(), absl::StrCat("Reserve(", n, ")"));
    }
    std::vector<BlockId> ids = AllBlockIds(r->pages);
    std::sort(ids.begin(), ids.end());
    Check(static_cast<int64_t>(ids.size()) == n, "Reserve: wrong count");
    books_->Take(ids, "Reserve");
    reservations_.push_back({r->reservation_id, ids});
  }

  void AllocFromReservation(size_t i) {
    Reservation& h = reservations_[i];
    const int64_t size = h.blocks.size();
    const int64_t n = Uniform(rng_, 0, size + 3);
    AllocRequest req;
    req.num_blocks = n;
    req.reservation_id = h.id;
    auto r = pool_->Alloc(req);
    if (!r.ok()) {
      return CheckRefusal(r.status(), "Alloc(reservation)",
                          /*reservation=*/true);
    }
    std::vector<BlockId> ids = AllBlockIds(*r);
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
          "Alloc(reservation) took the wrong share of the reservation");
    books_->Take(fresh, "Alloc(reservation)");
    allocated_.insert(allocated_.end(), ids.begin(), ids.end());
    h.blocks.assign(mine.begin(), mine.end());
  }

  void Release(size_t i) {
    Reservation h = std::move(reservations_[i]);
    reservations_.erase(reservations_.begin() + i);
    books_->Give(h.blocks);
    auto r = pool_->ReleaseReservation(h.id);
    Check(r.ok() && r->released_blocks == static_cast<int64_t>(h.blocks.size()),
          "ReleaseReservation(" + h.id + ")");
  }

  void SetLimit() {
    const Geometry& g = pool_->geometry();
    const int64_t T = g.page_count().value();
    const int64_t unit = g.bundle_bytes().value() * g.device_count();
    const int64_t pages = Uniform(rng_, 0, 2) ? T : Uniform(rng_, T / 2, T);
    auto r =
        pool_->SetMemoryLimit(Bytes(pages * unit), revision_->fetch_add(1) + 1);
    Check(r.ok(), "SetMemoryLimit: " + r.status().ToString());
  }

  PagePool* const pool_;
  Books* const books_;
  std::atomic<int64_t>* const revision_;
  std::mt19937_64 rng_;
  std::vector<BlockId> allocated_;
  std::vector<Reservation> reservations_;
};

// One seed: a random pool, the threads, then the single-threaded checks.
void RunSeed(uint64_t seed) {
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  static const int64_t kPages[] = {2, 4, 14};
  const int64_t P = kPages[Uniform(rng, 0, 2)] * kMiB;
  const int64_t B =
      Uniform(rng, 0, 1) ? Uniform(rng, 64 * kKiB, P) : P / Uniform(rng, 1, 16);
  PoolConfig pc;
  pc.name = "c";
  pc.page_size = Bytes(P);
  pc.block_bytes = Bytes(B);
  pc.max_blocks = Uniform(rng, 8, 600);
  pc.reserve_null_block = Uniform(rng, 0, 4) == 0;
  pc.min_idle_pages = Uniform(rng, 0, 2);
  pc.max_idle_pages = Uniform(rng, pc.min_idle_pages, 3);
  const int64_t T = (pc.max_blocks * B + P - 1) / P;
  const int64_t budget_pages =
      Uniform(rng, 0, 1) ? T + 2 : Uniform(rng, 1, std::max<int64_t>(1, T));

  HostBackendOptions ho;
  ho.device_count = 1;
  ho.device_total = Bytes(budget_pages * P);
  ho.granularity = MiB(2);
  HostBackend host(ho);
  FaultInjectingBackend backend(&host);
  DeviceBudgets budgets(&backend, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  ManualClock clock;
  auto pool_or = PagePool::Create(pc, &backend, &budgets, &clock, {});
  ASSERT_TRUE(pool_or.ok()) << pool_or.status();
  PagePool& pool = **pool_or;

  Books books;
  std::atomic<int64_t> revision{0};
  std::vector<std::unique_ptr<Caller>> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.push_back(
        std::make_unique<Caller>(&pool, &books, &revision, seed * 131 + t));
  }
  {
    std::vector<std::thread> threads;
    for (auto& c : callers) {
      threads.emplace_back([c = c.get()] { c->Run(kOpsPerThread); });
    }
    for (auto& t : threads) t.join();
  }
  for (const std::string& e : books.errors()) ADD_FAILURE() << e;

  // Quiet now. The books must match what the threads hold.
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  const int64_t null_blocks = pc.reserve_null_block ? 1 : 0;
  std::map<PageId, int64_t> allocated_on, reserved_on;
  int64_t allocated = 0, reserved = 0;
  for (const auto& c : callers) {
    for (BlockId b : c->allocated()) {
      ++allocated_on[pool.geometry().page_of(b)];
      ++allocated;
    }
    for (const Reservation& r : c->reservations()) {
      for (BlockId b : r.blocks) {
        ++reserved_on[pool.geometry().page_of(b)];
        ++reserved;
      }
    }
  }
  auto cap = pool.Capacity({T + 1});
  ASSERT_TRUE(cap.ok()) << cap.status();
  EXPECT_TRUE(cap->healthy) << cap->failure;
  EXPECT_EQ(cap->pages_mapping.value(), 0);
  EXPECT_EQ(cap->allocated_blocks.value(), allocated);
  EXPECT_EQ(cap->reserved_blocks.value(), reserved);
  std::vector<PageId> all(T);
  for (PageId p = 0; p < T; ++p) all[p] = p;
  auto occupancy = pool.GetPageOccupancy(all);
  ASSERT_TRUE(occupancy.ok());
  for (const PageOccupancy& o : *occupancy) {
    const int64_t null_here = (o.page_id == 0) ? null_blocks : 0;
    EXPECT_EQ(o.allocated_blocks.value(), allocated_on[o.page_id] + null_here)
        << "page " << o.page_id;
    EXPECT_EQ(o.reserved_blocks.value(), reserved_on[o.page_id])
        << "page " << o.page_id;
  }
  int64_t listed = 0;
  for (const PageInfo& pi : cap->pages) {
    if (pi.state == PageState::kOpen) listed += pi.free_blocks.value();
    if (pi.state == PageState::kIdle) listed += pi.usable_blocks.value();
    if (pi.state == PageState::kFree && pi.counted) {
      listed += pi.usable_blocks.value();
    }
  }
  EXPECT_EQ(cap->available_blocks.value(), listed);
  const int64_t mapped = cap->pages_idle.value() + cap->pages_open.value() +
                         cap->pages_full.value();
  EXPECT_EQ(host.live_handles(), mapped);

  // Everything back, the limit lifted: capacity is exact.
  for (auto& c : callers) c->Drain();
  auto lifted =
      pool.SetMemoryLimit(Bytes(int64_t{1} << 50), revision.fetch_add(1) + 1);
  ASSERT_TRUE(lifted.ok()) << lifted.status();
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  cap = pool.Capacity();
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(cap->allocated_blocks.value(), 0);
  EXPECT_EQ(cap->reserved_blocks.value(), 0);
  const int64_t c = cap->available_blocks.value();
  const int64_t maps = backend.map_calls();
  AllocRequest too_many;
  too_many.num_blocks = c + 1;
  auto refused = pool.Alloc(too_many);
  ASSERT_FALSE(refused.ok()) << "Alloc(c+1) with c=" << c;
  EXPECT_TRUE(IsCapacityReason(GetReason(refused.status())))
      << refused.status();
  EXPECT_EQ(backend.map_calls(), maps);
  AllocRequest exact;
  exact.num_blocks = c;
  auto got = pool.Alloc(exact);
  ASSERT_TRUE(got.ok()) << "Alloc(c) with c=" << c << ": " << got.status();
  std::vector<BlockId> ids = AllBlockIds(*got);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), c);
  EXPECT_EQ(std::set<BlockId>(ids.begin(), ids.end()).size(), ids.size());
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  ASSERT_TRUE(pool.Shutdown(/*force=*/true).ok());
  EXPECT_EQ(host.live_handles(), 0);
}

TEST(ConcurrentPropertyTest, ThreadsOnOnePoolKeepBooksAndExactCapacity) {
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    RunSeed(0xc0ffee00 + seed);
    if (HasFatalFailure()) return;
  }
}

// Bounded lock hold (docs/design.md): a call that commits, validates a Free
// of or trims more than PoolOptions::step_pages pages releases the lock
// between steps of at most that many (eight here); a Free's return and a
// landing are one step each. Here a caller runs between every two
// steps (the pool's between_steps hook, on the stepping thread: a deterministic
// interleaving) and checks the pool there: the invariants hold, and Capacity is
// exact at that moment: Alloc(c + 1) is refused with a capacity reason and
// Alloc(c) succeeds (and is freed again).
struct Stepping {
  PagePool* pool = nullptr;
  bool inside = false;
  int64_t steps = 0;
  // Capacity's allocated blocks at each pause, before the caller's own
  // calls: the stepping call is shown not started until it is done.
  std::vector<int64_t> allocated;
  std::vector<std::string> errors;
};

void CheckBetweenSteps(Stepping* st) {
  if (st->pool == nullptr || st->inside) return;
  st->inside = true;  // the caller's own calls step too; not checked again
  ++st->steps;
  PagePool& pool = *st->pool;
  auto fail = [&](const std::string& what) {
    st->errors.push_back(absl::StrCat("step ", st->steps, ": ", what));
  };
  if (absl::Status s = pool.CheckInvariants(); !s.ok()) fail(s.ToString());
  auto cap = pool.Capacity();
  if (!cap.ok()) {
    fail(cap.status().ToString());
  } else {
    st->allocated.push_back(cap->allocated_blocks.value());
    const int64_t c = cap->available_blocks.value();
    AllocRequest more;
    more.num_blocks = c + 1;
    auto refused = pool.Alloc(more);
    if (refused.ok() || !IsCapacityReason(GetReason(refused.status()))) {
      fail(absl::StrCat("Alloc(c + 1) with c = ", c, " was not refused"));
    }
    AllocRequest exact;
    exact.num_blocks = c;
    auto got = pool.Alloc(exact);
    if (!got.ok()) {
      fail(
          absl::StrCat("Alloc(c) with c = ", c, ": ", got.status().ToString()));
    } else if (c > 0) {
      const std::vector<BlockId> ids = AllBlockIds(*got);
      FreeRequest back;
      back.block_ids = ids;
      if (auto f = pool.Free(back); !f.ok()) fail(f.status().ToString());
    }
    if (absl::Status s = pool.CheckInvariants(); !s.ok()) fail(s.ToString());
  }
  st->inside = false;
}

// A pool of 40 pages of 2 MiB, four blocks each, on one host device, with
// `between_steps` called between the steps of its long locked walks.
constexpr int64_t kStepPoolPages = 40, kStepBlocksPerPage = 4;
struct SteppedRig {
  SteppedRig(const std::string& name, int64_t max_idle_pages,
             std::function<void()> between_steps)
      : host(Options()), budgets(&host, 1.0) {
    if (absl::Status s = budgets.Init(); !s.ok()) {
      pool = s;
      return;
    }
    PoolConfig pc;
    pc.name = name;
    pc.page_size = MiB(2);
    pc.block_bytes = Bytes(MiB(2).value() / kStepBlocksPerPage);
    pc.max_blocks = kStepPoolPages * kStepBlocksPerPage;
    PoolOptions po;
    po.min_idle_pages = 0;
    po.max_idle_pages = max_idle_pages;
    po.step_pages = 8;  // the step counts below are in eights
    po.free_one_step_blocks = 0;
    po.between_steps = std::move(between_steps);
    pool = PagePool::Create(pc, &host, &budgets, &clock, po);
  }
  static HostBackendOptions Options() {
    HostBackendOptions ho;
    ho.device_count = 1;
    ho.device_total = MiB(2 * 200);
    ho.granularity = MiB(2);
    return ho;
  }
  HostBackend host;
  DeviceBudgets budgets;
  ManualClock clock;
  absl::StatusOr<std::unique_ptr<PagePool>> pool;
};

TEST(ConcurrentPropertyTest, CallerBetweenStepsSeesAnExactPool) {
  Stepping st;
  SteppedRig rig("steps", kStepPoolPages, [&st] { CheckBetweenSteps(&st); });
  ASSERT_TRUE(rig.pool.ok()) << rig.pool.status();
  PagePool& pool = **rig.pool;
  HostBackend& host = rig.host;
  constexpr int64_t kPages = kStepPoolPages, kPerPage = kStepBlocksPerPage;
  st.pool = &pool;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // 40 fresh pages committed eight at a time: 4 steps.
    st.steps = 0;
    st.allocated.clear();
    AllocRequest all;
    all.num_blocks = kPages * kPerPage;
    auto got = pool.Alloc(all);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->pages_mapped, kPages);
    EXPECT_EQ(st.steps, 4);
    EXPECT_EQ(st.allocated, std::vector<int64_t>(4, 0));  // not committed
    st.allocated.clear();
    // Their blocks validated eight pages at a time (4 pauses), then
    // returned in one step (1 pause before it); every page stays IDLE.
    st.steps = 0;
    const std::vector<BlockId> ids = AllBlockIds(*got);
    FreeRequest back;
    back.block_ids = ids;
    auto freed = pool.Free(back);
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_EQ(freed->freed_blocks, kPages * kPerPage);
    EXPECT_EQ(st.steps, 5);
    EXPECT_EQ(st.allocated, std::vector<int64_t>(5, kPages * kPerPage));
    st.allocated.clear();
    // Trimmed: taken eight at a time (4 pauses), landed in one step.
    st.steps = 0;
    auto trimmed = pool.Trim();
    ASSERT_TRUE(trimmed.ok()) << trimmed.status();
    EXPECT_EQ(trimmed->pages_unmapped, kPages);
    EXPECT_EQ(st.steps, 4);
    EXPECT_EQ(st.allocated, std::vector<int64_t>(4, 0));
    st.allocated.clear();
    for (const std::string& e : st.errors) ADD_FAILURE() << e;
    st.errors.clear();
    // A caller between the steps may have mapped FREE pages for its own
    // Alloc(c) and left them IDLE; trimmed without it, the pool is empty.
    st.pool = nullptr;
    ASSERT_TRUE(pool.Trim().ok());
    st.pool = &pool;
    ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
    auto cap = pool.Capacity();
    ASSERT_TRUE(cap.ok());
    EXPECT_EQ(cap->available_blocks.value(), kPages * kPerPage);
    EXPECT_EQ(cap->allocated_blocks.value(), 0);
    EXPECT_EQ(cap->pages_free.value(), kPages);
    EXPECT_EQ(host.live_handles(), 0);
  }
  st.pool = nullptr;
}

// Two Frees of the same ids while the first steps (the waiting rule): one
// frees them, the other is refused with BLOCK_NOT_ALLOCATED, never both;
// meanwhile a third thread checks the invariants between the steps.
TEST(ConcurrentPropertyTest, TwoFreesOfTheSameIdsFreeThemOnce) {
  // Half the pages stay IDLE; the rest are unmapped by the Free.
  SteppedRig rig("twice", kStepPoolPages / 2, nullptr);
  ASSERT_TRUE(rig.pool.ok()) << rig.pool.status();
  PagePool& pool = **rig.pool;
  HostBackend& host = rig.host;
  constexpr int64_t kPages = kStepPoolPages, kPerPage = kStepBlocksPerPage;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> bad_invariants{0};
  std::thread checker([&] {
    while (!stop.load()) {
      if (!pool.CheckInvariants().ok()) ++bad_invariants;
      auto c = pool.Capacity();
      if (!c.ok() || c->allocated_blocks.value() > kPages * kPerPage) {
        ++bad_invariants;
      }
    }
  });
  for (int round = 0; round < 50; ++round) {
    AllocRequest all;
    all.num_blocks = kPages * kPerPage;
    auto got = pool.Alloc(all);
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<BlockId> ids = AllBlockIds(*got);
    FreeRequest back;
    back.block_ids = ids;
    // The second names them by runs alone: the same waiting rule.
    FreeRequest by_runs;
    const std::vector<int64_t> runs = {ids.front(),
                                       static_cast<int64_t>(ids.size())};
    ASSERT_EQ(ids.back() - ids.front() + 1, static_cast<BlockId>(ids.size()));
    by_runs.block_runs = runs;
    absl::StatusOr<FreeResult> results[2];
    std::thread a([&] { results[0] = pool.Free(back); });
    std::thread b([&] { results[1] = pool.Free(by_runs); });
    a.join();
    b.join();
    int ok = 0;
    for (const auto& r : results) {
      if (r.ok()) {
        ++ok;
        EXPECT_EQ(r->freed_blocks, kPages * kPerPage);
      } else {
        EXPECT_EQ(GetReason(r.status()), FailureReason::kBlockNotAllocated)
            << r.status();
      }
    }
    EXPECT_EQ(ok, 1) << "round " << round;
    auto cap = pool.Capacity();
    ASSERT_TRUE(cap.ok());
    EXPECT_EQ(cap->allocated_blocks.value(), 0);
    ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  }
  stop = true;
  checker.join();
  EXPECT_EQ(bad_invariants.load(), 0);
  ASSERT_TRUE(pool.Shutdown(/*force=*/true).ok());
  EXPECT_EQ(host.live_handles(), 0);
}

}  // namespace
}  // namespace kvbroker
