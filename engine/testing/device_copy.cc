// DeviceCopier for the host backend (memcpy) and the CUDA backend (the
// driver's synchronous copies, libcuda dlopen()ed).

#include "engine/testing/device_copy.h"

#include <dlfcn.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"

#ifdef KVB_HAVE_CUDA_H
#include <cuda.h>
#endif

namespace kvbroker::testing {
namespace {

class HostCopier final : public DeviceCopier {
 public:
  absl::Status ToDevice(int, uint64_t address, const void* src,
                        size_t bytes) override {
    std::memcpy(reinterpret_cast<void*>(address), src, bytes);
    return absl::OkStatus();
  }
  absl::Status FromDevice(int, void* dst, uint64_t address,
                          size_t bytes) override {
    std::memcpy(dst, reinterpret_cast<const void*>(address), bytes);
    return absl::OkStatus();
  }
};

#ifdef KVB_HAVE_CUDA_H

#define KVB_COPY_CUDA_FUNCTIONS(X) \
  X(cuGetErrorName)                \
  X(cuInit)                        \
  X(cuDeviceGetCount)              \
  X(cuDeviceGet)                   \
  X(cuDeviceGetUuid)               \
  X(cuDevicePrimaryCtxRetain)      \
  X(cuDevicePrimaryCtxRelease)     \
  X(cuCtxSetCurrent)               \
  X(cuMemcpyHtoD)                  \
  X(cuMemcpyDtoH)                  \
  X(cuCtxSynchronize)

#define KVB_COPY_STR_(x) #x
#define KVB_COPY_STR(x) KVB_COPY_STR_(x)

struct Driver {
#define KVB_DECLARE(fn) decltype(&::fn) fn = nullptr;
  KVB_COPY_CUDA_FUNCTIONS(KVB_DECLARE)
#undef KVB_DECLARE
  absl::Status load_status;

  absl::Status Check(CUresult r, const char* call) const {
    if (r == CUDA_SUCCESS) return absl::OkStatus();
    const char* name = nullptr;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = "unknown";
    return absl::InternalError(absl::StrCat(call, ": ", name));
  }
};

// Resolved once per process; the library is never closed.
const Driver& LoadDriver() {
  static Driver* driver = [] {
    auto* d = new Driver();
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      d->load_status = absl::UnavailableError(absl::StrCat(
          "libcuda.so.1 unavailable (", why ? why : "not found", ")"));
      return d;
    }
#define KVB_RESOLVE(fn)                                                    \
  d->fn = reinterpret_cast<decltype(d->fn)>(dlsym(lib, KVB_COPY_STR(fn))); \
  if (d->fn == nullptr) {                                                  \
    d->load_status =                                                       \
        absl::UnavailableError("libcuda.so.1 lacks " KVB_COPY_STR(fn));    \
    return d;                                                              \
  }
    KVB_COPY_CUDA_FUNCTIONS(KVB_RESOLVE)
#undef KVB_RESOLVE
    d->load_status = d->Check(d->cuInit(0), "cuInit");
    return d;
  }();
  return *driver;
}

class CudaCopier final : public DeviceCopier {
 public:
  explicit CudaCopier(const Driver& d) : d_(d) {}
  ~CudaCopier() override {
    for (const Device& dev : devices_) d_.cuDevicePrimaryCtxRelease(dev.device);
  }

  // Retains the primary context of the device with `uuid`.
  absl::Status Add(const std::string& uuid) {
    int count = 0;
    absl::Status s = d_.Check(d_.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (!s.ok()) return s;
    for (int ordinal = 0; ordinal < count; ++ordinal) {
      Device dev;
      CUuuid u = {};
      if (!(s = d_.Check(d_.cuDeviceGet(&dev.device, ordinal), "cuDeviceGet"))
               .ok() ||
          !(s = d_.Check(d_.cuDeviceGetUuid(&u, dev.device), "cuDeviceGetUuid"))
               .ok()) {
        return s;
      }
      if (FormatGpuUuid(u.bytes) != uuid) continue;
      s = d_.Check(d_.cuDevicePrimaryCtxRetain(&dev.context, dev.device),
                   "cuDevicePrimaryCtxRetain");
      if (!s.ok()) return s;
      devices_.push_back(dev);
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        absl::StrCat("no visible CUDA device has UUID ", uuid));
  }

  absl::Status ToDevice(int device_index, uint64_t address, const void* src,
                        size_t bytes) override {
    absl::Status s = Enter(device_index);
    if (!s.ok()) return s;
    s = d_.Check(d_.cuMemcpyHtoD(static_cast<CUdeviceptr>(address), src, bytes),
                 "cuMemcpyHtoD");
    if (!s.ok()) return s;
    return d_.Check(d_.cuCtxSynchronize(), "cuCtxSynchronize");
  }

  absl::Status FromDevice(int device_index, void* dst, uint64_t address,
                          size_t bytes) override {
    absl::Status s = Enter(device_index);
    if (!s.ok()) return s;
    return d_.Check(
        d_.cuMemcpyDtoH(dst, static_cast<CUdeviceptr>(address), bytes),
        "cuMemcpyDtoH");
  }

 private:
  struct Device {
    CUdevice device = 0;
    CUcontext context = nullptr;
  };

  absl::Status Enter(int device_index) {
    if (device_index < 0 || device_index >= static_cast<int>(devices_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("no session device ", device_index));
    }
    return d_.Check(d_.cuCtxSetCurrent(devices_[device_index].context),
                    "cuCtxSetCurrent");
  }

  const Driver& d_;
  std::vector<Device> devices_;  // by session device index
};

absl::StatusOr<std::unique_ptr<DeviceCopier>> CreateCuda(
    const std::vector<std::string>& device_uuids) {
  const Driver& d = LoadDriver();
  if (!d.load_status.ok()) return d.load_status;
  auto copier = std::make_unique<CudaCopier>(d);
  for (const std::string& uuid : device_uuids) {
    absl::Status s = copier->Add(uuid);
    if (!s.ok()) return s;
  }
  return std::unique_ptr<DeviceCopier>(std::move(copier));
}

#else  // !KVB_HAVE_CUDA_H

absl::StatusOr<std::unique_ptr<DeviceCopier>> CreateCuda(
    const std::vector<std::string>&) {
  return absl::UnavailableError("built without CUDA headers");
}

#endif  // KVB_HAVE_CUDA_H

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(
    const std::string& backend, const std::vector<std::string>& device_uuids) {
  if (backend == "host") return std::unique_ptr<DeviceCopier>(new HostCopier());
  if (backend == "cuda") return CreateCuda(device_uuids);
  return absl::UnimplementedError(
      absl::StrCat("no copier for backend \"", backend, "\""));
}

}  // namespace kvbroker::testing
