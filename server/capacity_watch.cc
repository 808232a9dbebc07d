// WatchCapacity streams: one reactor per stream, fed by the ChangeFeed.

#include "server/capacity_watch.h"

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "allocator/failure.h"
#include "server/status_convert.h"

namespace kvbroker {
namespace {

// A typed failure as ToGrpcStatus sends it; an untyped one (the feed's
// "shutting down") with its own code.
grpc::Status StreamStatus(const absl::Status& status) {
  if (GetFailure(status).has_value()) return ToGrpcStatus(status);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// Ownership: the reactor owns itself through `self_` from Begin() until
// OnDone(); the feed holds it weakly, so a notification that races with the
// end of the stream finds it either alive or gone, never half-destroyed.
//
// At most one thread "pumps" at a time: a pump claims `writing_` under `mu_`,
// then calls StartWrite or Finish without the lock (a write's completion may
// run inline and take `mu_` itself). Finish is called exactly once, never
// while a write is in flight.
class CapacityWatch final
    : public grpc::ServerWriteReactor<v1::WatchCapacityResponse>,
      public ChangeFeed::Subscriber {
 public:
  explicit CapacityWatch(std::shared_ptr<ChangeFeed> feed)
      : feed_(std::move(feed)) {}

  void Begin(std::shared_ptr<CapacityWatch> self, ChangeFeed::Watch watch) {
    self_ = std::move(self);
    if (absl::Status s = feed_->Subscribe(std::move(watch), self_); !s.ok()) {
      RequestFinish(StreamStatus(s));
    }
  }

  void OnSnapshot(ChangeFeed::Snapshot snapshot) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      pending_ = std::move(snapshot);
    }
    Pump();
  }
  void OnEnd(const absl::Status& failure) override {
    RequestFinish(ToGrpcStatus(failure));
  }
  void OnClose() override { RequestFinish(grpc::Status::OK); }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      in_flight_.reset();
      // A failed write means the stream is gone; OnCancel follows.
      if (!ok && !finish_.has_value()) finish_ = grpc::Status::CANCELLED;
    }
    Pump();
  }
  void OnCancel() override { RequestFinish(grpc::Status::CANCELLED); }

  void OnDone() override {
    feed_->Unsubscribe(this);
    std::shared_ptr<CapacityWatch> self = std::move(self_);
    // `self` destroys this object on return.
  }

 private:
  void RequestFinish(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_.has_value()) finish_ = std::move(status);
    }
    Pump();
  }

  void Pump() ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<grpc::Status> finish_now;
    const v1::WatchCapacityResponse* write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (finish_.has_value()) {
        finished_ = true;  // only this thread gets past the check above
        finish_now = *finish_;
      } else if (pending_ != nullptr) {
        in_flight_ = std::move(pending_);
        pending_.reset();
        write = in_flight_.get();
        writing_ = true;  // claims the pump
      } else {
        return;
      }
    }
    if (finish_now.has_value()) {
      Finish(*finish_now);
    } else {
      StartWrite(write);
    }
  }

  const std::shared_ptr<ChangeFeed> feed_;
  std::shared_ptr<CapacityWatch> self_;  // set by Begin, dropped by OnDone

  absl::Mutex mu_;
  // The newest snapshot not yet written; replaced by newer ones.
  ChangeFeed::Snapshot pending_ ABSL_GUARDED_BY(mu_);
  // The message being written; kept alive until OnWriteDone.
  ChangeFeed::Snapshot in_flight_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
};

// A reactor that only finishes.
class Refusal final
    : public grpc::ServerWriteReactor<v1::WatchCapacityResponse> {
 public:
  explicit Refusal(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::WatchCapacityResponse>* StartCapacityWatch(
    std::shared_ptr<ChangeFeed> feed, ChangeFeed::Watch watch) {
  auto reactor = std::make_shared<CapacityWatch>(std::move(feed));
  CapacityWatch* raw = reactor.get();
  raw->Begin(std::move(reactor), std::move(watch));
  return raw;
}

grpc::ServerWriteReactor<v1::WatchCapacityResponse>* RefuseCapacityWatch(
    const absl::Status& refusal) {
  return new Refusal(refusal);
}

}  // namespace kvbroker
