// OpenBenchBackend: the backend a benchmark's --backend flag names, and the
// words its report uses for the machine. Shared by the benchmarks that drive
// a pool directly (mapping, same pool, zeroing).
#ifndef KVBROKER_BENCH_BENCH_BACKEND_H_
#define KVBROKER_BENCH_BENCH_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/backend.h"

namespace kvbroker {

struct BenchBackend {
  std::unique_ptr<Backend> backend;
  // "host", or the GPU's name and the driver version.
  std::string device;
};

// "cuda": the CUDA backend (the driver loaded at run time). Anything else:
// the host backend with one device of 1 TiB and a 2 MiB granularity.
absl::StatusOr<BenchBackend> OpenBenchBackend(absl::string_view kind);

}  // namespace kvbroker

#endif  // KVBROKER_BENCH_BENCH_BACKEND_H_
