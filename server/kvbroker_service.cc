// kvbroker.v1.KvBroker over a Broker: each handler finds its pool (admitted),
// converts, calls the pool and converts back.

#include "server/kvbroker_service.h"

#include <grpc/grpc_security_constants.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/failure.h"
#include "server/capacity_watch.h"
#include "server/drain_gate.h"
#include "server/log.h"
#include "server/proto_convert.h"
#include "server/request_bounds.h"
#include "server/status_convert.h"

namespace kvbroker {
namespace {

// One line per failed call, with the caller's pool name and the message
// escaped and cut (log.h), at most 20 per second per method and reason.
void LogFailure(absl::string_view method, absl::string_view pool,
                const absl::Status& status) {
  const FailureReason reason = GetReason(status);
  const absl::string_view reason_name =
      reason == FailureReason::kUnspecified ? "UNTYPED" : ReasonName(reason);
  int64_t suppressed = 0;
  if (!FailureLogLimiter().Admit(absl::StrCat(method, " ", reason_name),
                                 absl::Now(), &suppressed)) {
    return;
  }
  LogLine("%s pool=\"%s\" failed: %s (%s) %s%s", method, CallerText(pool),
          reason_name, absl::StatusCodeToString(status.code()),
          CallerText(status.message()),
          suppressed == 0
              ? ""
              : absl::StrCat(" (", suppressed,
                             " similar lines suppressed before this one)"));
}

// The refusal of a call that is already cancelled or past its deadline.
// gRPC's completion-queue API (the poller) can tell a cancellation only
// once the call has ended, so there only the deadline is checked; a poller
// call runs on the thread that took it off its queue, as it arrives.
std::optional<grpc::Status> Expired(grpc::ServerContextBase* ctx) {
  if (dynamic_cast<grpc::CallbackServerContext*>(ctx) != nullptr &&
      ctx->IsCancelled()) {
    return grpc::Status::CANCELLED;
  }
  if (ctx->deadline() <= std::chrono::system_clock::now()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "the deadline passed before the call ran");
  }
  return std::nullopt;
}

// The status a unary call ends with: a refusal when the daemon is draining
// (`gate` closed: DRAINING), when `admission` failed (see
// KvBrokerService::Admit) or when the call has expired; otherwise `body`'s
// (which fills the response), converted. The call is counted by `gate`
// until `body` returns.
template <typename Body>
grpc::Status Unary(grpc::ServerContextBase* ctx, DrainGate& gate,
                   absl::string_view method, absl::string_view pool,
                   const absl::Status& admission, Body&& body) {
  absl::Status draining;
  const DrainGate::Pass pass = gate.Enter(&draining);
  if (!pass.admitted()) {
    LogFailure(method, pool, draining);
    return ToGrpcStatus(draining);
  }
  if (!admission.ok()) {
    LogFailure(method, pool, admission);
    return ToGrpcStatus(admission);
  }
  if (std::optional<grpc::Status> expired = Expired(ctx)) return *expired;
  absl::Status status = body();
  if (!status.ok()) LogFailure(method, pool, status);
  return ToGrpcStatus(status);
}

// A callback call finished with `status`.
grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* ctx,
                                   const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// OK unless the caller named another incarnation of the pool than `pool`
// (SPEC 5): then POOL_NOT_FOUND with both uids, and nothing changes.
absl::Status SameIncarnation(const PagePool& pool, const std::string& uid) {
  if (uid.empty() || uid == pool.uid()) return absl::OkStatus();
  return MakeFailure(
      FailureReason::kPoolNotFound,
      absl::StrCat("pool ", pool.name(), " is incarnation ", pool.uid(),
                   ", not ", uid, "; it was deleted and created again since"),
      {{"pool", pool.name()},
       {"expected_pool_uid", uid},
       {"current_pool_uid", pool.uid()}});
}

// `result`'s value converted into `response`, or its failure.
template <typename Result, typename Response>
absl::Status Reply(absl::StatusOr<Result> result, Response* response) {
  if (!result.ok()) return result.status();
  ToProto(*result, response);
  return absl::OkStatus();
}

void SessionToProto(const attach::SessionInfo& info, v1::EngineSession* out) {
  out->set_session_id(info.session_id);
  out->set_holder(info.holder);
  out->set_pid(info.pid);
  out->set_pool(info.pool);
  out->set_mapped_pages(info.mapped_pages);
  out->set_blocks(info.blocks);
  out->set_pending_revocations(info.pending_revocations);
  out->set_quarantined_pages(info.quarantined_pages);
  ToProto(info.attached_since, out->mutable_attached_since());
  const int64_t grace_nanos = absl::ToInt64Nanoseconds(info.reattach_grace);
  out->mutable_reattach_grace()->set_seconds(grace_nanos / 1000000000);
  out->mutable_reattach_grace()->set_nanos(
      static_cast<int32_t>(grace_nanos % 1000000000));
  out->set_in_grace(info.in_grace);
  if (info.in_grace) ToProto(info.grace_ends, out->mutable_grace_ends());
}

}  // namespace

KvBrokerService::KvBrokerService(
    Broker* broker, std::shared_ptr<ChangeFeed> feed,
    const AccessPolicy* access, ServiceLimits limits,
    std::shared_ptr<const attach::SessionDirectory> sessions)
    : broker_(broker),
      feed_(std::move(feed)),
      access_(access),
      limits_(limits),
      sessions_(std::move(sessions)) {}

std::string KvBrokerService::CallerOf(grpc::ServerContextBase* ctx,
                                      const AccessPolicy::Grant* grant) {
  if (grant != nullptr) return absl::StrCat("token:", grant->name);
  std::string peer = ctx->peer();
  if (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:")) {
    const size_t colon = peer.rfind(':');
    if (colon > 4) peer.resize(colon);
  }
  return peer;
}

absl::Status KvBrokerService::CheckPageList(int64_t max_pages) const {
  if (max_pages < 0) return InvalidField("max_pages", "must not be negative");
  if (max_pages > limits_.max_page_list) {
    return InvalidField("max_pages",
                        absl::StrCat("at most ", limits_.max_page_list,
                                     " page-list entries (--max_page_list)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AccessPolicy::Caller> KvBrokerService::Authenticate(
    grpc::ServerContextBase* ctx) const {
  if (access_ == nullptr) return AccessPolicy::Caller();
  std::vector<absl::string_view> headers;
  const auto range = ctx->client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    headers.emplace_back(it->second.data(), it->second.size());
  }
  // A call over TLS (the TCP listener with certificates): its client
  // certificate's subject alternative names.
  std::vector<std::string> sans;
  bool tls = false;
  if (const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
      auth != nullptr) {
    for (const grpc::string_ref& v :
         auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
      tls |= v == GRPC_SSL_TRANSPORT_SECURITY_TYPE;
    }
    for (const grpc::string_ref& v :
         auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
      sans.emplace_back(v.data(), v.size());
    }
  }
  return access_->Identify(headers, tls ? &sans : nullptr);
}

absl::Status KvBrokerService::Admit(grpc::ServerContextBase* ctx,
                                    absl::string_view method,
                                    absl::string_view pool) const {
  if (access_ == nullptr) return absl::OkStatus();
  absl::StatusOr<AccessPolicy::Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return caller.status();
  return AccessPolicy::Authorize(*caller, pool, method);
}

template <typename Body>
grpc::Status KvBrokerService::OnPool(grpc::ServerContextBase* ctx,
                                     absl::string_view method,
                                     const std::string& pool,
                                     const absl::Status& bounds, Body&& body) {
  const absl::Status admission =
      bounds.ok() ? Admit(ctx, method, pool) : bounds;
  return Unary(ctx, gate_, method, pool, admission, [&] {
    absl::StatusOr<std::shared_ptr<PagePool>> found = broker_->GetPool(pool);
    if (!found.ok()) return found.status();
    return body(**found);
  });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::CreatePoolRequest& request,
                                     v1::CreatePoolResponse* response) {
  absl::Status admission = CheckBounds(request);
  if (admission.ok()) {
    absl::StatusOr<AccessPolicy::Caller> caller = Authenticate(ctx);
    admission = caller.ok() ? AccessPolicy::AuthorizeCreate(
                                  *caller, request.pool().name())
                            : caller.status();
  }
  return Unary(ctx, gate_, "CreatePool", request.pool().name(), admission, [&] {
    CapacitySnapshot capacity;
    absl::StatusOr<std::shared_ptr<PagePool>> pool =
        broker_->CreatePool(FromProto(request.pool()), &capacity);
    if (!pool.ok()) return pool.status();
    ToProto((*pool)->geometry(), capacity, response->mutable_pool());
    return absl::OkStatus();
  });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::GetPoolRequest& request,
                                     v1::GetPoolResponse* response) {
  return OnPool(ctx, "GetPool", request.pool(), CheckBounds(request),
                [&](PagePool& pool) {
                  absl::StatusOr<CapacitySnapshot> capacity = pool.Capacity();
                  if (!capacity.ok()) return capacity.status();
                  ToProto(pool.geometry(), *capacity, response->mutable_pool());
                  return absl::OkStatus();
                });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::ListPoolsRequest& /*request*/,
                                     v1::ListPoolsResponse* response) {
  absl::StatusOr<AccessPolicy::Caller> caller = Authenticate(ctx);
  return Unary(ctx, gate_, "ListPools", "", caller.status(), [&] {
    for (const std::shared_ptr<PagePool>& pool : broker_->ListPools()) {
      if (!caller->Allows(pool->name())) continue;
      absl::StatusOr<CapacitySnapshot> capacity = pool->Capacity();
      if (!capacity.ok()) continue;  // deleted meanwhile
      ToProto(pool->geometry(), *capacity, response->add_pools());
    }
    return absl::OkStatus();
  });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::DeletePoolRequest& request,
                                     v1::DeletePoolResponse* /*response*/) {
  absl::Status admission = CheckBounds(request);
  if (admission.ok()) admission = Admit(ctx, "DeletePool", request.pool());
  return Unary(ctx, gate_, "DeletePool", request.pool(), admission, [&] {
    return broker_->DeletePool(request.pool(), request.force());
  });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::CapacityRequest& request,
                                     v1::CapacityResponse* response) {
  return OnPool(ctx, "Capacity", request.pool(), CheckBounds(request),
                [&](PagePool& pool) {
                  KVB_RETURN_IF_ERROR(CheckPageList(request.max_pages()));
                  absl::StatusOr<CapacitySnapshot> capacity =
                      pool.Capacity(CapacityQuery{request.max_pages()});
                  return Reply(std::move(capacity),
                               response->mutable_capacity());
                });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::AllocRequest& request,
                                     v1::AllocResponse* response) {
  return OnPool(
      ctx, "Alloc", request.pool(), CheckBounds(request), [&](PagePool& pool) {
        KVB_RETURN_IF_ERROR(SameIncarnation(pool, request.pool_uid()));
        KVB_RETURN_IF_ERROR(
            CheckReplyFits(request.num_blocks(), pool.geometry()));
        absl::StatusOr<AllocResult> result = pool.Alloc(FromProto(request));
        if (!result.ok()) return result.status();
        ToProto(*result, response);
        response->set_pool_uid(pool.uid());
        return absl::OkStatus();
      });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::FreeRequest& request,
                                     v1::FreeResponse* response) {
  return OnPool(
      ctx, "Free", request.pool(), CheckBounds(request), [&](PagePool& pool) {
        KVB_RETURN_IF_ERROR(SameIncarnation(pool, request.pool_uid()));
        std::vector<int64_t> expanded;
        absl::StatusOr<FreeRequest> free =
            FromProto(request, kMaxBlockIdsPerCall, &expanded);
        if (!free.ok()) return free.status();
        return Reply(pool.Free(*free), response);
      });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::ReserveRequest& request,
                                     v1::ReserveResponse* response) {
  return OnPool(
      ctx, "Reserve", request.pool(), CheckBounds(request),
      [&](PagePool& pool) {
        KVB_RETURN_IF_ERROR(
            CheckReplyFits(request.num_blocks(), pool.geometry()));
        KVB_RETURN_IF_ERROR(Reply(pool.Reserve(FromProto(request)), response));
        response->set_pool_uid(pool.uid());
        return absl::OkStatus();
      });
}

grpc::Status KvBrokerService::Handle(
    grpc::ServerContextBase* ctx, const v1::ReleaseReservationRequest& request,
    v1::ReleaseReservationResponse* response) {
  return OnPool(
      ctx, "ReleaseReservation", request.pool(), CheckBounds(request),
      [&](PagePool& pool) {
        KVB_RETURN_IF_ERROR(SameIncarnation(pool, request.pool_uid()));
        return Reply(pool.ReleaseReservation(request.reservation_id()),
                     response);
      });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::SetMemoryLimitRequest& request,
                                     v1::SetMemoryLimitResponse* response) {
  return OnPool(
      ctx, "SetMemoryLimit", request.pool(), CheckBounds(request),
      [&](PagePool& pool) {
        absl::StatusOr<LimitResult> result = pool.SetMemoryLimit(
            Bytes(request.limit_bytes()), request.revision());
        if (!result.ok()) return result.status();
        ToProto(*result, response);
        LogLine(
            "SetMemoryLimit pool=%s limit_bytes=%d revision=%d: %s "
            "(target %d pages, effective %d bytes, mapped %d bytes, overage %d "
            "bytes)",
            request.pool(), request.limit_bytes(), request.revision(),
            LimitOutcomeName(result->outcome),
            result->limit.target_pages.value(),
            result->limit.effective_bytes.value(), result->mapped_bytes.value(),
            result->limit.overage_bytes.value());
        return absl::OkStatus();
      });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::TrimRequest& request,
                                     v1::TrimResponse* response) {
  return OnPool(
      ctx, "Trim", request.pool(), CheckBounds(request), [&](PagePool& pool) {
        absl::StatusOr<TrimResult> result = pool.Trim(request.max_pages());
        if (!result.ok()) return result.status();
        ToProto(*result, response);
        if (result->pages_unmapped > 0) {
          LogLine("Trim pool=%s: unmapped %d idle pages", request.pool(),
                  result->pages_unmapped);
        }
        return absl::OkStatus();
      });
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::GetPageOccupancyRequest& request,
                                     v1::GetPageOccupancyResponse* response) {
  return OnPool(
      ctx, "GetPageOccupancy", request.pool(), CheckBounds(request),
      [&](PagePool& pool) {
        KVB_RETURN_IF_ERROR(SameIncarnation(pool, request.pool_uid()));
        std::vector<PageId> ids(request.page_ids().begin(),
                                request.page_ids().end());
        absl::StatusOr<std::vector<PageOccupancy>> result =
            pool.GetPageOccupancy(ids);
        if (!result.ok()) return result.status();
        for (const PageOccupancy& o : *result)
          ToProto(o, response->add_pages());
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<v1::WatchCapacityResponse>*
KvBrokerService::WatchCapacity(grpc::CallbackServerContext* ctx,
                               const v1::WatchCapacityRequest* request) {
  absl::Status refused = CheckBounds(*request);
  absl::StatusOr<AccessPolicy::Caller> caller = Authenticate(ctx);
  if (refused.ok()) refused = caller.status();
  if (refused.ok()) {
    refused =
        AccessPolicy::Authorize(*caller, request->pool(), "WatchCapacity");
  }
  if (refused.ok()) refused = CheckPageList(request->max_pages());
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
    return RefuseCapacityWatch(refused);
  }
  return StartCapacityWatch(
      feed_, ChangeFeed::Watch{std::move(pool), request->max_pages(),
                               CallerOf(ctx, caller->token)});
}

grpc::Status KvBrokerService::Handle(grpc::ServerContextBase* ctx,
                                     const v1::ListSessionsRequest& request,
                                     v1::ListSessionsResponse* response) {
  absl::Status admission = CheckBounds(request);
  absl::StatusOr<AccessPolicy::Caller> caller = AccessPolicy::Caller();
  if (admission.ok()) {
    caller = Authenticate(ctx);
    admission = caller.status();
  }
  if (admission.ok() && !request.pool().empty()) {
    admission =
        AccessPolicy::Authorize(*caller, request.pool(), "ListSessions");
  }
  return Unary(ctx, gate_, "ListSessions", request.pool(), admission, [&] {
    if (!request.pool().empty()) {
      absl::StatusOr<std::shared_ptr<PagePool>> found =
          broker_->GetPool(request.pool());
      if (!found.ok()) return found.status();
    }
    if (sessions_ == nullptr) return absl::OkStatus();
    for (const attach::SessionInfo& info : sessions_->ListSessions()) {
      if (!request.pool().empty() && info.pool != request.pool()) continue;
      // A session not attached yet names no pool: only a caller that may
      // use every pool (or any, without tokens) sees it.
      if (!caller->Allows(info.pool)) continue;
      SessionToProto(info, response->add_sessions());
    }
    return absl::OkStatus();
  });
}

// The callback API's entry points: the same handlers, finished at once.

grpc::ServerUnaryReactor* KvBrokerService::CreatePool(
    grpc::CallbackServerContext* ctx, const v1::CreatePoolRequest* request,
    v1::CreatePoolResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::GetPool(
    grpc::CallbackServerContext* ctx, const v1::GetPoolRequest* request,
    v1::GetPoolResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::ListPools(
    grpc::CallbackServerContext* ctx, const v1::ListPoolsRequest* request,
    v1::ListPoolsResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::DeletePool(
    grpc::CallbackServerContext* ctx, const v1::DeletePoolRequest* request,
    v1::DeletePoolResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::Capacity(
    grpc::CallbackServerContext* ctx, const v1::CapacityRequest* request,
    v1::CapacityResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::Alloc(
    grpc::CallbackServerContext* ctx, const v1::AllocRequest* request,
    v1::AllocResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::Free(
    grpc::CallbackServerContext* ctx, const v1::FreeRequest* request,
    v1::FreeResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::Reserve(
    grpc::CallbackServerContext* ctx, const v1::ReserveRequest* request,
    v1::ReserveResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::ReleaseReservation(
    grpc::CallbackServerContext* ctx,
    const v1::ReleaseReservationRequest* request,
    v1::ReleaseReservationResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::SetMemoryLimit(
    grpc::CallbackServerContext* ctx, const v1::SetMemoryLimitRequest* request,
    v1::SetMemoryLimitResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::Trim(
    grpc::CallbackServerContext* ctx, const v1::TrimRequest* request,
    v1::TrimResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::GetPageOccupancy(
    grpc::CallbackServerContext* ctx,
    const v1::GetPageOccupancyRequest* request,
    v1::GetPageOccupancyResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

grpc::ServerUnaryReactor* KvBrokerService::ListSessions(
    grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* request,
    v1::ListSessionsResponse* response) {
  return Finished(ctx, Handle(ctx, *request, response));
}

}  // namespace kvbroker
