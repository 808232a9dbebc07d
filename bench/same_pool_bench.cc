// same_pool_bench: how much a mapping Alloc slows the other callers of the
// same pool (host or CUDA backend, chosen as in mapping_bench).
//
// Pool X has 2 MiB pages of 32 blocks. A keeper holds 16 blocks of page 0
// all along; the measured loop holds the other 16 between its calls, so page
// 0 is FULL whenever the mapper looks and the measured calls do not map:
//   measured  a loop that alternates Capacity() and Free of its 16 blocks +
//             Alloc(16) (served from page 0 again); p50 / p99 of each;
//   mapper    a second thread that runs Alloc(64 pages' worth of blocks),
//             which maps 64 fresh pages into pool X, then Frees them (they
//             stay IDLE) and Trims them (unmapped again), over and over.
// Should the mapper's Alloc land in the few microseconds between the
// measured Free and Alloc, it takes page 0's blocks and the measured Alloc
// maps a page; such iterations are counted and reported.
// The measured loop pauses --interval_us between iterations, so that its
// calls arrive at moments spread over the mapper's cycle: a call that lands
// while the mapper holds the pool lock waits for it. (Back to back, one slow
// call per held lock would be outnumbered by thousands of fast ones and stay
// below the p99.)
// Each Free + Alloc(16) is also classed by whether it found the pool lock
// held (SpinThenLock::contended_on_this_thread): the share that did and the
// p50 / p99 of each class tell a tail made of waits from one made of the
// pool's cache lines, written by the mapper's core, read by the measured one.
// Phases: idle (no mapper) for half the time, busy (mapper running) for the
// full time, idle again for half; the two idle halves are pooled, so drift
// hits idle and busy alike. The last lines are the ratios the project tracks:
// busy p99 / idle p99 for Capacity and for Alloc(16)+Free (target <= 1.2).
//
// --control repeats the three phases with a control thread in place of the
// mapper: it makes the same driver calls (create, map and set access of
// --map_pages bundles on the pool's devices, then unmap and release them)
// in a range of its own, plus a pass over as many block ids, and never
// touches pool X. Its busy/idle ratios are what the machine alone does to
// the measured calls (about 1.0 on a quiet machine); the pool's ratios are
// to be read against them. --pin pins the measured thread and the other
// thread (mapper or control) to two distinct CPUs: the first two of the
// allowed set, or the two --cpus names (to keep them off one core's two
// hardware threads, or off a CPU that takes the device's interrupts).
//
// Two diagnostics tell apart why a measured call waits:
//   mapper sections  the backend is wrapped in a decorator that timestamps
//                    the mapper thread's driver calls, so each of its pool
//                    calls splits into driver time and the time around it:
//                    from the call to its first driver call (lock, plan,
//                    take), from its last driver call to the return (lock,
//                    commit or land), and the whole Free (no driver call).
//                    Those are upper bounds of how long the mapper holds
//                    the pool lock in each step;
//   mutex hand-off   with no pool at all: one thread holds an absl::Mutex
//                    for --handoff_hold_us at a time, another takes it at
//                    moments spread like the measured loop's; for takes
//                    that had to wait, the delay from the holder's unlock
//                    to the waiter's return (the machine's wake-up cost).
// Long sections mean the pool holds its lock too long; short sections and
// a large hand-off delay mean any wait at all costs the wake-up.

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocator/device_budget.h"
#include "allocator/page_pool.h"
#include "allocator/spin_then_lock.h"
#include "bench/bench_backend.h"
#include "bench/cpus.h"
#include "bench/stats.h"

ABSL_FLAG(std::string, backend, "host", "host or cuda");
ABSL_FLAG(double, seconds, 4, "seconds of the busy phase (idle: as long)");
ABSL_FLAG(int, map_pages, 64, "pages each of the mapper's Alloc calls maps");
ABSL_FLAG(int, interval_us, 50, "schedule of the measured loop");
ABSL_FLAG(bool, control, false,
          "also run the phases with a control thread doing the same driver "
          "work outside the pool");
ABSL_FLAG(bool, pin, false,
          "pin the measured thread and the other thread to distinct CPUs");
ABSL_FLAG(std::vector<std::string>, cpus, {},
          "with --pin: the CPUs of the measured thread and of the other "
          "thread, e.g. 2,3 (default: the first two allowed)");
ABSL_FLAG(absl::Duration, pool_lock_spin,
          absl::Nanoseconds(kvbroker::SpinThenLock::kDefaultSpinBoundNs),
          "how long a call that finds the pool lock held spins before it "
          "sleeps (kvbrokerd --pool_lock_spin)");
ABSL_FLAG(int, step_pages, kvbroker::PoolOptions{}.step_pages,
          "pages a long locked walk of the pool covers between two releases "
          "of its lock (PoolOptions::step_pages)");
ABSL_FLAG(int, handoff_hold_us, 10,
          "mutex hand-off probe: how long the holder keeps the lock");

namespace kvbroker {
namespace {

constexpr int64_t kBlocksPerPage = 32;

[[noreturn]] void Die(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "same_pool_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

void Spin(absl::Duration d) {
  for (const absl::Time end = absl::Now() + d; absl::Now() < end;) {
  }
}

// --cpus when given, else the first two CPUs the process may run on.
std::pair<int, int> ChosenCpus() {
  const std::vector<std::string> named = absl::GetFlag(FLAGS_cpus);
  if (named.empty()) return bench::FirstTwoCpus();
  int measured, other;
  if (named.size() != 2 || !absl::SimpleAtoi(named[0], &measured) ||
      !absl::SimpleAtoi(named[1], &other) || measured < 0 || other < 0 ||
      measured == other) {
    Die(absl::InvalidArgumentError("--cpus takes two distinct CPU numbers"),
        "flags");
  }
  return {measured, other};
}

// Pins the calling thread to `cpu` (nothing for -1).
void PinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    std::fprintf(stderr, "same_pool_bench: could not pin to CPU %d\n", cpu);
  }
}

// Where the mapper thread's driver calls fall within one pool call.
struct DriverWindow {
  absl::Time first = absl::InfiniteFuture();
  absl::Time last = absl::InfinitePast();
  absl::Duration total;
};
thread_local DriverWindow* driver_window = nullptr;

// Forwards every call; on a thread that set driver_window, notes when the
// calls that map and unmap began and ended.
class TimingBackend : public Backend {
 public:
  explicit TimingBackend(Backend* b) : b_(b) {}
  template <typename F>
  auto Timed(F f) {
    DriverWindow* w = driver_window;
    if (w == nullptr) return f();
    const absl::Time t0 = absl::Now();
    auto r = f();
    const absl::Time t1 = absl::Now();
    w->first = std::min(w->first, t0);
    w->last = std::max(w->last, t1);
    w->total += t1 - t0;
    return r;
  }
  std::string name() const override { return b_->name(); }
  int device_count() const override { return b_->device_count(); }
  Bytes granularity(int d) const override { return b_->granularity(d); }
  absl::StatusOr<VirtualRange> ReserveRange(int d, Bytes size) override {
    return b_->ReserveRange(d, size);
  }
  absl::Status FreeRange(int d, VirtualRange r) override {
    return b_->FreeRange(d, r);
  }
  absl::StatusOr<PhysicalHandle> Create(int d, Bytes size) override {
    return Timed([&] { return b_->Create(d, size); });
  }
  absl::Status Map(int d, uint64_t a, Bytes size, PhysicalHandle h) override {
    return Timed([&] { return b_->Map(d, a, size, h); });
  }
  absl::Status SetAccess(int d, uint64_t a, Bytes size) override {
    return Timed([&] { return b_->SetAccess(d, a, size); });
  }
  absl::Status Unmap(int d, uint64_t a, Bytes size) override {
    return Timed([&] { return b_->Unmap(d, a, size); });
  }
  absl::Status Release(int d, PhysicalHandle h) override {
    return Timed([&] { return b_->Release(d, h); });
  }
  absl::StatusOr<MemoryInfo> QueryMemory(int d) override {
    return Timed([&] { return b_->QueryMemory(d); });
  }

 private:
  Backend* const b_;
};

// The mapper's steps, in microseconds, one entry per cycle.
struct MapperSections {
  std::vector<double> alloc_before, alloc_after, free_call, trim_before,
      trim_after, driver;
};

// Runs `f` (one pool call) and splits its time around its driver calls.
template <typename F>
auto Split(F f, std::vector<double>* before, std::vector<double>* after,
           absl::Duration* driver) {
  DriverWindow w;
  driver_window = &w;
  const absl::Time t0 = absl::Now();
  auto r = f();
  const absl::Time t1 = absl::Now();
  driver_window = nullptr;
  if (w.first > w.last) {  // no driver call: all of it is one step
    before->push_back(absl::ToDoubleMicroseconds(t1 - t0));
  } else {
    before->push_back(absl::ToDoubleMicroseconds(w.first - t0));
    if (after != nullptr) {
      after->push_back(absl::ToDoubleMicroseconds(t1 - w.last));
    }
  }
  *driver += w.total;
  return r;
}

// The mutex hand-off probe (see the top of the file). Returns, for takes
// that waited, the delay from the holder's unlock to the waiter's return.
std::vector<double> MutexHandoff(double seconds) {
  absl::Mutex mu;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> unlocked_ns{0};
  const absl::Duration hold =
      absl::Microseconds(absl::GetFlag(FLAGS_handoff_hold_us));
  std::thread holder([&] {
    while (!stop.load()) {
      mu.Lock();
      Spin(hold);
      unlocked_ns.store(absl::GetCurrentTimeNanos());
      mu.Unlock();
      Spin(absl::Microseconds(200));
    }
  });
  std::vector<double> delays;
  const absl::Duration interval =
      absl::Microseconds(absl::GetFlag(FLAGS_interval_us));
  for (const absl::Time end = absl::Now() + absl::Seconds(seconds);
       absl::Now() < end;) {
    const int64_t t0 = absl::GetCurrentTimeNanos();
    mu.Lock();
    const int64_t t1 = absl::GetCurrentTimeNanos();
    const int64_t u = unlocked_ns.load();
    mu.Unlock();
    if (u > t0) delays.push_back((t1 - u) / 1000.0);
    Spin(interval);
  }
  stop = true;
  holder.join();
  return delays;
}

struct Samples {
  std::vector<double> capacity_us;
  std::vector<double> alloc_free_us;
  // Free+Alloc(16) calls that found the pool lock held, and the others.
  std::vector<double> waited_us;
  std::vector<double> not_waited_us;
  void Append(const Samples& o) {
    auto add = [](std::vector<double>* to, const std::vector<double>& from) {
      to->insert(to->end(), from.begin(), from.end());
    };
    add(&capacity_us, o.capacity_us);
    add(&alloc_free_us, o.alloc_free_us);
    add(&waited_us, o.waited_us);
    add(&not_waited_us, o.not_waited_us);
  }
};

Samples Measure(PagePool* pool, double seconds, std::vector<BlockId>* held,
                int64_t* mapped_iterations) {
  Samples s;
  s.capacity_us.reserve(1 << 20);
  s.alloc_free_us.reserve(1 << 20);
  const absl::Duration interval =
      absl::Microseconds(absl::GetFlag(FLAGS_interval_us));
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  // Capacity and Free + Alloc(16) take turns, each after its own pause.
  bool capacity_turn = true;
  for (absl::Time t0 = absl::Now(); t0 < end; t0 = absl::Now()) {
    if (capacity_turn) {
      absl::StatusOr<CapacitySnapshot> c = pool->Capacity();
      if (!c.ok()) Die(c.status(), "capacity");
      s.capacity_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    } else {
      const int64_t contended = SpinThenLock::contended_on_this_thread();
      absl::StatusOr<FreeResult> f = pool->Free({*held, ""});
      if (!f.ok()) Die(f.status(), "free");
      absl::StatusOr<AllocResult> r = pool->Alloc({16, "", "", {}});
      if (!r.ok()) Die(r.status(), "alloc(16)");
      const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
      s.alloc_free_us.push_back(us);
      (SpinThenLock::contended_on_this_thread() != contended ? s.waited_us
                                                             : s.not_waited_us)
          .push_back(us);
      if (r->pages_mapped != 0) ++*mapped_iterations;
      *held = AllBlockIds(*r);
    }
    capacity_turn = !capacity_turn;
    for (const absl::Time next = absl::Now() + interval; absl::Now() < next;) {
    }
  }
  return s;
}

int Main() {
  absl::StatusOr<BenchBackend> opened =
      OpenBenchBackend(absl::GetFlag(FLAGS_backend));
  if (!opened.ok()) Die(opened.status(), "backend");
  std::unique_ptr<Backend> backend = std::move(opened->backend);
  const std::string device = opened->device;
  TimingBackend timing(backend.get());
  DeviceBudgets budgets(&timing, 0.95);
  if (auto s = budgets.Init(); !s.ok()) Die(s, "budgets");
  ManualClock clock;
  const int64_t map_pages = absl::GetFlag(FLAGS_map_pages);

  // Page 0 for the measured calls, map_pages more for the mapper, and a
  // spare that the measured Alloc maps should the mapper take page 0's
  // blocks in the window between the measured Free and Alloc.
  PoolConfig pc;
  pc.name = "x";
  pc.page_size = MiB(2);
  pc.block_bytes = Bytes(MiB(2).value() / kBlocksPerPage);
  pc.max_blocks = (map_pages + 2) * kBlocksPerPage;
  PoolOptions po;
  po.min_idle_pages = 0;
  po.max_idle_pages = map_pages;
  po.step_pages = absl::GetFlag(FLAGS_step_pages);
  auto pool_or = PagePool::Create(pc, &timing, &budgets, &clock, po);
  if (!pool_or.ok()) Die(pool_or.status(), "pool");
  PagePool* pool = pool_or->get();
  absl::StatusOr<AllocResult> keeper = pool->Alloc({16, "", "", {}});
  if (!keeper.ok()) Die(keeper.status(), "keeper");
  absl::StatusOr<AllocResult> first = pool->Alloc({16, "", "", {}});
  if (!first.ok()) Die(first.status(), "first alloc(16)");
  std::vector<BlockId> held = AllBlockIds(*first);
  int64_t idle_mapped = 0, busy_mapped = 0;

  std::atomic<bool> stop{false};
  std::atomic<int64_t> mapper_calls{0};
  std::atomic<int64_t> mapper_pages{0};
  MapperSections sections;  // the mapper thread's until it is joined
  auto mapper = [&] {
    const int64_t n = map_pages * kBlocksPerPage;
    while (!stop.load()) {
      absl::Duration driver;
      absl::StatusOr<AllocResult> r = Split(
          [&] {
            return pool->Alloc({n, "", "", {}});
          },
          &sections.alloc_before, &sections.alloc_after, &driver);
      if (!r.ok()) Die(r.status(), "mapper alloc");
      mapper_pages += r->pages_mapped;
      const std::vector<BlockId> ids = AllBlockIds(*r);
      absl::StatusOr<FreeResult> f = Split(
          [&] {
            return pool->Free({ids, ""});
          },
          &sections.free_call, nullptr, &driver);
      if (!f.ok()) Die(f.status(), "mapper free");
      absl::StatusOr<TrimResult> t =
          Split([&] { return pool->Trim(); }, &sections.trim_before,
                &sections.trim_after, &driver);
      if (!t.ok()) Die(t.status(), "mapper trim");
      sections.driver.push_back(absl::ToDoubleMicroseconds(driver));
      ++mapper_calls;
    }
  };

  const double secs = absl::GetFlag(FLAGS_seconds);
  const std::pair<int, int> cpus =
      absl::GetFlag(FLAGS_pin) ? ChosenCpus() : std::pair<int, int>{-1, -1};
  PinTo(cpus.first);
  // Idle half, busy with `other` running on its own thread, idle half.
  auto phases = [&](const std::function<void()>& other, Samples* idle,
                    Samples* busy, int64_t* idle_mapped, int64_t* busy_mapped) {
    Measure(pool, 0.2, &held, idle_mapped);  // warm-up
    *idle_mapped = 0;
    *idle = Measure(pool, secs / 2, &held, idle_mapped);
    stop = false;
    std::thread busy_thread([&] {
      PinTo(cpus.second);
      other();
    });
    *busy = Measure(pool, secs, &held, busy_mapped);
    stop = true;
    busy_thread.join();
    idle->Append(Measure(pool, secs / 2, &held, idle_mapped));
  };
  Samples idle, busy;
  phases(mapper, &idle, &busy, &idle_mapped, &busy_mapped);

  // The control: the same driver work and a pass over as many block ids,
  // in a range of the control's own; pool X is not touched.
  Samples control_idle, control_busy;
  int64_t control_idle_mapped = 0, control_busy_mapped = 0;
  std::atomic<int64_t> control_cycles{0};
  if (absl::GetFlag(FLAGS_control)) {
    const Geometry& g = pool->geometry();
    const Bytes bundle = g.bundle_bytes();
    std::vector<VirtualRange> ranges;
    for (int d : g.devices()) {
      absl::StatusOr<VirtualRange> r =
          backend->ReserveRange(d, bundle * map_pages);
      if (!r.ok()) Die(r.status(), "control range");
      ranges.push_back(*r);
    }
    auto control = [&] {
      std::vector<PhysicalHandle> handles(map_pages * ranges.size());
      std::vector<BlockId> ids(map_pages * kBlocksPerPage);
      while (!stop.load()) {
        for (int64_t p = 0; p < map_pages; ++p) {
          for (size_t i = 0; i < ranges.size(); ++i) {
            const int d = g.devices()[i];
            const uint64_t at = ranges[i].base + p * bundle.value();
            absl::StatusOr<PhysicalHandle> h = backend->Create(d, bundle);
            if (!h.ok()) Die(h.status(), "control create");
            if (auto st = backend->Map(d, at, bundle, *h); !st.ok()) {
              Die(st, "control map");
            }
            if (auto st = backend->SetAccess(d, at, bundle); !st.ok()) {
              Die(st, "control set access");
            }
            handles[p * ranges.size() + i] = *h;
          }
        }
        for (size_t b = 0; b < ids.size(); ++b) {
          ids[b] = static_cast<BlockId>(b) + control_cycles.load();
        }
        for (int64_t p = 0; p < map_pages; ++p) {
          for (size_t i = 0; i < ranges.size(); ++i) {
            const int d = g.devices()[i];
            const uint64_t at = ranges[i].base + p * bundle.value();
            if (auto st = backend->Unmap(d, at, bundle); !st.ok()) {
              Die(st, "control unmap");
            }
            if (auto st = backend->Release(d, handles[p * ranges.size() + i]);
                !st.ok()) {
              Die(st, "control release");
            }
          }
        }
        ++control_cycles;
      }
    };
    phases(control, &control_idle, &control_busy, &control_idle_mapped,
           &control_busy_mapped);
    for (size_t i = 0; i < ranges.size(); ++i) {
      (void)backend->FreeRange(g.devices()[i], ranges[i]);
    }
  }
  const std::vector<double> handoff = MutexHandoff(secs / 2);

  std::printf(
      "\nsame_pool_bench on %s: pool of %lld 2 MiB pages, mapper "
      "Alloc maps %lld pages, locked walks in steps of %d pages\n",
      device.c_str(), static_cast<long long>(map_pages + 2),
      static_cast<long long>(map_pages), absl::GetFlag(FLAGS_step_pages));
  std::printf(
      "%-34s %10.1f calls/s (%lld calls, %.1f pages each)\n",
      "mapper Alloc+Free+Trim", mapper_calls.load() / secs,
      static_cast<long long>(mapper_calls.load()),
      mapper_calls.load() > 0
          ? static_cast<double>(mapper_pages.load()) / mapper_calls.load()
          : 0.0);
  std::printf(
      "%-34s %10lld idle, %lld busy\n", "measured iterations that mapped",
      static_cast<long long>(idle_mapped), static_cast<long long>(busy_mapped));
  std::printf("%-34s %10.2f / %.2f us (%zu calls)\n", "capacity idle p50 / p99",
              Percentile(idle.capacity_us, 0.5),
              Percentile(idle.capacity_us, 0.99), idle.capacity_us.size());
  std::printf("%-34s %10.2f / %.2f us (%zu calls)\n", "capacity busy p50 / p99",
              Percentile(busy.capacity_us, 0.5),
              Percentile(busy.capacity_us, 0.99), busy.capacity_us.size());
  std::printf("%-34s %10.2f / %.2f us\n", "free+alloc(16) idle p50 / p99",
              Percentile(idle.alloc_free_us, 0.5),
              Percentile(idle.alloc_free_us, 0.99));
  std::printf("%-34s %10.2f / %.2f us\n", "free+alloc(16) busy p50 / p99",
              Percentile(busy.alloc_free_us, 0.5),
              Percentile(busy.alloc_free_us, 0.99));
  // Which calls make the tail: those that found the pool lock held (a
  // wait), or the others (what the mapper's writes cost without a wait).
  for (const auto& [phase, samples] :
       {std::pair<const char*, const Samples*>{"idle", &idle},
        std::pair<const char*, const Samples*>{"busy", &busy}}) {
    const size_t all = samples->alloc_free_us.size();
    std::printf(
        "  %s: %zu of %zu met the pool lock held (%.2f %%), p50 / p99 "
        "%.2f / %.2f us; the others %.2f / %.2f us\n",
        phase, samples->waited_us.size(), all,
        all == 0 ? 0.0 : 100.0 * samples->waited_us.size() / all,
        Percentile(samples->waited_us, 0.5),
        Percentile(samples->waited_us, 0.99),
        Percentile(samples->not_waited_us, 0.5),
        Percentile(samples->not_waited_us, 0.99));
  }
  auto tail = [](const char* what, const std::vector<double>& v) {
    std::printf("%-34s %10.2f / %.2f / %.2f us (%zu)\n", what,
                Percentile(v, 0.5), Percentile(v, 0.99),
                v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()),
                v.size());
  };
  std::printf("mapper steps around its driver calls, p50 / p99 / max:\n");
  tail("  alloc: call to first map", sections.alloc_before);
  tail("  alloc: last map to return", sections.alloc_after);
  tail("  free (no driver call)", sections.free_call);
  tail("  trim: call to first unmap", sections.trim_before);
  tail("  trim: last unmap to return", sections.trim_after);
  tail("  driver time per cycle", sections.driver);
  tail("mutex hand-off delay (waited)", handoff);
  if (cpus.first >= 0) {
    std::printf("%-34s %10d / %d\n", "pinned: measured / other on CPU",
                cpus.first, cpus.second);
  }
  auto ratio = [](const std::vector<double>& b, const std::vector<double>& i) {
    return Percentile(b, 0.99) / Percentile(i, 0.99);
  };
  const double cap = ratio(busy.capacity_us, idle.capacity_us);
  const double af = ratio(busy.alloc_free_us, idle.alloc_free_us);
  if (absl::GetFlag(FLAGS_control)) {
    std::printf("%-34s %10.1f cycles/s\n", "control thread (no pool)",
                control_cycles.load() / secs);
    std::printf("%-34s %10.2f / %.2f us\n", "control: capacity idle / busy p99",
                Percentile(control_idle.capacity_us, 0.99),
                Percentile(control_busy.capacity_us, 0.99));
    std::printf("%-34s %10.2f / %.2f us\n",
                "control: free+alloc idle / busy p99",
                Percentile(control_idle.alloc_free_us, 0.99),
                Percentile(control_busy.alloc_free_us, 0.99));
    std::printf("%-34s %10.3f x\n", "control capacity busy/idle p99",
                ratio(control_busy.capacity_us, control_idle.capacity_us));
    std::printf("%-34s %10.3f x\n", "control alloc+free busy/idle p99",
                ratio(control_busy.alloc_free_us, control_idle.alloc_free_us));
  }
  std::printf("%-34s %10.3f x\n", "capacity busy/idle p99 (<= 1.2)", cap);
  std::printf("%-34s %10.3f x\n", "alloc+free busy/idle p99 (<= 1.2)", af);
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  kvbroker::SpinThenLock::SetSpinBound(absl::GetFlag(FLAGS_pool_lock_spin));
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return kvbroker::Main();
}
