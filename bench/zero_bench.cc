// zero_bench: what zeroing between holders costs an Alloc, beside its
// baseline in the same run (host or CUDA backend).
//
//   same     Alloc(--blocks) + Free by one holder: its own blocks come back,
//            nothing is zeroed;
//   switch   the same, alternating two holders: every Alloc zeroes its
//            blocks through the pool's mapping;
//   raw      Backend::Zero of exactly those bytes, straight on the backend
//            (host: memset; CUDA: cuMemsetD8 + synchronize).
//
// Pool: P = 2 MiB, --block_kib, L = --layers, K = 2 on one device; the
// blocks of one Alloc are contiguous, so each zeroing is one call per
// device. Rounds alternate so that drift hits all three alike. The table
// reports medians and two ratios: (switch - same) / raw, the price of
// zeroing inside the pool against a plain memset of the same bytes (1.0 is
// free), and switch / same, what a holder change costs an Alloc.

#include <algorithm>
#include <cstdio>
#include <memory>
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
ABSL_FLAG(int, blocks, 16, "blocks per Alloc");
ABSL_FLAG(int64_t, block_kib, 64, "block size in KiB (per layer and buffer)");
ABSL_FLAG(int, layers, 32, "layers (K = 2 buffers each)");
ABSL_FLAG(int, rounds, 15, "alternating rounds");
ABSL_FLAG(int, calls, 50, "calls per round and phase");

namespace kvbroker {
namespace {

[[noreturn]] void Die(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "zero_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Microseconds per Alloc + Free, holders taken in turn from `holders`.
double PoolRound(PagePool& pool, int n, int calls,
                 const std::vector<std::string>& holders, BlockId* first) {
  const absl::Time t0 = absl::Now();
  for (int c = 0; c < calls; ++c) {
    AllocRequest a;
    a.num_blocks = n;
    a.holder = holders[c % holders.size()];
    absl::StatusOr<AllocResult> r = pool.Alloc(a);
    if (!r.ok()) Die(r.status(), "alloc");
    const std::vector<BlockId> ids = AllBlockIds(*r);
    *first = ids.front();
    FreeRequest f;
    f.block_ids = ids;
    if (auto s = pool.Free(f); !s.ok()) Die(s.status(), "free");
  }
  return absl::ToDoubleMicroseconds(absl::Now() - t0) / calls;
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
  const int n = absl::GetFlag(FLAGS_blocks);
  PoolConfig c;
  c.name = "zero";
  c.page_size = MiB(2);
  c.block_bytes = KiB(absl::GetFlag(FLAGS_block_kib));
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_kv_buffers = 2;
  const int64_t per_page = c.page_size.value() / c.block_bytes.value();
  c.max_blocks = std::max<int64_t>(per_page, n);
  PoolOptions o;
  o.min_idle_pages = 0;
  o.max_idle_pages = 64;  // pages stay mapped: each Alloc reuses them
  auto pool = PagePool::Create(c, backend.get(), &budgets, &clock, o);
  if (!pool.ok()) Die(pool.status(), "pool");
  PagePool& p = **pool;
  const int64_t stride = p.geometry().block_stride().value();
  const Bytes bytes(n * stride);
  const int calls = absl::GetFlag(FLAGS_calls);

  BlockId first = 0;
  PoolRound(p, n, 2, {"warm-a", "warm-b"}, &first);  // map and touch
  std::vector<double> same, change, raw;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    same.push_back(PoolRound(p, n, calls, {"a"}, &first));
    change.push_back(PoolRound(p, n, calls, {"a", "b"}, &first));
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < calls; ++i) {
      if (auto s = backend->Zero(0, p.range_base(0) + first * stride, bytes);
          !s.ok()) {
        Die(s, "raw zero");
      }
    }
    raw.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0) / calls);
  }
  const PoolStats stats = p.Stats();
  const double ms = Median(same), mc = Median(change), mr = Median(raw);
  std::printf(
      "zero_bench: %s; Alloc(%d) + Free, %lld bytes zeroed per "
      "switching Alloc; %d rounds x %d calls; %lld blocks zeroed\n",
      device.c_str(), n, static_cast<long long>(bytes.value()),
      absl::GetFlag(FLAGS_rounds), calls,
      static_cast<long long>(stats.blocks_zeroed_total));
  std::printf("%-34s %10.1f us\n", "same holder (no zeroing)", ms);
  std::printf("%-34s %10.1f us\n", "switching holders (zeroing)", mc);
  std::printf("%-34s %10.1f us\n", "raw Backend::Zero, same bytes", mr);
  std::printf("%-34s %10.2f\n", "(switch - same) / raw",
              mr > 0 ? (mc - ms) / mr : 0);
  std::printf("%-34s %10.2f\n", "switch / same", ms > 0 ? mc / ms : 0);
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvbroker::Main();
}
