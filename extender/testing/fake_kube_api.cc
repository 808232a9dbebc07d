// Routes and shape checks of FakeKubeApi.

#include "extender/testing/fake_kube_api.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvbroker {
namespace extender {
namespace testing {

using nlohmann::json;

namespace {

std::string Status(int code, const std::string& reason,
                   const std::string& message) {
  return json{{"kind", "Status"},   {"apiVersion", "v1"}, {"status", "Failure"},
              {"message", message}, {"reason", reason},   {"code", code}}
      .dump();
}

// The API server's message for a failed resourceVersion precondition.
std::string Modified(const std::string& name) {
  return absl::StrCat("Operation cannot be fulfilled on pods \"", name,
                      "\": the object has been modified; please apply your "
                      "changes to the latest version and try again");
}

bool OnlyKeys(const json& obj, std::initializer_list<const char*> keys) {
  if (!obj.is_object()) return false;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    if (!known) return false;
  }
  return true;
}

}  // namespace

FakeKubeApi::FakeKubeApi(std::string token) : token_(std::move(token)) {
  server_ = HttpServer::Start("127.0.0.1:0", [this](const HttpRequest& r) {
              return Handle(r);
            }).value();
}

std::string FakeKubeApi::url() const {
  return absl::StrCat("http://127.0.0.1:", server_->port());
}

void FakeKubeApi::AddPod(
    const std::string& ns, const std::string& name, const std::string& uid,
    const std::map<std::string, std::string>& annotations) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", name},
                {"namespace", ns},
                {"uid", uid},
                {"annotations", annotations}}},
              {"spec", {{"containers", json::array()}}},
              {"status", {{"phase", "Pending"}}}};
  absl::MutexLock lock(&mu_);
  pod["metadata"]["resourceVersion"] = absl::StrCat(++resource_version_);
  pods_[absl::StrCat(ns, "/", name)] = std::move(pod);
}

void FakeKubeApi::Touch(const std::string& ns, const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(absl::StrCat(ns, "/", name));
  if (it != pods_.end()) {
    it->second["metadata"]["resourceVersion"] =
        absl::StrCat(++resource_version_);
  }
}

void FakeKubeApi::AddBroker(const std::string& node, int port) {
  absl::MutexLock lock(&mu_);
  json pod = {{"metadata",
               {{"name", absl::StrCat("kvbroker-", node)},
                {"namespace", kBrokerNamespace},
                {"labels",
                 {{"app.kubernetes.io/name", "kvbroker"},
                  {"app.kubernetes.io/component", "kvbrokerd"}}},
                {"creationTimestamp", "2026-01-01T00:00:00Z"}}},
              {"spec",
               {{"nodeName", node},
                {"containers",
                 {{{"name", "kvbrokerd"},
                   {"ports",
                    {{{"name", "metrics"}, {"containerPort", 9400}},
                     {{"name", "grpc"}, {"containerPort", port}}}}}}}}},
              {"status",
               {{"phase", "Running"},
                {"podIP", "127.0.0.1"},
                {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
  brokers_.push_back(std::move(pod));
}

void FakeKubeApi::AddBrokerPod(json pod) {
  absl::MutexLock lock(&mu_);
  brokers_.push_back(std::move(pod));
}

void FakeKubeApi::FailBrokerList(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_broker_list_ = fail;
}

void FakeKubeApi::ExpireContinueTokens(int n) {
  absl::MutexLock lock(&mu_);
  expire_continue_tokens_ = n;
}

int FakeKubeApi::broker_list_pages() {
  absl::MutexLock lock(&mu_);
  return broker_list_pages_;
}

size_t FakeKubeApi::largest_broker_list_page() {
  absl::MutexLock lock(&mu_);
  return largest_broker_list_page_;
}

json FakeKubeApi::Pod(const std::string& ns, const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(absl::StrCat(ns, "/", name));
  return it == pods_.end() ? json() : it->second;
}

std::map<std::string, std::string> FakeKubeApi::Annotations(
    const std::string& ns, const std::string& name) {
  const json pod = Pod(ns, name);
  std::map<std::string, std::string> out;
  if (!pod.is_object()) return out;
  for (auto it = pod["metadata"]["annotations"].begin();
       it != pod["metadata"]["annotations"].end(); ++it) {
    out[it.key()] = it->get<std::string>();
  }
  return out;
}

void FakeKubeApi::OnRequest(std::function<void(const HttpRequest&)> hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

void FakeKubeApi::RefuseBindings(int code) {
  absl::MutexLock lock(&mu_);
  refuse_bindings_ = code;
}

void FakeKubeApi::RefusePatches(int code) {
  absl::MutexLock lock(&mu_);
  refuse_patches_ = code;
}

void FakeKubeApi::RefusePodReads(int code) {
  absl::MutexLock lock(&mu_);
  refuse_pod_reads_ = code;
}

void FakeKubeApi::FailPodRequestsAtRandom(double chance, uint64_t seed) {
  absl::MutexLock lock(&mu_);
  fail_chance_ = chance;
  random_.seed(seed);
}

std::vector<RecordedBinding> FakeKubeApi::bindings() {
  absl::MutexLock lock(&mu_);
  return bindings_;
}

std::vector<RecordedPatch> FakeKubeApi::patches() {
  absl::MutexLock lock(&mu_);
  return patches_;
}

std::vector<std::string> FakeKubeApi::requests() {
  absl::MutexLock lock(&mu_);
  return requests_;
}

std::vector<std::string> FakeKubeApi::violations() {
  absl::MutexLock lock(&mu_);
  return violations_;
}

HttpResponse FakeKubeApi::Violation(int code, const std::string& what) {
  violations_.push_back(what);
  return {code, "application/json", Status(code, "BadRequest", what)};
}

HttpResponse FakeKubeApi::Handle(const HttpRequest& request) {
  std::function<void(const HttpRequest&)> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = hook_;
  }
  if (hook) hook(request);
  absl::MutexLock lock(&mu_);
  requests_.push_back(absl::StrCat(request.method, " ", request.path));
  if (fail_chance_ > 0 && absl::StrContains(request.path, "/pods/") &&
      std::bernoulli_distribution(fail_chance_)(random_)) {
    const bool after =
        request.method != "GET" && std::bernoulli_distribution(0.5)(random_);
    if (after) (void)HandleLocked(request);
    return {500, "application/json",
            Status(500, "InternalError",
                   after ? "lost the answer after the change" : "failed")};
  }
  return HandleLocked(request);
}

HttpResponse FakeKubeApi::HandleLocked(const HttpRequest& request) {
  if (request.Header("authorization") != absl::StrCat("Bearer ", token_)) {
    return Violation(401, absl::StrCat(request.method, " ", request.path,
                                       ": missing or wrong bearer token"));
  }
  if (request.Header("accept") != "application/json") {
    return Violation(406, absl::StrCat(request.path, ": Accept is \"",
                                       request.Header("accept"), "\""));
  }
  // /api/v1/namespaces/{ns}/pods[/{name}[/binding]]
  const std::vector<std::string> parts =
      absl::StrSplit(request.path, '/', absl::SkipEmpty());
  if (parts.size() < 5 || parts[0] != "api" || parts[1] != "v1" ||
      parts[2] != "namespaces" || parts[4] != "pods" || parts.size() > 7) {
    return Violation(404, absl::StrCat("unexpected path ", request.path));
  }
  const std::string& ns = parts[3];
  if (parts.size() == 5) {
    // labelSelector, and optionally limit and continue (a list in pages:
    // the token is the offset of the page's first pod).
    auto query = [&](const std::string& key) {
      auto it = request.query.find(key);
      return it == request.query.end() ? std::string() : it->second;
    };
    size_t limit = 0;
    size_t offset = 0;
    const bool paged = request.query.count("limit") != 0;
    const bool continued = request.query.count("continue") != 0;
    if (request.method != "GET" || ns != kBrokerNamespace ||
        query("labelSelector") != kBrokerSelector ||
        request.query.size() != 1u + paged + continued ||
        (paged && (!absl::SimpleAtoi(query("limit"), &limit) || limit == 0)) ||
        (continued &&
         (!paged || !absl::SimpleAtoi(query("continue"), &offset) ||
          offset == 0 || offset >= brokers_.size()))) {
      return Violation(400, absl::StrCat("unexpected pod list ", request.method,
                                         " ", request.path, " in ", ns));
    }
    if (fail_broker_list_) {
      return {500, "application/json",
              Status(500, "InternalError", "etcd is having a bad day")};
    }
    if (continued && expire_continue_tokens_ > 0) {
      --expire_continue_tokens_;
      return {
          410, "application/json",
          Status(410, "Expired", "The provided continue parameter is too old")};
    }
    const size_t end =
        paged ? std::min(brokers_.size(), offset + limit) : brokers_.size();
    json items = json::array();
    for (size_t i = offset; i < end; ++i) items.push_back(brokers_[i]);
    ++broker_list_pages_;
    largest_broker_list_page_ =
        std::max(largest_broker_list_page_, end - offset);
    json list = {{"apiVersion", "v1"},
                 {"kind", "PodList"},
                 {"metadata", {{"resourceVersion", "1"}}},
                 {"items", std::move(items)}};
    if (end < brokers_.size()) {
      list["metadata"]["continue"] = absl::StrCat(end);
    }
    return {200, "application/json", list.dump()};
  }
  const std::string& name = parts[5];
  auto pod = pods_.find(absl::StrCat(ns, "/", name));
  if (pod == pods_.end()) {
    return {
        404, "application/json",
        Status(404, "NotFound", absl::StrCat("pods \"", name, "\" not found"))};
  }
  if (parts.size() == 6 && request.method == "GET") {
    if (!request.body.empty()) return Violation(400, "GET with a body");
    if (refuse_pod_reads_ != 0) {
      return {refuse_pod_reads_, "application/json",
              Status(refuse_pod_reads_, "InternalError", "read refused")};
    }
    return {200, "application/json", pod->second.dump()};
  }
  if (parts.size() == 6 && request.method == "PATCH") {
    if (request.Header("content-type") != "application/merge-patch+json") {
      return Violation(415, absl::StrCat("PATCH content type \"",
                                         request.Header("content-type"), "\""));
    }
    json patch = json::parse(request.body, nullptr, false);
    if (!OnlyKeys(patch, {"metadata"}) ||
        !OnlyKeys(patch["metadata"], {"annotations", "resourceVersion"}) ||
        !patch["metadata"]["annotations"].is_object()) {
      return Violation(400, absl::StrCat("PATCH touches more than "
                                         "metadata.annotations: ",
                                         request.body));
    }
    for (auto it = patch["metadata"]["annotations"].begin();
         it != patch["metadata"]["annotations"].end(); ++it) {
      if (!it->is_string() && !it->is_null()) {
        return Violation(400, absl::StrCat("annotation ", it.key(),
                                           " is neither a string nor null"));
      }
      if (!absl::StartsWith(it.key(), "kvbroker.io/")) {
        return Violation(
            400, absl::StrCat("PATCH of a foreign annotation ", it.key()));
      }
    }
    if (refuse_patches_ != 0) {
      return {refuse_patches_, "application/json",
              Status(refuse_patches_, "InternalError", "patch refused")};
    }
    if (patch["metadata"].contains("resourceVersion") &&
        patch["metadata"]["resourceVersion"] !=
            pod->second["metadata"]["resourceVersion"]) {
      return {409, "application/json", Status(409, "Conflict", Modified(name))};
    }
    pod->second["metadata"]["resourceVersion"] =
        absl::StrCat(++resource_version_);
    json& annotations = pod->second["metadata"]["annotations"];
    for (auto it = patch["metadata"]["annotations"].begin();
         it != patch["metadata"]["annotations"].end(); ++it) {
      if (it->is_null()) {
        annotations.erase(it.key());
      } else {
        annotations[it.key()] = *it;
      }
    }
    patches_.push_back({ns, name, patch["metadata"]["annotations"]});
    return {200, "application/json", pod->second.dump()};
  }
  if (parts.size() == 7 && parts[6] == "binding" && request.method == "POST") {
    if (request.Header("content-type") != "application/json") {
      return Violation(415, "Binding content type is not application/json");
    }
    json b = json::parse(request.body, nullptr, false);
    const bool shape =
        OnlyKeys(b, {"apiVersion", "kind", "metadata", "target"}) &&
        b["apiVersion"] == "v1" && b["kind"] == "Binding" &&
        OnlyKeys(b["metadata"],
                 {"name", "namespace", "uid", "resourceVersion"}) &&
        b["metadata"]["name"] == name && b["metadata"]["namespace"] == ns &&
        b["metadata"]["uid"].is_string() &&
        OnlyKeys(b["target"], {"apiVersion", "kind", "name"}) &&
        b["target"]["apiVersion"] == "v1" && b["target"]["kind"] == "Node" &&
        b["target"]["name"].is_string() && b["target"]["name"] != "";
    if (!shape) {
      return Violation(400, absl::StrCat("malformed Binding ", request.body));
    }
    if (b["metadata"]["uid"] != pod->second["metadata"]["uid"]) {
      return {409, "application/json",
              Status(409, "Conflict", "the pod's uid differs")};
    }
    if (refuse_bindings_ != 0) {
      return {refuse_bindings_, "application/json",
              Status(refuse_bindings_, "InternalError", "binding refused")};
    }
    if (b["metadata"].contains("resourceVersion") &&
        b["metadata"]["resourceVersion"] !=
            pod->second["metadata"]["resourceVersion"]) {
      return {409, "application/json", Status(409, "Conflict", Modified(name))};
    }
    if (pod->second["spec"].contains("nodeName")) {
      return {409, "application/json",
              Status(409, "Conflict",
                     absl::StrCat(
                         "pod ", name, " is already assigned to node ",
                         pod->second["spec"]["nodeName"].get<std::string>()))};
    }
    const std::string node = b["target"]["name"].get<std::string>();
    pod->second["spec"]["nodeName"] = node;
    pod->second["metadata"]["resourceVersion"] =
        absl::StrCat(++resource_version_);
    bindings_.push_back(
        {ns, name, b["metadata"]["uid"].get<std::string>(), node});
    return {
        201, "application/json",
        json{{"kind", "Status"}, {"status", "Success"}, {"code", 201}}.dump()};
  }
  return Violation(
      405, absl::StrCat("unexpected ", request.method, " ", request.path));
}

}  // namespace testing
}  // namespace extender
}  // namespace kvbroker
