// The CUDA DeviceMapper: imported POSIX-fd handles mapped into a range
// reserved with the driver's VMM API. libcuda is dlopen()ed on first use and
// never linked, so the engine library loads on machines without a driver.
//
// The mapper runs on the engine's own threads, whose current CUDA context
// belongs to the engine (its framework's device choice rests on it): every
// driver call here runs under a ContextScope, which makes the device's
// primary context current only for the call and puts the thread's own back.

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/gpu_uuid.h"
#include "engine/mapper.h"

#ifdef KVB_HAVE_CUDA_H
#include <cuda.h>
#endif

namespace kvbroker::engine {

#ifdef KVB_HAVE_CUDA_H
namespace {

#define KVB_ENGINE_CUDA_FUNCTIONS(X) \
  X(cuGetErrorName)                  \
  X(cuInit)                          \
  X(cuDeviceGetCount)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetUuid)                 \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent)                 \
  X(cuMemAddressReserve)             \
  X(cuMemAddressFree)                \
  X(cuMemImportFromShareableHandle)  \
  X(cuMemMap)                        \
  X(cuMemSetAccess)                  \
  X(cuMemUnmap)                      \
  X(cuMemRelease)

#define KVB_ENGINE_STR_(x) #x
#define KVB_ENGINE_STR(x) KVB_ENGINE_STR_(x)

// The driver entry points, resolved once per process.
struct Driver {
#define KVB_DECLARE(fn) decltype(&::fn) fn = nullptr;
  KVB_ENGINE_CUDA_FUNCTIONS(KVB_DECLARE)
#undef KVB_DECLARE
  absl::Status load_status;

  absl::Status Error(CUresult r, absl::string_view call) const {
    const char* name = nullptr;
    if (cuGetErrorName == nullptr || cuGetErrorName(r, &name) != CUDA_SUCCESS) {
      name = nullptr;
    }
    const std::string text =
        name ? absl::StrCat(call, ": ", name)
             : absl::StrCat(call, ": CUDA error ", static_cast<int>(r));
    return r == CUDA_ERROR_OUT_OF_MEMORY ? absl::ResourceExhaustedError(text)
                                         : absl::UnavailableError(text);
  }
};

const Driver& LoadDriver() {
  static Driver* driver = [] {
    auto* d = new Driver();
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      d->load_status = absl::UnavailableError(
          absl::StrCat("CUDA driver unavailable: libcuda.so.1 (",
                       why ? why : "not found", ")"));
      return d;
    }
#define KVB_RESOLVE(fn)                                                      \
  d->fn = reinterpret_cast<decltype(d->fn)>(dlsym(lib, KVB_ENGINE_STR(fn))); \
  if (d->fn == nullptr) {                                                    \
    d->load_status = absl::UnavailableError(                                 \
        absl::StrCat("CUDA driver lacks ", KVB_ENGINE_STR(fn)));             \
    return d;                                                                \
  }
    KVB_ENGINE_CUDA_FUNCTIONS(KVB_RESOLVE)
#undef KVB_RESOLVE
    CUresult r = d->cuInit(0);
    if (r != CUDA_SUCCESS) d->load_status = d->Error(r, "cuInit");
    return d;
  }();
  return *driver;
}

// Makes `context` current on this thread for the scope's life and then
// restores the context that was current before (none included). A thread
// already on `context` costs one cuCtxGetCurrent.
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext context) : d_(d) {
    CUresult r = d_.cuCtxGetCurrent(&previous_);
    if (r != CUDA_SUCCESS) {
      status_ = d_.Error(r, "cuCtxGetCurrent");
      return;
    }
    if (previous_ == context) return;
    r = d_.cuCtxSetCurrent(context);
    if (r != CUDA_SUCCESS) {
      status_ = d_.Error(r, "cuCtxSetCurrent");
      return;
    }
    restore_ = true;
  }
  ~ContextScope() {
    if (restore_) d_.cuCtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  // Whether `context` is current; the driver's error otherwise.
  const absl::Status& status() const { return status_; }

 private:
  const Driver& d_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
  absl::Status status_;
};

class CudaMapper final : public DeviceMapper {
 public:
  CudaMapper(const Driver& d, CUdevice device, CUcontext context,
             CUdeviceptr base, int64_t size)
      : d_(d), device_(device), context_(context), base_(base), size_(size) {}

  ~CudaMapper() override {
    ContextScope scope(d_, context_);
    for (const auto& [offset, b] : bundles_) {
      d_.cuMemUnmap(base_ + offset, b.bytes);
      d_.cuMemRelease(b.handle);
    }
    d_.cuMemAddressFree(base_, size_);
    d_.cuDevicePrimaryCtxRelease(device_);
  }

  uint64_t base() const override { return static_cast<uint64_t>(base_); }
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
    if (bundles.empty()) return absl::OkStatus();
    ContextScope scope(d_, context_);
    if (!scope.status().ok()) return scope.status();
    CUresult r;
    // Handles imported and mapped by this call, in offset order.
    std::vector<CUmemGenericAllocationHandle> handles;
    handles.reserve(bundles.size());
    auto unwind = [&] {
      for (size_t i = 0; i < handles.size(); ++i) {
        d_.cuMemUnmap(base_ + bundles[i].offset, bytes);
        d_.cuMemRelease(handles[i]);
      }
    };
    for (BundleFd& b : bundles) {
      CUmemGenericAllocationHandle handle = 0;
      absl::Time t0 = absl::Now();
      r = d_.cuMemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<intptr_t>(b.fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      stats_.import += absl::Now() - t0;
      b.fd.Reset();  // the imported handle keeps the memory alive
      if (r != CUDA_SUCCESS) {
        unwind();
        return d_.Error(r, "cuMemImportFromShareableHandle");
      }
      t0 = absl::Now();
      r = d_.cuMemMap(base_ + b.offset, bytes, 0, handle, 0);
      stats_.map += absl::Now() - t0;
      if (r != CUDA_SUCCESS) {
        d_.cuMemRelease(handle);
        unwind();
        return d_.Error(r, "cuMemMap");
      }
      handles.push_back(handle);
    }
    if (absl::Status s = EnableRuns(bytes, bundles); !s.ok()) {
      unwind();
      return s;
    }
    for (size_t i = 0; i < bundles.size(); ++i) {
      bundles_[bundles[i].offset] = {handles[i], static_cast<size_t>(bytes)};
    }
    stats_.bundles += static_cast<int64_t>(bundles.size());
    return absl::OkStatus();
  }

  absl::Status Unmap(int64_t offset) override {
    auto it = bundles_.find(offset);
    if (it == bundles_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no bundle mapped at offset ", offset));
    }
    ContextScope scope(d_, context_);
    if (!scope.status().ok()) return scope.status();
    CUresult r = d_.cuMemUnmap(base_ + offset, it->second.bytes);
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuMemUnmap");
    r = d_.cuMemRelease(it->second.handle);
    bundles_.erase(it);
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuMemRelease");
    return absl::OkStatus();
  }

 private:
  // One cuMemSetAccess per run of back-to-back bundles (the range is fully
  // mapped: the driver accepts a range over several mappings); per bundle
  // of the run when that call fails.
  absl::Status EnableRuns(int64_t bytes, absl::Span<const BundleFd> bundles) {
    std::vector<int64_t> offsets;
    offsets.reserve(bundles.size());
    for (const BundleFd& b : bundles) offsets.push_back(b.offset);
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const absl::Time t0 = absl::Now();
    absl::Status error;
    for (auto [begin, end] : AdjacentRuns(offsets, bytes)) {
      ++stats_.access_calls;
      if (d_.cuMemSetAccess(base_ + offsets[begin], (end - begin) * bytes,
                            &access, 1) == CUDA_SUCCESS) {
        continue;
      }
      for (size_t i = begin; i < end && error.ok(); ++i) {
        ++stats_.access_calls;
        CUresult r = d_.cuMemSetAccess(base_ + offsets[i], bytes, &access, 1);
        if (r != CUDA_SUCCESS) error = d_.Error(r, "cuMemSetAccess");
      }
      if (!error.ok()) break;
    }
    stats_.access += absl::Now() - t0;
    return error;
  }

  struct Bundle {
    CUmemGenericAllocationHandle handle = 0;
    size_t bytes = 0;
  };
  const Driver& d_;
  const CUdevice device_;
  const CUcontext context_;  // the device's retained primary context
  const CUdeviceptr base_;
  const int64_t size_;
  // Mapped bundles by offset; each holds its imported handle.
  absl::flat_hash_map<int64_t, Bundle> bundles_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateCudaMapper(
    const std::string& device_uuid, int64_t size) {
  const Driver& d = LoadDriver();
  if (!d.load_status.ok()) return d.load_status;
  int count = 0;
  CUresult r = d.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return d.Error(r, "cuDeviceGetCount");
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice device = 0;
    if ((r = d.cuDeviceGet(&device, ordinal)) != CUDA_SUCCESS) {
      return d.Error(r, "cuDeviceGet");
    }
    CUuuid uuid = {};
    if ((r = d.cuDeviceGetUuid(&uuid, device)) != CUDA_SUCCESS) {
      return d.Error(r, "cuDeviceGetUuid");
    }
    if (FormatGpuUuid(uuid.bytes) != device_uuid) continue;
    CUcontext context = nullptr;
    if ((r = d.cuDevicePrimaryCtxRetain(&context, device)) != CUDA_SUCCESS) {
      return d.Error(r, "cuDevicePrimaryCtxRetain");
    }
    CUdeviceptr base = 0;
    {
      ContextScope scope(d, context);
      absl::Status s = scope.status();
      if (s.ok() &&
          (r = d.cuMemAddressReserve(&base, size, 0, 0, 0)) != CUDA_SUCCESS) {
        s = d.Error(r, "cuMemAddressReserve");
      }
      if (!s.ok()) {
        d.cuDevicePrimaryCtxRelease(device);
        return s;
      }
    }
    return std::unique_ptr<DeviceMapper>(
        new CudaMapper(d, device, context, base, size));
  }
  return absl::UnavailableError(
      absl::StrCat("no visible CUDA device has UUID ", device_uuid, " (", count,
                   " devices visible; check CUDA_VISIBLE_DEVICES)"));
}

#else  // !KVB_HAVE_CUDA_H

absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateCudaMapper(
    const std::string& device_uuid, int64_t size) {
  return absl::UnavailableError(
      "CUDA driver unavailable: built without CUDA headers");
}

#endif  // KVB_HAVE_CUDA_H

}  // namespace kvbroker::engine
