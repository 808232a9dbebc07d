// kvbroker-extender end to end, as kube-scheduler sees it: real kvbrokerd
// processes stand in for the nodes, a fake Kubernetes API server (real
// HTTP) serves the pods and the DaemonSet's pods and checks every request,
// and the extender answers filter / prioritize / bind over HTTP.

#include "extender/extender.h"

#include <curl/curl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/kvbroker_client.h"
#include "extender/broker_directory.h"
#include "extender/extender_api.h"
#include "extender/http_server.h"
#include "extender/kube_client.h"
#include "extender/testing/broker_process.h"
#include "extender/testing/fake_kube_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {
namespace {

using ::nlohmann::json;
using ::testing::AllOf;
using testing::BrokerProcess;
using testing::FakeKubeApi;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kMiB = 1 << 20;

// The seed case of the spec: 14 MiB pages, 6 MiB blocks, 5 block ids of
// which 3 are usable (block 2 straddles the page boundary).
constexpr char kSeedPools[] = R"pb(
  pools { name: "kv" page_size: 14680064 block_bytes: 6291456 max_blocks: 5 }
)pb";
// Room: 12 MiB pages of two 6 MiB blocks, 16 blocks, 16 tokens per block.
constexpr char kRoomyPools[] = R"pb(
  pools {
    name: "kv"
    page_size: 12582912
    block_bytes: 6291456
    tokens_per_block: 16
    max_blocks: 16
  }
)pb";
// One pool per capacity reason, on a node with 64 MiB of device memory.
constexpr char kReasonPools[] = R"pb(
  pools { name: "full" page_size: 2097152 block_bytes: 1048576 max_blocks: 8 }
  pools { name: "shrink" page_size: 2097152 block_bytes: 1048576 max_blocks: 8 }
  pools { name: "big" page_size: 16777216 block_bytes: 8388608 max_blocks: 16 }
)pb";

struct HttpResult {
  long code = 0;
  std::string body;
  json doc;
};

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// `ca_file` non-empty: an https URL's server must chain to it.
HttpResult Http(const std::string& method, const std::string& url,
                const std::string& body, const std::string& ca_file = "") {
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
    const std::string& pools, const std::vector<std::string>& flags = {}) {
  absl::StatusOr<std::unique_ptr<BrokerProcess>> p =
      BrokerProcess::Start(pools, flags);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

std::unique_ptr<KvBrokerClient> ClientOf(const BrokerProcess& broker,
                                         ClientOptions options = {}) {
  options.target = broker.target();
  return KvBrokerClient::Connect(options).value();
}

v1::CapacitySnapshot Cap(const BrokerProcess& broker, const std::string& pool,
                         ClientOptions options = {}) {
  absl::StatusOr<v1::CapacitySnapshot> s =
      ClientOf(broker, options)->Capacity(pool);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : v1::CapacitySnapshot();
}

// Releases `reservation` of pool "kv" on `broker`: the blocks it held, or
// -1 (with the broker's refusal reported) when it is not live there.
int64_t Release(const BrokerProcess& broker, const std::string& reservation) {
  absl::StatusOr<v1::ReleaseReservationResponse> released =
      ClientOf(broker)->ReleaseReservation("kv", reservation);
  EXPECT_TRUE(released.ok()) << released.status();
  return released.ok() ? released->released_blocks() : -1;
}

// The extender, in process, against a FakeKubeApi.
class Rig {
 public:
  explicit Rig(ExtenderOptions options = {},
               BrokerDirectoryOptions directory_options = {})
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

  ~Rig() {
    EXPECT_THAT(api_.violations(), ::testing::IsEmpty())
        << "requests the fake API server refused as malformed";
  }

  FakeKubeApi& api() { return api_; }
  Extender& extender() { return *extender_; }
  // A second extender over the same API and brokers, sharing no memory
  // with the first: another replica, or the first after a restart.
  std::unique_ptr<Extender> Replica(ExtenderOptions options = {}) {
    return std::make_unique<Extender>(directory_.get(), kube_.get(), options);
  }

  HttpResult Post(const std::string& verb, const std::string& body) {
    return Http("POST",
                absl::StrCat("http://127.0.0.1:", server_->port(), "/", verb),
                body);
  }
  HttpResult Get(const std::string& path) {
    return Http("GET", absl::StrCat("http://127.0.0.1:", server_->port(), path),
                "");
  }

  // ExtenderArgs for the stored pod and these candidates.
  static std::string Args(const json& pod,
                          const std::vector<std::string>& nodes,
                          bool node_names_mode = true) {
    if (node_names_mode) return json{{"Pod", pod}, {"NodeNames", nodes}}.dump();
    json items = json::array();
    for (const std::string& n : nodes) {
      items.push_back(
          {{"metadata", {{"name", n}, {"labels", {{"gpu", "h200"}}}}},
           {"status", {{"allocatable", {{"cpu", "64"}}}}}});
    }
    return json{{"Pod", pod},
                {"Nodes", {{"metadata", json::object()}, {"items", items}}}}
        .dump();
  }

  HttpResult Filter(const std::string& pod,
                    const std::vector<std::string>& nodes) {
    return Post("filter", Args(api_.Pod("serving", pod), nodes));
  }

  static std::string BindingArgs(const json& pod, const std::string& node) {
    return json{{"PodName", pod["metadata"]["name"]},
                {"PodNamespace", "serving"},
                {"PodUID", pod["metadata"]["uid"]},
                {"Node", node}}
        .dump();
  }

  HttpResult Bind(const std::string& pod, const std::string& node) {
    return Post("bind", BindingArgs(api_.Pod("serving", pod), node));
  }

  // Another replica's bind of `pod` to `node`, run at the first request of
  // method `step` the API receives, before that request is handled: a bind
  // landing between the steps of this rig's. Clear the API's hook
  // (OnRequest(nullptr)) before the race goes.
  struct RacingBind {
    std::unique_ptr<Extender> replica;
    bool ran = false;
    HttpResponse answer;
  };
  // `then`, if any, runs after the racing bind, before this rig's request
  // is handled.
  std::unique_ptr<RacingBind> RaceABind(const std::string& step,
                                        const std::string& pod,
                                        const std::string& node,
                                        std::function<void()> then = nullptr) {
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

 private:
  FakeKubeApi api_;
  std::string token_file_;
  std::unique_ptr<KubeClient> kube_;
  std::unique_ptr<BrokerDirectory> directory_;
  std::unique_ptr<Extender> extender_;
  std::unique_ptr<HttpServer> server_;
};

std::map<std::string, std::string> Asks(const std::string& pool,
                                        const std::string& key,
                                        const std::string& value) {
  return {{"kvbroker.io/pool", pool}, {key, value}};
}

// ===========================================================================
// The seed case, as kube-scheduler sees it.

TEST(ExtenderSeedCase, FiltersOffTheSeedNodeAndBindsOnTheRoomyOne) {
  auto a = StartBroker(kSeedPools);
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(a && b);
  Rig rig;
  rig.api().AddBroker("node-a", a->port());
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-0", "uid-llm-0",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  ASSERT_EQ(Cap(*a, "kv").available_blocks(), 3);
  ASSERT_EQ(Cap(*b, "kv").available_blocks(), 16);

  // Filter, node-cache-capable mode.
  HttpResult f = rig.Filter("llm-0", {"node-a", "node-b"});
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_EQ(f.doc["NodeNames"], json({"node-b"}));
  EXPECT_EQ(f.doc["FailedNodes"], json::object());
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"],
            json({{"node-a",
                   "REQUEST_TOO_LARGE: requested_blocks=4 available_blocks=3 "
                   "pool_total_blocks=3 reserved_blocks=0 "
                   "allocated_blocks=0"}}));
  EXPECT_EQ(f.doc["Error"], "");
  // The broker itself refuses the same way (and changes nothing).
  EXPECT_EQ(GetKvbReason(ClientOf(*a)->Reserve("kv", 4).status()),
            v1::REQUEST_TOO_LARGE);

  // Full node objects: the kept node comes back as sent.
  HttpResult full = rig.Post(
      "filter", Rig::Args(rig.api().Pod("serving", "llm-0"),
                          {"node-a", "node-b"}, /*node_names_mode=*/false));
  ASSERT_EQ(full.code, 200) << full.body;
  ASSERT_EQ(full.doc["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(full.doc["Nodes"]["items"][0]["metadata"]["name"], "node-b");
  EXPECT_EQ(full.doc["Nodes"]["items"][0]["metadata"]["labels"]["gpu"], "h200");
  EXPECT_FALSE(full.doc.contains("NodeNames"));
  EXPECT_EQ(full.doc["FailedAndUnresolvableNodes"].size(), 1u);

  // Prioritize: only node-b can take it.
  HttpResult p = rig.Post(
      "prioritize",
      Rig::Args(rig.api().Pod("serving", "llm-0"), {"node-a", "node-b"}));
  ASSERT_EQ(p.code, 200) << p.body;
  EXPECT_EQ(p.doc, json::parse(R"([{"Host":"node-a","Score":0},
                                   {"Host":"node-b","Score":10}])"));

  // Bind on node-b.
  HttpResult bound = rig.Bind("llm-0", "node-b");
  ASSERT_EQ(bound.code, 200) << bound.body;
  EXPECT_EQ(bound.doc, json({{"Error", ""}}));
  const v1::CapacitySnapshot after_b = Cap(*b, "kv");
  EXPECT_EQ(after_b.available_blocks(), 12);
  EXPECT_EQ(after_b.reserved_blocks(), 4);
  const v1::CapacitySnapshot after_a = Cap(*a, "kv");
  EXPECT_EQ(after_a.available_blocks(), 3);
  EXPECT_EQ(after_a.reserved_blocks(), 0);

  ASSERT_EQ(rig.api().bindings().size(), 1u);
  EXPECT_EQ(rig.api().bindings()[0].node, "node-b");
  EXPECT_EQ(rig.api().bindings()[0].uid, "uid-llm-0");
  const std::map<std::string, std::string> annotations =
      rig.api().Annotations("serving", "llm-0");
  ASSERT_EQ(annotations.count(kReservationAnnotation), 1u);
  EXPECT_FALSE(annotations.at(kReservationAnnotation).empty());
  EXPECT_EQ(annotations.at(kReservationNodeAnnotation), "node-b");
  EXPECT_EQ(annotations.count(kReservationExpiryAnnotation), 1u);
  ASSERT_EQ(rig.api().patches().size(), 1u);
  EXPECT_EQ(rig.api().Pod("serving", "llm-0")["spec"]["nodeName"], "node-b");

  // The reservation is the pod's: an engine redeems it with Alloc.
  AllocOptions redeem;
  redeem.reservation_id = annotations.at(kReservationAnnotation);
  absl::StatusOr<v1::AllocResponse> engine =
      ClientOf(*b)->Alloc("kv", 4, redeem);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(Cap(*b, "kv").allocated_blocks(), 4);
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
}

TEST(ExtenderSeedCase, TokensUseEachNodesTokensPerBlock) {
  auto a = StartBroker(kSeedPools);   // tokens_per_block unset: 1
  auto b = StartBroker(kRoomyPools);  // 16 tokens per block
  ASSERT_TRUE(a && b);
  Rig rig;
  rig.api().AddBroker("node-a", a->port());
  rig.api().AddBroker("node-b", b->port());
  // 100 tokens = ceil(100 / 16) = 7 blocks.
  rig.api().AddPod("serving", "chat", "uid-chat",
                   Asks("kv", "kvbroker.io/tokens", "100"));
  HttpResult f = rig.Filter("chat", {"node-a", "node-b"});
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_EQ(f.doc["NodeNames"], json({"node-b"}));
  // On node-a 100 tokens are 100 blocks.
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"]["node-a"],
            "REQUEST_TOO_LARGE: requested_blocks=100 available_blocks=3 "
            "pool_total_blocks=3 reserved_blocks=0 allocated_blocks=0");
  HttpResult bound = rig.Bind("chat", "node-b");
  EXPECT_EQ(bound.doc, json({{"Error", ""}})) << bound.body;
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 7);
  EXPECT_EQ(Cap(*b, "kv").available_blocks(), 9);
}

TEST(ExtenderSeedCase, PodsWithoutAnnotationsPassUntouched) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "web", "uid-web", {{"team", "search"}});
  // node-z has no broker: irrelevant for a pod that asks nothing.
  HttpResult f = rig.Filter("web", {"node-z", "node-b"});
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_EQ(f.doc["NodeNames"], json({"node-z", "node-b"}));
  EXPECT_EQ(f.doc["FailedNodes"], json::object());
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"], json::object());
  HttpResult p = rig.Post(
      "prioritize", Rig::Args(rig.api().Pod("serving", "web"), {"node-b"}));
  EXPECT_EQ(p.doc, json::parse(R"([{"Host":"node-b","Score":0}])"));
  // No broker was asked: nothing listed the broker pods.
  for (const std::string& r : rig.api().requests()) {
    EXPECT_THAT(r, ::testing::Not(HasSubstr("/namespaces/kvbroker/")));
  }
  HttpResult bound = rig.Bind("web", "node-z");
  EXPECT_EQ(bound.doc, json({{"Error", ""}})) << bound.body;
  ASSERT_EQ(rig.api().bindings().size(), 1u);
  EXPECT_EQ(rig.api().bindings()[0].node, "node-z");
  EXPECT_TRUE(rig.api().patches().empty());
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
}

// ===========================================================================
// Bind: retries and failures.

TEST(ExtenderBind, ARetriedBindIsIdempotent) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-1", "uid-llm-1",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  ASSERT_EQ(rig.Bind("llm-1", "node-b").doc, json({{"Error", ""}}));
  const std::string reservation =
      rig.api().Annotations("serving", "llm-1").at(kReservationAnnotation);
  ASSERT_EQ(rig.Bind("llm-1", "node-b").doc, json({{"Error", ""}}));
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
  EXPECT_EQ(Cap(*b, "kv").available_blocks(), 12);
  EXPECT_EQ(rig.api().bindings().size(), 1u);
  EXPECT_EQ(
      rig.api().Annotations("serving", "llm-1").at(kReservationAnnotation),
      reservation);
  // The same pod to another node is refused.
  HttpResult other = rig.Bind("llm-1", "node-c");
  EXPECT_EQ(other.doc["Error"], "pod is already bound to node node-b");
}

TEST(ExtenderBind, AReplayedReserveReturnsTheSameReservation) {
  // A bind whose Reserve reached the broker but whose answer was lost: the
  // retry's Reserve (request_id = the pod's UID, same blocks and TTL)
  // replays the first reservation instead of reserving again.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  ReserveOptions first;
  first.request_id = "uid-llm-2";
  first.ttl = ExtenderOptions().reservation_ttl;
  absl::StatusOr<v1::ReserveResponse> direct =
      ClientOf(*b)->Reserve("kv", 4, first);
  ASSERT_TRUE(direct.ok()) << direct.status();
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-2", "uid-llm-2",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  ASSERT_EQ(rig.Bind("llm-2", "node-b").doc, json({{"Error", ""}}));
  EXPECT_EQ(
      rig.api().Annotations("serving", "llm-2").at(kReservationAnnotation),
      direct->reservation_id());
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
}

TEST(ExtenderBind, AFailedBindingReleasesItsReservation) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-3", "uid-llm-3",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  rig.api().RefuseBindings(500);
  HttpResult failed = rig.Bind("llm-3", "node-b");
  ASSERT_EQ(failed.code, 200) << failed.body;
  EXPECT_EQ(failed.doc["Error"],
            "binding_failed: POST /api/v1/namespaces/serving/pods/llm-3/"
            "binding: HTTP 500: binding refused; the reservation was "
            "released");
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
  EXPECT_EQ(Cap(*b, "kv").available_blocks(), 16);
  EXPECT_TRUE(rig.api().bindings().empty());
  // Annotated, then the annotations removed again.
  ASSERT_EQ(rig.api().patches().size(), 2u);
  EXPECT_TRUE(
      rig.api().patches()[1].annotations[kReservationAnnotation].is_null());
  EXPECT_EQ(
      rig.api().Annotations("serving", "llm-3").count(kReservationAnnotation),
      0u);
  EXPECT_THAT(rig.Get("/metrics").body,
              HasSubstr("kvbroker_extender_reservations_released_total 1"));

  EXPECT_EQ(rig.api().Annotations("serving", "llm-3")[kReleasedBindsAnnotation],
            "1");

  // The scheduler retries once the API accepts: a new reservation, not a
  // replay of the released one.
  rig.api().RefuseBindings(0);
  HttpResult bound = rig.Bind("llm-3", "node-b");
  EXPECT_EQ(bound.doc, json({{"Error", ""}})) << bound.body;
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
  EXPECT_EQ(rig.api().bindings().size(), 1u);
}

TEST(ExtenderBind, AnotherReplicaRetriesAReleasedBindWithoutReplayingIt) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-r", "uid-llm-r",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  // Two binds fail on the first replica: two reservations made and released.
  rig.api().RefuseBindings(500);
  for (int i = 0; i < 2; ++i) {
    HttpResult failed = rig.Bind("llm-r", "node-b");
    EXPECT_THAT(failed.doc["Error"].get<std::string>(),
                StartsWith("binding_failed: "));
  }
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
  EXPECT_EQ(rig.api().Annotations("serving", "llm-r")[kReleasedBindsAnnotation],
            "2");

  // A replica that never saw them binds: it reserves under "uid-llm-r/2",
  // a new reservation, rather than replaying one of the released ones.
  rig.api().RefuseBindings(0);
  std::unique_ptr<Extender> replica = rig.Replica();
  HttpRequest request;
  request.method = "POST";
  request.path = "/bind";
  request.body = json{
      {"PodName", "llm-r"},
      {"PodNamespace", "serving"},
      {"PodUID", "uid-llm-r"},
      {"Node",
       "node-b"}}.dump();
  HttpResponse bound = replica->Handle(request);
  EXPECT_EQ(bound.code, 200);
  EXPECT_EQ(bound.body, R"({"Error":""})");
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
  ASSERT_EQ(rig.api().bindings().size(), 1u);
  // The reservation on the pod is live: releasing it returns 4 blocks.
  const std::string reservation =
      rig.api().Annotations("serving", "llm-r")[kReservationAnnotation];
  EXPECT_EQ(Release(*b, reservation), 4);
  // Reserve under the id the replica used replays that same reservation.
  ReserveOptions same;
  same.request_id = "uid-llm-r/2";
  same.ttl = ExtenderOptions().reservation_ttl;
  absl::StatusOr<v1::ReserveResponse> replay =
      ClientOf(*b)->Reserve("kv", 4, same);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_TRUE(replay->replayed());
  EXPECT_EQ(replay->reservation_id(), reservation);
}

TEST(ExtenderBind, TwoBindsOfOnePodAtOnceLeaveTheWinnersReservation) {
  // Replica B binds the pod to node-c while replica A is between its steps
  // for node-b: just before A's patch, and just before A's Binding. B must
  // win with its reservation on the pod; A must release its own and touch
  // nothing of B's.
  for (const std::string step : {"PATCH", "POST"}) {
    SCOPED_TRACE(step);
    auto b = StartBroker(kRoomyPools);
    auto c = StartBroker(kRoomyPools);
    ASSERT_TRUE(b && c);
    Rig rig;
    rig.api().AddBroker("node-b", b->port());
    rig.api().AddBroker("node-c", c->port());
    rig.api().AddPod("serving", "llm-x", "uid-llm-x",
                     Asks("kv", "kvbroker.io/blocks", "4"));
    std::unique_ptr<Rig::RacingBind> race =
        rig.RaceABind(step, "llm-x", "node-c");
    HttpResult lost = rig.Bind("llm-x", "node-b");
    rig.api().OnRequest(nullptr);
    ASSERT_TRUE(race->ran);
    EXPECT_EQ(race->answer.body, R"({"Error":""})");
    EXPECT_THAT(lost.doc["Error"].get<std::string>(),
                ::testing::Not(::testing::IsEmpty()));
    EXPECT_EQ(rig.api().Pod("serving", "llm-x")["spec"]["nodeName"], "node-c");
    // The pod names B's reservation on node-c, and it is live there.
    std::map<std::string, std::string> annotations =
        rig.api().Annotations("serving", "llm-x");
    EXPECT_EQ(annotations[kReservationNodeAnnotation], "node-c");
    EXPECT_EQ(Cap(*c, "kv").reserved_blocks(), 4);
    EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
    EXPECT_EQ(Release(*c, annotations[kReservationAnnotation]), 4);
  }
}

TEST(ExtenderBind, TwoBindsOfOnePodToOneNodeAtOnceKeepTheirReservation) {
  // Replica B binds the pod to the same node while replica A is between its
  // steps. Both reserve under the pod's UID, so B's Reserve replays A's: the
  // two binds share one reservation, and neither may release it.
  for (const std::string step : {"PATCH", "POST"}) {
    SCOPED_TRACE(step);
    auto b = StartBroker(kRoomyPools);
    ASSERT_TRUE(b);
    Rig rig;
    rig.api().AddBroker("node-b", b->port());
    rig.api().AddPod("serving", "llm-y", "uid-llm-y",
                     Asks("kv", "kvbroker.io/blocks", "4"));
    std::unique_ptr<Rig::RacingBind> race =
        rig.RaceABind(step, "llm-y", "node-b");
    HttpResult second = rig.Bind("llm-y", "node-b");
    rig.api().OnRequest(nullptr);
    ASSERT_TRUE(race->ran);
    EXPECT_EQ(race->answer.body, R"({"Error":""})");
    EXPECT_EQ(second.doc, json({{"Error", ""}}));
    EXPECT_EQ(rig.api().Pod("serving", "llm-y")["spec"]["nodeName"], "node-b");
    EXPECT_EQ(rig.api().bindings().size(), 1u);
    std::map<std::string, std::string> annotations =
        rig.api().Annotations("serving", "llm-y");
    EXPECT_EQ(annotations.count(kReleasedBindsAnnotation), 0u);
    EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
    EXPECT_EQ(Release(*b, annotations[kReservationAnnotation]), 4);
  }
}

TEST(ExtenderBind, AStepThatFailsAfterAnotherBindBoundThePodKeepsTheirShare) {
  // Replica B binds the pod to the same node (the same request id: the
  // same reservation) while A is between its steps, and then A's own step
  // fails for another reason than a conflict (the API answers 500). A must
  // not release the reservation the bound pod names: it reads the pod,
  // finds it bound here with that reservation, and succeeds.
  for (const std::string step : {"PATCH", "POST"}) {
    SCOPED_TRACE(step);
    auto b = StartBroker(kRoomyPools);
    ASSERT_TRUE(b);
    Rig rig;
    rig.api().AddBroker("node-b", b->port());
    rig.api().AddPod("serving", "llm-z", "uid-llm-z",
                     Asks("kv", "kvbroker.io/blocks", "4"));
    std::unique_ptr<Rig::RacingBind> race =
        rig.RaceABind(step, "llm-z", "node-b", [&rig, step] {
          if (step == "PATCH") rig.api().RefusePatches(500);
          if (step == "POST") rig.api().RefuseBindings(500);
        });
    HttpResult a = rig.Bind("llm-z", "node-b");
    rig.api().OnRequest(nullptr);
    ASSERT_TRUE(race->ran);
    EXPECT_EQ(race->answer.body, R"({"Error":""})");
    EXPECT_EQ(a.doc, json({{"Error", ""}})) << a.body;
    EXPECT_EQ(rig.api().Pod("serving", "llm-z")["spec"]["nodeName"], "node-b");
    EXPECT_EQ(rig.api().bindings().size(), 1u);
    std::map<std::string, std::string> annotations =
        rig.api().Annotations("serving", "llm-z");
    EXPECT_EQ(annotations.count(kReleasedBindsAnnotation), 0u);
    EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
    EXPECT_EQ(Release(*b, annotations[kReservationAnnotation]), 4);
  }
}

TEST(ExtenderBind, ABindThatFindsItsReservationGivenUpDoesNotBindWithIt) {
  // Replica B, under the same request id (so holding the same reservation),
  // runs its whole bind just before A's patch: B patches, its Binding fails
  // (500), and B gives the reservation up, recording the release on the pod.
  // A's patch is then refused 409 and A reads an unclaimed pod: it must not
  // patch the released reservation on and bind it.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-g", "uid-llm-g",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  rig.api().RefuseBindings(500);
  std::unique_ptr<Rig::RacingBind> race = rig.RaceABind(
      "PATCH", "llm-g", "node-b", [&rig] { rig.api().RefuseBindings(0); });
  HttpResult a = rig.Bind("llm-g", "node-b");
  rig.api().OnRequest(nullptr);
  ASSERT_TRUE(race->ran);
  EXPECT_THAT(race->answer.body,
              HasSubstr("binding refused; the reservation was released"));
  EXPECT_THAT(a.doc["Error"].get<std::string>(), StartsWith("patch_failed: "));
  EXPECT_TRUE(rig.api().bindings().empty());
  std::map<std::string, std::string> annotations =
      rig.api().Annotations("serving", "llm-g");
  EXPECT_EQ(annotations.count(kReservationAnnotation), 0u);
  EXPECT_EQ(annotations[kReleasedBindsAnnotation], "1");
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);

  // The scheduler's retry takes a new reservation.
  EXPECT_EQ(rig.Bind("llm-g", "node-b").doc, json({{"Error", ""}}));
  annotations = rig.api().Annotations("serving", "llm-g");
  EXPECT_EQ(Release(*b, annotations[kReservationAnnotation]), 4);
}

TEST(ExtenderBind, AFailedBindThatCannotReadItsPodKeepsTheReservation) {
  // The Binding fails and the pod cannot be read again: it may name the
  // reservation (another bind under the same id may bind it yet), so the
  // reservation is kept until it expires, and the retry binds with it.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-k", "uid-llm-k",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  rig.api().RefuseBindings(500);
  rig.api().OnRequest([&rig](const HttpRequest& r) {
    if (r.method == "POST") rig.api().RefusePodReads(503);
  });
  HttpResult failed = rig.Bind("llm-k", "node-b");
  rig.api().OnRequest(nullptr);
  EXPECT_THAT(failed.doc["Error"].get<std::string>(),
              AllOf(StartsWith("binding_failed: POST /api/v1/namespaces/"
                               "serving/pods/llm-k/binding: HTTP 500: "
                               "binding refused; the reservation is kept "
                               "until "),
                    HasSubstr("HTTP 503: read refused"),
                    HasSubstr("a retry of this bind uses it again")));
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
  const std::string reservation =
      rig.api().Annotations("serving", "llm-k")[kReservationAnnotation];
  EXPECT_FALSE(reservation.empty());

  rig.api().RefuseBindings(0);
  rig.api().RefusePodReads(0);
  EXPECT_EQ(rig.Bind("llm-k", "node-b").doc, json({{"Error", ""}}));
  EXPECT_EQ(rig.api().bindings().size(), 1u);
  std::map<std::string, std::string> annotations =
      rig.api().Annotations("serving", "llm-k");
  EXPECT_EQ(annotations[kReservationAnnotation], reservation);
  EXPECT_EQ(annotations.count(kReleasedBindsAnnotation), 0u);
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
  EXPECT_EQ(Release(*b, reservation), 4);
}

TEST(ExtenderBind, APodChangedByOthersBetweenItsStepsIsStillBoundOnce) {
  // Someone else (a label, a controller) changes the pod just before bind's
  // patch, or just before its Binding: the API refuses that step 409, and
  // bind takes it again at the pod's new version instead of giving the
  // reservation up.
  for (const std::string step : {"PATCH", "POST"}) {
    SCOPED_TRACE(step);
    auto b = StartBroker(kRoomyPools);
    ASSERT_TRUE(b);
    Rig rig;
    rig.api().AddBroker("node-b", b->port());
    rig.api().AddPod("serving", "llm-t", "uid-llm-t",
                     Asks("kv", "kvbroker.io/blocks", "4"));
    int seen = 0;
    rig.api().OnRequest([&](const HttpRequest& r) {
      if (r.method == step && seen++ == 0) rig.api().Touch("serving", "llm-t");
    });
    EXPECT_EQ(rig.Bind("llm-t", "node-b").doc, json({{"Error", ""}}));
    rig.api().OnRequest(nullptr);
    EXPECT_EQ(seen, 2);  // refused once (409), then done
    EXPECT_EQ(rig.api().bindings().size(), 1u);
    EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 4);
    std::map<std::string, std::string> annotations =
        rig.api().Annotations("serving", "llm-t");
    EXPECT_EQ(annotations[kReservationNodeAnnotation], "node-b");
    EXPECT_EQ(annotations.count(kReleasedBindsAnnotation), 0u);
  }
}

TEST(ExtenderBind, AReleasedBindsCountAtIntMaxIsNotTrusted) {
  // The pod's author may write any count; one past int's range used to
  // overflow when the next release added one.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  std::map<std::string, std::string> asks =
      Asks("kv", "kvbroker.io/blocks", "4");
  asks[kReleasedBindsAnnotation] = "2147483647";
  rig.api().AddPod("serving", "llm-m", "uid-llm-m", asks);
  rig.api().RefuseBindings(500);
  EXPECT_THAT(rig.Bind("llm-m", "node-b").doc["Error"].get<std::string>(),
              StartsWith("binding_failed: "));
  EXPECT_EQ(rig.api().Annotations("serving", "llm-m")[kReleasedBindsAnnotation],
            "1");
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
}

TEST(ExtenderBind, AFailedPatchReleasesOnlyOnceThePodRecordsTheRelease) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-4", "uid-llm-4",
                   Asks("kv", "kvbroker.io/blocks", "2"));
  // The API refuses the bind's patch (503) and takes the next one: the
  // release is recorded on the pod, then made.
  int patches = 0;
  rig.api().OnRequest([&](const HttpRequest& r) {
    if (r.method == "PATCH") rig.api().RefusePatches(patches++ == 0 ? 503 : 0);
  });
  HttpResult failed = rig.Bind("llm-4", "node-b");
  rig.api().OnRequest(nullptr);
  EXPECT_EQ(failed.doc["Error"],
            "patch_failed: PATCH /api/v1/namespaces/serving/pods/llm-4: HTTP "
            "503: patch refused; the reservation was released");
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
  EXPECT_TRUE(rig.api().bindings().empty());
  std::map<std::string, std::string> annotations =
      rig.api().Annotations("serving", "llm-4");
  EXPECT_EQ(annotations[kReleasedBindsAnnotation], "1");
  EXPECT_EQ(annotations.count(kReservationAnnotation), 0u);

  // While the API refuses every patch the release cannot be recorded, and
  // a bind that replayed it could be handed a released reservation: it is
  // kept until it expires, and the retry binds with it.
  rig.api().RefusePatches(503);
  EXPECT_THAT(rig.Bind("llm-4", "node-b").doc["Error"].get<std::string>(),
              AllOf(StartsWith("patch_failed: "),
                    HasSubstr("; the reservation is kept until ")));
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 2);
  rig.api().RefusePatches(0);
  EXPECT_EQ(rig.Bind("llm-4", "node-b").doc, json({{"Error", ""}}));
  ASSERT_EQ(rig.api().bindings().size(), 1u);
  annotations = rig.api().Annotations("serving", "llm-4");
  EXPECT_EQ(annotations[kReleasedBindsAnnotation], "1");
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 2);
  EXPECT_EQ(Release(*b, annotations[kReservationAnnotation]), 2);
}

TEST(ExtenderBind, ARefusedReserveBindsNothing) {
  auto a = StartBroker(kSeedPools);
  ASSERT_TRUE(a);
  Rig rig;
  rig.api().AddBroker("node-a", a->port());
  rig.api().AddPod("serving", "llm-5", "uid-llm-5",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  HttpResult failed = rig.Bind("llm-5", "node-a");
  EXPECT_THAT(failed.doc["Error"].get<std::string>(),
              StartsWith("Reserve 4 blocks of pool kv on node node-a: "
                         "REQUEST_TOO_LARGE: "));
  EXPECT_TRUE(rig.api().bindings().empty());
  EXPECT_TRUE(rig.api().patches().empty());
  // A replaced pod (another UID under the same name) is refused as well.
  HttpResult replaced = rig.Post("bind", json{{"PodName", "llm-5"},
                                              {"PodNamespace", "serving"},
                                              {"PodUID", "uid-old"},
                                              {"Node", "node-a"}}
                                             .dump());
  EXPECT_EQ(replaced.doc["Error"],
            "pod serving/llm-5 has uid uid-llm-5, not uid-old: it was "
            "replaced");
}

// ===========================================================================
// Brokers that are down, slow, or refuse for each reason.

TEST(ExtenderFilter, DownAndStoppedBrokersAreUnreachable) {
  auto b = StartBroker(kRoomyPools);
  auto down = StartBroker(kRoomyPools);
  auto slow = StartBroker(kRoomyPools);
  ASSERT_TRUE(b && down && slow);
  ExtenderOptions options;
  options.node_timeout = absl::Seconds(1);
  Rig rig(options);
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddBroker("node-down", down->port());
  rig.api().AddBroker("node-slow", slow->port());
  rig.api().AddPod("serving", "llm-6", "uid-llm-6",
                   Asks("kv", "kvbroker.io/blocks", "2"));
  down->Kill();
  slow->Pause();  // accepts connections, never answers
  HttpResult f = rig.Filter(
      "llm-6", {"node-down", "node-slow", "node-b", "node-nobroker"});
  slow->Resume();
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_EQ(f.doc["NodeNames"], json({"node-b"}));
  ASSERT_EQ(f.doc["FailedNodes"].size(), 2u) << f.body;
  EXPECT_THAT(f.doc["FailedNodes"]["node-down"].get<std::string>(),
              StartsWith("broker unreachable: UNAVAILABLE: "));
  EXPECT_THAT(f.doc["FailedNodes"]["node-slow"].get<std::string>(),
              StartsWith("broker unreachable: DEADLINE_EXCEEDED: "));
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"],
            json({{"node-nobroker", "no kvbroker on node node-nobroker"}}));
  const std::string metrics = rig.Get("/metrics").body;
  EXPECT_THAT(metrics, HasSubstr("kvbroker_extender_node_verdicts_total{"
                                 "verdict=\"BROKER_UNREACHABLE\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("kvbroker_extender_node_verdicts_total{"
                                 "verdict=\"fits\"} 1"));
  EXPECT_THAT(metrics,
              HasSubstr("kvbroker_extender_brokers{state=\"known\"} 3"));
}

TEST(ExtenderFilter, ASlowRelistDoesNotUseUpTheBrokersDeadline) {
  // node-x has no broker: looking it up relists the broker pods, and the
  // API takes 1.5 s to answer. node-b's broker still gets its whole
  // node_timeout.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  ExtenderOptions options;
  options.node_timeout = absl::Seconds(1);
  Rig rig(options);
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-s", "uid-llm-s",
                   Asks("kv", "kvbroker.io/blocks", "2"));
  rig.api().OnRequest([](const HttpRequest& r) {
    if (absl::StrContains(r.path, "/namespaces/kvbroker/pods")) {
      absl::SleepFor(absl::Milliseconds(1500));
    }
  });
  HttpResult f = rig.Filter("llm-s", {"node-x", "node-b"});
  rig.api().OnRequest(nullptr);
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_EQ(f.doc["NodeNames"], json({"node-b"})) << f.body;
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"],
            json({{"node-x", "no kvbroker on node node-x"}}));
}

TEST(ExtenderFilter, EveryCapacityReasonIsTheBrokersOwn) {
  auto r = StartBroker(kReasonPools, {"--host_device_memory=64MiB"});
  ASSERT_TRUE(r);
  auto client = ClientOf(*r);
  // full: 7 of 8 blocks allocated.
  ASSERT_TRUE(client->Alloc("full", 7).ok());
  // shrink: 6 blocks on 3 pages, then a limit of one page: DEFERRED.
  ASSERT_TRUE(client->Alloc("shrink", 6).ok());
  absl::StatusOr<v1::SetMemoryLimitResponse> limit =
      client->SetMemoryLimit("shrink", 2 * kMiB, 1);
  ASSERT_TRUE(limit.ok()) << limit.status();
  ASSERT_EQ(Cap(*r, "shrink").limit().state(), v1::LIMIT_STATE_DEFERRED);

  Rig rig;
  rig.api().AddBroker("node-r", r->port());
  struct Case {
    std::string pool;
    int64_t blocks;
    v1::Reason reason;
    bool unresolvable;
  };
  const v1::CapacitySnapshot big = Cap(*r, "big");
  ASSERT_LT(big.available_blocks(), big.total_blocks());
  for (const Case& c : std::vector<Case>{
           {"full", 2, v1::POOL_EXHAUSTED, false},
           {"shrink", 1, v1::SHRINK_PENDING, false},
           {"big", big.available_blocks() + 1, v1::GPU_MEMORY_EXHAUSTED, false},
           {"big", 17, v1::REQUEST_TOO_LARGE, true},
       }) {
    SCOPED_TRACE(c.pool);
    const std::string pod = absl::StrCat("p-", c.pool, "-", c.blocks);
    rig.api().AddPod(
        "serving", pod, "uid-" + pod,
        Asks(c.pool, "kvbroker.io/blocks", absl::StrCat(c.blocks)));
    const v1::CapacitySnapshot before = Cap(*r, c.pool);
    HttpResult f = rig.Filter(pod, {"node-r"});
    ASSERT_EQ(f.code, 200) << f.body;
    EXPECT_EQ(f.doc["NodeNames"], json::array());
    const json& dropped = c.unresolvable ? f.doc["FailedAndUnresolvableNodes"]
                                         : f.doc["FailedNodes"];
    ASSERT_TRUE(dropped.contains("node-r")) << f.body;
    EXPECT_THAT(dropped["node-r"].get<std::string>(),
                StartsWith(absl::StrCat(
                    v1::Reason_Name(c.reason), ": requested_blocks=", c.blocks,
                    " available_blocks=", before.available_blocks(),
                    " pool_total_blocks=", before.total_blocks())));
    // The broker refuses Reserve with the same reason, changing nothing.
    EXPECT_EQ(GetKvbReason(client->Reserve(c.pool, c.blocks).status()),
              c.reason);
    EXPECT_EQ(Cap(*r, c.pool).generation(), before.generation());
  }

  // A pool the node does not have: the broker's POOL_NOT_FOUND.
  rig.api().AddPod("serving", "p-nope", "uid-p-nope",
                   Asks("nope", "kvbroker.io/blocks", "1"));
  HttpResult f = rig.Filter("p-nope", {"node-r"});
  EXPECT_THAT(f.doc["FailedAndUnresolvableNodes"]["node-r"].get<std::string>(),
              StartsWith("POOL_NOT_FOUND: "));
}

TEST(ExtenderFilter, PrioritizeFollowsThePolicy) {
  auto small = StartBroker(kRoomyPools);
  auto large = StartBroker(kRoomyPools);
  auto mid = StartBroker(kRoomyPools);
  ASSERT_TRUE(small && large && mid);
  ASSERT_TRUE(ClientOf(*small)->Alloc("kv", 12).ok());  // 4 left
  ASSERT_TRUE(ClientOf(*mid)->Alloc("kv", 6).ok());     // 10 left
  for (ScorePolicy policy : {ScorePolicy::kMostFree, ScorePolicy::kLeastFree}) {
    ExtenderOptions options;
    options.policy = policy;
    Rig rig(options);
    rig.api().AddBroker("small", small->port());
    rig.api().AddBroker("large", large->port());
    rig.api().AddBroker("mid", mid->port());
    rig.api().AddPod("serving", "p", "uid-p",
                     Asks("kv", "kvbroker.io/blocks", "5"));
    HttpResult p = rig.Post(
        "prioritize",
        Rig::Args(rig.api().Pod("serving", "p"), {"small", "large", "mid"}));
    ASSERT_EQ(p.code, 200) << p.body;
    // small cannot take 5 blocks: 0. Fitting: mid 10, large 16.
    // most_free: mid 1 + round(9 * 0/6) = 1, large 10.
    // least_free: mid 10, large 1.
    const json expected = policy == ScorePolicy::kMostFree
                              ? json::parse(R"([{"Host":"small","Score":0},
                              {"Host":"large","Score":10},
                              {"Host":"mid","Score":1}])")
                              : json::parse(R"([{"Host":"small","Score":0},
                              {"Host":"large","Score":1},
                              {"Host":"mid","Score":10}])");
    EXPECT_EQ(p.doc, expected);
  }
}

// ===========================================================================
// Malformed input: a clear HTTP error and nothing reserved.

TEST(ExtenderInput, MalformedJsonAndAbsurdAnnotationsReserveNothing) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  for (const std::string& verb :
       std::initializer_list<std::string>{"filter", "prioritize", "bind"}) {
    HttpResult r = rig.Post(verb, "{\"Pod\": ");
    EXPECT_EQ(r.code, 400) << verb;
    EXPECT_THAT(r.doc["Error"].get<std::string>(),
                HasSubstr(": the body is not JSON"));
  }
  // A body nested a million levels deep is refused, not built.
  HttpResult deep =
      rig.Post("filter", std::string(1000000, '[') + std::string(1000000, ']'));
  EXPECT_EQ(deep.code, 400);
  EXPECT_EQ(deep.doc["Error"],
            "ExtenderArgs: the body nests deeper than 128 levels");
  EXPECT_EQ(rig.Get("/healthz").code, 200);
  HttpResult no_nodes = rig.Post("filter", R"({"Pod": {"metadata": {}}})");
  EXPECT_EQ(no_nodes.code, 400);
  EXPECT_EQ(no_nodes.doc["Error"], "ExtenderArgs: give Nodes or NodeNames");

  for (const std::string& blocks : std::initializer_list<std::string>{
           "99999999999", "0", "-4", "four", "4e3", "1.5"}) {
    SCOPED_TRACE(blocks);
    const std::string pod = "absurd";
    rig.api().AddPod("serving", pod, "uid-absurd",
                     Asks("kv", "kvbroker.io/blocks", blocks));
    HttpResult f = rig.Filter(pod, {"node-b"});
    EXPECT_EQ(f.code, 400);
    EXPECT_EQ(f.doc["Error"],
              absl::StrCat("annotation kvbroker.io/blocks=\"", blocks,
                           "\" must be a decimal integer in [1, 134217728]"));
    HttpResult bind = rig.Bind(pod, "node-b");
    EXPECT_EQ(bind.code, 400);
    EXPECT_EQ(bind.doc["Error"], f.doc["Error"]);
  }
  rig.api().AddPod("serving", "half", "uid-half",
                   {{"kvbroker.io/blocks", "4"}});
  EXPECT_EQ(rig.Filter("half", {"node-b"}).doc["Error"],
            "annotation kvbroker.io/blocks needs kvbroker.io/pool");
  EXPECT_EQ(rig.Post("bind", R"({"PodName": "x"})").code, 400);
  EXPECT_EQ(rig.Get("/filter").code, 405);
  EXPECT_EQ(rig.Get("/nope").code, 404);

  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
  EXPECT_EQ(Cap(*b, "kv").available_blocks(), 16);
  EXPECT_TRUE(rig.api().bindings().empty());
  EXPECT_TRUE(rig.api().patches().empty());
  EXPECT_THAT(rig.Get("/metrics").body,
              HasSubstr("kvbroker_extender_requests_total{code=\"400\",verb="
                        "\"filter\"}"));
}

// ===========================================================================
// TLS and bearer tokens to the brokers; health.

TEST(ExtenderSecurity, TlsAndBearerTokensToBrokers) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string tokens =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tokens.textproto");
  std::ofstream(tokens) << R"pb(tokens {
                                  name: "scheduler"
                                  token: "scheduler-token-0123456789"
                                  pools: "*"
                                })pb";
  auto b = StartBroker(kRoomyPools,
                       {"--tls_cert=" + Runfile("client/testdata/server.pem"),
                        "--tls_key=" + Runfile("client/testdata/server.key"),
                        "--auth_tokens=" + tokens});
  ASSERT_TRUE(b);
  absl::StatusOr<TlsOptions> tls =
      TlsOptions::FromFiles(Runfile("client/testdata/ca.pem"), "", "");
  ASSERT_TRUE(tls.ok()) << tls.status();
  for (const std::string& token : std::initializer_list<std::string>{
           "scheduler-token-0123456789", "wrong-token-0123456789"}) {
    SCOPED_TRACE(token);
    BrokerDirectoryOptions directory;
    directory.tls = *tls;
    directory.bearer_token = token;
    Rig rig({}, directory);
    EXPECT_EQ(rig.Get("/healthz").code, 200);
    rig.api().AddBroker("node-b", b->port());
    rig.api().AddPod("serving", "p", "uid-p",
                     Asks("kv", "kvbroker.io/blocks", "4"));
    HttpResult f = rig.Filter("p", {"node-b"});
    ASSERT_EQ(f.code, 200) << f.body;
    if (token == "scheduler-token-0123456789") {
      EXPECT_EQ(f.doc["NodeNames"], json({"node-b"}));
      EXPECT_EQ(rig.Bind("p", "node-b").doc, json({{"Error", ""}}));
      EXPECT_EQ(rig.Get("/readyz").code, 200);
    } else {
      EXPECT_THAT(f.doc["FailedNodes"]["node-b"].get<std::string>(),
                  StartsWith("UNAUTHENTICATED: "));
    }
  }
  ClientOptions options;
  options.tls = *tls;
  options.bearer_token = "scheduler-token-0123456789";
  EXPECT_EQ(Cap(*b, "kv", options).reserved_blocks(), 4);
}

// ===========================================================================
// The kvbroker-extender binary: flags, the in-cluster credentials files,
// /healthz, a filter, and SIGTERM.

// Runs the binary with the fake API's flags and `extra` ones against one
// broker on node-b: /healthz, a filter, /readyz, then SIGTERM and exit 0.
// `ca_file` non-empty: it serves HTTPS with a certificate from that CA.
void ServeFromFlags(const std::vector<std::string>& extra,
                    const std::string& ca_file) {
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  FakeKubeApi api("binary-token");
  api.AddBroker("node-b", b->port());
  api.AddPod("serving", "p", "uid-p", Asks("kv", "kvbroker.io/blocks", "20"));
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string token =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/binary-token");
  std::ofstream(token) << "binary-token";
  std::vector<std::string> args = {
      Runfile("extender/kvbroker-extender"),
      "--listen=127.0.0.1:0",
      "--kube_api_server=" + api.url(),
      "--kube_token_file=" + token,
      "--kube_ca_file=",
      absl::StrCat("--broker_namespace=", FakeKubeApi::kBrokerNamespace),
      absl::StrCat("--broker_selector=", FakeKubeApi::kBrokerSelector),
      "--score_policy=least_free"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  // "kvbroker-extender serving on port N (...)"
  std::string line;
  char ch;
  while (read(out[0], &ch, 1) == 1 && ch != '\n') line.push_back(ch);
  int port = 0;
  const std::string prefix = "kvbroker-extender serving on port ";
  ASSERT_THAT(line, StartsWith(prefix));
  ASSERT_TRUE(absl::SimpleAtoi(
      line.substr(prefix.size(), line.find(' ', prefix.size()) - prefix.size()),
      &port))
      << line;
  const bool https = !ca_file.empty();
  EXPECT_THAT(line, HasSubstr(https ? "(HTTPS, " : "(HTTP, "));
  const std::string base =
      absl::StrCat(https ? "https" : "http", "://127.0.0.1:", port);
  EXPECT_EQ(Http("GET", base + "/healthz", "", ca_file).body, "ok\n");
  if (https) {  // nothing in plain HTTP
    EXPECT_EQ(
        Http("GET", absl::StrCat("http://127.0.0.1:", port, "/healthz"), "")
            .code,
        0);
  }
  HttpResult f = Http("POST", base + "/filter",
                      Rig::Args(api.Pod("serving", "p"), {"node-b"}), ca_file);
  EXPECT_EQ(f.code, 200);
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"],
            json({{"node-b",
                   "REQUEST_TOO_LARGE: requested_blocks=20 "
                   "available_blocks=16 pool_total_blocks=16 "
                   "reserved_blocks=0 allocated_blocks=0"}}))
      << f.body;
  EXPECT_EQ(Http("GET", base + "/readyz", "", ca_file).code, 200);
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  close(out[0]);
  EXPECT_THAT(api.violations(), ::testing::IsEmpty());
}

TEST(ExtenderBinary, ServesFromFlagsAndStopsOnSigterm) {
  ServeFromFlags({}, "");
}

TEST(ExtenderBinary, ServesHttpsWithTlsCertAndKey) {
  ServeFromFlags({"--tls_cert=" + Runfile("client/testdata/server.pem"),
                  "--tls_key=" + Runfile("client/testdata/server.key")},
                 Runfile("client/testdata/ca.pem"));
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker
