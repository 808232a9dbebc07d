// The CPUs a benchmark's --pin flag uses: the first two the process may run
// on, so that the same pair is chosen on every run of one machine.

#ifndef KVBROKER_BENCH_CPUS_H_
#define KVBROKER_BENCH_CPUS_H_

#include <sched.h>

#include <utility>
#include <vector>

namespace kvbroker::bench {

// {-1, -1} when the process may run on fewer than two CPUs.
inline std::pair<int, int> FirstTwoCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {-1, -1};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.size() < 2) return {-1, -1};
  return {cpus[0], cpus[1]};
}

}  // namespace kvbroker::bench

#endif  // KVBROKER_BENCH_CPUS_H_
