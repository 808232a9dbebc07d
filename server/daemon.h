// Daemon: everything kvbrokerd serves, wired once, for main.cc and the
// end-to-end tests alike.
//
// A Daemon owns the Broker (over a caller-owned Backend), the KvBroker
// service, and one grpc::Server listening on TCP and/or a Unix socket at the
// same time. The server also carries:
//   - grpc.health.v1.Health (gRPC's default service) for "" and
//     "kvbroker.v1.KvBroker": SERVING while the daemon serves and
//     Broker::healthy() holds, NOT_SERVING while draining or once the
//     backend reported a fatal device error (re-read every
//     `health_interval`); a pool that FAILED alone leaves health SERVING;
//   - server reflection, v1alpha (gRPC's plugin) and v1 (reflection_v1.h),
//     both resolving google.rpc.ErrorInfo and the other error details;
//   - channelz (grpc.channelz.v1.Channelz), only with options.channelz: it
//     shows every client's address to anyone who can connect.
//
// Threading (options.threading, kvbrokerd --server_threading): kCallback
// serves KvBroker through gRPC's callback API, on gRPC's own threads;
// kPoller serves its unary methods from one completion queue polled by
// options.poller_workers threads, each call handled inline on the worker
// that took it (kvbroker_poller.h, unary_poller.h), and WatchCapacity
// through the callback API. Both run the same handlers
// (KvBrokerService::Handle), so answers, access, bounds and drain are the
// same; health, reflection and channelz are gRPC's in both.
//
// Lifecycle:
//   auto d = Daemon::Create(&backend, broker_options, options);
//   d->CreatePools(pools_file);   // optional, before serving
//   d->Start();                   // binds and serves
//   ...
//   d->Drain();                   // SIGTERM: NOT_SERVING, end watches,
//                                 // Shutdown(deadline); idempotent
// The destructor drains if needed, then releases every pool.
//
// Thread safety: Drain may be called from any thread, once or more; the rest
// from the owning thread.

#ifndef KVBROKER_SERVER_DAEMON_H_
#define KVBROKER_SERVER_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "allocator/backend.h"
#include "allocator/broker.h"
#include "common/unix_socket.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "server/access.h"
#include "server/change_feed.h"
#include "server/kvbroker_poller.h"
#include "server/kvbroker_service.h"
#include "server/unary_poller.h"

namespace kvbroker {

// How KvBroker's calls reach their handlers (see the file comment).
enum class ServerThreading { kCallback, kPoller };

// "callback" / "poller"; INVALID_ARGUMENT naming --server_threading
// otherwise.
absl::StatusOr<ServerThreading> ParseServerThreading(absl::string_view name);
absl::string_view ServerThreadingName(ServerThreading threading);

struct DaemonOptions {
  // TCP "host:port"; port 0 picks a free port. Empty: no TCP listener.
  std::string listen = "127.0.0.1:50051";
  // Unix socket path. Empty: no Unix listener.
  std::string unix_socket;
  // How long Drain lets in-flight calls finish before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(10);
  // Drain keeps answering DRAINING until no call has arrived for this long
  // (within drain_timeout): calls clients sent before the drain began get a
  // typed answer instead of gRPC's CANCELLED for a server shutting down.
  absl::Duration drain_quiet = absl::Milliseconds(250);
  // How often health re-reads Broker::healthy().
  absl::Duration health_interval = absl::Milliseconds(200);
  // Credentials of the TCP listener (TLS, mutual TLS); null: plaintext. The
  // Unix socket is always plaintext: its file permissions guard it.
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  // Bearer tokens scoped to pools (access.h), on both listeners; null:
  // every call is admitted.
  std::shared_ptr<const AccessPolicy> access;
  // Serve channelz (and keep its per-call statistics). Off by default.
  bool channelz = false;
  // More services served beside KvBroker by the same server (benchmarks
  // register their baseline ping here). Not owned; must outlive the daemon.
  std::vector<grpc::Service*> extra_services;
  // See the file comment. poller_workers: kPoller's worker threads, at
  // least 1; that many calls run at once.
  ServerThreading threading = ServerThreading::kCallback;
  int poller_workers = 2;
  // kPoller only: raw unary methods of `extra_services` that the poller
  // serves beside KvBroker's (a benchmark's ping served the same way).
  std::vector<UnaryPoller::Method> extra_poller_methods;
  // The engines on the attach socket, for ListSessions; null: none.
  std::shared_ptr<const attach::SessionDirectory> sessions;
  // Page-list bound of Capacity and WatchCapacity (kvbroker_service.h).
  ServiceLimits limits;
  // WatchCapacity streams per caller and the notifier's pacing
  // (change_feed.h).
  ChangeFeed::Options watch;
};

// The health service names the daemon reports.
inline constexpr char kServiceName[] = "kvbroker.v1.KvBroker";

class Daemon {
 public:
  // Creates the broker. `backend` must outlive the daemon. The daemon adds
  // its own on_change hook to `broker_options` (and still calls the
  // caller's). Errors: those of Broker::Create; INVALID_ARGUMENT when
  // neither listener is configured, when poller_workers < 1 with kPoller,
  // or with extra_poller_methods but not kPoller.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(
      Backend* backend, BrokerOptions broker_options, DaemonOptions options);

  // Drains (if serving) and releases every pool.
  ~Daemon();

  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Creates each pool of `pools`, in order. Stops at the first failure,
  // whose message names the entry. Pools created before it stay.
  absl::Status CreatePools(const v1::PoolsFile& pools);

  // Binds the listeners and starts serving. A Unix socket path that another
  // process serves is never taken over, and only a stale socket file is
  // replaced (unix_socket.h). Errors: UNAVAILABLE when a listener cannot be
  // bound; FAILED_PRECONDITION when called twice, when a process serves the
  // Unix socket path (the message names it) or when something other than a
  // socket lies there.
  absl::Status Start();

  // SIGTERM behaviour: health NOT_SERVING, WatchCapacity streams end (OK),
  // every new call is refused with DRAINING (UNAVAILABLE with RetryInfo,
  // never run), calls already running get `drain_timeout` to finish, and
  // refusals go on until arrivals pause for `drain_quiet`; then the server
  // shuts down (cancelling what still runs, which a bounded Alloc never
  // does). Returns when the server has stopped. Idempotent.
  void Drain() ABSL_LOCKS_EXCLUDED(drain_mu_, mu_);

  Broker* broker() { return broker_.get(); }
  // The bound TCP port (after Start); 0 without a TCP listener.
  int tcp_port() const { return tcp_port_; }
  // "host:port" with the bound port, or "" without a TCP listener.
  std::string tcp_address() const;
  // "unix:<path>", or "" without a Unix listener.
  std::string unix_address() const;
  // A channel into the server that bypasses the network (after Start).
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Re-reads Broker::healthy() and updates the health service now (the
  // background thread does it every health_interval).
  void RefreshHealth() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Daemon(DaemonOptions options, std::shared_ptr<ChangeFeed> feed);
  void HealthLoop();
  // Shuts the server down (by `deadline`), then the poller's queues.
  void StopServer(absl::Time deadline);

  const DaemonOptions options_;
  const std::shared_ptr<ChangeFeed> feed_;
  std::unique_ptr<Broker> broker_;
  std::unique_ptr<KvBrokerService> service_;
  // kPoller: the service registered in place of service_, and the workers.
  // The poller's queues outlive server_ (destroyed after it).
  std::unique_ptr<KvBrokerPollerService> poller_service_;
  std::unique_ptr<UnaryPoller> poller_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;
  // The socket file this daemon bound; Drain unlinks it only if the path
  // still names it.
  std::optional<UnixSocketFile> unix_file_;
  std::thread health_thread_;
  absl::Notification stop_health_;

  // Held for the whole of Drain, so that a second caller waits for the
  // first to finish.
  absl::Mutex drain_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool drained_ ABSL_GUARDED_BY(drain_mu_) = false;

  absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // What the health service was last told; nullopt before the first update.
  std::optional<bool> serving_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_DAEMON_H_
