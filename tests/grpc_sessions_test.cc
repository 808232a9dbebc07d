// ListSessions and the engine metrics end to end: the daemon's wiring (Rig)
// with an AttachServer on its broker, engines attached over the real attach
// socket (engine::Session), and ListSessions over real gRPC channels (TCP and
// Unix socket) with bearer tokens scoped to pools.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "allocator/failure.h"
#include "attach/attach_server.h"
#include "attach/session_directory.h"
#include "engine/session.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/access.h"
#include "server/metrics.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kMine[] = "mine-token-0123456789";

std::shared_ptr<const AccessPolicy> Policy() {
  return PolicyOf({{"admin", kAdmin, {"*"}}, {"mine-only", kMine, {"mine"}}});
}

// P = 2 MiB, B = 256 KiB, L = K = 1: 8 blocks per page, 64 blocks.
PoolConfig Pool(const std::string& name) {
  PoolConfig c;
  c.name = name;
  c.page_size = MiB(2);
  c.block_bytes = KiB(256);
  c.max_blocks = 64;
  return c;
}

// The value of the one sample named exactly `series` ("" when absent).
std::string Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::string(line.substr(series.size() + 1));
    }
  }
  return "";
}

class SessionsTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    RigOptions o;
    o.access = Policy();
    o.sessions = slot_;
    rig_ = std::make_unique<Rig>(o);
    ASSERT_NE(rig_->daemon, nullptr);
    ASSERT_TRUE(rig_->broker()->CreatePool(Pool("mine")).ok());
    ASSERT_TRUE(rig_->broker()->CreatePool(Pool("theirs")).ok());
    attach_path_ = rig_->unix_path + ".attach";
    attach::AttachServerOptions ao;
    ao.socket_path = attach_path_;
    ao.access = o.access;
    absl::StatusOr<std::unique_ptr<attach::AttachServer>> server =
        attach::AttachServer::Start(rig_->broker(), ao);
    ASSERT_TRUE(server.ok()) << server.status();
    attach_ = *std::move(server);
    slot_->Set(attach_.get());
    stub_ = v1::KvBroker::NewStub(rig_->Channel(GetParam()));
  }
  void TearDown() override {
    slot_->Set(nullptr);
    engines_.clear();
    if (attach_ != nullptr) attach_->Stop();
  }

  // An engine session said hello as `holder`, attached to `pool` (none when
  // empty) and holding `blocks` blocks.
  engine::Session* Engine(const std::string& holder, const std::string& pool,
                          int64_t blocks,
                          absl::Duration grace = absl::ZeroDuration()) {
    engine::ConnectOptions c;
    c.socket_path = attach_path_;
    c.token = kAdmin;
    c.holder = holder;
    c.reattach_grace = grace;
    absl::StatusOr<std::unique_ptr<engine::Session>> s =
        engine::Session::Connect(c);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    if (!pool.empty()) {
      engine::AttachOptions a;
      a.pool = pool;
      EXPECT_TRUE((*s)->Attach(a).ok());
      if (blocks > 0) {
        EXPECT_TRUE((*s)->Alloc(blocks).ok());
      }
    }
    engines_.push_back(*std::move(s));
    return engines_.back().get();
  }

  Reply<v1::ListSessionsResponse> List(const std::string& token,
                                       const std::string& pool = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::ListSessionsRequest request;
    request.set_pool(pool);
    Reply<v1::ListSessionsResponse> r;
    r.status = stub_->ListSessions(&ctx, request, &r.response);
    return r;
  }

  std::shared_ptr<attach::SessionDirectorySlot> slot_ =
      std::make_shared<attach::SessionDirectorySlot>();
  std::unique_ptr<Rig> rig_;
  std::string attach_path_;
  std::unique_ptr<attach::AttachServer> attach_;
  std::vector<std::unique_ptr<engine::Session>> engines_;
  std::unique_ptr<v1::KvBroker::Stub> stub_;
};

std::vector<std::string> Holders(const v1::ListSessionsResponse& r) {
  std::vector<std::string> out;
  for (const v1::EngineSession& s : r.sessions()) out.push_back(s.holder());
  return out;
}

TEST_P(SessionsTest, ListsEveryEngineAndHolderInGraceExactly) {
  const int64_t before = absl::ToUnixSeconds(absl::Now());
  engine::Session* a = Engine("rank-a", "mine", 10);
  Engine("rank-b", "theirs", 3);
  Engine("greeted", "", 0);
  engine::Session* g = Engine("parked", "mine", 4, absl::Hours(1));
  ASSERT_TRUE(g->Close(/*release=*/false).ok());
  const int64_t after = absl::ToUnixSeconds(absl::Now());
  // A round trip: the daemon sends every page it announced to this engine
  // before a reply, and the engine maps them before the call returns, so
  // both sides count the same pages.
  ASSERT_TRUE(a->Capacity().ok());

  Reply<v1::ListSessionsResponse> r = List(kAdmin);
  ASSERT_TRUE(r.ok()) << r.status.error_message();
  // By pool, then holder: the session not attached yet comes first.
  ASSERT_EQ(Holders(r.response), (std::vector<std::string>{
                                     "greeted", "parked", "rank-a", "rank-b"}));
  const v1::EngineSession& greeted = r->sessions(0);
  EXPECT_EQ(greeted.pool(), "");
  EXPECT_EQ(greeted.blocks(), 0);
  EXPECT_NE(greeted.session_id(), 0u);
  EXPECT_FALSE(greeted.in_grace());

  const v1::EngineSession& parked = r->sessions(1);
  EXPECT_EQ(parked.session_id(), 0u);
  EXPECT_EQ(parked.pool(), "mine");
  EXPECT_EQ(parked.blocks(), 4);
  EXPECT_TRUE(parked.in_grace());
  EXPECT_EQ(parked.reattach_grace().seconds(), 3600);
  EXPECT_GE(parked.grace_ends().seconds(), after + 3600 - 1);
  EXPECT_LE(parked.grace_ends().seconds(), after + 3600 + 60);
  EXPECT_EQ(parked.pid(), getpid());

  const v1::EngineSession& ra = r->sessions(2);
  EXPECT_EQ(ra.session_id(), a->hello().session_id());
  EXPECT_EQ(ra.pid(), getpid());
  EXPECT_EQ(ra.pool(), "mine");
  EXPECT_EQ(ra.blocks(), 10);
  // The pages the daemon sent this engine are the ones it mapped.
  EXPECT_EQ(ra.mapped_pages(), a->mapped_pages());
  EXPECT_EQ(ra.pending_revocations(), 0);
  EXPECT_EQ(ra.quarantined_pages(), 0);
  EXPECT_EQ(ra.reattach_grace().seconds(), 0);
  EXPECT_FALSE(ra.in_grace());
  EXPECT_FALSE(ra.has_grace_ends());
  EXPECT_GE(ra.attached_since().seconds(), before);
  EXPECT_LE(ra.attached_since().seconds(), after);

  EXPECT_EQ(r->sessions(3).pool(), "theirs");
  EXPECT_EQ(r->sessions(3).blocks(), 3);

  // Blocks follow the holder's Alloc and Free exactly.
  absl::StatusOr<std::vector<int64_t>> more = a->Alloc(6);
  ASSERT_TRUE(more.ok());
  ASSERT_TRUE(a->Free(absl::MakeConstSpan(more->data(), 2)).ok());
  r = List(kAdmin, "mine");
  ASSERT_TRUE(r.ok()) << r.status.error_message();
  ASSERT_EQ(Holders(r.response),
            (std::vector<std::string>{"parked", "rank-a"}));
  EXPECT_EQ(r->sessions(1).blocks(), 14);

  // A closed session is gone from the list at once (Close waits for the
  // daemon's confirmation).
  ASSERT_TRUE(a->Close().ok());
  r = List(kAdmin, "mine");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Holders(r.response), (std::vector<std::string>{"parked"}));
}

TEST_P(SessionsTest, AScopedTokenSeesItsPoolsSessionsOnly) {
  Engine("rank-a", "mine", 2);
  Engine("rank-b", "theirs", 1);
  Engine("greeted", "", 0);

  Reply<v1::ListSessionsResponse> r = List(kMine);
  ASSERT_TRUE(r.ok()) << r.status.error_message();
  EXPECT_EQ(Holders(r.response), (std::vector<std::string>{"rank-a"}));
  r = List(kMine, "mine");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Holders(r.response), (std::vector<std::string>{"rank-a"}));

  EXPECT_TRUE(IsRefusal(List(kMine, "theirs").status,
                        FailureReason::kPermissionDenied));
  EXPECT_TRUE(IsRefusal(List("").status, FailureReason::kUnauthenticated));
  EXPECT_TRUE(IsRefusal(List("not-a-token-0123456789").status,
                        FailureReason::kUnauthenticated));
  EXPECT_TRUE(
      IsRefusal(List(kAdmin, "nope").status, FailureReason::kPoolNotFound));
  EXPECT_TRUE(IsRefusal(List(kAdmin, std::string(300, 'p')).status,
                        FailureReason::kInvalidArgument));
}

TEST_P(SessionsTest, MetricsCountEnginesPerPoolAndPerSession) {
  engine::Session* a = Engine("rank-a", "mine", 5);
  Engine("rank-b", "mine", 7);
  engine::Session* g = Engine("parked", "theirs", 1, absl::Hours(1));
  ASSERT_TRUE(g->Close(/*release=*/false).ok());
  ASSERT_TRUE(a->Capacity().ok());  // both sides count the same pages

  const std::string text = RenderMetrics(*rig_->broker(), slot_);
  const std::string session_a =
      absl::StrCat("{pool=\"mine\",holder=\"rank-a\",session=\"",
                   a->hello().session_id(), "\"}");
  EXPECT_EQ(Sample(text, "kvbroker_engine_blocks" + session_a), "5");
  EXPECT_EQ(Sample(text, "kvbroker_engine_mapped_pages" + session_a),
            absl::StrCat(a->mapped_pages()));
  EXPECT_EQ(Sample(text, "kvbroker_engine_pending_revocations" + session_a),
            "0");
  EXPECT_EQ(Sample(text, "kvbroker_engine_quarantined_pages" + session_a), "0");
  EXPECT_EQ(Sample(text, "kvbroker_pool_sessions{pool=\"mine\"}"), "2");
  EXPECT_EQ(Sample(text, "kvbroker_pool_sessions{pool=\"theirs\"}"), "0");
  EXPECT_EQ(Sample(text, "kvbroker_pool_holders_in_grace{pool=\"theirs\"}"),
            "1");
  EXPECT_EQ(Sample(text, "kvbroker_pool_holders_in_grace{pool=\"mine\"}"), "0");
  EXPECT_EQ(Sample(text, "kvbroker_pool_quarantined_pages{pool=\"mine\"}"),
            "0");
  // The holder in grace has no engine series; the live ones have one each.
  size_t engine_series = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "kvbroker_engine_blocks{")) ++engine_series;
  }
  EXPECT_EQ(engine_series, 2u);

  // Without a directory (no attach socket), no session series at all.
  EXPECT_FALSE(absl::StrContains(RenderMetrics(*rig_->broker()),
                                 "kvbroker_pool_sessions"));
}

INSTANTIATE_TEST_SUITE_P(Transports, SessionsTest,
                         ::testing::Values(Transport::kTcp, Transport::kUnix),
                         TransportName);

}  // namespace
}  // namespace testing
}  // namespace kvbroker
