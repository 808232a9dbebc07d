// GatedBackend: holds one Create call at a gate. See the header.

#include "allocator/testing/gated_backend.h"

namespace kvbroker {
namespace testing_support {

void GatedBackend::Arm() {
  absl::MutexLock lock(&mu_);
  gate_ = Gate::kArmed;
}

void GatedBackend::WaitUntilHeld() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](Gate* g) { return *g == Gate::kHeld; }, &gate_));
}

void GatedBackend::Release(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_ = fail;
  gate_ = Gate::kReleased;
}

absl::StatusOr<PhysicalHandle> GatedBackend::Create(int device, Bytes size) {
  bool fail = false;
  {
    absl::MutexLock lock(&mu_);
    if (gate_ == Gate::kArmed) {
      gate_ = Gate::kHeld;
      mu_.Await(absl::Condition(
          +[](Gate* g) { return *g == Gate::kReleased; }, &gate_));
      fail = fail_;
      gate_ = Gate::kOpen;
    }
  }
  if (fail) return absl::UnavailableError("gated create failed on request");
  return target_->Create(device, size);
}

}  // namespace testing_support
}  // namespace kvbroker
