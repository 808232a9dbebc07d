// DeviceCopier: how the data tests move bytes between host memory and a
// mapped address of an attached pool, for the backend the pool runs on.
// On the host backend the mapping is ordinary memory (memcpy); on the CUDA
// backend it is device memory the CPU cannot touch, copied with
// cuMemcpyHtoD / cuMemcpyDtoH in the device's primary context. libcuda is
// dlopen()ed at run time (never linked), as engine/cuda_mapper.cc does, so
// the test binaries start on machines without a driver.
//
// Ownership: a CUDA copier retains each device's primary context and
// releases it on destruction. Thread safety: none.

#ifndef KVBROKER_ENGINE_TESTING_DEVICE_COPY_H_
#define KVBROKER_ENGINE_TESTING_DEVICE_COPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvbroker::testing {

class DeviceCopier {
 public:
  // `backend` is PoolLayout.backend ("host" or "cuda"); `device_uuids` the
  // layout's Device.uuid of each session device, in order. UNAVAILABLE when
  // the CUDA driver or a device is missing; UNIMPLEMENTED for another
  // backend.
  static absl::StatusOr<std::unique_ptr<DeviceCopier>> Create(
      const std::string& backend, const std::vector<std::string>& device_uuids);

  virtual ~DeviceCopier() = default;

  // REQUIRES: [address, address + bytes) is mapped and accessible on session
  // device `device_index`.
  virtual absl::Status ToDevice(int device_index, uint64_t address,
                                const void* src, size_t bytes) = 0;
  virtual absl::Status FromDevice(int device_index, void* dst, uint64_t address,
                                  size_t bytes) = 0;
};

}  // namespace kvbroker::testing

#endif  // KVBROKER_ENGINE_TESTING_DEVICE_COPY_H_
