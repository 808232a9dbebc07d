// The host DeviceMapper: memfd bundles mmap()ed into a reserved range, and
// what every mapper shares (Map, AdjacentRuns, CreateMapper).

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/mapper.h"

namespace kvbroker::engine {

std::vector<std::pair<size_t, size_t>> AdjacentRuns(
    absl::Span<const int64_t> sorted_offsets, int64_t bytes) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < sorted_offsets.size(); ++i) {
    if (!runs.empty() && sorted_offsets[i - 1] + bytes == sorted_offsets[i]) {
      runs.back().second = i + 1;
    } else {
      runs.push_back({i, i + 1});
    }
  }
  return runs;
}

absl::Status DeviceMapper::Map(int64_t offset, int64_t bytes, UniqueFd fd) {
  BundleFd one{offset, std::move(fd)};
  return MapMany(bytes, absl::MakeSpan(&one, 1));
}

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

  absl::Status MapMany(int64_t bytes, absl::Span<BundleFd> bundles) override {
    if (absl::Status s = CheckBatch(
            bytes, bundles,
            [this](int64_t offset) { return bundles_.contains(offset); });
        !s.ok()) {
      return s;
    }
    // A memfd shorter than a bundle would map, and then fault (SIGBUS) on
    // the first touch past its end. (What is not a file at all fails to
    // map below.)
    for (const BundleFd& b : bundles) {
      struct stat st;
      if (fstat(b.fd.get(), &st) != 0) return Errno("fstat bundle", errno);
      if (S_ISREG(st.st_mode) && st.st_size < bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a bundle fd of ", st.st_size, " bytes for a bundle of ", bytes));
      }
    }
    // Mapped without access first; each run is then enabled in one call.
    size_t done = 0;
    absl::Status error;
    absl::Time t0 = absl::Now();
    for (; done < bundles.size(); ++done) {
      BundleFd& b = bundles[done];
      void* p = mmap(base_ + b.offset, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED,
                     b.fd.get(), 0);
      b.fd.Reset();
      if (p == MAP_FAILED) {
        error = Errno("mmap bundle", errno);
        break;
      }
    }
    stats_.map += absl::Now() - t0;
    if (error.ok()) error = EnableRuns(bytes, bundles);
    if (!error.ok()) {
      // The batch's own error is what the caller needs; a placeholder that
      // fails here leaves that slot mapped, and the range is released with
      // the mapper.
      for (size_t i = 0; i < done; ++i) {
        Placeholder(bundles[i].offset, bytes).IgnoreError();
      }
      return error;
    }
    for (const BundleFd& b : bundles) bundles_[b.offset] = bytes;
    stats_.bundles += static_cast<int64_t>(bundles.size());
    return absl::OkStatus();
  }

  absl::Status Unmap(int64_t offset) override {
    auto it = bundles_.find(offset);
    if (it == bundles_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no bundle mapped at offset ", offset));
    }
    if (absl::Status s = Placeholder(offset, it->second); !s.ok()) return s;
    bundles_.erase(it);
    return absl::OkStatus();
  }

 private:
  // mprotect per run of adjacent bundles, per bundle when that fails.
  absl::Status EnableRuns(int64_t bytes, absl::Span<const BundleFd> bundles) {
    std::vector<int64_t> offsets;
    offsets.reserve(bundles.size());
    for (const BundleFd& b : bundles) offsets.push_back(b.offset);
    const absl::Time t0 = absl::Now();
    absl::Status error;
    for (auto [begin, end] : AdjacentRuns(offsets, bytes)) {
      ++stats_.access_calls;
      if (mprotect(base_ + offsets[begin], (end - begin) * bytes,
                   PROT_READ | PROT_WRITE) == 0) {
        continue;
      }
      for (size_t i = begin; i < end && error.ok(); ++i) {
        ++stats_.access_calls;
        if (mprotect(base_ + offsets[i], bytes, PROT_READ | PROT_WRITE) != 0) {
          error = Errno("mprotect bundle", errno);
        }
      }
      if (!error.ok()) break;
    }
    stats_.access += absl::Now() - t0;
    return error;
  }

  // Puts an inaccessible placeholder over [offset, +bytes), keeping the
  // range reserved.
  absl::Status Placeholder(int64_t offset, int64_t bytes) {
    void* p =
        mmap(base_ + offset, bytes, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return Errno("unmap bundle", errno);
    return absl::OkStatus();
  }

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
