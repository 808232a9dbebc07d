// kvbroker-extender's bind end to end: retries, another replica, two binds
// of one pod at once, failed patches and Bindings, against real kvbrokerd
// processes and the fake Kubernetes API server (extender/testing/).

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/kvbroker_client.h"
#include "extender/extender.h"
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
using testing::BrokerProcess;
using testing::Cap;
using testing::ClientOf;
using ::testing::HasSubstr;
using testing::HttpResult;
using testing::kRoomyPools;
using testing::kSeedPools;
using testing::Release;
using testing::Rig;
using testing::StartBroker;
using ::testing::StartsWith;

// ===========================================================================
// Bind: retries and failures.

// node-b's broker (kRoomyPools), known to `rig`, and pod `pod` (UID
// "uid-<pod>") asking `blocks` blocks of pool "kv"; null (the test failed)
// when the broker would not start.
std::unique_ptr<BrokerProcess> NodeBWithPod(Rig& rig, const std::string& pod,
                                            const std::string& blocks = "4") {
  std::unique_ptr<BrokerProcess> b = StartBroker(kRoomyPools);
  if (b == nullptr) return nullptr;
  rig.api().AddBroker("node-b", b->port());
  rig.api().AddPod("serving", pod, absl::StrCat("uid-", pod),
                   Asks("kv", "kvbroker.io/blocks", blocks));
  return b;
}

// `pod` is bound once, no bind of it released a reservation, and the
// reservation it names is live on `broker` with `blocks` blocks (released
// here, so that the broker ends the test holding nothing).
void ExpectBoundOnceHolding(Rig& rig, const BrokerProcess& broker,
                            const std::string& pod, int64_t blocks) {
  EXPECT_EQ(rig.api().bindings().size(), 1u);
  std::map<std::string, std::string> annotations =
      rig.api().Annotations("serving", pod);
  EXPECT_EQ(annotations.count(kReleasedBindsAnnotation), 0u);
  EXPECT_EQ(Cap(broker, "kv").reserved_blocks(), blocks);
  EXPECT_EQ(Release(broker, annotations[kReservationAnnotation]), blocks);
}

TEST(ExtenderBind, ARetriedBindIsIdempotent) {
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-1");
  ASSERT_TRUE(b);
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
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-3");
  ASSERT_TRUE(b);
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
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-r");
  ASSERT_TRUE(b);
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
    Rig rig;
    auto b = NodeBWithPod(rig, "llm-y");
    ASSERT_TRUE(b);
    std::unique_ptr<Rig::RacingBind> race =
        rig.RaceABind(step, "llm-y", "node-b");
    HttpResult second = rig.Bind("llm-y", "node-b");
    rig.api().OnRequest(nullptr);
    ASSERT_TRUE(race->ran);
    EXPECT_EQ(race->answer.body, R"({"Error":""})");
    EXPECT_EQ(second.doc, json({{"Error", ""}}));
    EXPECT_EQ(rig.api().Pod("serving", "llm-y")["spec"]["nodeName"], "node-b");
    ExpectBoundOnceHolding(rig, *b, "llm-y", 4);
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
    Rig rig;
    auto b = NodeBWithPod(rig, "llm-z");
    ASSERT_TRUE(b);
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
    ExpectBoundOnceHolding(rig, *b, "llm-z", 4);
  }
}

TEST(ExtenderBind, ABindThatFindsItsReservationGivenUpDoesNotBindWithIt) {
  // Replica B, under the same request id (so holding the same reservation),
  // runs its whole bind just before A's patch: B patches, its Binding fails
  // (500), and B gives the reservation up, recording the release on the pod.
  // A's patch is then refused 409 and A reads an unclaimed pod: it must not
  // patch the released reservation on and bind it.
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-g");
  ASSERT_TRUE(b);
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
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-k");
  ASSERT_TRUE(b);
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
  EXPECT_THAT(rig.Get("/metrics").body,
              HasSubstr("kvbroker_extender_reservations_kept_total 1"));
  const std::string reservation =
      rig.api().Annotations("serving", "llm-k")[kReservationAnnotation];
  EXPECT_FALSE(reservation.empty());

  rig.api().RefuseBindings(0);
  rig.api().RefusePodReads(0);
  EXPECT_EQ(rig.Bind("llm-k", "node-b").doc, json({{"Error", ""}}));
  EXPECT_EQ(rig.api().Annotations("serving", "llm-k")[kReservationAnnotation],
            reservation);
  ExpectBoundOnceHolding(rig, *b, "llm-k", 4);
}

TEST(ExtenderBind, BindsAtOnceOverAFailingApiNeverBindAReleasedReservation) {
  // Rounds of three binds of one pod at once, each by its own replica to
  // node-b or node-c, while a fifth of the API's pod requests fail (half of
  // the failing writes after taking effect) and someone else changes the
  // pod now and then; then the scheduler's retry while the API behaves.
  // Whatever the interleaving: the bound pod names a live reservation of
  // its blocks on its node, every bind that answered success asked for
  // that node, and what stays reserved besides is no more than the binds
  // that answered they kept theirs.
  constexpr int kRounds = 20;
  int kept_in_all = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto b = StartBroker(kRoomyPools);
    auto c = StartBroker(kRoomyPools);
    ASSERT_TRUE(b && c);
    // Declared before the rig, whose threads may still be in the API's
    // hook when a round's checks end.
    const std::string pod = absl::StrCat("llm-", round);
    std::atomic<int> requests{0};
    Rig rig;
    rig.api().AddBroker("node-b", b->port());
    rig.api().AddBroker("node-c", c->port());
    rig.api().AddPod("serving", pod, absl::StrCat("uid-", pod),
                     Asks("kv", "kvbroker.io/blocks", "4"));
    rig.api().OnRequest([&](const HttpRequest&) {
      if (++requests % 7 == 0) rig.api().Touch("serving", pod);
    });
    rig.api().FailPodRequestsAtRandom(0.2, round + 1);
    std::mt19937 pick(round);
    std::vector<std::string> nodes;
    std::vector<std::unique_ptr<Extender>> replicas;
    for (int i = 0; i < 3; ++i) {
      nodes.push_back(pick() % 2 == 0 ? "node-b" : "node-c");
      replicas.push_back(rig.Replica());
    }
    const json stored = rig.api().Pod("serving", pod);
    std::vector<std::string> answers(3);
    std::vector<std::thread> binds;
    for (int i = 0; i < 3; ++i) {
      binds.emplace_back([&, i] {
        HttpRequest r;
        r.method = "POST";
        r.path = "/bind";
        r.body = Rig::BindingArgs(stored, nodes[i]);
        answers[i] = json::parse(replicas[i]->Handle(r).body)["Error"];
      });
    }
    for (std::thread& t : binds) t.join();
    rig.api().FailPodRequestsAtRandom(0, 0);
    rig.api().OnRequest(nullptr);
    if (!rig.api().Pod("serving", pod)["spec"].contains("nodeName")) {
      EXPECT_EQ(rig.Bind(pod, "node-b").doc, json({{"Error", ""}}));
    }

    const json bound = rig.api().Pod("serving", pod);
    ASSERT_TRUE(bound["spec"].contains("nodeName")) << bound.dump();
    const std::string node = bound["spec"]["nodeName"];
    EXPECT_EQ(rig.api().bindings().size(), 1u);
    int kept = 0;
    for (int i = 0; i < 3; ++i) {
      if (answers[i].empty()) EXPECT_EQ(nodes[i], node) << i;
      if (absl::StrContains(answers[i], "is kept until")) ++kept;
    }
    kept_in_all += kept;
    std::map<std::string, std::string> annotations =
        rig.api().Annotations("serving", pod);
    EXPECT_EQ(annotations[kReservationNodeAnnotation], node);
    EXPECT_EQ(Release(node == "node-b" ? *b : *c,
                      annotations[kReservationAnnotation]),
              4)
        << "the bound pod names a released reservation";
    EXPECT_LE(Cap(*b, "kv").reserved_blocks() + Cap(*c, "kv").reserved_blocks(),
              4 * kept);
    if (::testing::Test::HasFailure()) {
      for (int i = 0; i < 3; ++i) {
        std::printf("bind %d to %s: %s\n", i, nodes[i].c_str(),
                    answers[i].c_str());
      }
      std::printf("pod: %s\n", bound.dump().c_str());
      break;
    }
  }
  std::printf("%d of %d binds kept their reservation\n", kept_in_all,
              3 * kRounds);
}

TEST(ExtenderBind, AFailedBindNeverReleasesAReservationOfThePoolCreatedAgain) {
  // Between the bind's Reserve and its release the pool is deleted and
  // created again, and someone reserves there: the new pool numbers its
  // reservations from the start, so theirs has the id the bind holds. The
  // bind's release names the old incarnation and leaves theirs alone.
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-p");
  ASSERT_TRUE(b);
  rig.api().RefuseBindings(500);
  std::string theirs;
  rig.api().OnRequest([&](const HttpRequest& r) {
    if (r.method != "POST" || !theirs.empty()) return;
    std::unique_ptr<KvBrokerClient> admin = ClientOf(*b);
    absl::StatusOr<v1::PoolInfo> info = admin->GetPool("kv");
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_TRUE(admin->DeletePool("kv", /*force=*/true).ok());
    ASSERT_TRUE(admin->CreatePool(info->spec()).ok());
    absl::StatusOr<v1::ReserveResponse> reserved = admin->Reserve("kv", 2);
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    theirs = reserved->reservation_id();
  });
  HttpResult failed = rig.Bind("llm-p", "node-b");
  rig.api().OnRequest(nullptr);
  ASSERT_FALSE(theirs.empty());
  EXPECT_THAT(failed.doc["Error"].get<std::string>(),
              AllOf(StartsWith("binding_failed: "),
                    HasSubstr("releasing the reservation failed too")));
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 2);
  EXPECT_EQ(Release(*b, theirs), 2);
}

TEST(ExtenderBind, APodChangedByOthersBetweenItsStepsIsStillBoundOnce) {
  // Someone else (a label, a controller) changes the pod just before bind's
  // patch, or just before its Binding: the API refuses that step 409, and
  // bind takes it again at the pod's new version instead of giving the
  // reservation up.
  for (const std::string step : {"PATCH", "POST"}) {
    SCOPED_TRACE(step);
    Rig rig;
    auto b = NodeBWithPod(rig, "llm-t");
    ASSERT_TRUE(b);
    int seen = 0;
    rig.api().OnRequest([&](const HttpRequest& r) {
      if (r.method == step && seen++ == 0) rig.api().Touch("serving", "llm-t");
    });
    EXPECT_EQ(rig.Bind("llm-t", "node-b").doc, json({{"Error", ""}}));
    rig.api().OnRequest(nullptr);
    EXPECT_EQ(seen, 2);  // refused once (409), then done
    EXPECT_EQ(
        rig.api().Annotations("serving", "llm-t")[kReservationNodeAnnotation],
        "node-b");
    ExpectBoundOnceHolding(rig, *b, "llm-t", 4);
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

TEST(ExtenderBind, ABindingTheApiFailsOnceIsTakenAgain) {
  // The pod read after the failed Binding is unbound and names our
  // reservation: the Binding is sent again at its version.
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-o");
  ASSERT_TRUE(b);
  int posts = 0;
  rig.api().OnRequest([&](const HttpRequest& r) {
    if (r.method == "POST") rig.api().RefuseBindings(posts++ == 0 ? 500 : 0);
  });
  EXPECT_EQ(rig.Bind("llm-o", "node-b").doc, json({{"Error", ""}}));
  rig.api().OnRequest(nullptr);
  EXPECT_EQ(posts, 2);
  ExpectBoundOnceHolding(rig, *b, "llm-o", 4);
}

TEST(ExtenderBind, AFailedPatchIsTakenAgainAndReleasesOnlyOnceRecorded) {
  // The API fails the first `refused` patches (503) and takes the next.
  auto refuse_patches = [](Rig& rig, int refused) {
    auto seen = std::make_shared<int>(0);
    rig.api().OnRequest([&rig, refused, seen](const HttpRequest& r) {
      if (r.method == "PATCH") {
        rig.api().RefusePatches((*seen)++ < refused ? 503 : 0);
      }
    });
  };
  {
    // One failure: the pod read again is unclaimed, and the patch is taken
    // again: bound, nothing released.
    Rig rig;
    auto b = NodeBWithPod(rig, "llm-4", "2");
    ASSERT_TRUE(b);
    refuse_patches(rig, 1);
    EXPECT_EQ(rig.Bind("llm-4", "node-b").doc, json({{"Error", ""}}));
    rig.api().OnRequest(nullptr);
    ExpectBoundOnceHolding(rig, *b, "llm-4", 2);
  }
  Rig rig;
  auto b = NodeBWithPod(rig, "llm-4", "2");
  ASSERT_TRUE(b);
  // Three failures use up the bind's attempts; the fourth patch records
  // the release on the pod, and then it is made.
  refuse_patches(rig, 3);
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

TEST(ExtenderBind, PodsBoundAtOnceNeverReserveMoreThanThePoolHolds) {
  // Ten pods of four blocks each are bound to one node at once, each by its
  // own replica, and the pool holds sixteen blocks: exactly four pods are
  // bound, each naming a live reservation of four blocks, and the broker
  // refuses the other six before anything is written to their pods.
  auto b = StartBroker(kRoomyPools);
  ASSERT_TRUE(b);
  Rig rig;
  rig.api().AddBroker("node-b", b->port());
  constexpr int kPods = 10;
  std::vector<std::string> bodies;
  std::vector<std::unique_ptr<Extender>> replicas;
  for (int i = 0; i < kPods; ++i) {
    const std::string pod = absl::StrCat("llm-c", i);
    rig.api().AddPod("serving", pod, absl::StrCat("uid-", pod),
                     Asks("kv", "kvbroker.io/blocks", "4"));
    bodies.push_back(Rig::BindingArgs(rig.api().Pod("serving", pod), "node-b"));
    replicas.push_back(rig.Replica());
  }
  std::vector<std::string> answers(kPods);
  std::vector<std::thread> binds;
  for (int i = 0; i < kPods; ++i) {
    binds.emplace_back([&, i] {
      HttpRequest r;
      r.method = "POST";
      r.path = "/bind";
      r.body = bodies[i];
      answers[i] = json::parse(replicas[i]->Handle(r).body)["Error"];
    });
  }
  for (std::thread& t : binds) t.join();
  int bound = 0;
  for (int i = 0; i < kPods; ++i) {
    SCOPED_TRACE(answers[i]);
    const std::string pod = absl::StrCat("llm-c", i);
    const json stored = rig.api().Pod("serving", pod);
    std::map<std::string, std::string> annotations =
        rig.api().Annotations("serving", pod);
    if (answers[i].empty()) {
      ++bound;
      EXPECT_EQ(stored["spec"]["nodeName"], "node-b");
      EXPECT_EQ(Release(*b, annotations[kReservationAnnotation]), 4);
    } else {
      EXPECT_THAT(answers[i],
                  StartsWith("Reserve 4 blocks of pool kv on node node-b: "
                             "POOL_EXHAUSTED: "));
      EXPECT_FALSE(stored["spec"].contains("nodeName"));
      EXPECT_EQ(annotations.count(kReservationAnnotation), 0u);
    }
  }
  EXPECT_EQ(bound, 4);
  EXPECT_EQ(rig.api().bindings().size(), 4u);
  EXPECT_EQ(rig.api().patches().size(), 4u);
  EXPECT_EQ(Cap(*b, "kv").reserved_blocks(), 0);  // all four released above
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

}  // namespace
}  // namespace extender
}  // namespace kvbroker
