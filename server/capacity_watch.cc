// WatchCapacity streams: one reactor per stream, fed by the ChangeFeed.

#include "server/capacity_watch.h"

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/proto_convert.h"
#include "server/status_convert.h"

namespace kvbroker {
namespace {

// One WatchCapacity stream; see capacity_watch.h.
//
// Ownership: the reactor owns itself through `self_` from Begin() until
// OnDone(); the feed holds it weakly, so a notification that races with the
// end of the stream finds it either alive or gone, never half-destroyed.
//
// At most one thread "pumps" at a time: a pump claims `writing_` under `mu_`,
// then takes the snapshot and calls StartWrite without the lock (a write's
// completion may run inline and take `mu_` itself). Finish is called exactly
// once, never while a write is in flight.
class CapacityWatch final
    : public grpc::ServerWriteReactor<v1::WatchCapacityResponse>,
      public ChangeFeed::Subscriber {
 public:
  CapacityWatch(std::shared_ptr<ChangeFeed> feed,
                std::shared_ptr<PagePool> pool, int64_t max_pages)
      : feed_(std::move(feed)), pool_(std::move(pool)), max_pages_(max_pages) {}

  // Starts the stream: subscribes and sends the first snapshot.
  void Begin(std::shared_ptr<CapacityWatch> self) {
    self_ = std::move(self);
    if (!feed_->Subscribe(pool_->name(), self_)) {
      RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the server is shutting down"));
    }
    Pump();
  }

  void OnPoolChanged() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      dirty_ = true;
    }
    Pump();
  }
  void OnClose() override { RequestFinish(grpc::Status::OK); }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
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
    for (;;) {
      std::optional<grpc::Status> finish_now;
      {
        absl::MutexLock lock(&mu_);
        if (finished_ || writing_) return;
        if (finish_.has_value()) {
          finished_ = true;  // only this thread gets past the check above
          finish_now = *finish_;
        } else if (dirty_) {
          dirty_ = false;
          writing_ = true;  // claims the pump
        } else {
          return;
        }
      }
      if (finish_now.has_value()) {
        Finish(*finish_now);
        return;
      }
      absl::StatusOr<CapacitySnapshot> snapshot =
          pool_->Capacity(CapacityQuery{max_pages_});
      if (snapshot.ok() && sent_generation_ != snapshot->generation) {
        sent_generation_ = snapshot->generation;
        response_.Clear();
        ToProto(*snapshot, response_.mutable_capacity());
        StartWrite(&response_);
        return;
      }
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!snapshot.ok() && !finish_.has_value()) {
        finish_ = ToGrpcStatus(snapshot.status());
      }
      // Loop: a change or a finish request may have arrived meanwhile.
    }
  }

  const std::shared_ptr<ChangeFeed> feed_;
  const std::shared_ptr<PagePool> pool_;
  const int64_t max_pages_;
  std::shared_ptr<CapacityWatch> self_;  // set by Begin, dropped by OnDone

  // Touched only by the thread that holds the pump (writing_ == true).
  std::optional<uint64_t> sent_generation_;
  v1::WatchCapacityResponse response_;

  absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;  // the first snapshot is due
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
    std::shared_ptr<ChangeFeed> feed, std::shared_ptr<PagePool> pool,
    int64_t max_pages) {
  auto watch = std::make_shared<CapacityWatch>(std::move(feed), std::move(pool),
                                               max_pages);
  CapacityWatch* reactor = watch.get();
  reactor->Begin(std::move(watch));
  return reactor;
}

grpc::ServerWriteReactor<v1::WatchCapacityResponse>* RefuseCapacityWatch(
    const absl::Status& refusal) {
  return new Refusal(refusal);
}

}  // namespace kvbroker
