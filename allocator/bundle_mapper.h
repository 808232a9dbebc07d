// BundleMapper: the backend side of one pool. It reserves the pool's virtual
// range on each of its devices and runs, per page id, the transaction that
// backs a page with memory: create -> map -> set access on every device of
// the pool, unwound in reverse when a step fails; and its reverse, unmap ->
// release, last device first. It keeps the physical handle of every mapped
// page and touches no other pool state (docs/design.md, "The mapping
// transaction"). For engines (SPEC section 10) it also keeps, per page and
// device, the fd its handle was exported as: exported at most once, at the
// first Export, and closed when the handle is released (Unmap, an unwound
// Map, the destructor), whatever the path.
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

  // `geometry` and `backend` must outlive the mapper.
  BundleMapper(const Geometry* geometry, Backend* backend);
  // Closes every exported fd still open.
  ~BundleMapper();

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

  // The fd page p's handle on the pool's `device_index`-th device is
  // exported as, exporting it on the first call (Backend::ExportHandle). The
  // mapper owns the fd until the handle is released: callers borrow it
  // (dup what must outlive the page's mapping). Errors: the backend's.
  // REQUIRES: page p is mapped, and no Unmap of p runs meanwhile (the pool's
  // PageAnnouncer guarantees it).
  absl::StatusOr<int> Export(PageId p, int device_index);
  // Exported fds open now, for tests and leak checks.
  int64_t exported_fds() const;

 private:
  // Closes page p's exported fds (its handles are being released).
  void CloseFds(PageId p);

  const Geometry* const geometry_;
  Backend* const backend_;
  std::vector<VirtualRange> ranges_;  // one per device of the pool
  // handles_[p * devices + i]: page p's allocation on the pool's i-th device.
  std::vector<PhysicalHandle> handles_;
  // fds_[p * devices + i]: the exported fd of handles_[p * devices + i], or
  // -1. Owned by whoever owns the page's handles (see the class comment).
  std::vector<int> fds_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_BUNDLE_MAPPER_H_
