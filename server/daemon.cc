// Daemon: broker + gRPC server wiring; see daemon.h.

#include "server/daemon.h"

#include <grpcpp/ext/channelz_service_plugin.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/failure.h"
#include "common/unix_socket.h"
#include "server/log.h"
#include "server/proto_convert.h"
#include "server/reflection_v1.h"
#include "server/unparsable_request.h"

namespace kvbroker {
namespace {

constexpr UnixSocketRole kGrpcSocketRole = {SOCK_STREAM, "--unix_socket"};

// Plugins that every ServerBuilder of the process picks up. gRPC's Init*
// functions guard against double registration themselves. Channelz shows
// every client's address, so it is registered only when asked for (and,
// being process-wide, stays registered for later servers of the process).
void RegisterGlobalPlugins(bool channelz) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  if (channelz) grpc::channelz::experimental::InitChannelzService();
}

std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return listen;
  return absl::StrCat(listen.substr(0, colon + 1), port);
}

}  // namespace

absl::StatusOr<ServerThreading> ParseServerThreading(absl::string_view name) {
  if (name == "callback") return ServerThreading::kCallback;
  if (name == "poller") return ServerThreading::kPoller;
  return InvalidField("server_threading",
                      absl::StrCat("must be callback or poller, not \"",
                                   CallerText(name), "\""));
}

absl::string_view ServerThreadingName(ServerThreading threading) {
  return threading == ServerThreading::kPoller ? "poller" : "callback";
}

Daemon::Daemon(DaemonOptions options, std::shared_ptr<ChangeFeed> feed)
    : options_(std::move(options)), feed_(std::move(feed)) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(
    Backend* backend, BrokerOptions broker_options, DaemonOptions options) {
  if (options.listen.empty() && options.unix_socket.empty()) {
    return InvalidField("listen", "set a TCP address, a Unix socket or both");
  }
  if (options.threading == ServerThreading::kPoller &&
      options.poller_workers < 1) {
    return InvalidField("poller_workers", "must be at least 1");
  }
  if (options.threading != ServerThreading::kPoller &&
      !options.extra_poller_methods.empty()) {
    return InvalidField("extra_poller_methods", "only the poller serves them");
  }
  auto feed = std::make_shared<ChangeFeed>(options.watch);
  broker_options.on_change =
      [feed,
       chained = std::move(broker_options.on_change)](const std::string& pool) {
        feed->Publish(pool);
        if (chained) chained(pool);
      };
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(options), feed));
  absl::StatusOr<std::unique_ptr<Broker>> broker =
      Broker::Create(backend, std::move(broker_options));
  if (!broker.ok()) return broker.status();
  daemon->broker_ = *std::move(broker);
  daemon->service_ = std::make_unique<KvBrokerService>(
      daemon->broker_.get(), feed, daemon->options_.access.get(),
      daemon->options_.limits, daemon->options_.sessions);
  return daemon;
}

Daemon::~Daemon() {
  Drain();
  server_.reset();
  poller_.reset();
  poller_service_.reset();
  service_.reset();
  broker_.reset();
}

absl::Status Daemon::CreatePools(const v1::PoolsFile& pools) {
  for (int i = 0; i < pools.pools_size(); ++i) {
    absl::StatusOr<std::shared_ptr<PagePool>> pool =
        broker_->CreatePool(FromProto(pools.pools(i)));
    if (!pool.ok()) {
      absl::Status s(
          pool.status().code(),
          absl::StrCat("pools entry ", i, " (\"", pools.pools(i).name(),
                       "\"): ", pool.status().message()));
      pool.status().ForEachPayload(
          [&s](absl::string_view url, const absl::Cord& payload) {
            s.SetPayload(url, payload);
          });
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  if (server_ != nullptr) {
    return absl::FailedPreconditionError("the daemon is already serving");
  }
  RegisterGlobalPlugins(options_.channelz);
  grpc::ServerBuilder builder;
  if (!options_.channelz)
    builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // A second daemon on the same port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (!options_.listen.empty()) {
    builder.AddListeningPort(options_.listen,
                             options_.tcp_credentials != nullptr
                                 ? options_.tcp_credentials
                                 : grpc::InsecureServerCredentials(),
                             &tcp_port_);
  }
  if (!options_.unix_socket.empty()) {
    KVB_RETURN_IF_ERROR(
        CheckUnixSocketPath(options_.unix_socket, kGrpcSocketRole));
    builder.AddListeningPort(
        absl::StrCat("unix:", StagingPath(options_.unix_socket)),
        grpc::InsecureServerCredentials());
  }
  absl::flat_hash_set<std::string> parsed_by_poller;
  if (options_.threading == ServerThreading::kPoller) {
    poller_service_ = std::make_unique<KvBrokerPollerService>(service_.get());
    builder.RegisterService(poller_service_.get());
    std::vector<UnaryPoller::Method> methods = poller_service_->UnaryMethods();
    methods.insert(methods.end(), options_.extra_poller_methods.begin(),
                   options_.extra_poller_methods.end());
    for (const UnaryPoller::Method& m : methods)
      parsed_by_poller.insert(m.name);
    poller_ = std::make_unique<UnaryPoller>(&builder, options_.poller_workers,
                                            std::move(methods));
  } else {
    builder.RegisterService(service_.get());
  }
  for (grpc::Service* extra : options_.extra_services) {
    builder.RegisterService(extra);
  }
  builder.SetOption(MakeReflectionV1Option());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      NewUnparsableRequestInterceptorFactory(std::move(parsed_by_poller)));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (server_ != nullptr && poller_ != nullptr) poller_->Start();
  if (server_ == nullptr || (!options_.listen.empty() && tcp_port_ == 0)) {
    if (server_ != nullptr) StopServer(absl::Now());
    server_.reset();
    poller_.reset();
    poller_service_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options_.listen.empty() ? "" : options_.listen,
        !options_.listen.empty() && !options_.unix_socket.empty() ? " and "
                                                                  : "",
        options_.unix_socket.empty() ? "" : unix_address()));
  }
  if (!options_.unix_socket.empty()) {
    absl::StatusOr<UnixSocketFile> file =
        UnixSocketFile::Publish(StagingPath(options_.unix_socket),
                                options_.unix_socket, kGrpcSocketRole);
    if (!file.ok()) {
      StopServer(absl::Now());
      server_.reset();
      poller_.reset();
      poller_service_.reset();
      return file.status();
    }
    unix_file_ = *std::move(file);
  }
  RefreshHealth();
  health_thread_ = std::thread([this] { HealthLoop(); });
  return absl::OkStatus();
}

void Daemon::HealthLoop() {
  while (
      !stop_health_.WaitForNotificationWithTimeout(options_.health_interval)) {
    RefreshHealth();
  }
}

void Daemon::RefreshHealth() {
  if (server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
  }
  // Takes pool locks (not under mu_); not needed once draining.
  const bool healthy = draining || broker_->healthy();
  absl::MutexLock lock(&mu_);
  const bool serving = !draining_ && healthy;
  if (serving_ == serving) return;
  serving_ = serving;
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
  LogLine("health %s%s", serving ? "SERVING" : "NOT_SERVING",
          serving     ? ""
          : draining_ ? " (draining)"
                      : " (a pool lost its device)");
}

void Daemon::Drain() {
  absl::MutexLock drain_lock(&drain_mu_);
  if (drained_ || server_ == nullptr) return;
  drained_ = true;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  // New calls get DRAINING from here on; those already running finish
  // before the server shuts down (its shutdown would cancel them). Nothing
  // here waits for a pool lock: a call may hold one while it maps.
  service_->BeginDrain();
  RefreshHealth();
  feed_->Close();
  stop_health_.Notify();
  const absl::Time start = absl::Now();
  const absl::Time drain_deadline = start + options_.drain_timeout;
  if (const int64_t left =
          service_->AwaitQuiet(options_.drain_quiet, drain_deadline);
      left > 0) {
    LogLine("%d call(s) still running after %s; cancelling them", left,
            absl::FormatDuration(options_.drain_timeout));
  }
  if (health_thread_.joinable()) health_thread_.join();
  StopServer(drain_deadline);
  LogLine("server stopped after %s", absl::FormatDuration(absl::Now() - start));
  if (unix_file_.has_value() && !unix_file_->Remove()) {
    LogLine("%s is no longer the socket this daemon bound; left in place",
            unix_file_->path());
  }
  broker_->StopWorker();
}

void Daemon::StopServer(absl::Time deadline) {
  // Returns once every call the server handed out is finished and released:
  // only then may the poller's queues shut down (unary_poller.h).
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  if (poller_ != nullptr) poller_->Shutdown();
}

std::string Daemon::tcp_address() const {
  if (options_.listen.empty()) return "";
  return WithPort(options_.listen, tcp_port_);
}

std::string Daemon::unix_address() const {
  if (options_.unix_socket.empty()) return "";
  return absl::StrCat("unix:", options_.unix_socket);
}

std::shared_ptr<grpc::Channel> Daemon::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

}  // namespace kvbroker
