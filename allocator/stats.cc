// PoolStats arithmetic and formatting.

#include "allocator/stats.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvbroker {

void LatencyHistogram::Record(absl::Duration d) {
  const double us = absl::ToDoubleMicroseconds(d);
  size_t i = 0;
  while (i < kBoundsMicros.size() && us > kBoundsMicros[i]) ++i;
  ++buckets[i];
  ++count;
  sum_micros += us;
}

LatencyHistogram& LatencyHistogram::operator+=(const LatencyHistogram& o) {
  for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += o.buckets[i];
  count += o.count;
  sum_micros += o.sum_micros;
  return *this;
}

PoolStats& PoolStats::operator+=(const PoolStats& o) {
  for (size_t i = 0; i < outcomes.size(); ++i) outcomes[i] += o.outcomes[i];
  alloc_calls += o.alloc_calls;
  free_calls += o.free_calls;
  reserve_calls += o.reserve_calls;
  blocks_allocated_total += o.blocks_allocated_total;
  blocks_freed_total += o.blocks_freed_total;
  pages_mapped_total += o.pages_mapped_total;
  pages_unmapped_total += o.pages_unmapped_total;
  prealloc_pages_total += o.prealloc_pages_total;
  map_failures_total += o.map_failures_total;
  reservations_expired_total += o.reservations_expired_total;
  idempotent_replays_total += o.idempotent_replays_total;
  peak_mapped_pages += o.peak_mapped_pages;
  map_latency += o.map_latency;
  unmap_latency += o.unmap_latency;
  return *this;
}

std::string PoolStats::DebugString() const {
  std::string s =
      absl::StrCat("alloc_calls=", alloc_calls, " free_calls=", free_calls,
                   " reserve_calls=", reserve_calls,
                   " blocks_allocated_total=", blocks_allocated_total,
                   " blocks_freed_total=", blocks_freed_total,
                   " pages_mapped_total=", pages_mapped_total,
                   " pages_unmapped_total=", pages_unmapped_total,
                   " prealloc_pages_total=", prealloc_pages_total,
                   " map_failures_total=", map_failures_total,
                   " reservations_expired_total=", reservations_expired_total,
                   " idempotent_replays_total=", idempotent_replays_total,
                   " peak_mapped_pages=", peak_mapped_pages);
  for (int r = 0; r <= kMaxFailureReason; ++r) {
    if (outcomes[r] == 0) continue;
    absl::StrAppend(&s, " outcome[",
                    r == 0 ? "OK" : ReasonName(static_cast<FailureReason>(r)),
                    "]=", outcomes[r]);
  }
  return s;
}

}  // namespace kvbroker
