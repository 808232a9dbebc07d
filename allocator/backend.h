// The contract between the allocator and the memory it brokers.
//
// A backend exposes, per device, the CUDA virtual memory management steps the
// pool composes: reserve a virtual range, create a physical allocation, map
// it into the range, make it accessible, unmap it, release it, and query the
// device's memory. The allocator calls nothing else; this header is the only
// place a device appears. Implementations:
//   - HostBackend (host_backend.h): memfd pages mapped with mmap(MAP_FIXED);
//   - CudaBackend (cuda_backend.h): the CUDA driver API, loaded at run time;
//   - FaultInjectingBackend (fault_injecting_backend.h): a decorator that fails
//     chosen calls and counts every call, for tests.
//
// Error convention (every implementation translates its native errors in one
// function):
//   RESOURCE_EXHAUSTED  the device is out of memory; nothing was created.
//   UNAVAILABLE         a recoverable failure of this call; the call left no
//                       state behind and the device remains usable.
//   INTERNAL            a fatal device error (lost context, ECC, ...): the
//                       device must be treated as failed.
//   INVALID_ARGUMENT    a precondition was violated (a bug in the caller).
// A failed call leaves nothing half-done: a failed Create created nothing, a
// failed Map mapped nothing. Composing steps into a transaction and unwinding
// it is the pool's job.
//
// Preconditions shared by every call: `device` is in [0, device_count());
// sizes and addresses are multiples of granularity(device) and non-zero.
//
// Thread safety: every method may be called concurrently from any thread.

#ifndef KVBROKER_ALLOCATOR_BACKEND_H_
#define KVBROKER_ALLOCATOR_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/units.h"

namespace kvbroker {

// An opaque physical allocation created by Backend::Create.
struct PhysicalHandle {
  uint64_t value = 0;
};

// A reserved virtual address range on one device.
struct VirtualRange {
  uint64_t base = 0;
  Bytes size;
};

struct MemoryInfo {
  Bytes free;   // what the device could still allocate, all processes counted
  Bytes total;  // device capacity
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "host", "cuda", ... for logs and metrics.
  virtual std::string name() const = 0;
  // Number of devices; ordinals are 0 .. device_count() - 1.
  virtual int device_count() const = 0;
  // Allocation granularity of `device` (2 MiB on current NVIDIA GPUs).
  virtual Bytes granularity(int device) const = 0;

  // Reserves `size` bytes of virtual address space usable by `device`.
  virtual absl::StatusOr<VirtualRange> ReserveRange(int device, Bytes size) = 0;
  // Returns a range obtained from ReserveRange. REQUIRES: nothing is mapped in
  // it.
  virtual absl::Status FreeRange(int device, VirtualRange range) = 0;

  // Creates `size` bytes of physical memory on `device`.
  virtual absl::StatusOr<PhysicalHandle> Create(int device, Bytes size) = 0;
  // Maps `handle` (of exactly `size` bytes) at `address`, inside a reserved
  // range, not yet accessible.
  virtual absl::Status Map(int device, uint64_t address, Bytes size,
                           PhysicalHandle handle) = 0;
  // Makes [address, address + size) readable and writable from `device`.
  virtual absl::Status SetAccess(int device, uint64_t address, Bytes size) = 0;
  // Unmaps [address, address + size); the range stays reserved.
  virtual absl::Status Unmap(int device, uint64_t address, Bytes size) = 0;
  // Releases a handle. The memory returns to the device once it is also
  // unmapped.
  virtual absl::Status Release(int device, PhysicalHandle handle) = 0;

  // Queries the device's free and total memory. This may cost several
  // microseconds on a GPU; the allocator calls it only from DeviceBudgets.
  virtual absl::StatusOr<MemoryInfo> QueryMemory(int device) = 0;

  // Sharing with engines (SPEC section 10).
  //
  // Exports `handle` as a POSIX file descriptor that another process can map
  // (host: mmap; CUDA: cuMemImportFromShareableHandle). Each call returns a
  // new close-on-exec fd that the caller owns and must close; the memory
  // stays alive while any exported fd or importer's mapping does, even after
  // Release. Exporting can cost up to a millisecond on a GPU: export a
  // handle once and keep the fd. UNIMPLEMENTED where the backend cannot
  // export (the default); UNAVAILABLE when this handle was created without
  // an exportable type.
  virtual absl::StatusOr<int> ExportHandle(int device, PhysicalHandle handle);
  // A name of `device` that other processes can match against their own
  // devices ("GPU-<uuid>" on CUDA, whose ordinals depend on
  // CUDA_VISIBLE_DEVICES; "host-<ordinal>" on the host). Empty when unknown
  // (the default).
  virtual std::string device_uuid(int device) const;

  // Writes zeros over [address, address + size) on `device`, which must lie
  // in a range of this backend, mapped and accessible; returns once the
  // zeros are written (host: memset; CUDA: cuMemsetD8 then a synchronize).
  // Any size. The pool zeroes blocks that pass from one engine to another.
  // UNIMPLEMENTED where the backend cannot (the default).
  virtual absl::Status Zero(int device, uint64_t address, Bytes size);
};

inline absl::StatusOr<int> Backend::ExportHandle(int device,
                                                 PhysicalHandle handle) {
  return absl::UnimplementedError("this backend cannot export handles");
}

inline std::string Backend::device_uuid(int device) const { return ""; }

inline absl::Status Backend::Zero(int device, uint64_t address, Bytes size) {
  return absl::UnimplementedError("this backend cannot zero memory");
}

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_BACKEND_H_
