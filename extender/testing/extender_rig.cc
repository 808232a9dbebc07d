// The extender's test rig: see extender_rig.h.

#include "extender/testing/extender_rig.h"

#include <curl/curl.h>

#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace extender {
namespace testing {
namespace {

using ::nlohmann::json;

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

HttpResult Http(const std::string& method, const std::string& url,
                const std::string& body, const std::string& ca_file) {
  HttpResult r;
  CURL* curl = curl_easy_init();
  if (!ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_file.c_str());
  curl_slist* headers =
      curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE,
                     static_cast<long>(body.size()));
  }
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.code);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  r.doc = json::parse(r.body, nullptr, false);
  return r;
}

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? absl::StrCat(srcdir, "/kvbroker/", path) : path;
}

std::unique_ptr<BrokerProcess> StartBroker(
    const std::string& pools, const std::vector<std::string>& flags) {
  absl::StatusOr<std::unique_ptr<BrokerProcess>> p =
      BrokerProcess::Start(pools, flags);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

std::unique_ptr<KvBrokerClient> ClientOf(const BrokerProcess& broker,
                                         ClientOptions options) {
  options.target = broker.target();
  return KvBrokerClient::Connect(options).value();
}

v1::CapacitySnapshot Cap(const BrokerProcess& broker, const std::string& pool,
                         ClientOptions options) {
  absl::StatusOr<v1::CapacitySnapshot> s =
      ClientOf(broker, options)->Capacity(pool);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : v1::CapacitySnapshot();
}

int64_t Release(const BrokerProcess& broker, const std::string& reservation) {
  absl::StatusOr<v1::ReleaseReservationResponse> released =
      ClientOf(broker)->ReleaseReservation("kv", reservation);
  EXPECT_TRUE(released.ok()) << released.status();
  return released.ok() ? released->released_blocks() : -1;
}

std::map<std::string, std::string> Asks(const std::string& pool,
                                        const std::string& key,
                                        const std::string& value) {
  return {{"kvbroker.io/pool", pool}, {key, value}};
}

Rig::Rig(ExtenderOptions options, BrokerDirectoryOptions directory_options)
    : api_("test-token-1") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  token_file_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kube-token");
  std::ofstream(token_file_) << "test-token-1\n";
  KubeClientOptions kube_options;
  kube_options.api_server = api_.url();
  kube_options.token_file = token_file_;
  kube_ = KubeClient::Create(kube_options).value();
  directory_options.namespace_ = FakeKubeApi::kBrokerNamespace;
  directory_options.label_selector = FakeKubeApi::kBrokerSelector;
  directory_options.min_refresh_interval = absl::ZeroDuration();
  directory_ =
      std::make_unique<BrokerDirectory>(kube_.get(), directory_options);
  extender_ =
      std::make_unique<Extender>(directory_.get(), kube_.get(), options);
  server_ = HttpServer::Start("127.0.0.1:0", [this](const HttpRequest& r) {
              return extender_->Handle(r);
            }).value();
}

Rig::~Rig() {
  EXPECT_THAT(api_.violations(), ::testing::IsEmpty())
      << "requests the fake API server refused as malformed";
}

std::string Rig::Args(const json& pod, const std::vector<std::string>& nodes,
                      bool node_names_mode) {
  if (node_names_mode) return json{{"Pod", pod}, {"NodeNames", nodes}}.dump();
  json items = json::array();
  for (const std::string& n : nodes) {
    items.push_back({{"metadata", {{"name", n}, {"labels", {{"gpu", "h200"}}}}},
                     {"status", {{"allocatable", {{"cpu", "64"}}}}}});
  }
  return json{{"Pod", pod},
              {"Nodes", {{"metadata", json::object()}, {"items", items}}}}
      .dump();
}

std::string Rig::BindingArgs(const json& pod, const std::string& node) {
  return json{{"PodName", pod["metadata"]["name"]},
              {"PodNamespace", "serving"},
              {"PodUID", pod["metadata"]["uid"]},
              {"Node", node}}
      .dump();
}

std::unique_ptr<Rig::RacingBind> Rig::RaceABind(const std::string& step,
                                                const std::string& pod,
                                                const std::string& node,
                                                std::function<void()> then) {
  auto race = std::make_unique<RacingBind>();
  race->replica = Replica();
  HttpRequest bind;
  bind.method = "POST";
  bind.path = "/bind";
  bind.body = BindingArgs(api_.Pod("serving", pod), node);
  api_.OnRequest(
      [r = race.get(), step, bind, then](const HttpRequest& request) {
        if (r->ran || request.method != step) return;
        r->ran = true;
        r->answer = r->replica->Handle(bind);
        if (then) then();
      });
  return race;
}

}  // namespace testing
}  // namespace extender
}  // namespace kvbroker
