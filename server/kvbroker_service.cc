// kvbroker.v1.KvBroker over a Broker: message conversion and delegation.

#include "server/kvbroker_service.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "server/log.h"
#include "server/proto_convert.h"
#include "server/status_convert.h"

namespace kvbroker {
namespace {

void LogFailure(absl::string_view method, absl::string_view pool,
                const absl::Status& status) {
  const FailureReason reason = GetReason(status);
  LogLine(
      "%s pool=%s failed: %s (%s) %s", method, pool,
      reason == FailureReason::kUnspecified ? "UNTYPED" : ReasonName(reason),
      absl::StatusCodeToString(status.code()), status.message());
}

// Runs one unary call: refuses a call that was not admitted (`admission`,
// see KvBrokerService::Admit), is already cancelled or past its deadline;
// otherwise runs `body` (which fills the response) and finishes with its
// converted status.
template <typename Body>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx,
                                absl::string_view method,
                                absl::string_view pool,
                                const absl::Status& admission, Body&& body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!admission.ok()) {
    LogFailure(method, pool, admission);
    reactor->Finish(ToGrpcStatus(admission));
    return reactor;
  }
  if (ctx->IsCancelled()) {
    reactor->Finish(grpc::Status::CANCELLED);
    return reactor;
  }
  if (ctx->deadline() <= std::chrono::system_clock::now()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                 "the deadline passed before the call ran"));
    return reactor;
  }
  absl::Status status = body();
  if (!status.ok()) LogFailure(method, pool, status);
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t seconds = absl::ToUnixSeconds(t);  // rounds down
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(seconds))));
}

// One WatchCapacity stream; see the class comment of KvBrokerService.
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

}  // namespace

KvBrokerService::KvBrokerService(Broker* broker,
                                 std::shared_ptr<ChangeFeed> feed,
                                 const AccessPolicy* access)
    : broker_(broker), feed_(std::move(feed)), access_(access) {}

absl::StatusOr<const AccessPolicy::Grant*> KvBrokerService::Authenticate(
    grpc::CallbackServerContext* ctx) const {
  if (access_ == nullptr) return nullptr;
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find("authorization");
  return access_->Authenticate(
      it == metadata.end()
          ? absl::string_view()
          : absl::string_view(it->second.data(), it->second.size()));
}

absl::Status KvBrokerService::Admit(grpc::CallbackServerContext* ctx,
                                    absl::string_view method,
                                    absl::string_view pool) const {
  if (access_ == nullptr) return absl::OkStatus();
  absl::StatusOr<const AccessPolicy::Grant*> grant = Authenticate(ctx);
  if (!grant.ok()) return grant.status();
  return AccessPolicy::Authorize(**grant, pool, method);
}

grpc::ServerUnaryReactor* KvBrokerService::CreatePool(
    grpc::CallbackServerContext* ctx, const v1::CreatePoolRequest* request,
    v1::CreatePoolResponse* response) {
  absl::Status admission;
  if (absl::StatusOr<const AccessPolicy::Grant*> grant = Authenticate(ctx);
      !grant.ok()) {
    admission = grant.status();
  } else if (*grant != nullptr) {
    admission = AccessPolicy::AuthorizeCreate(**grant, request->pool().name());
  }
  return Unary(ctx, "CreatePool", request->pool().name(), admission, [&] {
    absl::StatusOr<std::shared_ptr<PagePool>> pool =
        broker_->CreatePool(FromProto(request->pool()));
    if (!pool.ok()) return pool.status();
    absl::StatusOr<CapacitySnapshot> capacity = (*pool)->Capacity();
    if (!capacity.ok()) return capacity.status();
    ToProto((*pool)->geometry(), *capacity, response->mutable_pool());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvBrokerService::GetPool(
    grpc::CallbackServerContext* ctx, const v1::GetPoolRequest* request,
    v1::GetPoolResponse* response) {
  return Unary(
      ctx, "GetPool", request->pool(), Admit(ctx, "GetPool", request->pool()),
      [&] {
        absl::StatusOr<std::shared_ptr<PagePool>> pool =
            broker_->GetPool(request->pool());
        if (!pool.ok()) return pool.status();
        absl::StatusOr<CapacitySnapshot> capacity = (*pool)->Capacity();
        if (!capacity.ok()) return capacity.status();
        ToProto((*pool)->geometry(), *capacity, response->mutable_pool());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvBrokerService::ListPools(
    grpc::CallbackServerContext* ctx, const v1::ListPoolsRequest* /*request*/,
    v1::ListPoolsResponse* response) {
  absl::StatusOr<const AccessPolicy::Grant*> grant = Authenticate(ctx);
  return Unary(ctx, "ListPools", "", grant.status(), [&] {
    for (const std::shared_ptr<PagePool>& pool : broker_->ListPools()) {
      if (*grant != nullptr && !(*grant)->Allows(pool->name())) continue;
      absl::StatusOr<CapacitySnapshot> capacity = pool->Capacity();
      if (!capacity.ok()) continue;  // deleted meanwhile
      ToProto(pool->geometry(), *capacity, response->add_pools());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvBrokerService::DeletePool(
    grpc::CallbackServerContext* ctx, const v1::DeletePoolRequest* request,
    v1::DeletePoolResponse* /*response*/) {
  return Unary(ctx, "DeletePool", request->pool(),
               Admit(ctx, "DeletePool", request->pool()), [&] {
                 return broker_->DeletePool(request->pool(), request->force());
               });
}

grpc::ServerUnaryReactor* KvBrokerService::Capacity(
    grpc::CallbackServerContext* ctx, const v1::CapacityRequest* request,
    v1::CapacityResponse* response) {
  return Unary(ctx, "Capacity", request->pool(),
               Admit(ctx, "Capacity", request->pool()), [&] {
                 if (request->max_pages() < 0) {
                   return InvalidField("max_pages", "must not be negative");
                 }
                 absl::StatusOr<std::shared_ptr<PagePool>> pool =
                     broker_->GetPool(request->pool());
                 if (!pool.ok()) return pool.status();
                 absl::StatusOr<CapacitySnapshot> capacity =
                     (*pool)->Capacity(CapacityQuery{request->max_pages()});
                 if (!capacity.ok()) return capacity.status();
                 ToProto(*capacity, response->mutable_capacity());
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* KvBrokerService::Alloc(
    grpc::CallbackServerContext* ctx, const v1::AllocRequest* request,
    v1::AllocResponse* response) {
  return Unary(ctx, "Alloc", request->pool(),
               Admit(ctx, "Alloc", request->pool()), [&] {
                 absl::StatusOr<std::shared_ptr<PagePool>> pool =
                     broker_->GetPool(request->pool());
                 if (!pool.ok()) return pool.status();
                 AllocRequest alloc;
                 alloc.num_blocks = request->num_blocks();
                 alloc.request_id = request->request_id();
                 alloc.reservation_id = request->reservation_id();
                 if (request->has_expected_generation()) {
                   alloc.expected_generation = request->expected_generation();
                 }
                 absl::StatusOr<AllocResult> result = (*pool)->Alloc(alloc);
                 if (!result.ok()) return result.status();
                 ToProto(result->pages, response->mutable_pages());
                 response->set_num_blocks(result->num_blocks);
                 response->set_generation(result->generation);
                 response->set_replayed(result->replayed);
                 response->set_pages_mapped(result->pages_mapped);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* KvBrokerService::Free(
    grpc::CallbackServerContext* ctx, const v1::FreeRequest* request,
    v1::FreeResponse* response) {
  return Unary(ctx, "Free", request->pool(),
               Admit(ctx, "Free", request->pool()), [&] {
                 absl::StatusOr<std::shared_ptr<PagePool>> pool =
                     broker_->GetPool(request->pool());
                 if (!pool.ok()) return pool.status();
                 FreeRequest free;
                 free.block_ids =
                     request->block_ids();  // a view: request outlives the call
                 free.request_id = request->request_id();
                 absl::StatusOr<FreeResult> result = (*pool)->Free(free);
                 if (!result.ok()) return result.status();
                 response->set_freed_blocks(result->freed_blocks);
                 response->set_pages_unmapped(result->pages_unmapped);
                 response->set_generation(result->generation);
                 response->set_replayed(result->replayed);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* KvBrokerService::Reserve(
    grpc::CallbackServerContext* ctx, const v1::ReserveRequest* request,
    v1::ReserveResponse* response) {
  return Unary(ctx, "Reserve", request->pool(),
               Admit(ctx, "Reserve", request->pool()), [&] {
                 absl::StatusOr<std::shared_ptr<PagePool>> pool =
                     broker_->GetPool(request->pool());
                 if (!pool.ok()) return pool.status();
                 ReserveRequest reserve;
                 reserve.num_blocks = request->num_blocks();
                 if (request->has_ttl())
                   reserve.ttl = FromProto(request->ttl());
                 reserve.request_id = request->request_id();
                 absl::StatusOr<ReservationInfo> result =
                     (*pool)->Reserve(reserve);
                 if (!result.ok()) return result.status();
                 response->set_reservation_id(result->reservation_id);
                 ToProto(result->pages, response->mutable_pages());
                 response->set_num_blocks(result->num_blocks);
                 ToProto(result->expires, response->mutable_expire_time());
                 response->set_generation(result->generation);
                 response->set_replayed(result->replayed);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* KvBrokerService::ReleaseReservation(
    grpc::CallbackServerContext* ctx,
    const v1::ReleaseReservationRequest* request,
    v1::ReleaseReservationResponse* response) {
  return Unary(ctx, "ReleaseReservation", request->pool(),
               Admit(ctx, "ReleaseReservation", request->pool()), [&] {
                 absl::StatusOr<std::shared_ptr<PagePool>> pool =
                     broker_->GetPool(request->pool());
                 if (!pool.ok()) return pool.status();
                 absl::StatusOr<ReleaseResult> result =
                     (*pool)->ReleaseReservation(request->reservation_id());
                 if (!result.ok()) return result.status();
                 response->set_released_blocks(result->released_blocks);
                 response->set_generation(result->generation);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* KvBrokerService::SetMemoryLimit(
    grpc::CallbackServerContext* ctx, const v1::SetMemoryLimitRequest* request,
    v1::SetMemoryLimitResponse* response) {
  return Unary(
      ctx, "SetMemoryLimit", request->pool(),
      Admit(ctx, "SetMemoryLimit", request->pool()), [&] {
        absl::StatusOr<std::shared_ptr<PagePool>> pool =
            broker_->GetPool(request->pool());
        if (!pool.ok()) return pool.status();
        absl::StatusOr<LimitResult> result = (*pool)->SetMemoryLimit(
            Bytes(request->limit_bytes()), request->revision());
        if (!result.ok()) return result.status();
        response->set_outcome(ToProto(result->outcome));
        ToProto(result->limit, response->mutable_limit());
        response->set_mapped_bytes(result->mapped_bytes.value());
        response->set_generation(result->generation);
        LogLine(
            "SetMemoryLimit pool=%s limit_bytes=%d revision=%d: %s "
            "(target %d pages, effective %d bytes, mapped %d bytes, overage %d "
            "bytes)",
            request->pool(), request->limit_bytes(), request->revision(),
            LimitOutcomeName(result->outcome),
            result->limit.target_pages.value(),
            result->limit.effective_bytes.value(), result->mapped_bytes.value(),
            result->limit.overage_bytes.value());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvBrokerService::Trim(
    grpc::CallbackServerContext* ctx, const v1::TrimRequest* request,
    v1::TrimResponse* response) {
  return Unary(
      ctx, "Trim", request->pool(), Admit(ctx, "Trim", request->pool()), [&] {
        absl::StatusOr<std::shared_ptr<PagePool>> pool =
            broker_->GetPool(request->pool());
        if (!pool.ok()) return pool.status();
        absl::StatusOr<TrimResult> result = (*pool)->Trim(request->max_pages());
        if (!result.ok()) return result.status();
        response->set_pages_unmapped(result->pages_unmapped);
        response->set_generation(result->generation);
        if (result->pages_unmapped > 0) {
          LogLine("Trim pool=%s: unmapped %d idle pages", request->pool(),
                  result->pages_unmapped);
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvBrokerService::GetPageOccupancy(
    grpc::CallbackServerContext* ctx,
    const v1::GetPageOccupancyRequest* request,
    v1::GetPageOccupancyResponse* response) {
  return Unary(ctx, "GetPageOccupancy", request->pool(),
               Admit(ctx, "GetPageOccupancy", request->pool()), [&] {
                 absl::StatusOr<std::shared_ptr<PagePool>> pool =
                     broker_->GetPool(request->pool());
                 if (!pool.ok()) return pool.status();
                 std::vector<PageId> ids(request->page_ids().begin(),
                                         request->page_ids().end());
                 absl::StatusOr<std::vector<PageOccupancy>> result =
                     (*pool)->GetPageOccupancy(ids);
                 if (!result.ok()) return result.status();
                 for (const PageOccupancy& o : *result)
                   ToProto(o, response->add_pages());
                 return absl::OkStatus();
               });
}

grpc::ServerWriteReactor<v1::WatchCapacityResponse>*
KvBrokerService::WatchCapacity(grpc::CallbackServerContext* ctx,
                               const v1::WatchCapacityRequest* request) {
  absl::Status refused = Admit(ctx, "WatchCapacity", request->pool());
  if (refused.ok() && request->max_pages() < 0) {
    refused = InvalidField("max_pages", "must not be negative");
  }
  std::shared_ptr<PagePool> pool;
  if (refused.ok()) {
    absl::StatusOr<std::shared_ptr<PagePool>> found =
        broker_->GetPool(request->pool());
    if (found.ok()) {
      pool = *std::move(found);
    } else {
      refused = found.status();
    }
  }
  if (!refused.ok()) {
    LogFailure("WatchCapacity", request->pool(), refused);
    // A reactor that only finishes.
    class Refusal final
        : public grpc::ServerWriteReactor<v1::WatchCapacityResponse> {
     public:
      explicit Refusal(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Refusal(refused);
  }
  auto watch = std::make_shared<CapacityWatch>(feed_, std::move(pool),
                                               request->max_pages());
  CapacityWatch* reactor = watch.get();
  reactor->Begin(std::move(watch));
  return reactor;
}

}  // namespace kvbroker
