// DeviceBudgets: exact own-use accounting over a periodically refreshed
// driver view.

#include "allocator/device_budget.h"

#include <algorithm>
#include <cmath>

namespace kvbroker {

DeviceBudgets::DeviceBudgets(Backend* backend, double gpu_memory_utilization)
    : backend_(backend),
      utilization_(gpu_memory_utilization),
      device_count_(backend->device_count()),
      published_(new SeqLock<Figures>[device_count_]) {
  absl::MutexLock lock(&mu_);
  devices_.resize(device_count_);
}

absl::Status DeviceBudgets::Init() { return RefreshAll(); }

absl::Status DeviceBudgets::RefreshAll() {
  absl::Status first;
  for (int d = 0; d < device_count(); ++d) {
    absl::Status s = Refresh(d);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

absl::Status DeviceBudgets::Refresh(int device) {
  absl::StatusOr<MemoryInfo> info;
  Bytes created_at_query;
  for (int attempt = 0;; ++attempt) {
    int64_t changes_before;
    Bytes created_before, release_started_before;
    {
      absl::MutexLock lock(&mu_);
      const Device& d = devices_.at(device);
      changes_before = d.changes;
      created_before = d.created;
      release_started_before = d.release_started_total;
    }
    info = backend_->QueryMemory(device);
    if (!info.ok()) return info.status();
    absl::MutexLock lock(&mu_);
    const Device& d = devices_[device];
    if (d.changes == changes_before && d.creating == Bytes(0) &&
        d.releasing == Bytes(0)) {
      created_at_query = created_before;  // exact
      break;
    }
    if (attempt + 1 == kRefreshAttempts) {
      // The query saw at least what surely existed before it, less what
      // started to be released since.
      created_at_query = Bytes(std::max<int64_t>(
          0, created_before.value() - (d.release_started_total.value() -
                                       release_started_before.value())));
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  Device& d = devices_[device];
  d.total = info->total;
  d.driver_free = info->free;
  // Clamped: a driver that reports more free than it can have errs towards
  // no external use, not towards a negative one.
  d.external = Bytes(std::max<int64_t>(
      0, info->total.value() - info->free.value() - created_at_query.value()));
  // Rounded to the nearest byte: 1 - 0.95 is not exact in binary and must not
  // cost a whole bundle.
  d.headroom = Bytes(std::llround(static_cast<double>(info->total.value()) *
                                  (1.0 - utilization_)));
  ++d.refreshes;
  PublishLocked(device);
  return absl::OkStatus();
}

int64_t DeviceBudgets::Budget(const Figures& f) {
  return std::max<int64_t>(0, f.total - f.headroom - f.external - f.charged);
}

int64_t DeviceBudgets::BudgetLocked(const Device& d) const {
  return std::max<int64_t>(0, d.total.value() - d.headroom.value() -
                                  d.external.value() - d.charged.value());
}

void DeviceBudgets::PublishLocked(int device) {
  const Device& d = devices_[device];
  Figures f;
  f.total = d.total.value();
  f.driver_free = d.driver_free.value();
  f.headroom = d.headroom.value();
  f.charged = d.charged.value();
  f.created = d.created.value();
  f.external = d.external.value();
  f.refreshes = d.refreshes;
  published_[device].Publish(f);
}

int64_t DeviceBudgets::AffordableBundles(absl::Span<const int> devices,
                                         Bytes bundle) const {
  int64_t n = INT64_MAX;
  for (int dev : devices) {
    n = std::min(n, Budget(published_[dev].Read()) / bundle.value());
  }
  return devices.empty() ? 0 : n;
}

bool DeviceBudgets::TryCharge(absl::Span<const int> devices, Bytes bundle,
                              int64_t count) {
  if (count == 0) return true;
  const int64_t bytes = bundle.value() * count;
  absl::MutexLock lock(&mu_);
  for (int dev : devices) {
    if (BudgetLocked(devices_[dev]) < bytes) return false;
  }
  for (int dev : devices) {
    devices_[dev].charged += Bytes(bytes);
    PublishLocked(dev);
  }
  return true;
}

void DeviceBudgets::Uncharge(absl::Span<const int> devices, Bytes bundle,
                             int64_t count) {
  if (count == 0) return;
  absl::MutexLock lock(&mu_);
  for (int dev : devices) {
    devices_[dev].charged -= bundle * count;
    PublishLocked(dev);
  }
}

void DeviceBudgets::CreateStarting(int device, Bytes bytes) {
  absl::MutexLock lock(&mu_);
  Device& d = devices_.at(device);
  d.creating += bytes;
  ++d.changes;
}

void DeviceBudgets::CreateFinished(int device, Bytes bytes, bool ok) {
  absl::MutexLock lock(&mu_);
  Device& d = devices_.at(device);
  d.creating -= bytes;
  if (ok) d.created += bytes;
  ++d.changes;
  PublishLocked(device);
}

Bytes DeviceBudgets::ReleaseStarting(int device, Bytes bytes) {
  absl::MutexLock lock(&mu_);
  Device& d = devices_.at(device);
  const Bytes taken = std::min(bytes, d.created);
  d.created -= taken;
  d.releasing += taken;
  d.release_started_total += taken;
  ++d.changes;
  PublishLocked(device);
  return taken;
}

void DeviceBudgets::ReleaseFinished(int device, Bytes taken, bool ok) {
  absl::MutexLock lock(&mu_);
  Device& d = devices_.at(device);
  d.releasing -= taken;
  if (!ok) d.created += taken;  // still there
  ++d.changes;
  PublishLocked(device);
}

DeviceBudgetSnapshot DeviceBudgets::Snapshot(int device) const {
  ABSL_ASSERT(device >= 0 && device < device_count_);
  const Figures f = published_[device].Read();
  DeviceBudgetSnapshot s;
  s.device = device;
  s.total = Bytes(f.total);
  s.driver_free = Bytes(f.driver_free);
  s.headroom = Bytes(f.headroom);
  s.charged = Bytes(f.charged);
  s.created = Bytes(f.created);
  s.external = Bytes(f.external);
  s.budget = Bytes(Budget(f));
  s.refreshes = f.refreshes;
  return s;
}

}  // namespace kvbroker
