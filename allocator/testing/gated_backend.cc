// GatedBackend: holds one Create or Unmap call at a gate. See the header.

#include "allocator/testing/gated_backend.h"

namespace kvbroker {
namespace testing_support {

void GatedBackend::Arm(Call which) {
  absl::MutexLock lock(&mu_);
  gate_ = Gate::kArmed;
  armed_for_ = which;
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

bool GatedBackend::Pass(Call call) {
  absl::MutexLock lock(&mu_);
  if (gate_ != Gate::kArmed || armed_for_ != call) return false;
  gate_ = Gate::kHeld;
  mu_.Await(absl::Condition(
      +[](Gate* g) { return *g == Gate::kReleased; }, &gate_));
  gate_ = Gate::kOpen;
  return fail_;
}

absl::StatusOr<PhysicalHandle> GatedBackend::Create(int device, Bytes size) {
  if (Pass(Call::kCreate)) {
    return absl::UnavailableError("gated create failed on request");
  }
  return target_->Create(device, size);
}

absl::Status GatedBackend::Unmap(int device, uint64_t address, Bytes size) {
  if (Pass(Call::kUnmap)) {
    return absl::UnavailableError("gated unmap failed on request");
  }
  return target_->Unmap(device, address, size);
}

}  // namespace testing_support
}  // namespace kvbroker
