// kvbrokerd: the per-node daemon that brokers GPU memory for LLM KV caches.
//
// Parses flags, builds the backend, creates the pools of --pools, serves
// kvbroker.v1.KvBroker (plus health, reflection, and channelz when asked
// for) on TCP and/or a
// Unix socket, with TLS and bearer tokens when configured, Prometheus
// metrics over HTTP on --metrics_listen, and drains on SIGTERM or SIGINT
// (exit status 0).

#include <grpcpp/security/server_credentials.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/backend.h"
#include "allocator/broker.h"
#include "allocator/cuda_backend.h"
#include "allocator/failure.h"
#include "allocator/host_backend.h"
#include "allocator/spin_then_lock.h"
#include "allocator/units.h"
#include "attach/attach_server.h"
#include "common/byte_size.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "server/access.h"
#include "server/daemon.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/startup_config.h"

namespace kvbroker {

// A byte count as common/byte_size.h reads it: 1048576, 512KiB, 14MiB,
// 80GiB, 1TiB (every unit binary).
struct ByteSize {
  int64_t bytes = 0;
};

bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error) {
  absl::StatusOr<int64_t> bytes = ParseSize(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  out->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return FormatBytes(size.bytes); }

}  // namespace kvbroker

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "TCP address to serve on, host:port (port 0 picks a free port); "
          "empty: no TCP listener. Schedulers and operators connect here.");
ABSL_FLAG(std::string, unix_socket, "",
          "Unix socket path to serve on as well (engines on this node "
          "connect here); empty: none.");
ABSL_FLAG(std::string, attach_socket, "",
          "Unix socket (SOCK_SEQPACKET) where engines on this node attach to "
          "pools and allocate blocks on a session "
          "(proto/kvbroker/v1/attach.proto); the --auth_tokens apply. A live "
          "server on the path is never taken over; a stale socket file is "
          "replaced. Empty: none.");
ABSL_FLAG(std::string, backend, "auto",
          "Memory backend: 'cuda' (GPU memory through the CUDA driver, "
          "loaded at run time; fails if no usable GPU), 'host' (memfd-backed "
          "host memory with the budget of --host_device_count and "
          "--host_device_memory), or 'auto' (cuda when a usable GPU is "
          "found, else host).");
ABSL_FLAG(std::string, pools, "",
          "File of pools to create at start, in protobuf text format "
          "(kvbroker.v1.PoolsFile: 'pools { name: \"demo\" page_size: ... }'; "
          "see examples/pools.textproto). Empty: start with no pool.");
ABSL_FLAG(double, gpu_memory_utilization, 0.95,
          "Fraction of each device's total memory kvbroker may fill, all "
          "processes counted: it maps a page only while free memory stays "
          "above total * (1 - this). In (0, 1].");
ABSL_FLAG(int64_t, min_idle_pages, 5,
          "Pages per pool the background worker keeps mapped and unused "
          "(IDLE), so that allocations rarely wait for the driver; a pool's "
          "spec may override it.");
ABSL_FLAG(int64_t, max_idle_pages, 10,
          "IDLE pages per pool kept mapped after their last block is freed; "
          "beyond this they are unmapped. A pool's spec may override it.");
ABSL_FLAG(int64_t, host_device_count, 1,
          "Host backend only: number of simulated devices.");
ABSL_FLAG(kvbroker::ByteSize, host_device_memory,
          kvbroker::ByteSize{80 * kvbroker::kGiB},
          "Host backend only: memory of each simulated device (the physical "
          "budget), e.g. 80GiB or 512MiB.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "On SIGTERM/SIGINT: how long in-flight calls may take to finish "
          "before they are cancelled.");
ABSL_FLAG(absl::Duration, drain_quiet, absl::Milliseconds(250),
          "On SIGTERM/SIGINT: calls arriving are refused with DRAINING until "
          "none has arrived for this long (within --drain_timeout); only then "
          "does the server shut down.");

ABSL_FLAG(std::string, server_threading, "callback",
          "How KvBroker calls reach their handlers: 'callback' (gRPC's "
          "callback API on gRPC's threads) or 'poller' (one completion "
          "queue polled by --poller_workers threads, each call handled on "
          "the thread that took it off the queue). Answers, access, bounds "
          "and drain are the same; WatchCapacity, health and reflection use "
          "the callback API in both, whose threads keep polling, so the "
          "poller saves little today (docs/hardening.md, Threading).");
ABSL_FLAG(int, poller_workers, 2,
          "--server_threading=poller: worker threads (at least 1), the most "
          "calls that run at once; an Alloc that maps pages holds one until "
          "it returns.");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the TCP listener. With --tls_key, the TCP "
          "listener speaks TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed "
          "(mutual TLS). Needs --tls_cert and --tls_key.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port of the Prometheus endpoint (GET /metrics, plain HTTP), "
          "e.g. 0.0.0.0:9400; port 0 picks one. Empty: no metrics listener.");
ABSL_FLAG(std::string, auth_tokens, "",
          "File of bearer tokens scoped to pools, in protobuf text format "
          "(kvbroker.v1.AuthTokensFile: 'tokens { name: \"scheduler\" "
          "token: \"...\" pools: \"*\" }'). With tokens, every KvBroker "
          "call on either listener needs 'authorization: Bearer TOKEN'. "
          "'identities { name: \"sched\" san: \"scheduler.example.com\" "
          "pools: \"*\" }' entries (need --tls_client_ca) scope client "
          "certificates by subject alternative name: a TLS client whose "
          "certificate matches none is refused. Health, "
          "reflection and channelz stay open. Keep the file private.");
ABSL_FLAG(bool, channelz, false,
          "Serve grpc.channelz.v1.Channelz (connection and call statistics). "
          "Off by default: it shows every client's address to anyone who "
          "can connect, token or not.");
ABSL_FLAG(int64_t, max_page_list, 4096,
          "The most page-list entries Capacity and WatchCapacity return; a "
          "larger max_pages is refused (INVALID_ARGUMENT).");
ABSL_FLAG(int, max_watches_per_caller, 1024,
          "WatchCapacity streams one caller may hold at once (the bearer "
          "token's entry with --auth_tokens, else the peer's address without "
          "port); the next is refused (INVALID_ARGUMENT).");
ABSL_FLAG(absl::Duration, revoke_deadline, absl::Seconds(10),
          "How long an attached engine has to acknowledge a page revocation "
          "(unmap the page) before the page counts as quarantined.");
ABSL_FLAG(absl::Duration, pool_lock_spin,
          absl::Nanoseconds(kvbroker::SpinThenLock::kDefaultSpinBoundNs),
          "How long a call that finds a pool's lock held spins before it "
          "sleeps (0: sleep at once). About the cost of a sleep and wake-up "
          "on the machine; docs/design.md, \"Locking\".");
ABSL_FLAG(absl::Duration, watch_interval, absl::Milliseconds(20),
          "WatchCapacity snapshots of one pool are built at most once per "
          "interval (changes in between are coalesced).");

namespace kvbroker {
namespace {

// Raises the soft limit on open files to the hard one. The daemon's file
// descriptors grow with the memory it maps: the host backend keeps one
// memfd per mapped page and device, and every handle exported to engines
// is one more (a 100 GiB pool of 2 MiB pages is 51,200 a device), while
// the usual soft limit is 1,024. An exhausted limit is refused cleanly
// (a failed map rolls back, a page that cannot be exported ends the
// sessions that would miss it), but refused all the same.
void RaiseOpenFileLimit() {
  rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 ||
      files.rlim_cur >= files.rlim_max) {
    return;
  }
  const rlim_t was = files.rlim_cur;
  files.rlim_cur = files.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &files) == 0) {
    LogLine("open files: up to %d (the soft limit was %d)",
            static_cast<int64_t>(files.rlim_max), static_cast<int64_t>(was));
  }
}

// The one place a backend is chosen: 'cuda' creates the CUDA backend
// (allocator/cuda_backend.h) or fails, 'host' creates the host backend, and
// 'auto' tries CUDA first and falls back to the host backend, saying why.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const std::string& kind, const HostBackendOptions& host_options) {
  if (kind != "auto" && kind != "cuda" && kind != "host") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend must be auto, cuda or host, not \"", kind, "\""));
  }
  if (kind == "cuda" || kind == "auto") {
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CudaBackend::Create();
    if (cuda.ok()) return std::unique_ptr<Backend>(std::move(*cuda));
    if (kind == "cuda") {
      return absl::Status(
          cuda.status().code(),
          absl::StrCat("--backend=cuda: ", cuda.status().message()));
    }
    LogLine("no usable GPU (%s); using the host backend",
            cuda.status().message());
  }
  if (host_options.device_count <= 0) {
    return absl::InvalidArgumentError("--host_device_count must be positive");
  }
  if (host_options.device_total.value() <= 0) {
    return absl::InvalidArgumentError("--host_device_memory must be positive");
  }
  return std::unique_ptr<Backend>(new HostBackend(host_options));
}

// Flags that need no file or device, checked before anything else.
absl::Status CheckFlags() {
  if (const std::string listen = absl::GetFlag(FLAGS_listen); !listen.empty()) {
    KVB_RETURN_IF_ERROR(CheckListenAddress("listen", listen));
  }
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      !listen.empty()) {
    KVB_RETURN_IF_ERROR(CheckListenAddress("metrics_listen", listen));
  }
  if (absl::GetFlag(FLAGS_listen).empty() &&
      absl::GetFlag(FLAGS_unix_socket).empty()) {
    return absl::InvalidArgumentError(
        "--listen and --unix_socket are both empty: nothing to serve on");
  }
  const double utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  if (!(utilization > 0 && utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu_memory_utilization must be in (0, 1], not ", utilization));
  }
  if (absl::GetFlag(FLAGS_min_idle_pages) < 0 ||
      absl::GetFlag(FLAGS_max_idle_pages) < 0) {
    return absl::InvalidArgumentError(
        "--min_idle_pages and --max_idle_pages must not be negative");
  }
  if (absl::GetFlag(FLAGS_revoke_deadline) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--revoke_deadline must be positive");
  }
  if (absl::GetFlag(FLAGS_pool_lock_spin) < absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_pool_lock_spin) > absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "--pool_lock_spin must be between 0 and 1ms");
  }
  if (absl::GetFlag(FLAGS_drain_quiet) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_quiet must not be negative");
  }
  if (absl::GetFlag(FLAGS_drain_timeout) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must not be negative");
  }
  if (const std::string threading = absl::GetFlag(FLAGS_server_threading);
      !ParseServerThreading(threading).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--server_threading must be callback or poller, not \"",
                     CallerText(threading), "\""));
  }
  if (absl::GetFlag(FLAGS_poller_workers) < 1) {
    return absl::InvalidArgumentError("--poller_workers must be at least 1");
  }
  return absl::OkStatus();
}

// --tls_cert, --tls_key, --tls_client_ca -> the TCP listener's credentials;
// null when TLS is not configured. The files are read and the key checked
// against the certificate here, so that a mistake is named before serving.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsCredentials() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() && key.empty() && client_ca.empty()) return nullptr;
  if (cert.empty() || key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together (and --tls_client_ca needs "
        "both)");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert_pem = ReadConfigFile("tls_cert", cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadConfigFile("tls_key", key);
  if (!key_pem.ok()) return key_pem.status();
  KVB_RETURN_IF_ERROR(CheckCertificateAndKey(*cert_pem, *key_pem));
  pair.cert_chain = *std::move(cert_pem);
  pair.private_key = *std::move(key_pem);
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!client_ca.empty()) {
    absl::StatusOr<std::string> ca_pem =
        ReadConfigFile("tls_client_ca", client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    KVB_RETURN_IF_ERROR(CheckCertificateBundle("tls_client_ca", *ca_pem));
    ssl.pem_root_certs = *std::move(ca_pem);
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<const AccessPolicy>> ReadAuthTokens() {
  const std::string path = absl::GetFlag(FLAGS_auth_tokens);
  if (path.empty()) return nullptr;
  v1::AuthTokensFile file;
  // Secret: a parse error must not quote a token.
  KVB_RETURN_IF_ERROR(
      ReadTextProtoFile("auth_tokens", path, FileSecrecy::kSecret, &file));
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::Create(file);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens: ", path, ": ", policy.status().message()));
  }
  return std::make_shared<const AccessPolicy>(*std::move(policy));
}

// Start-up failures name the reason (typed failures) or the code, and the
// message; never the internal payload.
int Fail(const absl::Status& status) {
  const FailureReason reason = GetReason(status);
  absl::FPrintF(stderr, "kvbrokerd: %s: %s\n",
                reason == FailureReason::kUnspecified
                    ? absl::StatusCodeToString(status.code())
                    : std::string(ReasonName(reason)),
                status.message());
  return 1;
}

int Run() {
  // Block the signals in every thread, then take them synchronously below:
  // gRPC's threads inherit this mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (absl::Status s = CheckFlags(); !s.ok()) return Fail(s);
  v1::PoolsFile pools;
  if (const std::string path = absl::GetFlag(FLAGS_pools); !path.empty()) {
    if (absl::Status s =
            ReadTextProtoFile("pools", path, FileSecrecy::kPublic, &pools);
        !s.ok()) {
      return Fail(s);
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
      TlsCredentials();
  if (!tls.ok()) return Fail(tls.status());
  absl::StatusOr<std::shared_ptr<const AccessPolicy>> access = ReadAuthTokens();
  if (!access.ok()) return Fail(access.status());
  if (*access != nullptr && (*access)->has_identities() &&
      absl::GetFlag(FLAGS_tls_client_ca).empty()) {
    return Fail(absl::InvalidArgumentError(
        "--auth_tokens lists client identities, which need mutual TLS "
        "(--tls_client_ca)"));
  }

  RaiseOpenFileLimit();
  HostBackendOptions host_options;
  host_options.device_count =
      static_cast<int>(absl::GetFlag(FLAGS_host_device_count));
  host_options.device_total =
      Bytes(absl::GetFlag(FLAGS_host_device_memory).bytes);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(absl::GetFlag(FLAGS_backend), host_options);
  if (!backend.ok()) return Fail(backend.status());

  SpinThenLock::SetSpinBound(absl::GetFlag(FLAGS_pool_lock_spin));
  BrokerOptions broker_options;
  broker_options.gpu_memory_utilization =
      absl::GetFlag(FLAGS_gpu_memory_utilization);
  broker_options.min_idle_pages = absl::GetFlag(FLAGS_min_idle_pages);
  broker_options.max_idle_pages = absl::GetFlag(FLAGS_max_idle_pages);
  broker_options.revoke_timeout = absl::GetFlag(FLAGS_revoke_deadline);
  DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  options.drain_quiet = absl::GetFlag(FLAGS_drain_quiet);
  options.channelz = absl::GetFlag(FLAGS_channelz);
  options.threading =
      *ParseServerThreading(absl::GetFlag(FLAGS_server_threading));
  options.poller_workers = absl::GetFlag(FLAGS_poller_workers);
  options.limits.max_page_list = absl::GetFlag(FLAGS_max_page_list);
  options.watch.max_watches_per_caller =
      absl::GetFlag(FLAGS_max_watches_per_caller);
  options.watch.min_interval = absl::GetFlag(FLAGS_watch_interval);
  if (options.limits.max_page_list < 0 ||
      options.watch.max_watches_per_caller < 0 ||
      options.watch.min_interval < absl::ZeroDuration()) {
    return Fail(absl::InvalidArgumentError(
        "--max_page_list, --max_watches_per_caller and --watch_interval must "
        "not be negative"));
  }
  options.tcp_credentials = *tls;
  options.access = *access;
  // ListSessions and the metrics read the attach server's sessions through
  // this slot: both start before it, and it goes before they do.
  auto sessions = std::make_shared<attach::SessionDirectorySlot>();
  options.sessions = sessions;
  if (options.access != nullptr) {
    LogLine("%d bearer token(s) from %s; KvBroker calls need one",
            options.access->size(), absl::GetFlag(FLAGS_auth_tokens));
    if (options.tcp_credentials == nullptr && !options.listen.empty()) {
      LogLine("warning: --auth_tokens without TLS: tokens cross %s in clear",
              options.listen);
    }
  }

  absl::StatusOr<std::unique_ptr<Daemon>> daemon =
      Daemon::Create(backend->get(), broker_options, options);
  if (!daemon.ok()) return Fail(daemon.status());
  if (absl::Status s = (*daemon)->CreatePools(pools); !s.ok()) return Fail(s);
  // The metrics listener binds before the gRPC one serves: a bad
  // --metrics_listen stops the daemon before health ever says SERVING.
  std::unique_ptr<MetricsServer> metrics;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      !listen.empty()) {
    Broker* broker = (*daemon)->broker();
    absl::StatusOr<std::unique_ptr<MetricsServer>> started =
        MetricsServer::Start(
            listen, std::make_shared<BrokerCollector>(broker, sessions));
    if (!started.ok()) return Fail(started.status());
    metrics = *std::move(started);
  }
  // The attach socket is claimed before the gRPC listener serves, for the
  // same reason: a path another daemon serves stops this one first.
  std::unique_ptr<attach::AttachServer> attach_server;
  if (const std::string path = absl::GetFlag(FLAGS_attach_socket);
      !path.empty()) {
    attach::AttachServerOptions attach_options;
    attach_options.socket_path = path;
    attach_options.access = options.access;
    absl::StatusOr<std::unique_ptr<attach::AttachServer>> started =
        attach::AttachServer::Start((*daemon)->broker(), attach_options);
    if (!started.ok()) return Fail(started.status());
    attach_server = *std::move(started);
    sessions->Set(attach_server.get());
  }

  if (absl::Status s = (*daemon)->Start(); !s.ok()) {
    sessions->Set(nullptr);
    return Fail(s);
  }
  if (options.threading == ServerThreading::kPoller) {
    LogLine("serving unary calls from %d completion-queue worker(s)",
            options.poller_workers);
  }

  absl::PrintF(
      "kvbrokerd: %s backend with %d device(s); serving "
      "kvbroker.v1.KvBroker",
      (*backend)->name(), (*backend)->device_count());
  if (!(*daemon)->tcp_address().empty()) {
    absl::PrintF(
        " on %s%s", (*daemon)->tcp_address(),
        options.tcp_credentials == nullptr
            ? ""
            : (absl::GetFlag(FLAGS_tls_client_ca).empty() ? " (TLS)"
                                                          : " (mutual TLS)"));
  }
  if (!(*daemon)->unix_address().empty()) {
    absl::PrintF("%s %s", (*daemon)->tcp_address().empty() ? " on" : " and",
                 (*daemon)->unix_address());
  }
  if (attach_server != nullptr) {
    absl::PrintF("; engines attach on %s", attach_server->socket_path());
  }
  if (metrics != nullptr) {
    const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
    absl::PrintF("; metrics on http://%s:%d/metrics",
                 listen.substr(0, listen.rfind(':')), metrics->port());
  }
  absl::PrintF("\n");
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  LogLine("%s received, draining (up to %s)",
          signal_number == SIGTERM ? "SIGTERM" : "SIGINT",
          absl::FormatDuration(options.drain_timeout));
  if (attach_server != nullptr) attach_server->Stop();
  (*daemon)->Drain();
  sessions->Set(nullptr);
  attach_server.reset();
  metrics.reset();  // it reads the broker
  daemon->reset();
  LogLine("stopped");
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "brokers GPU memory for LLM KV caches over gRPC "
      "(kvbroker.v1.KvBroker).\n"
      "Usage: kvbrokerd [--listen=HOST:PORT] [--unix_socket=PATH] "
      "[--backend=auto|cuda|host] [--pools=FILE] ...");
  // --help lists the flags of this file (abseil's default looks for a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles,
  // which costs more than the pool's whole Capacity; the lock order is fixed
  // by design (allocator/README.md) and checked by the tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return kvbroker::Run();
}
