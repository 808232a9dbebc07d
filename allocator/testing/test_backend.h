// The backend tests run on: host memory by default, the GPUs when the
// environment says KVB_TEST_BACKEND=cuda. Scenario, rollback and data tests
// use it so that the same test binaries prove the same rows on an H200.
//
// Budgets are set through FaultInjectingBackend::OverrideMemory, which works
// over either backend, so no test depends on host-only knobs.

#ifndef KVBROKER_ALLOCATOR_TESTING_TEST_BACKEND_H_
#define KVBROKER_ALLOCATOR_TESTING_TEST_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "allocator/backend.h"

namespace kvbroker {
namespace testing_support {

class TestBackend {
 public:
  // "host" or "cuda", from KVB_TEST_BACKEND (default "host").
  static std::string Kind();

  // A backend with at least `devices` devices, or nullptr with `why` set
  // (the caller skips: e.g. a one-GPU machine asked for two).
  static std::unique_ptr<TestBackend> Make(int devices, std::string* why);

  Backend* backend() const { return backend_; }
  // Copies between host memory and a mapped, accessible device address.
  absl::Status Write(int device, uint64_t address, const void* src,
                     size_t bytes);
  absl::Status Read(int device, void* dst, uint64_t address, size_t bytes);

 private:
  TestBackend() = default;
  std::unique_ptr<Backend> owned_;
  Backend* backend_ = nullptr;
  bool cuda_ = false;
};

}  // namespace testing_support
}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_TESTING_TEST_BACKEND_H_
