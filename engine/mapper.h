// DeviceMapper: the engine's side of one device of an attached pool. It
// reserves a virtual range of the pool's size, maps page bundles received as
// POSIX fds at their offsets, makes them readable and writable, and unmaps
// them on revocation, so that the engine sees the daemon's layout (SPEC
// section 10) in its own address space.
//
// Implementations:
//   host  mmap(PROT_NONE) reserves; each bundle is mmap(MAP_FIXED |
//         MAP_SHARED) of the received memfd; unmapping puts an inaccessible
//         placeholder back so the range stays reserved.
//   cuda  the driver, dlopen()ed at run time (never linked): the device is
//         found by UUID (ordinals differ between processes under
//         CUDA_VISIBLE_DEVICES); cuMemAddressReserve, then per bundle
//         cuMemImportFromShareableHandle + cuMemMap + cuMemSetAccess, and
//         cuMemUnmap + cuMemRelease on unmap.
//
// Ownership: Map() consumes the fd (closed once imported or mapped, whether
// or not the call succeeds). The mapper owns its range and every mapping;
// its destructor unmaps them all and frees the range.
//
// Thread safety: none; the engine Session serialises calls.

#ifndef KVBROKER_ENGINE_MAPPER_H_
#define KVBROKER_ENGINE_MAPPER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "attach/unique_fd.h"

namespace kvbroker::engine {

class DeviceMapper {
 public:
  virtual ~DeviceMapper() = default;

  // Base address of the reserved range (aligned to the bundle granularity).
  virtual uint64_t base() const = 0;
  virtual int64_t size() const = 0;
  // Maps `fd` (one whole bundle of `bytes`) at base() + offset and makes it
  // readable and writable. FAILED_PRECONDITION when something is already
  // mapped there; INVALID_ARGUMENT outside the range.
  virtual absl::Status Map(int64_t offset, int64_t bytes, UniqueFd fd) = 0;
  // Unmaps what Map put at `offset`; the range stays reserved. NOT_FOUND when
  // nothing is mapped there.
  virtual absl::Status Unmap(int64_t offset) = 0;
  // Bundles mapped now.
  virtual int64_t mapped() const = 0;
};

// `backend` is PoolLayout.backend ("host" or "cuda"); `device_uuid` the
// Device.uuid to map on (cuda only). Reserves `size` bytes.
// UNIMPLEMENTED for an unknown backend; UNAVAILABLE when the CUDA driver or a
// device with that UUID is missing.
absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateMapper(
    const std::string& backend, const std::string& device_uuid, int64_t size);

absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateHostMapper(int64_t size);
absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateCudaMapper(
    const std::string& device_uuid, int64_t size);

}  // namespace kvbroker::engine

#endif  // KVBROKER_ENGINE_MAPPER_H_
