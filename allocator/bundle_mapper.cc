// BundleMapper: the per-page backend transaction. Contract in bundle_mapper.h.

#include "allocator/bundle_mapper.h"

#include <unistd.h>

#include <algorithm>

#include "absl/time/clock.h"

namespace kvbroker {

BundleMapper::BundleMapper(const Geometry* geometry, Backend* backend,
                           DeviceBudgets* budgets)
    : geometry_(geometry),
      backend_(backend),
      budgets_(budgets),
      slots_(geometry->page_count().value() * geometry->device_count()) {}

BundleMapper::~BundleMapper() {
  for (Slot& slot : slots_) {
    if (slot.fd >= 0) close(slot.fd);
    slot.fd = -1;
  }
}

absl::StatusOr<int> BundleMapper::Export(PageId p, int device_index) {
  Slot& slot = slots_[p * geometry_->device_count() + device_index];
  if (slot.fd >= 0) return slot.fd;
  absl::StatusOr<int> fd = backend_->ExportHandle(
      geometry_->devices()[device_index], slot.handle);
  if (!fd.ok()) return fd.status();
  slot.fd = *fd;
  return *fd;
}

int64_t BundleMapper::exported_fds() const {
  return std::count_if(slots_.begin(), slots_.end(),
                       [](const Slot& slot) { return slot.fd >= 0; });
}

void BundleMapper::CloseFds(PageId p) {
  const int n = geometry_->device_count();
  for (int i = 0; i < n; ++i) {
    int& fd = slots_[p * n + i].fd;
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

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
  absl::Status error;
  for (int i = 0; i < n && error.ok(); ++i) {
    const int dev = g.devices()[i];
    const uint64_t va = ranges_[i].base + offset;
    Slot& slot = slots_[p * n + i];
    if (budgets_ != nullptr) budgets_->CreateStarting(dev, size);
    absl::StatusOr<PhysicalHandle> h = backend_->Create(dev, size);
    if (budgets_ != nullptr) budgets_->CreateFinished(dev, size, h.ok());
    if (!h.ok()) {
      error = h.status();
      break;
    }
    slot.handle = *h;
    slot.step = Step::kCreated;
    held_handles_.fetch_add(1, std::memory_order_relaxed);
    error = backend_->Map(dev, va, size, *h);
    if (!error.ok()) break;
    slot.step = Step::kMapped;
    error = backend_->SetAccess(dev, va, size);
  }
  // A pool that exports at map time pays for its exports here, inside the
  // mapping's cost; the fds stay until the handles are released (Undo).
  for (int i = 0; i < n && error.ok() && g.config().export_at_map; ++i) {
    error = Export(p, i).status();
  }
  MapOutcome out;
  if (error.ok()) {
    out.took = absl::Now() - start;
    return out;
  }
  out.status = error;
  out.unwound = Undo(p).ok();
  return out;
}

absl::Status BundleMapper::Undo(PageId p) {
  // The exported fds go with the handles, whether or not the release
  // succeeds: an importer's mapping keeps the memory alive on its own.
  CloseFds(p);
  const Geometry& g = *geometry_;
  const Bytes size = g.bundle_bytes();
  const uint64_t offset = g.page_offset(p).value();
  const int n = g.device_count();
  absl::Status first;
  for (int i = n - 1; i >= 0; --i) {
    const int dev = g.devices()[i];
    Slot& slot = slots_[p * n + i];
    absl::Status s;
    if (slot.step == Step::kMapped) {
      s = backend_->Unmap(dev, ranges_[i].base + offset, size);
      if (s.ok()) slot.step = Step::kCreated;
    }
    if (slot.step == Step::kCreated) {
      s = Release(dev, slot.handle);
      if (s.ok()) {
        slot = Slot();
        held_handles_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status BundleMapper::Unmap(PageId p, absl::Duration* took) {
  const absl::Time start = absl::Now();
  absl::Status s = Undo(p);
  if (s.ok()) *took = absl::Now() - start;
  return s;
}

bool BundleMapper::holds(PageId p) const {
  const int n = geometry_->device_count();
  for (int i = 0; i < n; ++i) {
    if (slots_[p * n + i].step != Step::kNone) return true;
  }
  return false;
}

int64_t BundleMapper::ReleaseHeld(const std::vector<bool>& keep) {
  int64_t still_held = 0;
  const int64_t pages = geometry_->page_count().value();
  for (PageId p = 0; p < pages && held_handles() > 0; ++p) {
    if (!holds(p)) continue;
    if (p < static_cast<PageId>(keep.size()) && keep[p]) continue;
    if (!Undo(p).ok()) ++still_held;
  }
  return still_held;
}

}  // namespace kvbroker
