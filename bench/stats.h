// Order statistics of a benchmark's samples. Every benchmark here reads its
// medians and tails through these two, so that a p99 in one table of
// bench/RESULTS.md means what it means in the others: the sample at index
// floor(q × n) of the n samples sorted (the largest for q = 1), and 0 when
// there are none.

#ifndef KVBROKER_BENCH_STATS_H_
#define KVBROKER_BENCH_STATS_H_

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace kvbroker {

// REQUIRES: 0 <= q <= 1.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  return v[i];
}

inline double Median(std::vector<double> v) {
  return Percentile(std::move(v), 0.5);
}

}  // namespace kvbroker

#endif  // KVBROKER_BENCH_STATS_H_
