// HostBackend: memfd-backed physical pages, mmap(MAP_FIXED) mappings.

#include "allocator/host_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvbroker {
namespace {

absl::Status ErrnoStatus(absl::string_view what, int err) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOMEM || err == ENOSPC || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::UnavailableError(message);
}

// An inaccessible, unbacked mapping that keeps an address range reserved.
void* Placeholder(void* at, size_t size) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (at != nullptr) flags |= MAP_FIXED;
  return mmap(at, size, PROT_NONE, flags, -1, 0);
}

}  // namespace

HostBackend::HostBackend(HostBackendOptions options) : options_(options) {
  absl::MutexLock lock(&mu_);
  devices_.resize(options_.device_count, Device{options_.device_total});
}

HostBackend::~HostBackend() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, h] : handles_) close(h.fd);
}

absl::Status HostBackend::CheckDevice(int device) const {
  if (device < 0 || device >= options_.device_count) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  }
  return absl::OkStatus();
}

absl::StatusOr<VirtualRange> HostBackend::ReserveRange(int device, Bytes size) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  const size_t align = options_.granularity.value();
  const size_t want = size.value();
  // Over-reserve by one granule so the range can start on a granule boundary.
  void* raw = Placeholder(nullptr, want + align);
  if (raw == MAP_FAILED) return ErrnoStatus("reserve address range", errno);
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + align - 1) / align * align;
  if (aligned > start) munmap(raw, aligned - start);
  uintptr_t tail = aligned + want;
  uintptr_t raw_end = start + want + align;
  if (raw_end > tail) munmap(reinterpret_cast<void*>(tail), raw_end - tail);
  return VirtualRange{aligned, size};
}

absl::Status HostBackend::FreeRange(int device, VirtualRange range) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (munmap(reinterpret_cast<void*>(range.base), range.size.value()) != 0) {
    return ErrnoStatus("free address range", errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> HostBackend::Create(int device, Bytes size) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    Device& d = devices_[device];
    if (d.created.value() + d.external.value() + size.value() >
        d.total.value()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device ", device, " out of memory: ", size.value(),
          " bytes requested, ",
          std::max<int64_t>(
              0, d.total.value() - d.created.value() - d.external.value()),
          " free"));
    }
    d.created += size;
  }
  int fd = memfd_create("kvbroker-page", MFD_CLOEXEC);
  int err = errno;
  if (fd >= 0 && ftruncate(fd, size.value()) != 0) {
    err = errno;
    close(fd);
    fd = -1;
  }
  absl::MutexLock lock(&mu_);
  if (fd < 0) {
    devices_[device].created -= size;
    return ErrnoStatus("create physical page", err);
  }
  uint64_t id = next_handle_++;
  handles_[id] = Handle{fd, device, size};
  return PhysicalHandle{id};
}

absl::Status HostBackend::Map(int device, uint64_t address, Bytes size,
                              PhysicalHandle handle) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  int fd;
  {
    absl::MutexLock lock(&mu_);
    auto it = handles_.find(handle.value);
    if (it == handles_.end() || it->second.device != device ||
        it->second.size != size) {
      return absl::InvalidArgumentError("map: unknown handle or size mismatch");
    }
    fd = it->second.fd;
  }
  void* at = mmap(reinterpret_cast<void*>(address), size.value(), PROT_NONE,
                  MAP_SHARED | MAP_FIXED, fd, 0);
  if (at == MAP_FAILED) return ErrnoStatus("map page", errno);
  return absl::OkStatus();
}

absl::Status HostBackend::SetAccess(int device, uint64_t address, Bytes size) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (mprotect(reinterpret_cast<void*>(address), size.value(),
               PROT_READ | PROT_WRITE) != 0) {
    return ErrnoStatus("set access", errno);
  }
  return absl::OkStatus();
}

absl::Status HostBackend::Unmap(int device, uint64_t address, Bytes size) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (Placeholder(reinterpret_cast<void*>(address), size.value()) ==
      MAP_FAILED) {
    return ErrnoStatus("unmap page", errno);
  }
  return absl::OkStatus();
}

absl::Status HostBackend::Release(int device, PhysicalHandle handle) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(handle.value);
  if (it == handles_.end() || it->second.device != device) {
    return absl::InvalidArgumentError("release: unknown handle");
  }
  close(it->second.fd);
  devices_[device].created -= it->second.size;
  handles_.erase(it);
  return absl::OkStatus();
}

absl::Status HostBackend::Zero(int device, uint64_t address, Bytes size) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (size.value() < 0)
    return absl::InvalidArgumentError("zero: negative size");
  // The caller guarantees the range is mapped; it is plain process memory.
  std::memset(reinterpret_cast<void*>(address), 0, size.value());
  return absl::OkStatus();
}

absl::StatusOr<int> HostBackend::ExportHandle(int device,
                                              PhysicalHandle handle) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(handle.value);
  if (it == handles_.end() || it->second.device != device) {
    return absl::InvalidArgumentError("export: unknown handle");
  }
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("export (dup memfd)", errno);
  return fd;
}

std::string HostBackend::device_uuid(int device) const {
  return absl::StrCat("host-", device);
}

absl::StatusOr<MemoryInfo> HostBackend::QueryMemory(int device) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const Device& d = devices_[device];
  int64_t free = d.total.value() - d.created.value() - d.external.value();
  return MemoryInfo{Bytes(std::max<int64_t>(0, free)), d.total};
}

void HostBackend::SetExternalUse(int device, Bytes bytes) {
  absl::MutexLock lock(&mu_);
  devices_.at(device).external = bytes;
}

void HostBackend::SetDeviceTotal(int device, Bytes total) {
  absl::MutexLock lock(&mu_);
  devices_.at(device).total = total;
}

Bytes HostBackend::created_bytes(int device) const {
  absl::MutexLock lock(&mu_);
  return devices_.at(device).created;
}

int64_t HostBackend::live_handles() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(handles_.size());
}

}  // namespace kvbroker
