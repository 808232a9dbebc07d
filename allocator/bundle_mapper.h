// BundleMapper: the backend side of one pool. It reserves the pool's virtual
// range on each of its devices and runs, per page id, the transaction that
// backs a page with memory: create -> map -> set access on every device of
// the pool, unwound in reverse when a step fails; and its reverse, unmap ->
// release, last device first. It keeps the physical handle of every page on
// every device, with how far that handle got (created, mapped), so that no
// handle is ever forgotten: a step that fails leaves its handle recorded,
// and a later Unmap or ReleaseHeld retries exactly the steps still owed. It
// touches no other pool state (docs/design.md, "The mapping transaction").
// For engines (SPEC section 10) it also keeps, per page and device, the fd
// its handle was exported as: exported at most once, at the first Export
// (or, for a pool with PoolConfig::export_at_map, as the last step of Map,
// whose failure unwinds the page like any other step), and closed when the
// handle's page is unmapped or unwound, or the mapper is destroyed, whatever
// the path. It reports every allocation it creates or
// releases to the device budgets, which tell the broker's own memory from
// other processes' by it (device_budget.h).
//
// Thread safety: calls for different page ids may run at the same time, on
// any threads, without a lock: each page id has its own handle slots, fixed
// at construction. Calls for one page id must not overlap; the pool
// guarantees it by holding the page in flight (MAPPING) while a call runs.
// ReserveRanges, FreeRanges and ReleaseHeld run alone, before and after
// everything else. held_handles() may be read at any time.

#ifndef KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_
#define KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "allocator/backend.h"
#include "allocator/device_budget.h"
#include "allocator/geometry.h"
#include "allocator/units.h"

namespace kvbroker {

class BundleMapper {
 public:
  // The result of mapping one page id.
  struct MapOutcome {
    absl::Status status;  // of the step that failed; OK when mapped
    // Whether every step done before the failure was undone. When false,
    // some device memory of the page is still held: holds(p) is true until
    // an Unmap or ReleaseHeld undoes the rest.
    bool unwound = true;
    absl::Duration took;  // of a successful mapping
  };

  // `geometry`, `backend` and `budgets` (when not null) must outlive the
  // mapper.
  BundleMapper(const Geometry* geometry, Backend* backend,
               DeviceBudgets* budgets = nullptr);
  // Closes every exported fd still open.
  ~BundleMapper();

  BundleMapper(const BundleMapper&) = delete;
  BundleMapper& operator=(const BundleMapper&) = delete;

  // Reserves virtual_bytes_per_device on every device of the pool, or
  // nothing. On failure returns the backend's error, with `failed_device`
  // set to the device ordinal that refused.
  absl::Status ReserveRanges(int* failed_device);
  // Frees the ranges. REQUIRES: no handle is held (held_handles() == 0).
  void FreeRanges();
  bool has_ranges() const { return !ranges_.empty(); }
  // Base address of the range on the pool's `device_index`-th device.
  uint64_t range_base(int device_index) const {
    return ranges_[device_index].base;
  }

  // Create -> map -> set access of page p on every device of the pool, then
  // (export_at_map) export of each handle. On failure the steps already done
  // are undone in reverse (see MapOutcome); `took` includes the exports.
  // REQUIRES: !holds(p).
  MapOutcome Map(PageId p);
  // Unmap -> release of whatever page p still holds on each device, last
  // device first; a handle whose unmap failed is not released (it stays
  // held, mapped, for the next attempt). Returns the first error; `took` is
  // set when every step succeeded. Calling it again after an error retries
  // only the steps still owed.
  absl::Status Unmap(PageId p, absl::Duration* took);

  // The fd page p's handle on the pool's `device_index`-th device is
  // exported as, exporting it on the first call (Backend::ExportHandle). The
  // mapper owns the fd until the handle is released: callers borrow it
  // (dup what must outlive the page's mapping). Errors: the backend's.
  // REQUIRES: page p is mapped, and no Unmap of p runs meanwhile (the pool's
  // PageAnnouncer guarantees it).
  absl::StatusOr<int> Export(PageId p, int device_index);
  // Exported fds open now, for tests and leak checks.
  int64_t exported_fds() const;

  // Whether any device of page p still holds a handle (mapped, or created
  // and not yet released).
  bool holds(PageId p) const;
  // Unmaps and releases every page that holds anything, except the pages p
  // with keep[p] (engines may still map them). Returns the pages not kept
  // that still hold a handle afterwards (their steps failed again).
  int64_t ReleaseHeld(const std::vector<bool>& keep = {});
  // Backend handles created and not yet released, over every page.
  int64_t held_handles() const {
    return held_handles_.load(std::memory_order_relaxed);
  }

 private:
  // Closes page p's exported fds (its handles are being released).
  void CloseFds(PageId p);
  // How far one page's handle on one device got. Only forward steps and
  // their exact reverses change it, each after the backend call succeeded.
  enum class Step : uint8_t { kNone, kCreated, kMapped };
  struct Slot {
    PhysicalHandle handle;  // valid unless step == kNone
    Step step = Step::kNone;
    // The handle's exported fd, or -1 (see the class comment).
    int fd = -1;
  };

  // The reverse steps owed by page p's slots, last device first.
  absl::Status Undo(PageId p);
  // backend_->Release, reported to the budgets around the call.
  absl::Status Release(int device, PhysicalHandle handle);

  const Geometry* const geometry_;
  Backend* const backend_;
  DeviceBudgets* const budgets_;      // may be null
  std::vector<VirtualRange> ranges_;  // one per device of the pool
  // slots_[p * devices + i]: page p's allocation on the pool's i-th device.
  std::vector<Slot> slots_;
  // Slots whose step is not kNone.
  std::atomic<int64_t> held_handles_{0};
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_
