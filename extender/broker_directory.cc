// Broker discovery from the DaemonSet's pods, and the channels to them.

#include "extender/broker_directory.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "extender/extender_api.h"

namespace kvbroker {
namespace extender {

using nlohmann::json;

namespace {

struct Candidate {
  std::string pod;
  std::string target;
  bool ready = false;
  std::string created;  // RFC 3339 sorts as text
};

std::string Str(const json& obj, absl::string_view name) {
  const json* v = FindField(obj, name);
  return v != nullptr && v->is_string() ? v->get<std::string>() : "";
}

const json& Child(const json& obj, absl::string_view name) {
  static const json kNull;
  const json* v = FindField(obj, name);
  return v != nullptr ? *v : kNull;
}

bool IsReady(const json& status) {
  const json& conditions = Child(status, "conditions");
  if (!conditions.is_array()) return false;
  for (const json& c : conditions) {
    if (Str(c, "type") == "Ready") return Str(c, "status") == "True";
  }
  return false;
}

int PortOf(const json& spec, const std::string& name, int fallback) {
  const json& containers = Child(spec, "containers");
  if (!containers.is_array()) return fallback;
  for (const json& c : containers) {
    const json& ports = Child(c, "ports");
    if (!ports.is_array()) continue;
    for (const json& p : ports) {
      const json& number = Child(p, "containerPort");
      if (Str(p, "name") == name && number.is_number_integer()) {
        const int64_t port = number.get<int64_t>();
        if (port > 0 && port < 65536) return static_cast<int>(port);
      }
    }
  }
  return fallback;
}

// A broker pod as a candidate for its node: running, not being deleted,
// with a node and an IP. Among several on one node the ready one wins, then
// the newer.
void ConsiderPod(const json& pod, const std::string& port_name,
                 int default_port, std::map<std::string, Candidate>* chosen) {
  const json& metadata = Child(pod, "metadata");
  const json& spec = Child(pod, "spec");
  const json& pod_status = Child(pod, "status");
  const std::string node = Str(spec, "nodeName");
  const std::string ip = Str(pod_status, "podIP");
  if (node.empty() || ip.empty() || Str(pod_status, "phase") != "Running" ||
      !Str(metadata, "deletionTimestamp").empty()) {
    return;
  }
  Candidate c;
  c.pod = absl::StrCat(Str(metadata, "namespace"), "/", Str(metadata, "name"));
  const bool v6 = ip.find(':') != std::string::npos;
  c.target = absl::StrCat(v6 ? "[" : "", ip, v6 ? "]" : "", ":",
                          PortOf(spec, port_name, default_port));
  c.ready = IsReady(pod_status);
  c.created = Str(metadata, "creationTimestamp");
  auto [it, inserted] = chosen->emplace(node, c);
  if (!inserted && std::tie(c.ready, c.created) >
                       std::tie(it->second.ready, it->second.created)) {
    it->second = c;
  }
}

}  // namespace

BrokerDirectory::BrokerDirectory(const KubeClient* kube,
                                 BrokerDirectoryOptions options)
    : kube_(kube), options_(std::move(options)) {
  worker_ = std::thread([this] { Work(); });
}

BrokerDirectory::~BrokerDirectory() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  worker_.join();
}

void BrokerDirectory::Start() {
  absl::MutexLock lock(&mu_);
  periodic_ = true;
  relist_wanted_ = true;
}

void BrokerDirectory::Work() {
  absl::Time periodic_due = absl::InfiniteFuture();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto asked = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || relist_wanted_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&asked), periodic_due);
      if (stopping_) return;
      relist_wanted_ = false;
    }
    (void)Refresh();
    absl::MutexLock lock(&mu_);
    if (periodic_) periodic_due = absl::Now() + options_.refresh_interval;
  }
}

std::shared_ptr<const Broker> BrokerDirectory::MakeBroker(
    const std::string& node, const std::string& pod,
    const std::string& target) const {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  if (options_.tls.has_value()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls->root_ca_pem;
    ssl.pem_cert_chain = options_.tls->cert_chain_pem;
    ssl.pem_private_key = options_.tls->private_key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options_.tls->target_name_override.empty()) {
      args.SetSslTargetNameOverride(options_.tls->target_name_override);
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, credentials, args);
  ClientOptions once;
  once.bearer_token = options_.bearer_token;
  once.timeout = options_.call_timeout;
  once.retry.max_attempts = 1;
  ClientOptions retrying = once;
  retrying.retry.max_attempts = 3;
  auto broker = std::make_shared<Broker>();
  broker->node = node;
  broker->pod = pod;
  broker->target = target;
  broker->credentials = CheckBearerToken(options_.bearer_token);
  if (!options_.bearer_token.empty() && broker->credentials.ok()) {
    broker->authorization = absl::StrCat("Bearer ", options_.bearer_token);
  }
  broker->stub = v1::KvBroker::NewStub(channel);
  broker->filter = KvBrokerClient::FromChannel(channel, once);
  broker->bind = KvBrokerClient::FromChannel(channel, retrying);
  return broker;
}

absl::Status BrokerDirectory::Refresh() {
  absl::MutexLock serial(&refresh_mu_);
  {
    absl::MutexLock lock(&mu_);
    ++relists_begun_;
  }
  std::map<std::string, Candidate> chosen;
  absl::Status status;
  std::string next_page;
  for (int restarts = 0, pages = 0;; ++pages) {
    if (pages == kMaxListPages) {
      status = absl::UnavailableError(absl::StrCat(
          "the broker pod list did not end within ", pages, " pages"));
      break;
    }
    absl::StatusOr<json> list = kube_->ListPods(
        options_.namespace_, options_.label_selector, kListPage, next_page);
    if (list.status().code() == absl::StatusCode::kFailedPrecondition &&
        !next_page.empty() && restarts++ == 0) {
      chosen.clear();  // the token expired between pages: from the start
      next_page.clear();
      continue;
    }
    if (!list.ok()) {
      status = list.status().code() == absl::StatusCode::kFailedPrecondition
                   ? absl::UnavailableError(list.status().message())
                   : list.status();
      break;
    }
    const json& items = Child(*list, "items");
    if (!items.is_array()) {
      status = absl::UnavailableError("the broker pod list has no items");
      break;
    }
    for (const json& pod : items) {
      ConsiderPod(pod, options_.port_name, options_.default_port, &chosen);
    }
    const std::string token = Str(Child(*list, "metadata"), "continue");
    if (token.empty()) break;
    if (token == next_page) {
      status = absl::UnavailableError(
          "the broker pod list names the same page again");
      break;
    }
    next_page = token;
  }
  absl::MutexLock lock(&mu_);
  last_refresh_ = absl::Now();
  ++refreshes_;
  if (!status.ok()) {
    ++refresh_failures_;
    return status;
  }
  std::map<std::string, std::shared_ptr<const Broker>> next;
  for (const auto& [node, c] : chosen) {
    auto old = brokers_.find(node);
    if (old != brokers_.end() && old->second->target == c.target &&
        old->second->pod == c.pod) {
      next.emplace(node, old->second);
    } else {
      next.emplace(node, MakeBroker(node, c.pod, c.target));
    }
  }
  brokers_ = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Broker>> BrokerDirectory::Find(
    const std::string& node, absl::Time wait_until) {
  absl::MutexLock lock(&mu_);
  auto it = brokers_.find(node);
  if (it != brokers_.end()) return it->second;
  // The relist running now, or the next one, asked for unless throttled.
  int64_t awaited = relists_begun_;
  if (refreshes_ == relists_begun_ &&
      (relist_wanted_ ||
       absl::Now() - last_refresh_ >= options_.min_refresh_interval)) {
    relist_wanted_ = true;
    awaited = relists_begun_ + 1;
  }
  auto ended = [this, awaited]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stopping_ || refreshes_ >= awaited;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ended), wait_until);
  it = brokers_.find(node);
  if (it != brokers_.end()) return it->second;
  return absl::NotFoundError(
      absl::StrCat("no running kvbroker pod on node ", node));
}

size_t BrokerDirectory::size() const {
  absl::MutexLock lock(&mu_);
  return brokers_.size();
}

int64_t BrokerDirectory::refreshes() const {
  absl::MutexLock lock(&mu_);
  return refreshes_;
}

int64_t BrokerDirectory::refresh_failures() const {
  absl::MutexLock lock(&mu_);
  return refresh_failures_;
}

}  // namespace extender
}  // namespace kvbroker
