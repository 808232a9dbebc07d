// CudaBackend: the Backend contract on NVIDIA GPUs, through the CUDA driver's
// virtual memory management (VMM) API.
//
// The driver is loaded at run time: Create() dlopen()s "libcuda.so.1" and
// resolves every entry point by name, so nothing links against libcuda and
// every binary still starts on a machine without a GPU or driver (Create()
// then fails with UNAVAILABLE and the daemon serves the host backend).
// cuda_backend.cc is the only file of the project that includes <cuda.h>;
// built without the CUDA headers (KVB_HAVE_CUDA_H undefined) this class still
// compiles and Create() reports UNAVAILABLE "built without CUDA headers".
//
// The operations map one to one onto the driver:
//   ReserveRange  cuMemAddressReserve (aligned to the granularity)
//   FreeRange     cuMemAddressFree
//   Create        cuMemCreate: pinned device memory located on `device`,
//                 requesting POSIX file descriptor export (engines attaching on the same node)
//                 when the device accepts it (see exportable())
//   Map           cuMemMap, offset 0, the whole handle
//   SetAccess     cuMemSetAccess, read-write for `device`, exactly the range
//   Unmap         cuMemUnmap
//   Release       cuMemRelease
//   QueryMemory   cuMemGetInfo in `device`'s context (free, total)
// granularity(device) is cuMemGetAllocationGranularity(MINIMUM) for that
// allocation type, queried once at Create() (2 MiB on current GPUs).
//
// Ownership: the backend owns one retained primary context per device,
// released on destruction, and the driver library handle, which is never
// closed (unloading the driver is unsafe). It owns no physical handle and no
// virtual range: those belong to the caller, who must unmap, release and free
// them before destroying the backend (if this backend holds the last reference
// to a primary context, destroying it frees the device's memory anyway).
//
// Context and threads: driver calls come from arbitrary threads (RPC threads,
// the prealloc worker). Every call first makes `device`'s primary context
// current on the calling thread with cuCtxSetCurrent (tens of nanoseconds),
// and leaves it current afterwards. Code that shares a thread with this
// backend and uses its own CUDA context must set it again itself.
//
// Error mapping (one function, internal::CudaResultToStatus; backend.h's
// convention):
//   CUDA_ERROR_OUT_OF_MEMORY                          -> RESOURCE_EXHAUSTED
//   sticky or fatal errors: ILLEGAL_ADDRESS, LAUNCH_FAILED, ECC_UNCORRECTABLE,
//     DEVICE_UNAVAILABLE, CONTEXT_IS_DESTROYED, INVALID_CONTEXT,
//     HARDWARE_STACK_ERROR, ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS,
//     INVALID_ADDRESS_SPACE, INVALID_PC, ASSERT, LAUNCH_TIMEOUT,
//     NVLINK_UNCORRECTABLE, CONTAINED, EXTERNAL_DEVICE, DEINITIALIZED,
//     NOT_INITIALIZED, UNKNOWN, ...                   -> INTERNAL
//   caller bugs: INVALID_VALUE, INVALID_HANDLE, INVALID_DEVICE,
//     ALREADY_MAPPED, NOT_MAPPED                       -> INVALID_ARGUMENT
//   anything else (NOT_SUPPORTED, NOT_PERMITTED, OPERATING_SYSTEM, ...)
//                                                     -> UNAVAILABLE
// The message names the call, the driver's error name and string, and the
// device, e.g. "cuMemCreate(2097152 bytes) on device 0:
// CUDA_ERROR_OUT_OF_MEMORY (out of memory)". Arguments this class can check
// itself (device ordinal, zero or unaligned sizes and addresses) are refused
// with INVALID_ARGUMENT before the driver is called.
//
// Thread safety: every method may be called concurrently from any thread. All
// state is constant after Create(); the driver serialises what it must.

#ifndef KVBROKER_ALLOCATOR_CUDA_BACKEND_H_
#define KVBROKER_ALLOCATOR_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/backend.h"

// The driver's context type, declared here so the header needs no cuda.h
// (cuda.h: typedef struct CUctx_st* CUcontext).
struct CUctx_st;

namespace kvbroker {

struct CudaBackendOptions {
  // The driver library to dlopen. Tests point it at a missing file.
  std::string driver_library = "libcuda.so.1";
};

class CudaBackend final : public Backend {
 public:
  // Loads the driver, initialises it and prepares every visible device
  // (CUDA_VISIBLE_DEVICES applies): retains its primary context, checks VMM
  // support, queries the granularity and whether handles can be exported as
  // POSIX file descriptors (a one-granule cuMemCreate probe, released at
  // once).
  //
  // Every failure is UNAVAILABLE with a reason, for example:
  //   "CUDA driver unavailable: libcuda.so.1 not found (dlopen: ...)"
  //   "CUDA driver unavailable: libcuda.so.1 lacks cuMemCreate ..."
  //   "CUDA driver unavailable: no CUDA device (...)"
  //   "CUDA driver unavailable: VMM not supported on device 1 (...)"
  //   "CUDA driver unavailable: built without CUDA headers"
  // A failed Create leaves no context retained.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create();
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const CudaBackendOptions& options);

  // Releases the primary contexts. REQUIRES: the caller has released every
  // handle and freed every range it obtained from this backend.
  ~CudaBackend() override;

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Backend. Codes: see the error mapping above and backend.h.
  std::string name() const override { return "cuda"; }
  int device_count() const override {
    return static_cast<int>(devices_.size());
  }
  // REQUIRES: 0 <= device < device_count().
  Bytes granularity(int device) const override;

  absl::StatusOr<VirtualRange> ReserveRange(int device, Bytes size) override;
  absl::Status FreeRange(int device, VirtualRange range) override;
  absl::StatusOr<PhysicalHandle> Create(int device, Bytes size) override;
  absl::Status Map(int device, uint64_t address, Bytes size,
                   PhysicalHandle handle) override;
  absl::Status SetAccess(int device, uint64_t address, Bytes size) override;
  absl::Status Unmap(int device, uint64_t address, Bytes size) override;
  absl::Status Release(int device, PhysicalHandle handle) override;
  absl::StatusOr<MemoryInfo> QueryMemory(int device) override;
  // cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  // UNAVAILABLE on a device whose handles are not exportable().
  absl::StatusOr<int> ExportHandle(int device, PhysicalHandle handle) override;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (cuDeviceGetUuid, as
  // nvidia-smi prints it).
  std::string device_uuid(int device) const override;
  absl::Status Zero(int device, uint64_t address, Bytes size) override;

  // Facts gathered at Create(), for logs and metrics.
  // The driver's CUDA version, e.g. 13000.
  int driver_version() const { return driver_version_; }
  // REQUIRES: 0 <= device < device_count() for the three below.
  // The device's product name, e.g. "NVIDIA H200".
  const std::string& device_name(int device) const;
  // cuDeviceTotalMem.
  Bytes device_total_memory(int device) const;
  // True when Create() requests CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, so
  // handles can later be exported to engines (engines attaching on the same node); false when
  // the device refused it and handles are created with no export type.
  bool exportable(int device) const;

  // Synchronous copies between host memory and a mapped, accessible device
  // address (cuMemcpyHtoD followed by cuCtxSynchronize, and cuMemcpyDtoH).
  // For tests and diagnostics (proving that data survives remapping on a
  // GPU); never on the allocation path. Copying to or from an address that is
  // not mapped and accessible may be reported as a fatal (INTERNAL) error.
  // REQUIRES: [address, address + bytes) lies inside mappings made
  // accessible with SetAccess on `device`.
  absl::Status CopyToDevice(int device, uint64_t dst, const void* src,
                            size_t bytes);
  absl::Status CopyFromDevice(int device, void* dst, uint64_t src,
                              size_t bytes);

 private:
  // The resolved driver entry points; defined in cuda_backend.cc.
  struct Driver;

  struct Device {
    int cu_device = 0;            // CUdevice of this ordinal
    CUctx_st* context = nullptr;  // retained primary context
    Bytes granularity;            // minimum allocation granularity
    int handle_type = 0;          // CUmemAllocationHandleType for cuMemCreate
    Bytes total;                  // cuDeviceTotalMem
    std::string name;             // cuDeviceGetName
    std::string uuid;             // cuDeviceGetUuid, formatted
  };

  CudaBackend(std::unique_ptr<const Driver> driver, int driver_version,
              std::vector<Device> devices);

  // Checks the ordinal and makes the device's context current on this thread.
  absl::Status Enter(int device) const;
  // INVALID_ARGUMENT unless `value` is a non-zero multiple of the granularity.
  absl::Status CheckAligned(int device, absl::string_view what,
                            uint64_t value) const;

  // Constant after construction.
  const std::unique_ptr<const Driver> driver_;
  const int driver_version_;
  const std::vector<Device> devices_;
};

namespace internal {

// The one CUresult -> absl::Status translation (see the mapping in the file
// comment). `result` is the CUresult's value; `error_name` and
// `error_string` come from cuGetErrorName and cuGetErrorString (either may be
// empty); `call` names the driver call and its arguments. CUDA_SUCCESS maps to
// OK. Built without CUDA headers every error maps to UNAVAILABLE.
absl::Status CudaResultToStatus(int result, absl::string_view error_name,
                                absl::string_view error_string,
                                absl::string_view call, int device);

}  // namespace internal
}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_CUDA_BACKEND_H_
