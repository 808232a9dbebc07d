// DrainGate: admission counting and the DRAINING refusal.

#include "server/drain_gate.h"

#include "allocator/failure.h"

namespace kvbroker {

DrainGate::Pass DrainGate::Enter(absl::Status* refusal) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    *refusal = MakeFailure(FailureReason::kDraining,
                           "the daemon is shutting down and did not run the "
                           "call; retry on another replica or after it "
                           "restarts");
    return Pass(nullptr);
  }
  ++running_;
  return Pass(this);
}

void DrainGate::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

int64_t DrainGate::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return running_;
}

void DrainGate::Leave() {
  absl::MutexLock lock(&mu_);
  --running_;
}

}  // namespace kvbroker
