// HostBackend: the Backend contract on any Linux machine, with host memory.
//
// Each "device" is a budget of host memory. A physical allocation is a memfd
// of the requested size; mapping it places the memfd at a fixed address inside
// a range reserved with an inaccessible anonymous mapping; SetAccess makes it
// readable and writable; Unmap puts the inaccessible placeholder back so the
// range stays reserved; Release closes the memfd. Memory written through a
// mapping therefore survives other pages being mapped and unmapped around it,
// exactly as on a GPU.
//
// The physical budget is configurable: Create fails with RESOURCE_EXHAUSTED
// when the bytes created on a device plus the bytes "used by other processes"
// (SetExternalUse, for tests and demos) would exceed its total.
//
// Thread safety: all methods are thread-safe.

#ifndef KVBROKER_ALLOCATOR_HOST_BACKEND_H_
#define KVBROKER_ALLOCATOR_HOST_BACKEND_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "allocator/backend.h"

namespace kvbroker {

struct HostBackendOptions {
  int device_count = 1;
  // Capacity of each simulated device.
  Bytes device_total = Bytes(80 * kGiB);
  Bytes granularity = Bytes(2 * kMiB);
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(HostBackendOptions options = {});
  ~HostBackend() override;

  std::string name() const override { return "host"; }
  int device_count() const override { return options_.device_count; }
  Bytes granularity(int device) const override { return options_.granularity; }

  absl::StatusOr<VirtualRange> ReserveRange(int device, Bytes size) override;
  absl::Status FreeRange(int device, VirtualRange range) override;
  absl::StatusOr<PhysicalHandle> Create(int device, Bytes size) override;
  absl::Status Map(int device, uint64_t address, Bytes size,
                   PhysicalHandle handle) override;
  absl::Status SetAccess(int device, uint64_t address, Bytes size) override;
  absl::Status Unmap(int device, uint64_t address, Bytes size) override;
  absl::Status Release(int device, PhysicalHandle handle) override;
  absl::StatusOr<MemoryInfo> QueryMemory(int device) override;
  // A duplicate of the handle's memfd (F_DUPFD_CLOEXEC).
  absl::StatusOr<int> ExportHandle(int device, PhysicalHandle handle) override;
  // "host-<device>".
  std::string device_uuid(int device) const override;
  absl::Status Zero(int device, uint64_t address, Bytes size) override;

  // Simulates other processes using `bytes` of `device`.
  void SetExternalUse(int device, Bytes bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Changes the capacity of `device` (tests).
  void SetDeviceTotal(int device, Bytes total) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes currently created (not yet released) on `device`.
  Bytes created_bytes(int device) const ABSL_LOCKS_EXCLUDED(mu_);
  // Handles currently alive across all devices.
  int64_t live_handles() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Device {
    Bytes total;
    Bytes created;
    Bytes external;
  };
  struct Handle {
    int fd = -1;
    int device = 0;
    Bytes size;
  };

  absl::Status CheckDevice(int device) const;

  const HostBackendOptions options_;

  mutable absl::Mutex mu_;
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);
  // Live handles by id; ids are never reused.
  absl::flat_hash_map<uint64_t, Handle> handles_ ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_HOST_BACKEND_H_
