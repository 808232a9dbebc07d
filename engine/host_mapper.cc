// The host DeviceMapper: memfd bundles mmap()ed into a reserved range.

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/mapper.h"

namespace kvbroker::engine {
namespace {

absl::Status Errno(absl::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(err)));
}

class HostMapper final : public DeviceMapper {
 public:
  HostMapper(char* base, int64_t size) : base_(base), size_(size) {}
  ~HostMapper() override { munmap(base_, size_); }

  uint64_t base() const override { return reinterpret_cast<uint64_t>(base_); }
  int64_t size() const override { return size_; }
  int64_t mapped() const override {
    return static_cast<int64_t>(bundles_.size());
  }

  absl::Status Map(int64_t offset, int64_t bytes, UniqueFd fd) override {
    if (offset < 0 || bytes <= 0 || offset > size_ - bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle [", offset, ", +", bytes, ") outside the range of ", size_));
    }
    if (bundles_.contains(offset)) {
      return absl::FailedPreconditionError(
          absl::StrCat("a bundle is already mapped at offset ", offset));
    }
    void* p = mmap(base_ + offset, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd.get(), 0);
    if (p == MAP_FAILED) return Errno("mmap bundle", errno);
    bundles_[offset] = bytes;
    return absl::OkStatus();
  }

  absl::Status Unmap(int64_t offset) override {
    auto it = bundles_.find(offset);
    if (it == bundles_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no bundle mapped at offset ", offset));
    }
    void* p =
        mmap(base_ + offset, it->second, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return Errno("unmap bundle", errno);
    bundles_.erase(it);
    return absl::OkStatus();
  }

 private:
  char* const base_;
  const int64_t size_;
  // Mapped bundles: offset -> bytes.
  absl::flat_hash_map<int64_t, int64_t> bundles_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateHostMapper(int64_t size) {
  if (size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("range of ", size, " bytes"));
  }
  void* p = mmap(nullptr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Errno("reserve range", errno);
  return std::unique_ptr<DeviceMapper>(
      new HostMapper(static_cast<char*>(p), size));
}

absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateMapper(
    const std::string& backend, const std::string& device_uuid, int64_t size) {
  if (backend == "host") return CreateHostMapper(size);
  if (backend == "cuda") return CreateCudaMapper(device_uuid, size);
  return absl::UnimplementedError(
      absl::StrCat("cannot map pages of backend \"", backend, "\""));
}

}  // namespace kvbroker::engine
