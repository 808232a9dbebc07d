// CudaBackend: the CUDA driver's VMM API, loaded with dlopen at run time.
// The daemon's only file that includes <cuda.h> (an engine's own mapping is
// engine/cuda_mapper.cc, in the engine's process).

#include "allocator/cuda_backend.h"

#include <dlfcn.h>
#include <fcntl.h>

#include <utility>

#include "absl/base/macros.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"

#ifdef KVB_HAVE_CUDA_H
#include <cuda.h>
#endif

namespace kvbroker {
namespace {

absl::Status Unavailable(absl::string_view reason) {
  return absl::UnavailableError(
      absl::StrCat("CUDA driver unavailable: ", reason));
}

absl::Status StatusWithCode(absl::StatusCode code, int result,
                            absl::string_view error_name,
                            absl::string_view error_string,
                            absl::string_view call, int device) {
  std::string message(call);
  if (device >= 0) absl::StrAppend(&message, " on device ", device);
  absl::StrAppend(&message, ": ",
                  error_name.empty() ? absl::StrCat("CUresult ", result)
                                     : std::string(error_name));
  if (!error_string.empty()) absl::StrAppend(&message, " (", error_string, ")");
  return absl::Status(code, message);
}

}  // namespace

Bytes CudaBackend::granularity(int device) const {
  ABSL_ASSERT(device >= 0 && device < device_count());
  return devices_[device].granularity;
}

const std::string& CudaBackend::device_name(int device) const {
  ABSL_ASSERT(device >= 0 && device < device_count());
  return devices_[device].name;
}

Bytes CudaBackend::device_total_memory(int device) const {
  ABSL_ASSERT(device >= 0 && device < device_count());
  return devices_[device].total;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create() {
  return Create(CudaBackendOptions());
}

absl::Status CudaBackend::CheckAligned(int device, absl::string_view what,
                                       uint64_t value) const {
  const uint64_t g =
      static_cast<uint64_t>(devices_[device].granularity.value());
  if (value == 0 || g == 0 || value % g != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", value, " on device ", device,
                     " is not a non-zero multiple of the granularity ", g));
  }
  return absl::OkStatus();
}

#ifdef KVB_HAVE_CUDA_H

// Every driver entry point this file calls. Each name is expanded by cuda.h's
// macros before use, so the versioned symbol is resolved (cuMemGetInfo ->
// cuMemGetInfo_v2, cuDeviceTotalMem -> cuDeviceTotalMem_v2,
// cuDevicePrimaryCtxRelease -> cuDevicePrimaryCtxRelease_v2, cuMemcpyHtoD ->
// cuMemcpyHtoD_v2, ...) with the signature cuda.h declares for it.
#define KVB_CUDA_DRIVER_FUNCTIONS(X) \
  X(cuGetErrorName)                  \
  X(cuGetErrorString)                \
  X(cuInit)                          \
  X(cuDriverGetVersion)              \
  X(cuDeviceGetCount)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetName)                 \
  X(cuDeviceGetAttribute)            \
  X(cuDeviceTotalMem)                \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxSetCurrent)                 \
  X(cuCtxSynchronize)                \
  X(cuMemGetAllocationGranularity)   \
  X(cuMemAddressReserve)             \
  X(cuMemAddressFree)                \
  X(cuMemCreate)                     \
  X(cuMemMap)                        \
  X(cuMemSetAccess)                  \
  X(cuMemUnmap)                      \
  X(cuMemRelease)                    \
  X(cuMemGetInfo)                    \
  X(cuMemcpyHtoD)                    \
  X(cuMemsetD8)                      \
  X(cuMemcpyDtoH)                    \
  X(cuMemExportToShareableHandle)    \
  X(cuDeviceGetUuid)

#define KVB_CUDA_STRINGIFY_(x) #x
#define KVB_CUDA_STRINGIFY(x) KVB_CUDA_STRINGIFY_(x)

struct CudaBackend::Driver {
  void* library = nullptr;  // never dlclose()d once cuInit has run

#define KVB_CUDA_DECLARE(fn) decltype(&::fn) fn = nullptr;
  KVB_CUDA_DRIVER_FUNCTIONS(KVB_CUDA_DECLARE)
#undef KVB_CUDA_DECLARE

  // The Status for a failed call; OK for CUDA_SUCCESS.
  absl::Status Error(CUresult result, absl::string_view call,
                     int device) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
    return internal::CudaResultToStatus(static_cast<int>(result),
                                        name ? name : "", text ? text : "",
                                        call, device);
  }
};

namespace internal {

absl::Status CudaResultToStatus(int result, absl::string_view error_name,
                                absl::string_view error_string,
                                absl::string_view call, int device) {
  absl::StatusCode code;
  switch (static_cast<CUresult>(result)) {
    case CUDA_SUCCESS: return absl::OkStatus();

    case CUDA_ERROR_OUT_OF_MEMORY:
      code = absl::StatusCode::kResourceExhausted;
      break;

    // Sticky or fatal: the context or the device is lost.
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_UNKNOWN: code = absl::StatusCode::kInternal; break;

    // A violated precondition: a bug in the caller.
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_ALREADY_MAPPED:
    case CUDA_ERROR_NOT_MAPPED:
      code = absl::StatusCode::kInvalidArgument;
      break;

    default:  // recoverable: NOT_SUPPORTED, NOT_PERMITTED, OPERATING_SYSTEM...
      code = absl::StatusCode::kUnavailable;
      break;
  }
  return StatusWithCode(code, result, error_name, error_string, call, device);
}

}  // namespace internal

namespace {

CUmemAllocationProp DeviceAllocationProp(CUdevice device,
                                         CUmemAllocationHandleType type) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = type;
  return prop;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  const std::string& lib_name = options.driver_library;
  dlerror();
  void* library = dlopen(lib_name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return Unavailable(absl::StrCat(
        lib_name, " not found (dlopen: ", why ? why : "unknown error", ")"));
  }

  auto driver = std::make_unique<Driver>();
  driver->library = library;
#define KVB_CUDA_RESOLVE(fn)                                              \
  driver->fn = reinterpret_cast<decltype(driver->fn)>(                    \
      dlsym(library, KVB_CUDA_STRINGIFY(fn)));                            \
  if (driver->fn == nullptr) {                                            \
    dlclose(library);                                                     \
    return Unavailable(absl::StrCat(lib_name, " lacks ",                  \
                                    KVB_CUDA_STRINGIFY(fn),               \
                                    " (driver older than this build?)")); \
  }
  KVB_CUDA_DRIVER_FUNCTIONS(KVB_CUDA_RESOLVE)
#undef KVB_CUDA_RESOLVE

  // From here on the library stays loaded, whatever happens.
  const Driver& d = *driver;
  CUresult r = d.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    return Unavailable(absl::StrCat("no CUDA device (",
                                    d.Error(r, "cuInit", -1).message(), ")"));
  }
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    return Unavailable(absl::StrCat(
        lib_name, " is the CUDA toolkit's link stub, not a driver (cuInit: ",
        "CUDA_ERROR_STUB_LIBRARY)"));
  }
  if (r != CUDA_SUCCESS) {
    return Unavailable(d.Error(r, "cuInit", -1).message());
  }
  int version = 0;
  if ((r = d.cuDriverGetVersion(&version)) != CUDA_SUCCESS) {
    return Unavailable(d.Error(r, "cuDriverGetVersion", -1).message());
  }
  int count = 0;
  if ((r = d.cuDeviceGetCount(&count)) != CUDA_SUCCESS) {
    return Unavailable(d.Error(r, "cuDeviceGetCount", -1).message());
  }
  if (count <= 0) return Unavailable("no CUDA device (cuDeviceGetCount = 0)");

  std::vector<Device> devices;
  devices.reserve(count);
  // Releases the contexts retained so far if preparation fails.
  absl::Cleanup release_contexts = [&d, &devices] {
    for (const Device& dev : devices) {
      if (dev.context != nullptr) d.cuDevicePrimaryCtxRelease(dev.cu_device);
    }
  };

  for (int ordinal = 0; ordinal < count; ++ordinal) {
    Device dev;
    CUdevice cu_device = 0;
    if ((r = d.cuDeviceGet(&cu_device, ordinal)) != CUDA_SUCCESS) {
      return Unavailable(d.Error(r, "cuDeviceGet", ordinal).message());
    }
    dev.cu_device = cu_device;
    char name[256] = {};
    if (d.cuDeviceGetName(name, sizeof(name) - 1, cu_device) == CUDA_SUCCESS) {
      dev.name = name;
    }
    size_t total = 0;
    if ((r = d.cuDeviceTotalMem(&total, cu_device)) != CUDA_SUCCESS) {
      return Unavailable(d.Error(r, "cuDeviceTotalMem", ordinal).message());
    }
    dev.total = Bytes(static_cast<int64_t>(total));
    CUuuid uuid = {};
    if (d.cuDeviceGetUuid(&uuid, cu_device) == CUDA_SUCCESS) {
      dev.uuid = FormatGpuUuid(uuid.bytes);
    }

    int vmm = 0;
    r = d.cuDeviceGetAttribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        cu_device);
    if (r != CUDA_SUCCESS || vmm == 0) {
      return Unavailable(absl::StrCat("VMM not supported on device ", ordinal,
                                      " (", dev.name, ")"));
    }
    int posix_fd = 0;
    if (d.cuDeviceGetAttribute(
            &posix_fd,
            CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            cu_device) != CUDA_SUCCESS) {
      posix_fd = 0;
    }

    CUcontext context = nullptr;
    if ((r = d.cuDevicePrimaryCtxRetain(&context, cu_device)) != CUDA_SUCCESS) {
      return Unavailable(
          d.Error(r, "cuDevicePrimaryCtxRetain", ordinal).message());
    }
    dev.context = context;
    devices.push_back(dev);  // from now on released by the cleanup
    if ((r = d.cuCtxSetCurrent(context)) != CUDA_SUCCESS) {
      return Unavailable(d.Error(r, "cuCtxSetCurrent", ordinal).message());
    }

    // Granularity for the allocations Create() will make; export as a POSIX
    // file descriptor where the device allows it, else no export.
    CUmemAllocationHandleType type =
        posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                 : CU_MEM_HANDLE_TYPE_NONE;
    size_t gran = 0;
    CUmemAllocationProp prop = DeviceAllocationProp(cu_device, type);
    r = d.cuMemGetAllocationGranularity(&gran, &prop,
                                        CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS && type != CU_MEM_HANDLE_TYPE_NONE) {
      type = CU_MEM_HANDLE_TYPE_NONE;
      prop = DeviceAllocationProp(cu_device, type);
      r = d.cuMemGetAllocationGranularity(&gran, &prop,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    }
    if (r != CUDA_SUCCESS || gran == 0) {
      return Unavailable(
          d.Error(r, "cuMemGetAllocationGranularity", ordinal).message());
    }
    // The attribute can promise export that cuMemCreate then refuses (e.g.
    // in some containers): probe one granule and fall back to no export.
    if (type != CU_MEM_HANDLE_TYPE_NONE) {
      CUmemGenericAllocationHandle probe = 0;
      r = d.cuMemCreate(&probe, gran, &prop, 0);
      if (r == CUDA_SUCCESS) {
        d.cuMemRelease(probe);
      } else if (r == CUDA_ERROR_NOT_SUPPORTED ||
                 r == CUDA_ERROR_NOT_PERMITTED ||
                 r == CUDA_ERROR_INVALID_VALUE) {
        type = CU_MEM_HANDLE_TYPE_NONE;
        prop = DeviceAllocationProp(cu_device, type);
        if ((r = d.cuMemGetAllocationGranularity(
                 &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) !=
            CUDA_SUCCESS) {
          return Unavailable(
              d.Error(r, "cuMemGetAllocationGranularity", ordinal).message());
        }
      }
      // Any other failure (out of memory now) says nothing about export:
      // keep what the attribute promised.
    }
    devices.back().granularity = Bytes(static_cast<int64_t>(gran));
    devices.back().handle_type = static_cast<int>(type);
  }

  std::move(release_contexts).Cancel();
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::move(driver), version, std::move(devices)));
}

CudaBackend::~CudaBackend() {
  for (const Device& dev : devices_) {
    driver_->cuDevicePrimaryCtxRelease(dev.cu_device);
  }
}

absl::StatusOr<int> CudaBackend::ExportHandle(int device,
                                              PhysicalHandle handle) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (!exportable(device)) {
    return absl::UnavailableError(
        absl::StrCat("device ", device,
                     " creates handles without POSIX file descriptor export"));
  }
  int fd = -1;
  CUresult r = driver_->cuMemExportToShareableHandle(
      &fd, handle.value, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(r, "cuMemExportToShareableHandle", device);
  }
  // The driver's fd is not close-on-exec; engines are exec()ed, never
  // forked, so mark it to keep it out of unrelated children.
  const int flags = fcntl(fd, F_GETFD);
  if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  return fd;
}

std::string CudaBackend::device_uuid(int device) const {
  if (device < 0 || device >= device_count()) return "";
  return devices_[device].uuid;
}

bool CudaBackend::exportable(int device) const {
  ABSL_ASSERT(device >= 0 && device < device_count());
  return devices_[device].handle_type ==
         static_cast<int>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

absl::Status CudaBackend::Enter(int device) const {
  if (device < 0 || device >= device_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no CUDA device ", device, " (", device_count(), " devices)"));
  }
  CUresult r = driver_->cuCtxSetCurrent(devices_[device].context);
  if (r != CUDA_SUCCESS) return driver_->Error(r, "cuCtxSetCurrent", device);
  return absl::OkStatus();
}

absl::StatusOr<VirtualRange> CudaBackend::ReserveRange(int device, Bytes size) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (absl::Status s = CheckAligned(device, "size", size.value()); !s.ok()) {
    return s;
  }
  CUdeviceptr base = 0;
  CUresult r = driver_->cuMemAddressReserve(
      &base, size.value(), devices_[device].granularity.value(), 0, 0);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(
        r, absl::StrCat("cuMemAddressReserve(", size.value(), " bytes)"),
        device);
  }
  return VirtualRange{static_cast<uint64_t>(base), size};
}

absl::Status CudaBackend::FreeRange(int device, VirtualRange range) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (absl::Status s = CheckAligned(device, "address", range.base); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAligned(device, "size", range.size.value());
      !s.ok()) {
    return s;
  }
  CUresult r = driver_->cuMemAddressFree(range.base, range.size.value());
  if (r != CUDA_SUCCESS) {
    return driver_->Error(
        r,
        absl::StrCat("cuMemAddressFree(0x", absl::Hex(range.base), ", ",
                     range.size.value(), " bytes)"),
        device);
  }
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> CudaBackend::Create(int device, Bytes size) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (absl::Status s = CheckAligned(device, "size", size.value()); !s.ok()) {
    return s;
  }
  const Device& dev = devices_[device];
  CUmemAllocationProp prop = DeviceAllocationProp(
      dev.cu_device, static_cast<CUmemAllocationHandleType>(dev.handle_type));
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = driver_->cuMemCreate(&handle, size.value(), &prop, 0);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(
        r, absl::StrCat("cuMemCreate(", size.value(), " bytes)"), device);
  }
  return PhysicalHandle{static_cast<uint64_t>(handle)};
}

absl::Status CudaBackend::Map(int device, uint64_t address, Bytes size,
                              PhysicalHandle handle) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (absl::Status s = CheckAligned(device, "address", address); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAligned(device, "size", size.value()); !s.ok()) {
    return s;
  }
  CUresult r = driver_->cuMemMap(address, size.value(), 0, handle.value, 0);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(r,
                          absl::StrCat("cuMemMap(0x", absl::Hex(address), ", ",
                                       size.value(), " bytes)"),
                          device);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::SetAccess(int device, uint64_t address, Bytes size) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (absl::Status s = CheckAligned(device, "address", address); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAligned(device, "size", size.value()); !s.ok()) {
    return s;
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = devices_[device].cu_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult r = driver_->cuMemSetAccess(address, size.value(), &access, 1);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(r,
                          absl::StrCat("cuMemSetAccess(0x", absl::Hex(address),
                                       ", ", size.value(), " bytes)"),
                          device);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Unmap(int device, uint64_t address, Bytes size) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (absl::Status s = CheckAligned(device, "address", address); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAligned(device, "size", size.value()); !s.ok()) {
    return s;
  }
  CUresult r = driver_->cuMemUnmap(address, size.value());
  if (r != CUDA_SUCCESS) {
    return driver_->Error(r,
                          absl::StrCat("cuMemUnmap(0x", absl::Hex(address),
                                       ", ", size.value(), " bytes)"),
                          device);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Release(int device, PhysicalHandle handle) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  CUresult r = driver_->cuMemRelease(handle.value);
  if (r != CUDA_SUCCESS) return driver_->Error(r, "cuMemRelease", device);
  return absl::OkStatus();
}

absl::StatusOr<MemoryInfo> CudaBackend::QueryMemory(int device) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  size_t free = 0;
  size_t total = 0;
  CUresult r = driver_->cuMemGetInfo(&free, &total);
  if (r != CUDA_SUCCESS) return driver_->Error(r, "cuMemGetInfo", device);
  return MemoryInfo{Bytes(static_cast<int64_t>(free)),
                    Bytes(static_cast<int64_t>(total))};
}

absl::Status CudaBackend::CopyToDevice(int device, uint64_t dst,
                                       const void* src, size_t bytes) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  CUresult r = driver_->cuMemcpyHtoD(dst, src, bytes);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(
        r,
        absl::StrCat("cuMemcpyHtoD(0x", absl::Hex(dst), ", ", bytes, " bytes)"),
        device);
  }
  // A copy from pageable memory may return before the DMA lands.
  r = driver_->cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return driver_->Error(r, "cuCtxSynchronize", device);
  return absl::OkStatus();
}

absl::Status CudaBackend::Zero(int device, uint64_t address, Bytes size) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (size.value() <= 0) return absl::OkStatus();
  CUresult r = driver_->cuMemsetD8(address, 0, size.value());
  if (r != CUDA_SUCCESS) {
    return driver_->Error(r,
                          absl::StrCat("cuMemsetD8(0x", absl::Hex(address),
                                       ", ", size.value(), " bytes)"),
                          device);
  }
  r = driver_->cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return driver_->Error(r, "cuCtxSynchronize", device);
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyFromDevice(int device, void* dst, uint64_t src,
                                         size_t bytes) {
  if (absl::Status s = Enter(device); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  CUresult r = driver_->cuMemcpyDtoH(dst, src, bytes);
  if (r != CUDA_SUCCESS) {
    return driver_->Error(
        r,
        absl::StrCat("cuMemcpyDtoH(0x", absl::Hex(src), ", ", bytes, " bytes)"),
        device);
  }
  return absl::OkStatus();
}

#undef KVB_CUDA_STRINGIFY
#undef KVB_CUDA_STRINGIFY_
#undef KVB_CUDA_DRIVER_FUNCTIONS

#else  // !KVB_HAVE_CUDA_H

// Built without cuda.h: Create() always fails, so no instance ever exists and
// the methods below are unreachable; they still answer per the contract.

struct CudaBackend::Driver {};

namespace internal {

absl::Status CudaResultToStatus(int result, absl::string_view error_name,
                                absl::string_view error_string,
                                absl::string_view call, int device) {
  if (result == 0) return absl::OkStatus();
  return StatusWithCode(absl::StatusCode::kUnavailable, result, error_name,
                        error_string, call, device);
}

}  // namespace internal

namespace {

absl::Status NoCuda() { return Unavailable("built without CUDA headers"); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& /*options*/) {
  return NoCuda();
}

CudaBackend::~CudaBackend() = default;

bool CudaBackend::exportable(int /*device*/) const { return false; }

absl::StatusOr<int> CudaBackend::ExportHandle(int /*device*/,
                                              PhysicalHandle /*handle*/) {
  return NoCuda();
}

std::string CudaBackend::device_uuid(int /*device*/) const { return ""; }

absl::Status CudaBackend::Zero(int /*device*/, uint64_t /*address*/,
                               Bytes /*size*/) {
  return NoCuda();
}

absl::Status CudaBackend::Enter(int /*device*/) const { return NoCuda(); }

absl::StatusOr<VirtualRange> CudaBackend::ReserveRange(int /*device*/,
                                                       Bytes /*size*/) {
  return NoCuda();
}

absl::Status CudaBackend::FreeRange(int /*device*/, VirtualRange /*range*/) {
  return NoCuda();
}

absl::StatusOr<PhysicalHandle> CudaBackend::Create(int /*device*/,
                                                   Bytes /*size*/) {
  return NoCuda();
}

absl::Status CudaBackend::Map(int /*device*/, uint64_t /*address*/,
                              Bytes /*size*/, PhysicalHandle /*handle*/) {
  return NoCuda();
}

absl::Status CudaBackend::SetAccess(int /*device*/, uint64_t /*address*/,
                                    Bytes /*size*/) {
  return NoCuda();
}

absl::Status CudaBackend::Unmap(int /*device*/, uint64_t /*address*/,
                                Bytes /*size*/) {
  return NoCuda();
}

absl::Status CudaBackend::Release(int /*device*/, PhysicalHandle /*handle*/) {
  return NoCuda();
}

absl::StatusOr<MemoryInfo> CudaBackend::QueryMemory(int /*device*/) {
  return NoCuda();
}

absl::Status CudaBackend::CopyToDevice(int /*device*/, uint64_t /*dst*/,
                                       const void* /*src*/, size_t /*bytes*/) {
  return NoCuda();
}

absl::Status CudaBackend::CopyFromDevice(int /*device*/, void* /*dst*/,
                                         uint64_t /*src*/, size_t /*bytes*/) {
  return NoCuda();
}

#endif  // KVB_HAVE_CUDA_H

// Defined last, where Driver is a complete type in either build.
CudaBackend::CudaBackend(std::unique_ptr<const Driver> driver,
                         int driver_version, std::vector<Device> devices)
    : driver_(std::move(driver)),
      driver_version_(driver_version),
      devices_(std::move(devices)) {}

}  // namespace kvbroker
