// Allocator benchmarks (Google Benchmark), in-process, host backend.
//
//   BM_Capacity/<pages>          Capacity() on pools of 1 Ki, 64 Ki and 1 Mi
//                                pages; must stay flat (no page-list walk).
//   BM_AllocFree/<blocks>        Alloc(n) + Free of the same ids, served from
//                                mapped pages: no backend call.
//   BM_AllocMapsPage             Alloc that maps one fresh page + the Free
//                                that unmaps it (max_idle_pages = 0).
//   BM_RawHostMapUnmap           baseline for the line above: the backend's
//                                own create/map/set-access/unmap/release loop
//                                for one page, no pool.
//   BM_MutexBaseline             baseline: one uncontended lock/unlock.
//   BM_WideFree/<step_pages>     Free of 2 048 blocks on 64 mapped pages
//                                (the same_pool_bench mapper's Free), walked
//                                in steps of 1 or 8 pages; the counter
//                                last_step_ns is the time from the last
//                                pause between steps to the return: the
//                                step that gives the blocks back (the
//                                longest lock hold of the call) and the
//                                call's end.
//   BM_WideTrim                  Trim of those 64 pages (IDLE), in steps of
//                                one; last_step_ns is the time from the
//                                last driver call (a Release) to the
//                                return: the step that lands the pages
//                                and the call's end.
//
// Report ratios against the baselines (bench/RESULTS.md).

#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocator/device_budget.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "benchmark/benchmark.h"

namespace kvbroker {
namespace {

struct Fixture {
  explicit Fixture(int64_t pages, int64_t block_bytes, int64_t min_idle,
                   int64_t max_idle, int64_t step_pages = 1,
                   std::function<void()> between_steps = nullptr)
      : host(HostBackendOptions{1, Bytes(int64_t{1} << 46), MiB(2)}),
        budgets(&host, 1.0) {
    (void)budgets.Init();
    PoolConfig c;
    c.name = "bench";
    c.page_size = MiB(2);
    c.block_bytes = Bytes(block_bytes);
    c.max_blocks = pages * (MiB(2).value() / block_bytes);
    PoolOptions o;
    o.min_idle_pages = min_idle;
    o.max_idle_pages = max_idle;
    o.step_pages = step_pages;
    o.between_steps = std::move(between_steps);
    pool = *PagePool::Create(c, &host, &budgets, &clock, o);
  }
  HostBackend host;
  DeviceBudgets budgets;
  ManualClock clock;
  std::unique_ptr<PagePool> pool;
};

void BM_Capacity(benchmark::State& state) {
  Fixture f(state.range(0), 16 * kKiB, 0, 4);
  // Some OPEN and FULL pages so every counter is live.
  (void)f.pool->Alloc({1000, "", "", {}});
  for (auto _ : state) {
    auto c = f.pool->Capacity();
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(BM_Capacity)->Arg(1 << 10)->Arg(1 << 16)->Arg(1 << 20);

void BM_AllocFree(benchmark::State& state) {
  const int64_t n = state.range(0);
  Fixture f(1024, 16 * kKiB, 0, 1 << 20);
  // Map enough pages up front and keep them IDLE.
  auto warm = f.pool->Alloc({4 * n + 1024, "", "", {}});
  (void)f.pool->Free({AllBlockIds(*warm), ""});
  for (auto _ : state) {
    auto r = f.pool->Alloc({n, "", "", {}});
    auto fr = f.pool->Free({AllBlockIds(*r), ""});
    benchmark::DoNotOptimize(fr);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_AllocFree)->Arg(1)->Arg(16)->Arg(256);

void BM_AllocMapsPage(benchmark::State& state) {
  Fixture f(1024, 2 * kMiB, 0, 0);
  for (auto _ : state) {
    auto r = f.pool->Alloc({1, "", "", {}});
    auto fr = f.pool->Free({AllBlockIds(*r), ""});
    benchmark::DoNotOptimize(fr);
  }
}
BENCHMARK(BM_AllocMapsPage);

void BM_RawHostMapUnmap(benchmark::State& state) {
  HostBackend host;
  const Bytes page = MiB(2);
  VirtualRange range = *host.ReserveRange(0, page);
  for (auto _ : state) {
    PhysicalHandle h = *host.Create(0, page);
    (void)host.Map(0, range.base, page, h);
    (void)host.SetAccess(0, range.base, page);
    (void)host.Unmap(0, range.base, page);
    (void)host.Release(0, h);
  }
  (void)host.FreeRange(0, range);
}
BENCHMARK(BM_RawHostMapUnmap);

void BM_WideFree(benchmark::State& state) {
  int64_t last_pause = 0;
  Fixture f(66, 64 * kKiB, 0, 66, state.range(0),
            [&last_pause] { last_pause = absl::GetCurrentTimeNanos(); });
  constexpr int64_t kBlocks = 64 * 32;
  auto warm = f.pool->Alloc({kBlocks, "", "", {}});  // 64 pages, kept IDLE
  (void)f.pool->Free({AllBlockIds(*warm), ""});
  int64_t last_step = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto r = f.pool->Alloc({kBlocks, "", "", {}});
    std::vector<BlockId> ids = AllBlockIds(*r);
    state.ResumeTiming();
    auto fr = f.pool->Free({std::move(ids), ""});
    last_step += absl::GetCurrentTimeNanos() - last_pause;
    benchmark::DoNotOptimize(fr);
  }
  state.counters["last_step_ns"] = benchmark::Counter(
      static_cast<double>(last_step), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_WideFree)->Arg(1)->Arg(8);

void BM_WideTrim(benchmark::State& state) {
  HostBackend host(HostBackendOptions{1, Bytes(int64_t{1} << 46), MiB(2)});
  FaultInjectingBackend timed(&host);
  int64_t last_release = 0;
  timed.SetHook(BackendOp::kRelease, [&last_release] {
    last_release = absl::GetCurrentTimeNanos();
  });
  DeviceBudgets budgets(&timed, 1.0);
  (void)budgets.Init();
  ManualClock clock;
  PoolConfig c;
  c.name = "bench";
  c.page_size = MiB(2);
  c.block_bytes = KiB(64);
  c.max_blocks = 66 * 32;
  PoolOptions o;
  o.min_idle_pages = 0;
  o.max_idle_pages = 66;
  std::unique_ptr<PagePool> pool =
      *PagePool::Create(c, &timed, &budgets, &clock, o);
  int64_t last_step = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto r = pool->Alloc({64 * 32, "", "", {}});  // maps 64 pages
    (void)pool->Free({AllBlockIds(*r), ""});      // all IDLE
    state.ResumeTiming();
    auto t = pool->Trim(0);
    last_step += absl::GetCurrentTimeNanos() - last_release;
    benchmark::DoNotOptimize(t);
  }
  state.counters["last_step_ns"] = benchmark::Counter(
      static_cast<double>(last_step), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_WideTrim);

void BM_MutexBaseline(benchmark::State& state) {
  absl::Mutex mu;
  int64_t x = 0;
  for (auto _ : state) {
    absl::MutexLock lock(&mu);
    benchmark::DoNotOptimize(++x);
  }
}
BENCHMARK(BM_MutexBaseline);

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  // Debian's Abseil is built with Mutex deadlock detection on; a daemon
  // turns it off (server/main.cc), so the benchmark measures that setting.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
