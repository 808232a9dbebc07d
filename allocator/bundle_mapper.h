// BundleMapper: the backend side of one pool. It reserves the pool's virtual
// range on each of its devices and runs, per page id, the transaction that
// backs a page with memory: create -> map -> set access on every device of
// the pool, unwound in reverse when a step fails; and its reverse, unmap ->
// release, last device first. It keeps the physical handle of every mapped
// page and touches no other pool state (docs/design.md, "The mapping
// transaction"). It reports every allocation it creates or releases to the
// device budgets, which tell the broker's own memory from other processes'
// by it (device_budget.h).
//
// Thread safety: calls for different page ids may run at the same time, on
// any threads, without a lock: each page id has its own handle slots, fixed
// at construction. Calls for one page id must not overlap; the pool
// guarantees it by holding the page in flight (MAPPING) while a call runs.
// ReserveRanges and FreeRanges run alone, before and after everything else.

#ifndef KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_
#define KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_

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
    // some device memory of the page is still held (and cannot be reused).
    bool unwound = true;
    absl::Duration took;  // of a successful mapping
  };

  // `geometry`, `backend` and `budgets` (when not null) must outlive the
  // mapper.
  BundleMapper(const Geometry* geometry, Backend* backend,
               DeviceBudgets* budgets = nullptr);

  BundleMapper(const BundleMapper&) = delete;
  BundleMapper& operator=(const BundleMapper&) = delete;

  // Reserves virtual_bytes_per_device on every device of the pool, or
  // nothing. On failure returns the backend's error, with `failed_device`
  // set to the device ordinal that refused.
  absl::Status ReserveRanges(int* failed_device);
  // Frees the ranges. REQUIRES: no page is mapped.
  void FreeRanges();
  bool has_ranges() const { return !ranges_.empty(); }
  // Base address of the range on the pool's `device_index`-th device.
  uint64_t range_base(int device_index) const {
    return ranges_[device_index].base;
  }

  // Create -> map -> set access of page p on every device of the pool. On
  // failure the steps already done are undone in reverse (see MapOutcome).
  // REQUIRES: page p is not mapped.
  MapOutcome Map(PageId p);
  // Unmap -> release of page p on every device, last device first; a handle
  // whose unmap failed is not released. Returns the first error; `took` is
  // set when every step succeeded. REQUIRES: page p is mapped.
  absl::Status Unmap(PageId p, absl::Duration* took);

 private:
  // backend_->Release, reported to the budgets around the call.
  absl::Status Release(int device, PhysicalHandle handle);

  const Geometry* const geometry_;
  Backend* const backend_;
  DeviceBudgets* const budgets_;      // may be null
  std::vector<VirtualRange> ranges_;  // one per device of the pool
  // handles_[p * devices + i]: page p's allocation on the pool's i-th device.
  std::vector<PhysicalHandle> handles_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_
