// FaultInjectingBackend: counting, rule matching, forwarding.

#include "allocator/fault_injecting_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvbroker {
namespace {

const char* OpName(BackendOp op) {
  switch (op) {
    case BackendOp::kReserveRange: return "ReserveRange";
    case BackendOp::kFreeRange: return "FreeRange";
    case BackendOp::kCreate: return "Create";
    case BackendOp::kMap: return "Map";
    case BackendOp::kSetAccess: return "SetAccess";
    case BackendOp::kUnmap: return "Unmap";
    case BackendOp::kRelease: return "Release";
    case BackendOp::kQueryMemory: return "QueryMemory";
    case BackendOp::kExportHandle: return "ExportHandle";
    case BackendOp::kZero: return "Zero";
    case BackendOp::kCount: break;
  }
  return "?";
}

}  // namespace

void FaultInjectingBackend::AddFault(FaultRule rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back({rule, 0});
}

void FaultInjectingBackend::ClearFaults() {
  absl::MutexLock lock(&mu_);
  rules_.clear();
}

void FaultInjectingBackend::OverrideMemory(int device, MemoryInfo info) {
  absl::MutexLock lock(&mu_);
  for (auto& [d, m] : memory_overrides_) {
    if (d == device) {
      m = info;
      return;
    }
  }
  memory_overrides_.push_back({device, info});
}

int64_t FaultInjectingBackend::live_handles() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(live_.size());
}

Bytes FaultInjectingBackend::created_bytes(int device) const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [h, dev_bytes] : live_) {
    if (dev_bytes.first == device) bytes += dev_bytes.second;
  }
  return Bytes(bytes);
}

void FaultInjectingBackend::ClearMemoryOverrides() {
  absl::MutexLock lock(&mu_);
  memory_overrides_.clear();
}

void FaultInjectingBackend::SetHook(BackendOp op, std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  hooks_[static_cast<int>(op)] = std::move(hook);
}

absl::Status FaultInjectingBackend::Intercept(BackendOp op, int device) {
  const int i = static_cast<int>(op);
  calls_[i].fetch_add(1, std::memory_order_relaxed);
  std::function<void()> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = hooks_[i];
  }
  if (hook) hook();
  absl::MutexLock lock(&mu_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    const FaultRule& r = it->rule;
    if (r.op != op || (r.device >= 0 && r.device != device)) continue;
    ++it->seen;
    if (r.nth != 0 && it->seen != r.nth) continue;
    FaultKind kind = r.kind;
    if (r.nth != 0) rules_.erase(it);
    injected_[i].fetch_add(1, std::memory_order_relaxed);
    std::string what =
        absl::StrCat("injected fault in ", OpName(op), " on device ", device);
    switch (kind) {
      case FaultKind::kOutOfMemory:
        return absl::ResourceExhaustedError(what + ": out of memory");
      case FaultKind::kError:
        return absl::UnavailableError(what + ": driver error");
      case FaultKind::kFatal:
        return absl::InternalError(what + ": fatal device error");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<VirtualRange> FaultInjectingBackend::ReserveRange(int device,
                                                                 Bytes size) {
  if (absl::Status s = Intercept(BackendOp::kReserveRange, device); !s.ok()) {
    return s;
  }
  return target_->ReserveRange(device, size);
}

absl::Status FaultInjectingBackend::FreeRange(int device, VirtualRange range) {
  if (absl::Status s = Intercept(BackendOp::kFreeRange, device); !s.ok()) {
    return s;
  }
  return target_->FreeRange(device, range);
}

absl::StatusOr<PhysicalHandle> FaultInjectingBackend::Create(int device,
                                                             Bytes size) {
  if (absl::Status s = Intercept(BackendOp::kCreate, device); !s.ok()) {
    return s;
  }
  absl::StatusOr<PhysicalHandle> h = target_->Create(device, size);
  if (h.ok()) {
    absl::MutexLock lock(&mu_);
    live_[h->value] = {device, size.value()};
  }
  return h;
}

absl::Status FaultInjectingBackend::Map(int device, uint64_t address,
                                        Bytes size, PhysicalHandle handle) {
  if (absl::Status s = Intercept(BackendOp::kMap, device); !s.ok()) return s;
  return target_->Map(device, address, size, handle);
}

absl::Status FaultInjectingBackend::SetAccess(int device, uint64_t address,
                                              Bytes size) {
  if (absl::Status s = Intercept(BackendOp::kSetAccess, device); !s.ok()) {
    return s;
  }
  return target_->SetAccess(device, address, size);
}

absl::Status FaultInjectingBackend::Unmap(int device, uint64_t address,
                                          Bytes size) {
  if (absl::Status s = Intercept(BackendOp::kUnmap, device); !s.ok()) return s;
  return target_->Unmap(device, address, size);
}

absl::StatusOr<int> FaultInjectingBackend::ExportHandle(int device,
                                                        PhysicalHandle handle) {
  if (absl::Status s = Intercept(BackendOp::kExportHandle, device); !s.ok()) {
    return s;
  }
  return target_->ExportHandle(device, handle);
}

absl::Status FaultInjectingBackend::Zero(int device, uint64_t address,
                                        Bytes size) {
  if (absl::Status s = Intercept(BackendOp::kZero, device); !s.ok()) return s;
  return target_->Zero(device, address, size);
}

absl::Status FaultInjectingBackend::Release(int device, PhysicalHandle handle) {
  if (absl::Status s = Intercept(BackendOp::kRelease, device); !s.ok()) {
    return s;
  }
  absl::Status s = target_->Release(device, handle);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    live_.erase(handle.value);
  }
  return s;
}

absl::StatusOr<MemoryInfo> FaultInjectingBackend::QueryMemory(int device) {
  if (absl::Status s = Intercept(BackendOp::kQueryMemory, device); !s.ok()) {
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [d, m] : memory_overrides_) {
      if (d != device) continue;
      int64_t created = 0;
      for (const auto& [h, dev_bytes] : live_) {
        if (dev_bytes.first == device) created += dev_bytes.second;
      }
      return MemoryInfo{Bytes(std::max<int64_t>(0, m.free.value() - created)),
                        m.total};
    }
  }
  return target_->QueryMemory(device);
}

}  // namespace kvbroker
