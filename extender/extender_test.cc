// kvbroker-extender end to end, as kube-scheduler sees it: real kvbrokerd
// processes stand in for the nodes, a fake Kubernetes API server (real
// HTTP) serves the pods and the DaemonSet's pods and checks every request,
// and the extender answers filter / prioritize / bind over HTTP. Bind's
// retries, races and failures are in extender_bind_test.cc; the rig is
// extender/testing/extender_rig.h.

#include "extender/extender.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/kvbroker_client.h"
#include "extender/broker_directory.h"
#include "extender/extender_api.h"
#include "extender/testing/extender_rig.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {
namespace {

using ::nlohmann::json;
using ::testing::AllOf;
using testing::Asks;
using testing::Cap;
using testing::ClientOf;
using testing::FakeKubeApi;
using ::testing::HasSubstr;
using testing::Http;
using testing::HttpResult;
using testing::kMiB;
using testing::kReasonPools;
using testing::kRoomyPools;
using testing::kSeedPools;
using testing::Rig;
using testing::Runfile;
using testing::StartBroker;
using ::testing::StartsWith;

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

TEST(ExtenderFilter, AFilterWaitsForASlowRelistNoLongerThanItsNodeTimeout) {
  // node-b's broker is known; node-x has none, so looking it up asks for a
  // relist of the broker pods, and the API holds that list until the
  // filter has answered. The filter answers on its own: node-x dropped
  // after at most node_timeout, node-b checked within its whole
  // node_timeout.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  // Declared before the rig: its directory's worker may still be in the
  // API's hook when the test's checks end.
  absl::Notification filtered;
  std::atomic<bool> listed{false};
  ExtenderOptions options;
  options.node_timeout = absl::Milliseconds(500);
  Rig rig(options);
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "llm-s", "uid-llm-s",
                   Asks("kv", "kvbroker.io/blocks", "2"));
  ASSERT_EQ(rig.Filter("llm-s", {"node-b"}).doc["NodeNames"],
            json({"node-b"}));  // the first lookup lists the brokers
  rig.api().OnRequest([&](const HttpRequest& r) {
    if (absl::StrContains(r.path, "/namespaces/kvbroker/pods")) {
      filtered.WaitForNotificationWithTimeout(absl::Seconds(10));
      listed = true;
    }
  });
  HttpResult f = rig.Filter("llm-s", {"node-x", "node-b"});
  const bool answered_before_the_list = !listed;
  filtered.Notify();
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_TRUE(answered_before_the_list);
  EXPECT_EQ(f.doc["NodeNames"], json({"node-b"})) << f.body;
  EXPECT_EQ(f.doc["FailedAndUnresolvableNodes"],
            json({{"node-x", "no kvbroker on node node-x"}}));
  rig.api().OnRequest(nullptr);
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

TEST(ExtenderFilter, ANodeIsKeptExactlyWhenItsReserveWouldSucceed) {
  // Random geometries (blocks that divide the page and blocks that do not),
  // device memory, blocks allocated already, and asks: the filter keeps the
  // node exactly when bind's Reserve then succeeds, and a dropped node
  // names the reason the broker then refuses Reserve with. A bound pod
  // keeps its reservation, so later asks see less room.
  std::mt19937 random(20261207);
  const int64_t page_mib[] = {2, 4, 6, 14, 16};
  const int64_t block_mib[] = {1, 2, 3, 4, 6};
  int kept_in_all = 0;
  int dropped_in_all = 0;
  for (int round = 0; round < 8; ++round) {
    const int64_t page = page_mib[random() % 5];
    int64_t block = block_mib[random() % 5];
    while (block > page) block = block_mib[random() % 5];
    const int64_t max_blocks = 3 + random() % 30;
    const int64_t device = 32 + random() % 96;
    SCOPED_TRACE(absl::StrCat("page ", page, " MiB, block ", block,
                              " MiB, max_blocks ", max_blocks, ", device ",
                              device, " MiB"));
    auto r = StartBroker(
        absl::StrCat("pools { name: \"kv\" page_size: ", page * kMiB,
                     " block_bytes: ", block * kMiB,
                     " max_blocks: ", max_blocks, " }"),
        {absl::StrCat("--host_device_memory=", device, "MiB")});
    ASSERT_TRUE(r);
    auto client = ClientOf(*r);
    for (int i = 0; i < 3; ++i) (void)client->Alloc("kv", 1 + random() % 4);
    Rig rig;
    rig.api().AddBroker("node-r", r->port());
    for (int ask = 0; ask < 5; ++ask) {
      const int64_t blocks = random() % 2 == 0
                                 ? 1 + random() % 4
                                 : 1 + random() % (max_blocks + 2);
      const std::string pod = absl::StrCat("r", round, "-", ask);
      rig.api().AddPod("serving", pod, "uid-" + pod,
                       Asks("kv", "kvbroker.io/blocks", absl::StrCat(blocks)));
      HttpResult f = rig.Filter(pod, {"node-r"});
      ASSERT_EQ(f.code, 200) << f.body;
      const bool kept = f.doc["NodeNames"] == json({"node-r"});
      const std::string error = rig.Bind(pod, "node-r").doc["Error"];
      EXPECT_EQ(kept, error.empty()) << f.body << " / " << error;
      if (kept) {
        ++kept_in_all;
        continue;
      }
      ++dropped_in_all;
      const json& why = f.doc["FailedNodes"].contains("node-r")
                            ? f.doc["FailedNodes"]["node-r"]
                            : f.doc["FailedAndUnresolvableNodes"]["node-r"];
      ASSERT_TRUE(why.is_string()) << f.body;
      const std::string reason =
          why.get<std::string>().substr(0, why.get<std::string>().find(':'));
      EXPECT_THAT(error, StartsWith(absl::StrCat("Reserve ", blocks,
                                                 " blocks of pool kv on node "
                                                 "node-r: ",
                                                 reason, ": ")));
    }
  }
  std::printf("%d nodes kept, %d dropped\n", kept_in_all, dropped_in_all);
  EXPECT_GT(kept_in_all, 0);
  EXPECT_GT(dropped_in_all, 0);
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

TEST(ExtenderSecurity, ABrokerTokenThatCannotBeSentIsRefusedNotSent) {
  // gRPC aborts the process on a header value outside printable ASCII; a
  // token file holding such a byte must not take the extender down on its
  // first filter.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  BrokerDirectoryOptions directory;
  directory.bearer_token = "secret\x01token";
  Rig rig({}, directory);
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", "p", "uid-p",
                   Asks("kv", "kvbroker.io/blocks", "4"));
  HttpResult f = rig.Filter("p", {"node-b"});
  ASSERT_EQ(f.code, 200) << f.body;
  EXPECT_THAT(f.doc["FailedAndUnresolvableNodes"]["node-b"].get<std::string>(),
              AllOf(StartsWith("INVALID_ARGUMENT: the bearer token has byte "
                               "0x01 at offset 6"),
                    ::testing::Not(HasSubstr("secret"))));
  EXPECT_THAT(rig.Bind("p", "node-b").doc["Error"].get<std::string>(),
              HasSubstr("the bearer token has byte 0x01"));
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);
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

TEST(ExtenderBinary, ABrokerTokenFileThatCannotBeSentIsAUsageError) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  std::ofstream(dir + "/kube-token-ok") << "kube-token";
  std::ofstream(dir + "/broker-token-bad") << "s3cr\x01t\n";
  const std::string command =
      absl::StrCat(Runfile("extender/kvbroker-extender"),
                   " --listen=127.0.0.1:0 --kube_api_server=http://127.0.0.1:1",
                   " --kube_token_file=", dir, "/kube-token-ok --kube_ca_file=",
                   " --broker_token_file=", dir, "/broker-token-bad 2>&1");
  FILE* run = popen(command.c_str(), "r");
  ASSERT_NE(run, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), run) != nullptr) out += buf;
  const int status = pclose(run);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_THAT(out, HasSubstr("--broker_token_file: the bearer token has byte "
                             "0x01 at offset 4"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("s3cr")));
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
