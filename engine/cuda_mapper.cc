// The CUDA DeviceMapper: imported POSIX-fd handles mapped into a range
// reserved with the driver's VMM API. libcuda is dlopen()ed on first use and
// never linked, so the engine library loads on machines without a driver.

#include <dlfcn.h>

#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
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

std::string FormatUuid(const CUuuid& uuid) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(static_cast<unsigned char>(uuid.bytes[i]),
                                    absl::kZeroPad2));
  }
  return out;
}

class CudaMapper final : public DeviceMapper {
 public:
  CudaMapper(const Driver& d, CUdevice device, CUcontext context,
             CUdeviceptr base, int64_t size)
      : d_(d), device_(device), context_(context), base_(base), size_(size) {}

  ~CudaMapper() override {
    d_.cuCtxSetCurrent(context_);
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

  absl::Status Map(int64_t offset, int64_t bytes, UniqueFd fd) override {
    if (offset < 0 || bytes <= 0 || offset > size_ - bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle [", offset, ", +", bytes, ") outside the range of ", size_));
    }
    if (bundles_.contains(offset)) {
      return absl::FailedPreconditionError(
          absl::StrCat("a bundle is already mapped at offset ", offset));
    }
    CUresult r = d_.cuCtxSetCurrent(context_);
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuCtxSetCurrent");
    CUmemGenericAllocationHandle handle = 0;
    r = d_.cuMemImportFromShareableHandle(
        &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd.get())),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    fd.Reset();  // the imported handle keeps the memory alive
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuMemImportFromShareableHandle");
    const CUdeviceptr at = base_ + offset;
    r = d_.cuMemMap(at, bytes, 0, handle, 0);
    if (r != CUDA_SUCCESS) {
      d_.cuMemRelease(handle);
      return d_.Error(r, "cuMemMap");
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d_.cuMemSetAccess(at, bytes, &access, 1);
    if (r != CUDA_SUCCESS) {
      d_.cuMemUnmap(at, bytes);
      d_.cuMemRelease(handle);
      return d_.Error(r, "cuMemSetAccess");
    }
    bundles_[offset] = {handle, static_cast<size_t>(bytes)};
    return absl::OkStatus();
  }

  absl::Status Unmap(int64_t offset) override {
    auto it = bundles_.find(offset);
    if (it == bundles_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no bundle mapped at offset ", offset));
    }
    CUresult r = d_.cuCtxSetCurrent(context_);
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuCtxSetCurrent");
    r = d_.cuMemUnmap(base_ + offset, it->second.bytes);
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuMemUnmap");
    r = d_.cuMemRelease(it->second.handle);
    bundles_.erase(it);
    if (r != CUDA_SUCCESS) return d_.Error(r, "cuMemRelease");
    return absl::OkStatus();
  }

 private:
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
    if (FormatUuid(uuid) != device_uuid) continue;
    CUcontext context = nullptr;
    if ((r = d.cuDevicePrimaryCtxRetain(&context, device)) != CUDA_SUCCESS) {
      return d.Error(r, "cuDevicePrimaryCtxRetain");
    }
    CUdeviceptr base = 0;
    if ((r = d.cuCtxSetCurrent(context)) != CUDA_SUCCESS ||
        (r = d.cuMemAddressReserve(&base, size, 0, 0, 0)) != CUDA_SUCCESS) {
      d.cuDevicePrimaryCtxRelease(device);
      return d.Error(r, "cuMemAddressReserve");
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
