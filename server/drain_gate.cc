// DrainGate: admission counting and the DRAINING refusal.

#include "server/drain_gate.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "allocator/failure.h"

namespace kvbroker {

DrainGate::Pass DrainGate::Enter(absl::Status* refusal) {
  absl::MutexLock lock(&mu_);
  ++arrivals_;
  if (closed_) {
    last_arrival_ = absl::Now();
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
  if (!closed_) last_arrival_ = absl::Now();
  closed_ = true;
}

int64_t DrainGate::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return running_;
}

int64_t DrainGate::AwaitQuiet(absl::Duration quiet, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return running_ == 0;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return running_;
    }
    const absl::Time quiet_at = last_arrival_ + quiet;
    if (absl::Now() >= quiet_at || absl::Now() >= deadline) return running_;
    // Sleep until the pause is long enough, waking on any arrival.
    const int64_t seen = arrivals_;
    auto arrived = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return arrivals_ != seen;
    };
    mu_.AwaitWithDeadline(absl::Condition(&arrived),
                          std::min(quiet_at, deadline));
  }
}

void DrainGate::Leave() {
  absl::MutexLock lock(&mu_);
  --running_;
}

}  // namespace kvbroker
