// BundleMapper: the per-page backend transaction. Contract in bundle_mapper.h.

#include "allocator/bundle_mapper.h"

#include "absl/time/clock.h"

namespace kvbroker {

BundleMapper::BundleMapper(const Geometry* geometry, Backend* backend,
                           DeviceBudgets* budgets)
    : geometry_(geometry),
      backend_(backend),
      budgets_(budgets),
      handles_(geometry->page_count().value() * geometry->device_count()) {}

absl::Status BundleMapper::ReserveRanges(int* failed_device) {
  const Geometry& g = *geometry_;
  for (int i = 0; i < g.device_count(); ++i) {
    absl::StatusOr<VirtualRange> r =
        backend_->ReserveRange(g.devices()[i], g.virtual_bytes_per_device());
    if (!r.ok()) {
      for (int j = i - 1; j >= 0; --j) {
        (void)backend_->FreeRange(g.devices()[j], ranges_[j]);
      }
      ranges_.clear();
      *failed_device = g.devices()[i];
      return r.status();
    }
    ranges_.push_back(*r);
  }
  return absl::OkStatus();
}

void BundleMapper::FreeRanges() {
  for (size_t i = 0; i < ranges_.size(); ++i) {
    (void)backend_->FreeRange(geometry_->devices()[i], ranges_[i]);
  }
  ranges_.clear();
}

absl::Status BundleMapper::Release(int device, PhysicalHandle handle) {
  const Bytes taken =
      budgets_ == nullptr
          ? Bytes(0)
          : budgets_->ReleaseStarting(device, geometry_->bundle_bytes());
  absl::Status s = backend_->Release(device, handle);
  if (budgets_ != nullptr) budgets_->ReleaseFinished(device, taken, s.ok());
  return s;
}

BundleMapper::MapOutcome BundleMapper::Map(PageId p) {
  const Geometry& g = *geometry_;
  const Bytes size = g.bundle_bytes();
  const uint64_t offset = g.page_offset(p).value();
  const int n = g.device_count();
  const absl::Time start = absl::Now();
  // Steps done so far on the device being mapped: 0 none, 1 created,
  // 2 mapped. Devices before it are fully done.
  int done_devices = 0;
  int step = 0;
  absl::Status error;
  for (; done_devices < n; ++done_devices) {
    const int dev = g.devices()[done_devices];
    const uint64_t va = ranges_[done_devices].base + offset;
    step = 0;
    if (budgets_ != nullptr) budgets_->CreateStarting(dev, size);
    absl::StatusOr<PhysicalHandle> h = backend_->Create(dev, size);
    if (budgets_ != nullptr) budgets_->CreateFinished(dev, size, h.ok());
    if (!h.ok()) {
      error = h.status();
      break;
    }
    handles_[p * n + done_devices] = *h;
    step = 1;
    error = backend_->Map(dev, va, size, *h);
    if (!error.ok()) break;
    step = 2;
    error = backend_->SetAccess(dev, va, size);
    if (!error.ok()) break;
  }
  MapOutcome out;
  if (error.ok()) {
    out.took = absl::Now() - start;
    return out;
  }
  out.status = error;
  // Unwind in reverse: the failing device's finished steps, then every
  // earlier device.
  for (int i = done_devices; i >= 0; --i) {
    const int dev = g.devices()[i];
    const uint64_t va = ranges_[i].base + offset;
    const int steps = (i == done_devices) ? step : 2;
    if (steps >= 2 && !backend_->Unmap(dev, va, size).ok()) {
      out.unwound = false;
      continue;  // a handle still mapped must not be released
    }
    if (steps >= 1 && !Release(dev, handles_[p * n + i]).ok()) {
      out.unwound = false;
    }
  }
  return out;
}

absl::Status BundleMapper::Unmap(PageId p, absl::Duration* took) {
  const Geometry& g = *geometry_;
  const Bytes size = g.bundle_bytes();
  const uint64_t offset = g.page_offset(p).value();
  const int n = g.device_count();
  const absl::Time start = absl::Now();
  absl::Status first;
  for (int i = n - 1; i >= 0; --i) {
    const int dev = g.devices()[i];
    absl::Status s = backend_->Unmap(dev, ranges_[i].base + offset, size);
    if (s.ok()) s = Release(dev, handles_[p * n + i]);
    if (!s.ok() && first.ok()) first = s;
  }
  if (first.ok()) *took = absl::Now() - start;
  return first;
}

}  // namespace kvbroker
