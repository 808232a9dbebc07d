// DeviceBudgets: how many more page bundles each device can afford, shared by
// every pool on the device, answered without a driver call.
//
// For each device:
//   headroom   = total * (1 - gpu_memory_utilization)
//   external   = total - driver_free - created_at_query
//   budget     = max(0, total - headroom - external - charged)
// `charged` is the bytes this broker has committed to hold on the device:
// charged before a page's physical allocation is created, uncharged after
// it is released, so it covers every allocation that exists and every one
// about to. `created` is the bytes of this broker's allocations that surely
// exist: the mapper reports each create once it succeeded and each release
// before it starts. A refresh asks the driver for its free memory and
// subtracts what it knows is its own, so `external` is what other
// processes use, and nothing of the broker's own is counted twice or not at
// all, whichever step a page is at when the refresh runs (docs/design.md,
// "Device budgets").
//
// `created_at_query` is exact when no create or release was under way
// during the driver query; a refresh retries a few times until none was,
// else it takes the lowest `created` the query can have seen, which errs
// towards a smaller budget until the next refresh, never a larger one.
//
// Charging is how pools on the same device avoid promising the same memory:
// a pool charges the bundles it is about to map under this object's lock,
// all devices of the pool at once or none.
//
// Reading without the lock: every change under the lock ends by publishing
// the device's figures in a sequence lock (seqlock.h), so AffordableBundles
// and Snapshot never wait for the lock, for a charge, a create or a refresh
// of another thread. A read returns each device's figures as they were at
// the end of some change; a reader that saw a pool's counters published
// after a charge sees that charge (docs/design.md, "Capacity without the
// lock").
//
// Thread safety: thread-safe; the lock is a leaf (never held while calling
// into a pool or the backend).

#ifndef KVBROKER_ALLOCATOR_DEVICE_BUDGET_H_
#define KVBROKER_ALLOCATOR_DEVICE_BUDGET_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/backend.h"
#include "allocator/seqlock.h"

namespace kvbroker {

struct DeviceBudgetSnapshot {
  int device = 0;
  Bytes total;
  Bytes driver_free;  // at the last refresh
  Bytes headroom;
  Bytes charged;   // bytes this broker holds or is about to hold
  Bytes created;   // bytes of this broker's allocations that exist
  Bytes external;  // other processes' use at the last refresh
  Bytes budget;    // what pools may still map
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
  // afford: the minimum over the devices. From the published figures: takes
  // no lock.
  int64_t AffordableBundles(absl::Span<const int> devices, Bytes bundle) const;

  // Charges `count` bundles of `bundle` bytes on every device of `devices`,
  // or nothing if any device cannot afford them. Returns whether it charged.
  bool TryCharge(absl::Span<const int> devices, Bytes bundle, int64_t count)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns what TryCharge took.
  void Uncharge(absl::Span<const int> devices, Bytes bundle, int64_t count)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The mapper brackets each backend Create and Release of `bytes` on
  // `device` with these; `ok` is whether the call succeeded.
  void CreateStarting(int device, Bytes bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void CreateFinished(int device, Bytes bytes, bool ok)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ReleaseStarting returns the bytes it took off `created` (less than
  // `bytes` only for a handle the broker no longer counts, such as one
  // released already); ReleaseFinished takes that back.
  Bytes ReleaseStarting(int device, Bytes bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseFinished(int device, Bytes taken, bool ok)
      ABSL_LOCKS_EXCLUDED(mu_);

  // From the published figures: takes no lock.
  DeviceBudgetSnapshot Snapshot(int device) const;
  double gpu_memory_utilization() const { return utilization_; }
  int device_count() const { return device_count_; }

 private:
  struct Device {
    Bytes total;
    Bytes driver_free;
    Bytes charged;
    Bytes headroom;
    Bytes external;
    // What the driver holds for this broker lies in
    // [created, created + creating + releasing].
    Bytes created;
    Bytes creating;
    Bytes releasing;
    // Monotonic: bytes whose release has started; and every change above.
    Bytes release_started_total;
    int64_t changes = 0;
    int64_t refreshes = 0;
  };

  // Refreshes attempted before settling for the lower bound of `created`.
  static constexpr int kRefreshAttempts = 3;

  // What readers see of one device, published at the end of every change
  // (int64 words, for SeqLock).
  struct Figures {
    int64_t total = 0;
    int64_t driver_free = 0;
    int64_t headroom = 0;
    int64_t charged = 0;
    int64_t created = 0;
    int64_t external = 0;
    int64_t refreshes = 0;
  };

  int64_t BudgetLocked(const Device& d) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int64_t Budget(const Figures& f);
  // Publishes device `device`'s figures; ends every change under mu_.
  void PublishLocked(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend* const backend_;
  const double utilization_;
  const int device_count_;

  mutable absl::Mutex mu_;
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);
  // One per device; written under mu_ (PublishLocked), read by anyone.
  std::unique_ptr<SeqLock<Figures>[]> published_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_DEVICE_BUDGET_H_
