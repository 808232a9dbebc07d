// PoolStats: monotonic counters and latency histograms of one pool, taken as
// one snapshot under the pool lock. Current counts (pages by state, blocks)
// live in CapacitySnapshot; this struct holds what only ever grows, plus
// peaks, so that two snapshots can be subtracted and several pools summed.
//
// Identities:
//   pages_mapped_total - pages_unmapped_total == mapped pages now
//   outcomes[r] == calls of Alloc/Free/Reserve that returned reason r
//     (outcomes[0] counts successes); each refusal is counted at the site
//     that decides it, from the reason it builds the status with, so
//     nothing re-reads a payload. An untyped error (a bug) counts in none.

#ifndef KVBROKER_ALLOCATOR_STATS_H_
#define KVBROKER_ALLOCATOR_STATS_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "allocator/failure.h"

namespace kvbroker {

// Fixed-bucket latency histogram in microseconds (Prometheus-style upper
// bounds; the last bucket is +Inf).
struct LatencyHistogram {
  static constexpr std::array<double, 12> kBoundsMicros = {
      5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 100000};
  std::array<int64_t, kBoundsMicros.size() + 1> buckets = {};
  int64_t count = 0;
  double sum_micros = 0;

  void Record(absl::Duration d);
  LatencyHistogram& operator+=(const LatencyHistogram& o);
};

struct PoolStats {
  int64_t alloc_calls = 0;
  int64_t free_calls = 0;
  int64_t reserve_calls = 0;
  int64_t blocks_allocated_total = 0;
  int64_t blocks_freed_total = 0;
  int64_t pages_mapped_total = 0;
  int64_t pages_unmapped_total = 0;
  int64_t prealloc_pages_total = 0;
  int64_t map_failures_total = 0;
  int64_t reservations_expired_total = 0;
  int64_t idempotent_replays_total = 0;
  // Blocks zeroed because they passed from one holder to another.
  int64_t blocks_zeroed_total = 0;
  int64_t peak_mapped_pages = 0;
  // Outcomes of Alloc, Free and Reserve, indexed by FailureReason (0 = OK).
  std::array<int64_t, kMaxFailureReason + 1> outcomes = {};
  LatencyHistogram map_latency;  // one page on every device of the pool
  LatencyHistogram unmap_latency;

  PoolStats& operator+=(const PoolStats& o);
  std::string DebugString() const;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_STATS_H_
