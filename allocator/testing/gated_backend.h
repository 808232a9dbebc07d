// GatedBackend: a backend decorator that can hold one Create call (a page
// being mapped) or one Unmap call (a page being unmapped) at a gate, so
// that a test sees a pool, or calls it, while that call's pages are in
// flight, then lets the call go on, or fail. Every other call is forwarded
// unchanged.
//
// Use: Arm(which); start the call on another thread; WaitUntilHeld(); look
// at the pool; Release(fail). Thread-safe. For tests only.

#ifndef KVBROKER_ALLOCATOR_TESTING_GATED_BACKEND_H_
#define KVBROKER_ALLOCATOR_TESTING_GATED_BACKEND_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "allocator/backend.h"

namespace kvbroker {
namespace testing_support {

class GatedBackend final : public Backend {
 public:
  // `target` must outlive this object.
  explicit GatedBackend(Backend* target) : target_(target) {}

  enum class Call { kCreate, kUnmap };
  // The next call of that kind waits at the gate.
  void Arm(Call which = Call::kCreate) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until a Create call waits at the gate.
  void WaitUntilHeld() ABSL_LOCKS_EXCLUDED(mu_);
  // Lets the held call go on: forwarded, or failed with UNAVAILABLE (a
  // recoverable driver error, which the pool rolls back) when `fail`.
  void Release(bool fail) ABSL_LOCKS_EXCLUDED(mu_);

  std::string name() const override { return target_->name(); }
  int device_count() const override { return target_->device_count(); }
  Bytes granularity(int device) const override {
    return target_->granularity(device);
  }
  absl::StatusOr<VirtualRange> ReserveRange(int device, Bytes size) override {
    return target_->ReserveRange(device, size);
  }
  absl::Status FreeRange(int device, VirtualRange range) override {
    return target_->FreeRange(device, range);
  }
  absl::StatusOr<PhysicalHandle> Create(int device, Bytes size) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Map(int device, uint64_t address, Bytes size,
                   PhysicalHandle handle) override {
    return target_->Map(device, address, size, handle);
  }
  absl::Status SetAccess(int device, uint64_t address, Bytes size) override {
    return target_->SetAccess(device, address, size);
  }
  absl::Status Unmap(int device, uint64_t address, Bytes size) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Release(int device, PhysicalHandle handle) override {
    return target_->Release(device, handle);
  }
  absl::StatusOr<MemoryInfo> QueryMemory(int device) override {
    return target_->QueryMemory(device);
  }

 private:
  enum class Gate { kOpen, kArmed, kHeld, kReleased };

  // Waits at the gate if it is armed for `call`; whether to fail it.
  bool Pass(Call call) ABSL_LOCKS_EXCLUDED(mu_);

  Backend* const target_;
  absl::Mutex mu_;
  Gate gate_ ABSL_GUARDED_BY(mu_) = Gate::kOpen;
  Call armed_for_ ABSL_GUARDED_BY(mu_) = Call::kCreate;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace testing_support
}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_TESTING_GATED_BACKEND_H_
