// DeviceBudgets: exact own-use accounting over a periodically refreshed
// driver view.

#include "allocator/device_budget.h"

#include <algorithm>
#include <cmath>

namespace kvbroker {

DeviceBudgets::DeviceBudgets(Backend* backend, double gpu_memory_utilization)
    : backend_(backend),
      utilization_(gpu_memory_utilization),
      device_count_(backend->device_count()) {
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
  Bytes charged_before;
  {
    absl::MutexLock lock(&mu_);
    charged_before = devices_.at(device).charged;
  }
  absl::StatusOr<MemoryInfo> info = backend_->QueryMemory(device);
  if (!info.ok()) return info.status();
  absl::MutexLock lock(&mu_);
  Device& d = devices_[device];
  d.total = info->total;
  d.driver_free = info->free;
  d.charged_at_refresh = charged_before;
  // Rounded to the nearest byte: 1 - 0.95 is not exact in binary and must not
  // cost a whole bundle.
  d.headroom = Bytes(std::llround(static_cast<double>(info->total.value()) *
                                  (1.0 - utilization_)));
  ++d.refreshes;
  return absl::OkStatus();
}

int64_t DeviceBudgets::BudgetLocked(const Device& d) const {
  int64_t free_now = d.driver_free.value() -
                     (d.charged.value() - d.charged_at_refresh.value());
  return std::max<int64_t>(0, free_now - d.headroom.value());
}

int64_t DeviceBudgets::AffordableBundles(absl::Span<const int> devices,
                                         Bytes bundle) const {
  absl::MutexLock lock(&mu_);
  int64_t n = INT64_MAX;
  for (int dev : devices) {
    n = std::min(n, BudgetLocked(devices_[dev]) / bundle.value());
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
  for (int dev : devices) devices_[dev].charged += Bytes(bytes);
  return true;
}

void DeviceBudgets::Uncharge(absl::Span<const int> devices, Bytes bundle,
                             int64_t count) {
  if (count == 0) return;
  absl::MutexLock lock(&mu_);
  for (int dev : devices) devices_[dev].charged -= bundle * count;
}

DeviceBudgetSnapshot DeviceBudgets::Snapshot(int device) const {
  absl::MutexLock lock(&mu_);
  const Device& d = devices_.at(device);
  DeviceBudgetSnapshot s;
  s.device = device;
  s.total = d.total;
  s.driver_free = d.driver_free;
  s.headroom = d.headroom;
  s.charged = d.charged;
  s.budget = Bytes(BudgetLocked(d));
  s.refreshes = d.refreshes;
  return s;
}

}  // namespace kvbroker
