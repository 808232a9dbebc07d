// DeviceBudgets: how many more page bundles each device can afford, shared by
// every pool on the device, answered without a driver call.
//
// For each device:
//   headroom   = total * (1 - gpu_memory_utilization)
//   free_now   = driver_free - (charged - charged_at_refresh)
//   budget     = max(0, free_now - headroom)
// where `driver_free` is the driver's view at the last refresh (it includes
// this broker's own allocations at that moment), `charged` is the bytes this
// broker has committed to map on the device (kept exact: charged before a
// page is created, uncharged after it is released) and `charged_at_refresh`
// is `charged` sampled just before the driver query. Other processes' use is
// picked up by Refresh, which the broker calls in the background and the
// pools call after every mapping failure.
//
// Sampling `charged` before the query errs on the safe side: a charge that
// lands during the query is counted twice until the next refresh, never zero
// times.
//
// Charging is how pools on the same device avoid promising the same memory:
// a pool charges the bundles it is about to map under this object's lock,
// all devices of the pool at once or none.
//
// Thread safety: thread-safe; the lock is a leaf (never held while calling
// into a pool or the backend).

#ifndef KVBROKER_ALLOCATOR_DEVICE_BUDGET_H_
#define KVBROKER_ALLOCATOR_DEVICE_BUDGET_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/backend.h"

namespace kvbroker {

struct DeviceBudgetSnapshot {
  int device = 0;
  Bytes total;
  Bytes driver_free;  // at the last refresh
  Bytes headroom;
  Bytes charged;  // bytes this broker holds on the device
  Bytes budget;   // what pools may still map
  int64_t refreshes = 0;
};

class DeviceBudgets {
 public:
  // REQUIRES: 0 < gpu_memory_utilization <= 1. `backend` outlives this.
  DeviceBudgets(Backend* backend, double gpu_memory_utilization);

  // Queries every device once. Errors: what QueryMemory returned.
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_);

  // Re-reads the driver's view of one device / every device.
  absl::Status Refresh(int device) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RefreshAll() ABSL_LOCKS_EXCLUDED(mu_);

  // Bundles of `bundle` bytes that every device in `devices` can still
  // afford: the minimum over the devices.
  int64_t AffordableBundles(absl::Span<const int> devices, Bytes bundle) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Charges `count` bundles of `bundle` bytes on every device of `devices`,
  // or nothing if any device cannot afford them. Returns whether it charged.
  bool TryCharge(absl::Span<const int> devices, Bytes bundle, int64_t count)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns what TryCharge took.
  void Uncharge(absl::Span<const int> devices, Bytes bundle, int64_t count)
      ABSL_LOCKS_EXCLUDED(mu_);

  DeviceBudgetSnapshot Snapshot(int device) const ABSL_LOCKS_EXCLUDED(mu_);
  double gpu_memory_utilization() const { return utilization_; }
  int device_count() const { return device_count_; }

 private:
  struct Device {
    Bytes total;
    Bytes driver_free;
    Bytes charged;
    Bytes charged_at_refresh;
    Bytes headroom;
    int64_t refreshes = 0;
  };

  int64_t BudgetLocked(const Device& d) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend* const backend_;
  const double utilization_;
  const int device_count_;

  mutable absl::Mutex mu_;
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_DEVICE_BUDGET_H_
