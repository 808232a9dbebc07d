// DrainGate: the door unary calls pass through, closed on SIGTERM (SPEC 9:
// a call in flight ends OK or UNAVAILABLE, never CANCELLED).
//
// While open, Enter() admits a call and counts it until its Pass is
// destroyed. Close() shuts the door: every later Enter() is refused with a
// typed DRAINING failure (UNAVAILABLE, RetryInfo), so a call arriving
// during the drain gets an answer a client can act on instead of being
// cancelled by the server's shutdown. AwaitIdle() waits for the admitted
// calls to finish, and AwaitQuiet() also for a pause in arrivals: gRPC
// cancels a call that reaches a server already shutting down, so the
// daemon shuts the gRPC server down only once the calls clients had sent
// before they learnt of the drain have been answered.
//
// Thread safety: thread-safe.

#ifndef KVBROKER_SERVER_DRAIN_GATE_H_
#define KVBROKER_SERVER_DRAIN_GATE_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvbroker {

class DrainGate {
 public:
  // An admitted call; leaving its scope ends it.
  class Pass {
   public:
    explicit Pass(DrainGate* gate) : gate_(gate) {}
    Pass(Pass&& other) : gate_(other.gate_) { other.gate_ = nullptr; }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (gate_ != nullptr) gate_->Leave();
    }
    // False for the refusal's placeholder.
    bool admitted() const { return gate_ != nullptr; }

   private:
    DrainGate* gate_;
  };

  // Admits the call (admitted() is true) or, once closed, returns a pass
  // that admits nothing and stores the DRAINING refusal in `*refusal`.
  Pass Enter(absl::Status* refusal) ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses every later call. Idempotent.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until no admitted call remains or `deadline` passes; returns the
  // number still running.
  int64_t AwaitIdle(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no admitted call remains and no call (admitted or refused)
  // has arrived for `quiet`, or until `deadline`; returns the number of
  // admitted calls still running.
  int64_t AwaitQuiet(absl::Duration quiet, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls that entered, admitted or refused, and when the last one did (or
  // when the gate closed, if later).
  int64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_arrival_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_DRAIN_GATE_H_
