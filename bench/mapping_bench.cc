// mapping_bench: what the pool adds on top of the driver, measured beside a
// raw backend loop in the same run (host or CUDA backend).
//
//   raw      create -> map -> set access for K fresh page ids, then
//            unmap -> release for all of them, straight on the Backend;
//   pool     the same K page ids through PagePool: one Alloc that maps K
//            pages, one Free that unmaps them (min = max idle pages = 0);
//   bringup  a pool of --bringup_gib GiB (P = 2 MiB, L = 32, K = 2: 128 MiB
//            bundles) created and fully mapped by one Alloc of every block;
//   latency  Alloc(16) + Free of blocks on mapped pages, p50/p99 alone, then
//            while another thread maps and unmaps pages continuously.
//
// Rounds of raw and pool alternate so that drift hits both alike. The last
// lines are a table of medians and the ratios the project tracks:
//   pool/raw per page id (target <= 1.10), busy/idle p99 (target <= 1.2).

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "allocator/device_budget.h"
#include "allocator/page_pool.h"
#include "bench/bench_backend.h"
#include "bench/stats.h"

ABSL_FLAG(std::string, backend, "host", "host or cuda");
ABSL_FLAG(int, pages, 64, "page ids per round (raw and pool)");
ABSL_FLAG(int, rounds, 15, "alternating rounds of raw and pool");
ABSL_FLAG(int64_t, page_mib, 2, "page (handle) size in MiB");
ABSL_FLAG(int, bringup_gib, 100, "size of the bring-up pool; 0 skips it");
ABSL_FLAG(double, latency_seconds, 2, "seconds per latency phase");

namespace kvbroker {
namespace {

[[noreturn]] void Die(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "mapping_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Per page id: microseconds to map (create+map+access) and to unmap
// (unmap+release) `k` pages straight on the backend.
std::pair<double, double> RawRound(Backend* b, VirtualRange range, Bytes page,
                                   int k) {
  std::vector<PhysicalHandle> handles(k);
  absl::Time t0 = absl::Now();
  for (int i = 0; i < k; ++i) {
    const uint64_t va = range.base + static_cast<uint64_t>(i) * page.value();
    absl::StatusOr<PhysicalHandle> h = b->Create(0, page);
    if (!h.ok()) Die(h.status(), "raw create");
    handles[i] = *h;
    if (auto s = b->Map(0, va, page, *h); !s.ok()) Die(s, "raw map");
    if (auto s = b->SetAccess(0, va, page); !s.ok()) Die(s, "raw access");
  }
  absl::Time t1 = absl::Now();
  for (int i = 0; i < k; ++i) {
    const uint64_t va = range.base + static_cast<uint64_t>(i) * page.value();
    if (auto s = b->Unmap(0, va, page); !s.ok()) Die(s, "raw unmap");
    if (auto s = b->Release(0, handles[i]); !s.ok()) Die(s, "raw release");
  }
  absl::Time t2 = absl::Now();
  return {absl::ToDoubleMicroseconds(t1 - t0) / k,
          absl::ToDoubleMicroseconds(t2 - t1) / k};
}

std::pair<double, double> PoolRound(PagePool* pool, int k) {
  absl::Time t0 = absl::Now();
  absl::StatusOr<AllocResult> r = pool->Alloc({k, "", "", {}});
  absl::Time t1 = absl::Now();
  if (!r.ok()) Die(r.status(), "pool alloc");
  if (r->pages_mapped != k)
    Die(absl::InternalError("unexpected pages"), "pool");
  absl::StatusOr<FreeResult> f = pool->Free({AllBlockIds(*r), ""});
  absl::Time t2 = absl::Now();
  if (!f.ok()) Die(f.status(), "pool free");
  return {absl::ToDoubleMicroseconds(t1 - t0) / k,
          absl::ToDoubleMicroseconds(t2 - t1) / k};
}

// Alloc(16) + Free pairs for `seconds`; microseconds per pair.
std::vector<double> LatencyPhase(PagePool* pool, double seconds) {
  std::vector<double> us;
  us.reserve(1 << 20);
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  for (absl::Time t0 = absl::Now(); t0 < end; t0 = absl::Now()) {
    absl::StatusOr<AllocResult> r = pool->Alloc({16, "", "", {}});
    if (!r.ok()) Die(r.status(), "latency alloc");
    absl::StatusOr<FreeResult> f = pool->Free({AllBlockIds(*r), ""});
    if (!f.ok()) Die(f.status(), "latency free");
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  return us;
}

int Main() {
  absl::StatusOr<BenchBackend> opened =
      OpenBenchBackend(absl::GetFlag(FLAGS_backend));
  if (!opened.ok()) Die(opened.status(), "backend");
  std::unique_ptr<Backend> backend = std::move(opened->backend);
  const std::string device = opened->device;
  DeviceBudgets budgets(backend.get(), 0.95);
  if (auto s = budgets.Init(); !s.ok()) Die(s, "budgets");
  ManualClock clock;
  const Bytes page = MiB(absl::GetFlag(FLAGS_page_mib));
  const int k = absl::GetFlag(FLAGS_pages);

  // raw vs pool, alternating.
  absl::StatusOr<VirtualRange> range = backend->ReserveRange(0, page * k);
  if (!range.ok()) Die(range.status(), "reserve");
  PoolConfig pc;
  pc.name = "bench";
  pc.page_size = page;
  pc.block_bytes = page;
  pc.max_blocks = k;
  PoolOptions po;
  po.min_idle_pages = 0;
  po.max_idle_pages = 0;
  auto pool = PagePool::Create(pc, backend.get(), &budgets, &clock, po);
  if (!pool.ok()) Die(pool.status(), "pool");
  std::vector<double> raw_map, raw_unmap, pool_map, pool_unmap;
  RawRound(backend.get(), *range, page, k);  // warm-up
  PoolRound(pool->get(), k);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    auto [rm, ru] = RawRound(backend.get(), *range, page, k);
    auto [pm, pu] = PoolRound(pool->get(), k);
    raw_map.push_back(rm);
    raw_unmap.push_back(ru);
    pool_map.push_back(pm);
    pool_unmap.push_back(pu);
  }
  (void)backend->FreeRange(0, *range);
  pool->reset();

  // Bring-up of a large pool.
  double bringup_s = 0, bringup_pages = 0;
  if (int gib = absl::GetFlag(FLAGS_bringup_gib); gib > 0) {
    PoolConfig big;
    big.name = "bringup";
    big.page_size = MiB(2);
    big.block_bytes = MiB(2);
    big.num_layers = 32;
    big.num_kv_buffers = 2;
    big.max_blocks = int64_t{gib} * kGiB / (128 * kMiB);
    absl::Time t0 = absl::Now();
    auto p = PagePool::Create(big, backend.get(), &budgets, &clock, po);
    if (!p.ok()) Die(p.status(), "bring-up pool");
    auto r = (*p)->Alloc({big.max_blocks, "", "", {}});
    if (!r.ok()) Die(r.status(), "bring-up alloc");
    bringup_s = absl::ToDoubleSeconds(absl::Now() - t0);
    bringup_pages = static_cast<double>(r->pages_mapped);
  }

  // Alloc/free latency, idle and while another thread maps and unmaps.
  PoolConfig lc;
  lc.name = "latency";
  lc.page_size = MiB(2);
  lc.block_bytes = KiB(64);
  lc.max_blocks = 32 * 64;
  PoolOptions lo;
  lo.min_idle_pages = 0;
  lo.max_idle_pages = 64;
  auto lat = PagePool::Create(lc, backend.get(), &budgets, &clock, lo);
  if (!lat.ok()) Die(lat.status(), "latency pool");
  {
    auto warm = (*lat)->Alloc({lc.max_blocks, "", "", {}});
    if (!warm.ok()) Die(warm.status(), "latency warm-up");
    (void)(*lat)->Free({AllBlockIds(*warm), ""});
  }
  const double secs = absl::GetFlag(FLAGS_latency_seconds);
  std::vector<double> idle = LatencyPhase(lat->get(), secs / 2);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> churn_pages{0};
  std::thread churn([&] {
    VirtualRange r = *backend->ReserveRange(0, page * 8);
    while (!stop.load()) {
      RawRound(backend.get(), r, page, 8);
      churn_pages += 8;
    }
    (void)backend->FreeRange(0, r);
  });
  std::vector<double> busy = LatencyPhase(lat->get(), secs);
  stop = true;
  churn.join();
  std::vector<double> idle2 = LatencyPhase(lat->get(), secs / 2);
  idle.insert(idle.end(), idle2.begin(), idle2.end());

  const double raw_page = Median(raw_map) + Median(raw_unmap);
  const double pool_page = Median(pool_map) + Median(pool_unmap);
  std::printf("\nmapping_bench on %s, %s pages, %d ids x %d rounds\n",
              device.c_str(),
              absl::StrFormat("%d MiB", absl::GetFlag(FLAGS_page_mib)).c_str(),
              k, absl::GetFlag(FLAGS_rounds));
  std::printf("%-34s %12s\n", "measure", "value");
  std::printf("%-34s %10.2f us\n", "raw map per page (median)",
              Median(raw_map));
  std::printf("%-34s %10.2f us\n", "raw unmap per page (median)",
              Median(raw_unmap));
  std::printf("%-34s %10.2f us\n", "pool map per page (median)",
              Median(pool_map));
  std::printf("%-34s %10.2f us\n", "pool unmap per page (median)",
              Median(pool_unmap));
  std::printf("%-34s %10.3f x\n", "pool/raw per page id (<= 1.10)",
              pool_page / raw_page);
  if (bringup_pages > 0) {
    std::printf("%-34s %10.3f s (%0.f pages, %.0f pages/s)\n",
                absl::StrFormat("bring-up %d GiB pool",
                                absl::GetFlag(FLAGS_bringup_gib))
                    .c_str(),
                bringup_s, bringup_pages, bringup_pages / bringup_s);
  }
  std::printf("%-34s %10.2f / %.2f us\n", "alloc+free(16) idle p50 / p99",
              Percentile(idle, 0.5), Percentile(idle, 0.99));
  std::printf(
      "%-34s %10.2f / %.2f us (%.0f pages/s mapped and unmapped "
      "beside it)\n",
      "alloc+free(16) busy p50 / p99", Percentile(busy, 0.5),
      Percentile(busy, 0.99), churn_pages.load() / secs);
  std::printf("%-34s %10.3f x\n", "busy/idle p99 (<= 1.2)",
              Percentile(busy, 0.99) / Percentile(idle, 0.99));
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return kvbroker::Main();
}
