// OpenBenchBackend. Contract in bench_backend.h.

#include "bench/bench_backend.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/cuda_backend.h"
#include "allocator/host_backend.h"

namespace kvbroker {

absl::StatusOr<BenchBackend> OpenBenchBackend(absl::string_view kind) {
  BenchBackend out;
  if (kind == "cuda") {
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CudaBackend::Create();
    if (!cuda.ok()) return cuda.status();
    out.device = absl::StrFormat("%s, driver %d", (*cuda)->device_name(0),
                                 (*cuda)->driver_version());
    out.backend = *std::move(cuda);
  } else {
    out.device = "host";
    out.backend = std::make_unique<HostBackend>(
        HostBackendOptions{1, Bytes(int64_t{1} << 40), MiB(2)});
  }
  return out;
}

}  // namespace kvbroker
