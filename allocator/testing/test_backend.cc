// TestBackend: host or CUDA, chosen by the environment.

#include "allocator/testing/test_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "allocator/cuda_backend.h"
#include "allocator/host_backend.h"

namespace kvbroker {
namespace testing_support {
namespace {

// One CUDA backend per process: retaining primary contexts is slow and the
// driver keeps them per process anyway.
CudaBackend* SharedCuda(std::string* why) {
  static absl::StatusOr<std::unique_ptr<CudaBackend>>* cuda =
      new absl::StatusOr<std::unique_ptr<CudaBackend>>(CudaBackend::Create());
  if (!cuda->ok()) {
    *why = std::string(cuda->status().message());
    return nullptr;
  }
  return cuda->value().get();
}

}  // namespace

std::string TestBackend::Kind() {
  const char* kind = std::getenv("KVB_TEST_BACKEND");
  return kind != nullptr && std::string(kind) == "cuda" ? "cuda" : "host";
}

std::unique_ptr<TestBackend> TestBackend::Make(int devices, std::string* why) {
  std::unique_ptr<TestBackend> t(new TestBackend());
  if (Kind() == "cuda") {
    CudaBackend* cuda = SharedCuda(why);
    if (cuda == nullptr) return nullptr;
    if (cuda->device_count() < devices) {
      *why = absl::StrCat("needs ", devices, " GPUs, this machine has ",
                          cuda->device_count());
      return nullptr;
    }
    t->backend_ = cuda;
    t->cuda_ = true;
    return t;
  }
  HostBackendOptions o;
  o.device_count = devices;
  o.device_total = Bytes(int64_t{1} << 40);
  t->owned_ = std::make_unique<HostBackend>(o);
  t->backend_ = t->owned_.get();
  return t;
}

absl::Status TestBackend::Write(int device, uint64_t address, const void* src,
                                size_t bytes) {
  if (cuda_) {
    return static_cast<CudaBackend*>(backend_)->CopyToDevice(device, address,
                                                             src, bytes);
  }
  std::memcpy(reinterpret_cast<void*>(address), src, bytes);
  return absl::OkStatus();
}

absl::Status TestBackend::Read(int device, void* dst, uint64_t address,
                               size_t bytes) {
  if (cuda_) {
    return static_cast<CudaBackend*>(backend_)->CopyFromDevice(device, dst,
                                                               address, bytes);
  }
  std::memcpy(dst, reinterpret_cast<const void*>(address), bytes);
  return absl::OkStatus();
}

}  // namespace testing_support
}  // namespace kvbroker
