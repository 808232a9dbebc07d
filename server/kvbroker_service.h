// KvBrokerService: the kvbroker.v1.KvBroker gRPC service over a Broker.
//
// Thin by design: a handler that names a pool goes through OnPool, which
// admits the call (access), refuses it if it already expired and finds the
// pool; the handler then converts its request (proto_convert.h), calls the
// pool and converts the result, and OnPool converts a typed failure
// (status_convert.h). All policy (exact capacity, rollback, idempotency by
// request_id, reservations, limits) lives in the allocator core.
//
// Every unary RPC has one handler, Handle(ctx, request, response), which
// returns the status the call ends with; both ways kvbrokerd serves calls
// run it (daemon.h, --server_threading): the callback API's entry points
// below, on gRPC's threads, and the completion-queue poller
// (kvbroker_poller.h), on its own workers. So admission, bounds, drain and
// the mapping of failures to gRPC statuses (status_convert.h) live in one
// place. The only blocking a handler does is the pool's own critical section
// (which, for an Alloc that grows the pool, includes mapping its pages: SPEC
// 4's linearizability). A call that is already past its deadline when it
// starts is refused with DEADLINE_EXCEEDED, and (callback mode: the
// completion-queue API cannot tell before the call ends) one already
// cancelled with CANCELLED, before it touches the pool. A deadline that passes
// while the pool is working does not undo the work: a client that may time out
// retries with the same request_id and receives the first outcome.
//
// WatchCapacity streams live in capacity_watch.h; their snapshots are built
// by the ChangeFeed's notifier thread, never on the thread of an Alloc or
// Free.
//
// Bounds (ServiceLimits, kvbrokerd flags): Capacity and WatchCapacity return
// page lists of at most `max_page_list` entries; a larger max_pages is
// refused with INVALID_ARGUMENT (BadRequest field "max_pages") before the
// pool is read. A caller may hold at most --max_watches_per_caller streams
// (ChangeFeed::Options; refused with INVALID_ARGUMENT, field "pool"). The
// caller of a call is the name of its bearer token's entry when access
// control is on, else the peer's address without the port
// ("ipv4:10.0.0.7", "ipv6:[::1]", "unix:/run/kvbroker.sock").
//
// Access: with an AccessPolicy (--auth_tokens), every call is authenticated
// and the pool it names authorized before anything else happens
// (access.h); ListPools shows a token the pools it may use and ListSessions
// the engine sessions attached to them. WatchCapacity is
// checked when it starts.
//
// Logging: one line on stderr per failed call (method, pool, reason, code,
// message) and per memory-limit or trim change; the broker logs pool creation
// and deletion itself.
//
// Thread safety: thread-safe. `broker` must outlive the service; the
// service's reactors keep `feed` and the pools they watch alive themselves.

#ifndef KVBROKER_SERVER_KVBROKER_SERVICE_H_
#define KVBROKER_SERVER_KVBROKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "allocator/broker.h"
#include "attach/session_directory.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/access.h"
#include "server/change_feed.h"
#include "server/drain_gate.h"

namespace kvbroker {

struct ServiceLimits {
  // The most page-list entries Capacity and WatchCapacity return: a request's
  // max_pages above it is refused. A pool has at most 2^22 pages; a full
  // list of them is tens of megabytes per snapshot.
  int64_t max_page_list = 4096;
};

class KvBrokerService final : public v1::KvBroker::CallbackService {
 public:
  // `feed` must receive the broker's on_change notifications. `access`
  // (nullable: every call is admitted) must outlive the service.
  // `sessions` (nullable: no attach socket, ListSessions lists nothing)
  // reports the engines attached on the attach socket.
  KvBrokerService(
      Broker* broker, std::shared_ptr<ChangeFeed> feed,
      const AccessPolicy* access = nullptr, ServiceLimits limits = {},
      std::shared_ptr<const attach::SessionDirectory> sessions = nullptr);

  // SIGTERM: every unary call from now on is refused with DRAINING
  // (UNAVAILABLE, RetryInfo) without running. Idempotent.
  void BeginDrain() { gate_.Close(); }
  // Waits until the unary calls admitted before BeginDrain have finished,
  // or `deadline`; returns how many still run.
  int64_t AwaitCallsDone(absl::Time deadline) {
    return gate_.AwaitIdle(deadline);
  }
  // The same, then also until no call has arrived for `quiet` (or
  // `deadline`): see DrainGate::AwaitQuiet.
  int64_t AwaitQuiet(absl::Duration quiet, absl::Time deadline) {
    return gate_.AwaitQuiet(quiet, deadline);
  }

  KvBrokerService(const KvBrokerService&) = delete;
  KvBrokerService& operator=(const KvBrokerService&) = delete;

  // The unary handlers: each refuses or runs one call of its method, fills
  // `response` when it runs, and returns the status the call ends with.
  // `ctx` gives the call's metadata, peer, deadline and cancellation.
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::CreatePoolRequest& request,
                      v1::CreatePoolResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::GetPoolRequest& request,
                      v1::GetPoolResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::ListPoolsRequest& request,
                      v1::ListPoolsResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::DeletePoolRequest& request,
                      v1::DeletePoolResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::CapacityRequest& request,
                      v1::CapacityResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::AllocRequest& request,
                      v1::AllocResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::FreeRequest& request,
                      v1::FreeResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::ReserveRequest& request,
                      v1::ReserveResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::ReleaseReservationRequest& request,
                      v1::ReleaseReservationResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::SetMemoryLimitRequest& request,
                      v1::SetMemoryLimitResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::TrimRequest& request,
                      v1::TrimResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::GetPageOccupancyRequest& request,
                      v1::GetPageOccupancyResponse* response);
  grpc::Status Handle(grpc::ServerContextBase* ctx,
                      const v1::ListSessionsRequest& request,
                      v1::ListSessionsResponse* response);

  // The callback API (--server_threading=callback): Handle, finished at
  // once; WatchCapacity is served through this API in both modes.
  grpc::ServerUnaryReactor* CreatePool(
      grpc::CallbackServerContext* ctx, const v1::CreatePoolRequest* request,
      v1::CreatePoolResponse* response) override;
  grpc::ServerUnaryReactor* GetPool(grpc::CallbackServerContext* ctx,
                                    const v1::GetPoolRequest* request,
                                    v1::GetPoolResponse* response) override;
  grpc::ServerUnaryReactor* ListPools(grpc::CallbackServerContext* ctx,
                                      const v1::ListPoolsRequest* request,
                                      v1::ListPoolsResponse* response) override;
  grpc::ServerUnaryReactor* DeletePool(
      grpc::CallbackServerContext* ctx, const v1::DeletePoolRequest* request,
      v1::DeletePoolResponse* response) override;
  grpc::ServerUnaryReactor* Capacity(grpc::CallbackServerContext* ctx,
                                     const v1::CapacityRequest* request,
                                     v1::CapacityResponse* response) override;
  grpc::ServerUnaryReactor* Alloc(grpc::CallbackServerContext* ctx,
                                  const v1::AllocRequest* request,
                                  v1::AllocResponse* response) override;
  grpc::ServerUnaryReactor* Free(grpc::CallbackServerContext* ctx,
                                 const v1::FreeRequest* request,
                                 v1::FreeResponse* response) override;
  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* ctx,
                                    const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseReservation(
      grpc::CallbackServerContext* ctx,
      const v1::ReleaseReservationRequest* request,
      v1::ReleaseReservationResponse* response) override;
  grpc::ServerUnaryReactor* SetMemoryLimit(
      grpc::CallbackServerContext* ctx,
      const v1::SetMemoryLimitRequest* request,
      v1::SetMemoryLimitResponse* response) override;
  grpc::ServerUnaryReactor* Trim(grpc::CallbackServerContext* ctx,
                                 const v1::TrimRequest* request,
                                 v1::TrimResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchCapacityResponse>* WatchCapacity(
      grpc::CallbackServerContext* ctx,
      const v1::WatchCapacityRequest* request) override;
  grpc::ServerUnaryReactor* GetPageOccupancy(
      grpc::CallbackServerContext* ctx,
      const v1::GetPageOccupancyRequest* request,
      v1::GetPageOccupancyResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(
      grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* request,
      v1::ListSessionsResponse* response) override;

 private:
  // The caller's grants (none without an access policy).
  absl::StatusOr<AccessPolicy::Caller> Authenticate(
      grpc::ServerContextBase* ctx) const;
  // Authenticates and authorizes a call that names `pool`.
  absl::Status Admit(grpc::ServerContextBase* ctx, absl::string_view method,
                     absl::string_view pool) const;
  // Who holds a watch (see the file comment); `grant` is the caller's
  // token grant from Authenticate.
  static std::string CallerOf(grpc::ServerContextBase* ctx,
                              const AccessPolicy::Grant* grant);
  // INVALID_ARGUMENT when `max_pages` is negative or above the bound.
  absl::Status CheckPageList(int64_t max_pages) const;
  // Runs a unary call on the pool named `pool`: refuses it unless the
  // request is within its bounds (`bounds`, request_bounds.h), admitted for
  // `method`, still live and the pool exists; otherwise returns
  // `body(PagePool&)`'s status (body fills the response).
  template <typename Body>
  grpc::Status OnPool(grpc::ServerContextBase* ctx, absl::string_view method,
                      const std::string& pool, const absl::Status& bounds,
                      Body&& body);

  Broker* const broker_;
  const std::shared_ptr<ChangeFeed> feed_;
  const AccessPolicy* const access_;
  const ServiceLimits limits_;
  const std::shared_ptr<const attach::SessionDirectory> sessions_;
  // Every unary call passes it; closed by BeginDrain.
  DrainGate gate_;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_KVBROKER_SERVICE_H_
