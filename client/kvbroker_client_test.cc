// The client library against a scripted fake KvBroker service: error
// parsing, request ids, credentials, deadlines, and which failures are
// retried (and how often). The real server is exercised in
// client_server_test.cc.

#include "client/kvbroker_client.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::SizeIs;

// A google.rpc.Status as kvbrokerd sends it: ErrorInfo (+ RetryInfo).
grpc::Status Rich(grpc::StatusCode code, const std::string& reason,
                  std::map<std::string, std::string> metadata = {},
                  absl::Duration retry_delay = absl::ZeroDuration()) {
  google::rpc::Status rpc;
  rpc.set_code(code);
  rpc.set_message("refused: " + reason);
  google::rpc::ErrorInfo info;
  info.set_domain("kvbroker");
  info.set_reason(reason);
  for (auto& [k, v] : metadata) (*info.mutable_metadata())[k] = v;
  rpc.add_details()->PackFrom(info);
  if (retry_delay > absl::ZeroDuration()) {
    google::rpc::RetryInfo retry;
    retry.mutable_retry_delay()->set_nanos(
        static_cast<int32_t>(absl::ToInt64Nanoseconds(retry_delay)));
    rpc.add_details()->PackFrom(retry);
  }
  return grpc::Status(code, rpc.message(), rpc.SerializeAsString());
}

grpc::Status Unavailable() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
}

// Every call pops the next scripted status (OK once the script is empty)
// and records what it saw.
class ScriptedService final : public v1::KvBroker::Service {
 public:
  struct Seen {
    std::string method;
    std::string request_id;
    std::string authorization;
    absl::Time deadline;
  };

  void Script(std::vector<grpc::Status> statuses) {
    absl::MutexLock lock(&mu_);
    script_.assign(statuses.begin(), statuses.end());
  }
  std::vector<Seen> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

  grpc::Status Capacity(grpc::ServerContext* ctx, const v1::CapacityRequest* r,
                        v1::CapacityResponse* resp) override {
    resp->mutable_capacity()->set_pool(r->pool());
    resp->mutable_capacity()->set_available_blocks(3);
    return Next(ctx, "Capacity", "");
  }
  grpc::Status Alloc(grpc::ServerContext* ctx, const v1::AllocRequest* r,
                     v1::AllocResponse* resp) override {
    v1::PageBlocks* page = resp->add_pages();
    page->set_page_id(0);
    page->add_block_ids(0);
    page->add_block_ids(1);
    page = resp->add_pages();
    page->set_page_id(1);
    page->add_block_ids(3);
    resp->set_num_blocks(3);
    return Next(ctx, "Alloc", r->request_id());
  }
  grpc::Status Free(grpc::ServerContext* ctx, const v1::FreeRequest* r,
                    v1::FreeResponse* resp) override {
    resp->set_freed_blocks(r->block_ids_size());
    return Next(ctx, "Free", r->request_id());
  }
  grpc::Status Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* r,
                       v1::ReserveResponse* resp) override {
    resp->set_reservation_id("res-1");
    return Next(ctx, "Reserve", r->request_id());
  }
  grpc::Status CreatePool(grpc::ServerContext* ctx,
                          const v1::CreatePoolRequest*,
                          v1::CreatePoolResponse*) override {
    return Next(ctx, "CreatePool", "");
  }
  grpc::Status DeletePool(grpc::ServerContext* ctx,
                          const v1::DeletePoolRequest*,
                          v1::DeletePoolResponse*) override {
    return Next(ctx, "DeletePool", "");
  }
  grpc::Status ReleaseReservation(grpc::ServerContext* ctx,
                                  const v1::ReleaseReservationRequest*,
                                  v1::ReleaseReservationResponse*) override {
    return Next(ctx, "ReleaseReservation", "");
  }
  grpc::Status Trim(grpc::ServerContext* ctx, const v1::TrimRequest*,
                    v1::TrimResponse*) override {
    return Next(ctx, "Trim", "");
  }
  grpc::Status SetMemoryLimit(grpc::ServerContext* ctx,
                              const v1::SetMemoryLimitRequest*,
                              v1::SetMemoryLimitResponse*) override {
    return Next(ctx, "SetMemoryLimit", "");
  }
  grpc::Status ListPools(grpc::ServerContext* ctx, const v1::ListPoolsRequest*,
                         v1::ListPoolsResponse* resp) override {
    resp->add_pools()->mutable_spec()->set_name("a");
    resp->add_pools()->mutable_spec()->set_name("b");
    return Next(ctx, "ListPools", "");
  }

 private:
  grpc::Status Next(grpc::ServerContext* ctx, const std::string& method,
                    const std::string& request_id) {
    Seen seen{method, request_id, "", absl::FromChrono(ctx->deadline())};
    auto auth = ctx->client_metadata().find("authorization");
    if (auth != ctx->client_metadata().end()) {
      seen.authorization.assign(auth->second.data(), auth->second.size());
    }
    absl::MutexLock lock(&mu_);
    seen_.push_back(seen);
    if (script_.empty()) return grpc::Status::OK;
    grpc::Status s = script_.front();
    script_.pop_front();
    return s;
  }

  absl::Mutex mu_;
  std::deque<grpc::Status> script_ ABSL_GUARDED_BY(mu_);
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  // A client with fast, deterministic backoff unless `options` says else.
  std::unique_ptr<KvBrokerClient> NewClient(ClientOptions options = Fast()) {
    return KvBrokerClient::FromChannel(
        server_->InProcessChannel(grpc::ChannelArguments()), options);
  }
  static ClientOptions Fast() {
    ClientOptions o;
    o.retry.initial_backoff = absl::Milliseconds(1);
    o.retry.max_backoff = absl::Milliseconds(5);
    o.retry.jitter = 0;
    return o;
  }
  std::vector<std::string> RequestIds() {
    std::vector<std::string> ids;
    for (const auto& s : service_.seen()) ids.push_back(s.request_id);
    return ids;
  }

  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
};

bool IsHex128(const std::string& id) {
  return id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
           return absl::ascii_isxdigit(c) && !absl::ascii_isupper(c);
         });
}

// --- Errors ----------------------------------------------------------------

TEST(KvbErrorTest, ParsesErrorInfoBadRequestAndRetryInfo) {
  google::rpc::Status rpc;
  rpc.set_code(grpc::StatusCode::INVALID_ARGUMENT);
  rpc.set_message("bad");
  google::rpc::ErrorInfo info;
  info.set_domain("kvbroker");
  info.set_reason("INVALID_GEOMETRY");
  (*info.mutable_metadata())["min_page_size_bytes"] = "4194304";
  rpc.add_details()->PackFrom(info);
  google::rpc::BadRequest bad;
  auto* v = bad.add_field_violations();
  v->set_field("page_size");
  v->set_description("too small");
  rpc.add_details()->PackFrom(bad);
  google::rpc::RetryInfo retry;
  retry.mutable_retry_delay()->set_seconds(1);
  retry.mutable_retry_delay()->set_nanos(500000000);
  rpc.add_details()->PackFrom(retry);

  absl::Status s = KvbStatusFromGrpc(grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT, "bad", rpc.SerializeAsString()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad");
  std::optional<KvbError> e = GetKvbError(s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->reason, v1::INVALID_GEOMETRY);
  EXPECT_EQ(e->reason_name, "INVALID_GEOMETRY");
  EXPECT_EQ(e->code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(e->metadata, ElementsAre(Pair("min_page_size_bytes", "4194304")));
  ASSERT_THAT(e->field_violations, SizeIs(1));
  EXPECT_EQ(e->field_violations[0].field(), "page_size");
  EXPECT_EQ(e->retry_delay, absl::Milliseconds(1500));
  EXPECT_EQ(e->details.details_size(), 3);
  EXPECT_EQ(GetKvbReason(s), v1::INVALID_GEOMETRY);
  EXPECT_EQ(e->ToString(),
            "INVALID_GEOMETRY (INVALID_ARGUMENT): bad "
            "{min_page_size_bytes=4194304}; field page_size: too small");
}

TEST(KvbErrorTest, OkAndUntypedStatuses) {
  EXPECT_FALSE(GetKvbError(absl::OkStatus()).has_value());
  EXPECT_TRUE(KvbStatusFromGrpc(grpc::Status::OK).ok());

  absl::Status plain = KvbStatusFromGrpc(Unavailable());
  std::optional<KvbError> e = GetKvbError(plain);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->reason, v1::REASON_UNSPECIFIED);
  EXPECT_EQ(e->code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(e->message, "connection reset");
  EXPECT_TRUE(e->metadata.empty());
  EXPECT_EQ(e->ToString(), "UNAVAILABLE: connection reset");

  // Unparseable details are ignored; the code and message survive.
  absl::Status garbage = KvbStatusFromGrpc(
      grpc::Status(grpc::StatusCode::INTERNAL, "x", "\xff\xff not a proto"));
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(GetKvbReason(garbage), v1::REASON_UNSPECIFIED);
}

TEST(KvbErrorTest, OtherDomainsAndUnknownReasons) {
  google::rpc::Status rpc;
  google::rpc::ErrorInfo other;
  other.set_domain("googleapis.com");
  other.set_reason("POOL_EXHAUSTED");
  rpc.add_details()->PackFrom(other);
  EXPECT_EQ(
      GetKvbReason(KvbStatusFromGrpc(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED, "", rpc.SerializeAsString()))),
      v1::REASON_UNSPECIFIED);

  std::optional<KvbError> e = GetKvbError(KvbStatusFromGrpc(
      Rich(grpc::StatusCode::FAILED_PRECONDITION, "SOMETHING_NEW")));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->reason, v1::REASON_UNSPECIFIED);
  EXPECT_EQ(e->reason_name, "SOMETHING_NEW");
}

TEST(KvbErrorTest, CapacityRefusals) {
  EXPECT_TRUE(IsCapacityRefusal(v1::POOL_EXHAUSTED));
  EXPECT_TRUE(IsCapacityRefusal(v1::GPU_MEMORY_EXHAUSTED));
  EXPECT_TRUE(IsCapacityRefusal(v1::SHRINK_PENDING));
  EXPECT_TRUE(IsCapacityRefusal(v1::REQUEST_TOO_LARGE));
  EXPECT_FALSE(IsCapacityRefusal(v1::MAPPING_FAILED));
  EXPECT_FALSE(IsCapacityRefusal(v1::REASON_UNSPECIFIED));
}

TEST(HelpersTest, NewRequestIdIsRandom128BitHex) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewRequestId();
    EXPECT_TRUE(IsHex128(id)) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(HelpersTest, BlockIdsFlattensPages) {
  v1::AllocResponse r;
  auto* p = r.add_pages();
  p->set_page_id(0);
  p->add_block_ids(0);
  p->add_block_ids(1);
  p = r.add_pages();
  p->set_page_id(1);
  p->add_block_ids(3);
  EXPECT_THAT(BlockIds(r), ElementsAre(0, 1, 3));
  EXPECT_TRUE(BlockIds(v1::ReserveResponse()).empty());
}

TEST(ConnectTest, ValidatesOptions) {
  ClientOptions o;
  o.target = "";
  EXPECT_EQ(KvBrokerClient::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.target = "127.0.0.1:1";
  o.tls = TlsOptions();
  o.tls->cert_chain_pem = "cert";
  EXPECT_EQ(KvBrokerClient::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.tls->private_key_pem = "key";
  EXPECT_TRUE(KvBrokerClient::Connect(o).ok());
  o.tls.reset();
  EXPECT_TRUE(KvBrokerClient::Connect(o).ok());
  EXPECT_EQ(
      TlsOptions::FromFiles("/nonexistent/ca.pem", "", "").status().code(),
      absl::StatusCode::kNotFound);
}

// A token that cannot travel in an HTTP/2 header (a line break from a
// file or a Kubernetes secret, a control byte, non-ASCII) made gRPC abort the
// process on the first call. It is refused up front instead, without
// repeating the secret.
TEST(ConnectTest, RefusesABearerTokenThatCannotBeSent) {
  for (const std::string& token : std::vector<std::string>{
           "s3cret-token\n", "s3cret-token\r", "s3cret\x1btoken",
           "s3cret-\xc3\xa9t\xc3\xa9", std::string("s3cret\0token", 12)}) {
    ClientOptions o;
    o.target = "127.0.0.1:1";
    o.bearer_token = token;
    absl::StatusOr<std::unique_ptr<KvBrokerClient>> client =
        KvBrokerClient::Connect(o);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument)
        << absl::CEscape(token);
    EXPECT_THAT(std::string(client.status().message()),
                ::testing::Not(::testing::HasSubstr("s3cret")));
  }
  // Over an existing channel every call is refused without being sent.
  ScriptedService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ClientOptions o;
  o.bearer_token = "s3cret-token\n";
  std::unique_ptr<KvBrokerClient> client = KvBrokerClient::FromChannel(
      server->InProcessChannel(grpc::ChannelArguments()), o);
  EXPECT_EQ(client->Capacity("demo").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Alloc("demo", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::unique_ptr<CapacityWatch> watch = client->WatchCapacity("demo");
  v1::CapacitySnapshot snapshot;
  EXPECT_FALSE(watch->Next(&snapshot));
  EXPECT_EQ(watch->Finish().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(service.seen(), SizeIs(0));
  // Spaces around a token are legal in a header and trimmed by kvbrokerd.
  o.bearer_token = "s3cret token ";
  client = KvBrokerClient::FromChannel(
      server->InProcessChannel(grpc::ChannelArguments()), o);
  EXPECT_TRUE(client->Capacity("demo").ok());
  server->Shutdown();
}

// An empty file or a directory named as the CA once gave an empty PEM, which
// gRPC takes as "the system's roots": the client trusted every public CA
// instead of the one it was told to.
TEST(ConnectTest, TlsFilesThatAreEmptyOrDirectoriesAreRefused) {
  const char* env = std::getenv("TEST_TMPDIR");
  const std::string dir = env != nullptr ? env : "/tmp";
  const std::string empty = dir + "/empty.pem";
  { std::ofstream f(empty); }
  for (const std::string& path : {empty, dir}) {
    absl::StatusOr<TlsOptions> tls = TlsOptions::FromFiles(path, "", "");
    EXPECT_FALSE(tls.ok()) << path;
    EXPECT_THAT(std::string(tls.status().message()),
                ::testing::HasSubstr(path));
    EXPECT_FALSE(TlsOptions::FromFiles("", path, "").ok()) << path;
    EXPECT_FALSE(TlsOptions::FromFiles("", "", path).ok()) << path;
  }
  EXPECT_TRUE(TlsOptions::FromFiles("client/testdata/ca.pem", "", "").ok());
}

TEST(ConnectTest, NoServerIsUnavailableWithoutReason) {
  ClientOptions o;
  o.target = "unix:/nonexistent/kvbroker.sock";
  o.retry.max_attempts = 2;
  o.retry.initial_backoff = absl::Milliseconds(1);
  auto client = KvBrokerClient::Connect(o);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<v1::CapacitySnapshot> c = (*client)->Capacity("demo");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetKvbReason(c.status()), v1::REASON_UNSPECIFIED);
}

TEST(ConnectTest, WaitReadyWaitsForAStartingServerAndTimesOut) {
  // Under /tmp: a Unix socket's path has at most 107 bytes.
  char dir[] = "/tmp/kvbc-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/kvbrokerd.sock");
  ClientOptions o;
  o.target = "unix:" + path;
  auto client = KvBrokerClient::Connect(o);
  ASSERT_TRUE(client.ok());

  // Nothing listens: UNAVAILABLE, no kvbroker reason, naming the target.
  const absl::Time start = absl::Now();
  absl::Status none = (*client)->WaitReady(absl::Milliseconds(300));
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetKvbReason(none), v1::REASON_UNSPECIFIED);
  EXPECT_THAT(std::string(none.message()), ::testing::HasSubstr(o.target));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));

  // The server starts while the client waits; after WaitReady, a call that
  // is sent once goes through (on a channel whose last attempt failed it
  // would fail at once).
  ScriptedService service;
  std::unique_ptr<grpc::Server> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(o.target, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  });
  absl::Status ready = (*client)->WaitReady(absl::Seconds(30));
  starter.join();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(ready.ok()) << ready;
  EXPECT_TRUE((*client)->CreatePool(v1::PoolSpec()).ok());
  EXPECT_THAT(service.seen(), SizeIs(1));
  server->Shutdown();
  unlink(path.c_str());
  rmdir(dir);
}

// --- Retries ---------------------------------------------------------------

TEST_F(ClientTest, TransportUnavailableIsRetriedUntilSuccess) {
  service_.Script({Unavailable(), Unavailable()});
  absl::StatusOr<v1::CapacitySnapshot> c = NewClient()->Capacity("demo");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->available_blocks(), 3);
  EXPECT_THAT(service_.seen(), SizeIs(3));
}

TEST_F(ClientTest, AllocRetriesReuseTheGeneratedRequestId) {
  service_.Script({Unavailable(), Unavailable()});
  absl::StatusOr<v1::AllocResponse> r = NewClient()->Alloc("demo", 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(BlockIds(*r), ElementsAre(0, 1, 3));
  std::vector<std::string> ids = RequestIds();
  ASSERT_THAT(ids, SizeIs(3));
  EXPECT_TRUE(IsHex128(ids[0])) << ids[0];
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);

  // A second call gets a fresh id.
  ASSERT_TRUE(NewClient()->Alloc("demo", 3).ok());
  EXPECT_NE(RequestIds().back(), ids[0]);
}

TEST_F(ClientTest, CallerRequestIdIsSentOnEveryAttempt) {
  service_.Script({Unavailable()});
  FreeOptions free;
  free.request_id = "free-7";
  ASSERT_TRUE(NewClient()->Free("demo", {0, 1}, free).ok());
  service_.Script({Unavailable()});
  ReserveOptions reserve;
  reserve.request_id = "res-7";
  ASSERT_TRUE(NewClient()->Reserve("demo", 2, reserve).ok());
  EXPECT_EQ(RequestIds(),
            (std::vector<std::string>{"free-7", "free-7", "res-7", "res-7"}));
}

TEST_F(ClientTest, MappingFailedIsRetriedWithTheSameRequestId) {
  service_.Script({Rich(grpc::StatusCode::UNAVAILABLE, "MAPPING_FAILED")});
  ASSERT_TRUE(NewClient()->Alloc("demo", 3).ok());
  std::vector<std::string> ids = RequestIds();
  ASSERT_THAT(ids, SizeIs(2));
  EXPECT_EQ(ids[0], ids[1]);
}

TEST_F(ClientTest, PoolExhaustedIsNotRetried) {
  service_.Script({Rich(grpc::StatusCode::RESOURCE_EXHAUSTED, "POOL_EXHAUSTED",
                        {{"available_blocks", "1"}, {"requested_blocks", "2"}}),
                   Unavailable()});
  absl::StatusOr<v1::AllocResponse> r = NewClient()->Alloc("demo", 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  std::optional<KvbError> e = GetKvbError(r.status());
  EXPECT_EQ(e->reason, v1::POOL_EXHAUSTED);
  EXPECT_EQ(e->metadata["available_blocks"], "1");
  EXPECT_THAT(service_.seen(), SizeIs(1));
}

TEST_F(ClientTest, OtherReasonsAreNotRetriedEvenWhenUnavailable) {
  // Only MAPPING_FAILED among kvbroker reasons is retryable; a reason is
  // trusted over the code.
  service_.Script({Rich(grpc::StatusCode::UNAVAILABLE, "GPU_MEMORY_EXHAUSTED",
                        {}, absl::Milliseconds(1))});
  absl::StatusOr<v1::AllocResponse> r = NewClient()->Alloc("demo", 2);
  EXPECT_EQ(GetKvbReason(r.status()), v1::GPU_MEMORY_EXHAUSTED);
  EXPECT_THAT(service_.seen(), SizeIs(1));
}

// A reason this build does not know (a newer daemon) is still the daemon's
// word, not a transport failure: it is returned at once, as Python does.
TEST_F(ClientTest, UnknownReasonsAreNotRetriedEvenWhenUnavailable) {
  service_.Script({Rich(grpc::StatusCode::UNAVAILABLE, "SOME_NEWER_REASON"),
                   Unavailable()});
  absl::StatusOr<v1::AllocResponse> r = NewClient()->Alloc("demo", 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetKvbError(r.status())->reason_name, "SOME_NEWER_REASON");
  EXPECT_THAT(service_.seen(), SizeIs(1));
}

TEST_F(ClientTest, OtherCodesAreNotRetried) {
  service_.Script({grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow"),
                   grpc::Status(grpc::StatusCode::INTERNAL, "bug")});
  auto client = NewClient();
  EXPECT_EQ(client->Capacity("demo").status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client->Capacity("demo").status().code(),
            absl::StatusCode::kInternal);
  EXPECT_THAT(service_.seen(), SizeIs(2));
}

TEST_F(ClientTest, NonIdempotentCallsAreSentOnce) {
  auto client = NewClient();
  service_.Script({Unavailable()});
  EXPECT_EQ(client->CreatePool(v1::PoolSpec()).status().code(),
            absl::StatusCode::kUnavailable);
  service_.Script({Unavailable()});
  EXPECT_EQ(client->DeletePool("demo").code(), absl::StatusCode::kUnavailable);
  service_.Script({Unavailable()});
  EXPECT_EQ(client->ReleaseReservation("demo", "r").status().code(),
            absl::StatusCode::kUnavailable);
  service_.Script({Unavailable()});
  EXPECT_EQ(client->Trim("demo").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_THAT(service_.seen(), SizeIs(4));

  // SetMemoryLimit is idempotent through its revision.
  service_.Script({Unavailable()});
  EXPECT_TRUE(client->SetMemoryLimit("demo", 1 << 20, 1).ok());
  EXPECT_THAT(service_.seen(), SizeIs(6));
}

TEST_F(ClientTest, AttemptsAreBounded) {
  ClientOptions o = Fast();
  o.retry.max_attempts = 4;
  service_.Script(std::vector<grpc::Status>(10, Unavailable()));
  absl::StatusOr<v1::AllocResponse> r = NewClient(o)->Alloc("demo", 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(service_.seen(), SizeIs(4));

  o.retry.max_attempts = 1;
  service_.Script({Unavailable()});
  EXPECT_FALSE(NewClient(o)->ListPools().ok());
  EXPECT_THAT(service_.seen(), SizeIs(5));
}

TEST_F(ClientTest, RetriesStopAtTheDeadline) {
  ClientOptions o = Fast();
  o.retry.max_attempts = 100;
  o.retry.initial_backoff = absl::Milliseconds(100);
  o.retry.max_backoff = absl::Milliseconds(100);
  service_.Script(std::vector<grpc::Status>(100, Unavailable()));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CapacitySnapshot> c = NewClient(o)->Capacity(
      "demo", 0, CallOptions::WithTimeout(absl::Milliseconds(350)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(c.ok());
  // Attempts at about 0, 100, 200 and 300 ms; none is started when its wait
  // would end past the deadline.
  EXPECT_GE(service_.seen().size(), 2u);
  EXPECT_LE(service_.seen().size(), 4u);
  EXPECT_LT(took, absl::Milliseconds(600));
}

TEST_F(ClientTest, ServerRetryDelayIsHonoured) {
  service_.Script({Rich(grpc::StatusCode::UNAVAILABLE, "MAPPING_FAILED", {},
                        absl::Milliseconds(200))});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(NewClient()->Alloc("demo", 1).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST_F(ClientTest, SendsBearerTokenAndDeadline) {
  ClientOptions o = Fast();
  o.bearer_token = "s3cret";
  o.timeout = absl::Seconds(7);
  const absl::Duration kSlack = absl::Milliseconds(50);
  const absl::Time before = absl::Now();
  ASSERT_TRUE(NewClient(o)->ListPools().ok());
  ASSERT_TRUE(
      NewClient(Fast())
          ->Capacity("demo", 0, CallOptions::WithTimeout(absl::Seconds(2)))
          .ok());
  std::vector<ScriptedService::Seen> seen = service_.seen();
  ASSERT_THAT(seen, SizeIs(2));
  EXPECT_EQ(seen[0].authorization, "Bearer s3cret");
  EXPECT_GT(seen[0].deadline, before + absl::Seconds(6));
  // gRPC may round a deadline up slightly on the wire.
  EXPECT_LE(seen[0].deadline, absl::Now() + absl::Seconds(7) + kSlack);
  EXPECT_EQ(seen[1].authorization, "");
  EXPECT_LE(seen[1].deadline, absl::Now() + absl::Seconds(2) + kSlack);
}

TEST_F(ClientTest, ListPoolsReturnsEveryPool) {
  absl::StatusOr<std::vector<v1::PoolInfo>> pools = NewClient()->ListPools();
  ASSERT_TRUE(pools.ok());
  ASSERT_THAT(*pools, SizeIs(2));
  EXPECT_EQ((*pools)[1].spec().name(), "b");
}

// --- TLS -----------------------------------------------------------------

// The scripted service behind TLS that requires a client certificate, with
// the test certificates of client/testdata (a CA, a server certificate for
// localhost and 127.0.0.1, a client certificate; valid until 2126).
class TlsTest : public ::testing::Test {
 protected:
  static constexpr char kData[] = "client/testdata/";

  void SetUp() override {
    absl::StatusOr<TlsOptions> server = TlsOptions::FromFiles(
        std::string(kData) + "ca.pem", std::string(kData) + "server.pem",
        std::string(kData) + "server.key");
    ASSERT_TRUE(server.ok()) << server.status();
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = server->root_ca_pem;
    ssl.pem_key_cert_pairs.push_back(
        {server->private_key_pem, server->cert_chain_pem});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  absl::StatusOr<v1::CapacitySnapshot> CapacityWith(const std::string& cert,
                                                    const std::string& key) {
    ClientOptions o;
    // An address, not a name: no DNS lookup; the certificate is checked
    // against the overriding name.
    o.target = absl::StrCat("127.0.0.1:", port_);
    o.retry.max_attempts = 1;
    o.bearer_token = "t0k";
    absl::StatusOr<TlsOptions> tls = TlsOptions::FromFiles(
        std::string(kData) + "ca.pem", cert.empty() ? "" : kData + cert,
        key.empty() ? "" : kData + key);
    if (!tls.ok()) return tls.status();
    tls->target_name_override = "localhost";
    o.tls = *tls;
    absl::StatusOr<std::unique_ptr<KvBrokerClient>> client =
        KvBrokerClient::Connect(o);
    if (!client.ok()) return client.status();
    return (*client)->Capacity("demo", 0,
                               CallOptions::WithTimeout(absl::Seconds(5)));
  }

  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(TlsTest, MutualTlsWithBearerToken) {
  absl::StatusOr<v1::CapacitySnapshot> c =
      CapacityWith("client.pem", "client.key");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->available_blocks(), 3);
  ASSERT_THAT(service_.seen(), SizeIs(1));
  EXPECT_EQ(service_.seen()[0].authorization, "Bearer t0k");
}

TEST_F(TlsTest, ServerRefusesAClientWithoutCertificate) {
  absl::StatusOr<v1::CapacitySnapshot> c = CapacityWith("", "");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(service_.seen(), SizeIs(0));
}

}  // namespace
}  // namespace kvbroker
