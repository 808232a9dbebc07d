// kvbroker-extender: the Kubernetes scheduler extender of kvbroker
// (extender.h). Parses flags, connects to the Kubernetes API with the
// service account's credentials, starts the broker directory and serves
// HTTP until SIGTERM or SIGINT.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/kvbroker_client.h"
#include "extender/broker_directory.h"
#include "extender/extender.h"
#include "extender/http_server.h"
#include "extender/kube_client.h"

namespace {
constexpr char kServiceAccountDir[] =
    "/var/run/secrets/kubernetes.io/serviceaccount/";
}  // namespace

ABSL_FLAG(std::string, listen, "0.0.0.0:8888",
          "host:port of the extender's HTTP endpoint (filter, prioritize, "
          "bind, healthz, readyz, metrics); port 0 picks one.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of the extender's own endpoint. Set with "
          "--tls_key: HTTPS only (kube-scheduler's enableHTTPS); read at "
          "start, so a rotated certificate takes a restart.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, kube_api_server, "",
          "URL of the Kubernetes API. Empty: https://$KUBERNETES_SERVICE_HOST:"
          "$KUBERNETES_SERVICE_PORT (in-cluster).");
ABSL_FLAG(std::string, kube_token_file,
          std::string(kServiceAccountDir) + "token",
          "Bearer token file for the Kubernetes API (re-read per request); "
          "empty: none.");
ABSL_FLAG(std::string, kube_ca_file, std::string(kServiceAccountDir) + "ca.crt",
          "PEM CA of the Kubernetes API server; empty: the system's roots.");
ABSL_FLAG(std::string, broker_namespace, "kvbroker",
          "Namespace of the kvbroker DaemonSet's pods.");
ABSL_FLAG(
    std::string, broker_selector,
    "app.kubernetes.io/name=kvbroker,app.kubernetes.io/component=kvbrokerd",
    "Label selector of the kvbroker DaemonSet's pods.");
ABSL_FLAG(std::string, broker_port_name, "grpc",
          "Name of the broker container's gRPC port.");
ABSL_FLAG(int, broker_port, 50051,
          "Broker gRPC port when the pod names none --broker_port_name.");
ABSL_FLAG(absl::Duration, broker_refresh, absl::Seconds(30),
          "How often the broker pods are listed again.");
ABSL_FLAG(std::string, broker_tls_ca, "",
          "PEM CA of the brokers' certificates. Set: TLS to the brokers.");
ABSL_FLAG(std::string, broker_tls_cert, "",
          "PEM client certificate for mutual TLS to the brokers.");
ABSL_FLAG(std::string, broker_tls_key, "", "PEM key of --broker_tls_cert.");
ABSL_FLAG(std::string, broker_tls_server_name, "",
          "Name checked against the brokers' certificates (they are dialled "
          "by pod IP); empty: the IP.");
ABSL_FLAG(std::string, broker_token_file, "",
          "File holding the bearer token for the brokers (kvbrokerd "
          "--auth_tokens); empty: none.");
ABSL_FLAG(absl::Duration, node_timeout, absl::Milliseconds(500),
          "Deadline of each node's Capacity call in filter and prioritize; "
          "a broker slower than this drops its node as unreachable.");
ABSL_FLAG(absl::Duration, bind_timeout, absl::Seconds(5),
          "Deadline of each broker call in bind.");
ABSL_FLAG(std::string, score_policy, "most_free",
          "Prioritize policy: most_free (spread: the node with the most "
          "available blocks scores 10) or least_free (pack: the fullest node "
          "that still fits scores 10).");
ABSL_FLAG(absl::Duration, reservation_ttl, absl::Minutes(10),
          "TTL of the reservation made at bind, at most 24h; the engine "
          "redeems it when it attaches.");

namespace kvbroker {
namespace extender {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Run() {
  std::string api = absl::GetFlag(FLAGS_kube_api_server);
  if (api.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || port == nullptr) {
      std::fprintf(stderr,
                   "kvbroker-extender: --kube_api_server is empty and "
                   "KUBERNETES_SERVICE_HOST/PORT are not set\n");
      return 2;
    }
    const bool v6 = std::string(host).find(':') != std::string::npos;
    api =
        absl::StrCat("https://", v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
  }
  KubeClientOptions kube_options;
  kube_options.api_server = api;
  kube_options.token_file = absl::GetFlag(FLAGS_kube_token_file);
  kube_options.ca_file = absl::GetFlag(FLAGS_kube_ca_file);
  absl::StatusOr<std::unique_ptr<KubeClient>> kube =
      KubeClient::Create(kube_options);
  if (!kube.ok()) {
    std::fprintf(stderr, "kvbroker-extender: %s\n",
                 kube.status().ToString().c_str());
    return 2;
  }

  BrokerDirectoryOptions directory_options;
  directory_options.namespace_ = absl::GetFlag(FLAGS_broker_namespace);
  directory_options.label_selector = absl::GetFlag(FLAGS_broker_selector);
  directory_options.port_name = absl::GetFlag(FLAGS_broker_port_name);
  directory_options.default_port = absl::GetFlag(FLAGS_broker_port);
  directory_options.refresh_interval = absl::GetFlag(FLAGS_broker_refresh);
  directory_options.call_timeout = absl::GetFlag(FLAGS_bind_timeout);
  if (!absl::GetFlag(FLAGS_broker_tls_ca).empty()) {
    absl::StatusOr<TlsOptions> tls =
        TlsOptions::FromFiles(absl::GetFlag(FLAGS_broker_tls_ca),
                              absl::GetFlag(FLAGS_broker_tls_cert),
                              absl::GetFlag(FLAGS_broker_tls_key));
    if (!tls.ok()) {
      std::fprintf(stderr, "kvbroker-extender: %s\n",
                   tls.status().ToString().c_str());
      return 2;
    }
    tls->target_name_override = absl::GetFlag(FLAGS_broker_tls_server_name);
    directory_options.tls = *std::move(tls);
  }
  if (!absl::GetFlag(FLAGS_broker_token_file).empty()) {
    absl::StatusOr<std::string> token =
        ReadFile(absl::GetFlag(FLAGS_broker_token_file));
    if (!token.ok()) {
      std::fprintf(stderr, "kvbroker-extender: %s\n",
                   token.status().ToString().c_str());
      return 2;
    }
    directory_options.bearer_token =
        std::string(absl::StripAsciiWhitespace(*token));
    if (absl::Status sendable =
            CheckBearerToken(directory_options.bearer_token);
        !sendable.ok()) {
      std::fprintf(stderr, "kvbroker-extender: --broker_token_file: %s\n",
                   std::string(sendable.message()).c_str());
      return 2;
    }
  }

  ExtenderOptions options;
  options.node_timeout = absl::GetFlag(FLAGS_node_timeout);
  options.bind_timeout = absl::GetFlag(FLAGS_bind_timeout);
  options.reservation_ttl = absl::GetFlag(FLAGS_reservation_ttl);
  absl::StatusOr<ScorePolicy> policy =
      ParseScorePolicy(absl::GetFlag(FLAGS_score_policy));
  // The broker refuses a reservation TTL past 24 h (its request bounds).
  if (!policy.ok() || options.node_timeout <= absl::ZeroDuration() ||
      options.bind_timeout <= absl::ZeroDuration() ||
      directory_options.refresh_interval <= absl::ZeroDuration() ||
      options.reservation_ttl <= absl::ZeroDuration() ||
      options.reservation_ttl > absl::Hours(24)) {
    std::fprintf(
        stderr,
        "kvbroker-extender: --score_policy must be most_free or "
        "least_free; --node_timeout, --bind_timeout and --broker_refresh "
        "> 0; "
        "--reservation_ttl in (0, 24h]\n");
    return 2;
  }
  options.policy = *policy;

  HttpServerOptions http_options;
  if (absl::GetFlag(FLAGS_tls_cert).empty() !=
      absl::GetFlag(FLAGS_tls_key).empty()) {
    std::fprintf(stderr,
                 "kvbroker-extender: --tls_cert and --tls_key go together\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    absl::StatusOr<std::string> cert = ReadFile(absl::GetFlag(FLAGS_tls_cert));
    absl::StatusOr<std::string> key = ReadFile(absl::GetFlag(FLAGS_tls_key));
    if (!cert.ok() || !key.ok()) {
      std::fprintf(stderr, "kvbroker-extender: %s\n",
                   (cert.ok() ? key : cert).status().ToString().c_str());
      return 2;
    }
    http_options.tls_cert_pem = *std::move(cert);
    http_options.tls_key_pem = *std::move(key);
  }

  BrokerDirectory directory(kube->get(), directory_options);
  directory.Start();
  Extender extender(&directory, kube->get(), options);
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      absl::GetFlag(FLAGS_listen),
      [&extender](const HttpRequest& r) { return extender.Handle(r); },
      std::move(http_options));
  if (!server.ok()) {
    std::fprintf(stderr, "kvbroker-extender: --listen: %s\n",
                 server.status().ToString().c_str());
    return 2;
  }
  std::printf(
      "kvbroker-extender serving on port %d (%s, API %s, brokers %s/%s)\n",
      (*server)->port(), (*server)->tls() ? "HTTPS" : "HTTP", api.c_str(),
      directory_options.namespace_.c_str(),
      directory_options.label_selector.c_str());
  std::fflush(stdout);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  int received = 0;
  sigwait(&signals, &received);
  std::printf("kvbroker-extender: signal %d, stopping\n", received);
  return 0;
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker

int main(int argc, char** argv) {
  // Block the stop signals in every thread; main waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::SetProgramUsageMessage(
      "kvbroker-extender: Kubernetes scheduler extender that admits pods by "
      "their brokers' exact KV-cache capacity (filter, prioritize, bind).");
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil checks every lock for deadlock cycles; kvbrokerd turns
  // that off as well.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return kvbroker::extender::Run();
}
