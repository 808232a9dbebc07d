// FaultInjectingBackend: a Backend decorator that counts every call and fails
// the ones a test chooses.
//
// It forwards to a target backend by default. A fault rule names an operation,
// optionally a device, which matching call fails (the n-th from when the rule
// was added, or every one), and how: out of memory (RESOURCE_EXHAUSTED), a
// recoverable error (UNAVAILABLE) or a fatal device error (INTERNAL), per the
// error convention of backend.h. A failed call does not reach the target, so
// it leaves no state behind. Tests read the per-operation counters to prove
// that a refusal happened before any map call.
//
// Thread safety: all methods are thread-safe; rules may change mid-scenario.

#ifndef KVBROKER_ALLOCATOR_FAULT_INJECTING_BACKEND_H_
#define KVBROKER_ALLOCATOR_FAULT_INJECTING_BACKEND_H_

#include <array>
#include <atomic>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "allocator/backend.h"

namespace kvbroker {

enum class BackendOp : int {
  kReserveRange = 0,
  kFreeRange,
  kCreate,
  kMap,
  kSetAccess,
  kUnmap,
  kRelease,
  kQueryMemory,
  kExportHandle,
  kZero,
  kCount,  // number of operations, not an operation
};

enum class FaultKind {
  kOutOfMemory,  // RESOURCE_EXHAUSTED
  kError,        // UNAVAILABLE: recoverable, device healthy
  kFatal,        // INTERNAL: the device is lost
};

struct FaultRule {
  BackendOp op = BackendOp::kCreate;
  FaultKind kind = FaultKind::kError;
  // Fail the nth matching call counted from when the rule is added (1 = the
  // next one). 0 means every matching call until cleared.
  int64_t nth = 1;
  // Match only calls on this device; -1 matches every device.
  int device = -1;
};

class FaultInjectingBackend final : public Backend {
 public:
  // `target` must outlive this object.
  explicit FaultInjectingBackend(Backend* target) : target_(target) {}

  // Adds a rule; rules are independent and a one-shot rule disarms after it
  // fires.
  void AddFault(FaultRule rule) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearFaults() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `hook` (no lock of this wrapper held) at the start of every call
  // of `op`, before its rules are looked at; an empty function removes it.
  // For tests that look at the caller while one of its backend calls runs.
  void SetHook(BackendOp op, std::function<void()> hook)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes QueryMemory(device) report `info.total` and `info.free` minus the
  // bytes created through this wrapper and not yet released, instead of the
  // target's answer, so a test can give any backend (a real GPU included) an
  // exact budget. The target still allocates for real.
  void OverrideMemory(int device, MemoryInfo info) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearMemoryOverrides() ABSL_LOCKS_EXCLUDED(mu_);

  // Calls of `op` that reached this wrapper (failed ones included).
  int64_t calls(BackendOp op) const {
    return calls_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  // Calls of `op` that this wrapper failed.
  int64_t injected(BackendOp op) const {
    return injected_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  // Create + Map + SetAccess calls: the "mapping" work of the contract's "refused
  // before mapping".
  int64_t map_calls() const {
    return calls(BackendOp::kCreate) + calls(BackendOp::kMap) +
           calls(BackendOp::kSetAccess);
  }

  // Handles created through this wrapper and not yet released, and their
  // bytes on `device`: what the pool holds, whatever the target backend.
  int64_t live_handles() const ABSL_LOCKS_EXCLUDED(mu_);
  Bytes created_bytes(int device) const ABSL_LOCKS_EXCLUDED(mu_);

  std::string name() const override { return target_->name(); }
  int device_count() const override { return target_->device_count(); }
  Bytes granularity(int device) const override {
    return target_->granularity(device);
  }
  absl::StatusOr<VirtualRange> ReserveRange(int device, Bytes size) override;
  absl::Status FreeRange(int device, VirtualRange range) override;
  absl::StatusOr<PhysicalHandle> Create(int device, Bytes size) override;
  absl::Status Map(int device, uint64_t address, Bytes size,
                   PhysicalHandle handle) override;
  absl::Status SetAccess(int device, uint64_t address, Bytes size) override;
  absl::Status Unmap(int device, uint64_t address, Bytes size) override;
  absl::Status Release(int device, PhysicalHandle handle) override;
  absl::StatusOr<MemoryInfo> QueryMemory(int device) override;
  absl::StatusOr<int> ExportHandle(int device, PhysicalHandle handle) override;
  absl::Status Zero(int device, uint64_t address, Bytes size) override;
  std::string device_uuid(int device) const override {
    return target_->device_uuid(device);
  }

 private:
  struct ArmedRule {
    FaultRule rule;
    int64_t seen = 0;  // matching calls since the rule was added
  };

  // Counts the call and returns the injected failure, if any.
  absl::Status Intercept(BackendOp op, int device) ABSL_LOCKS_EXCLUDED(mu_);

  Backend* const target_;
  std::array<std::atomic<int64_t>, static_cast<int>(BackendOp::kCount)>
      calls_{};
  std::array<std::atomic<int64_t>, static_cast<int>(BackendOp::kCount)>
      injected_{};

  mutable absl::Mutex mu_;
  std::vector<ArmedRule> rules_ ABSL_GUARDED_BY(mu_);
  std::array<std::function<void()>, static_cast<int>(BackendOp::kCount)>
      hooks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, MemoryInfo>> memory_overrides_
      ABSL_GUARDED_BY(mu_);
  // Live handles created through this wrapper: handle -> (device, bytes).
  absl::flat_hash_map<uint64_t, std::pair<int, int64_t>> live_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_FAULT_INJECTING_BACKEND_H_
