// kvbrokerd's access control end to end (SPEC 9): the TCP listener with
// mutual TLS, bearer tokens scoped to pools on both listeners, and what stays
// open without a token (health). Real channels to the real daemon wiring.

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "allocator/failure.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/access.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kEngine[] = "engine-token-0123456789";

std::string ReadTestFile(const std::string& name) {
  std::ifstream in("client/testdata/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<const AccessPolicy> Policy() {
  return PolicyOf({{"admin", kAdmin, {"*"}}, {"engine-0", kEngine, {"mine"}}});
}

RigOptions SecureRig() {
  RigOptions o;
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = ReadTestFile("ca.pem");
  ssl.pem_key_cert_pairs.push_back(
      {ReadTestFile("server.key"), ReadTestFile("server.pem")});
  o.tcp_credentials = grpc::SslServerCredentials(ssl);
  o.access = Policy();
  return o;
}

// A TLS channel to the rig's TCP listener; with the client certificate
// unless `client_cert` is false.
std::shared_ptr<grpc::Channel> TlsChannel(const Rig& rig,
                                          bool client_cert = true) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadTestFile("ca.pem");
  if (!client_cert) {  // refused in the handshake: it never connects
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    return grpc::CreateCustomChannel(rig.daemon->tcp_address(),
                                     grpc::SslCredentials(ssl), args);
  }
  ssl.pem_private_key = ReadTestFile("client.key");
  ssl.pem_cert_chain = ReadTestFile("client.pem");
  return ConnectedChannel(rig.daemon->tcp_address(), grpc::SslCredentials(ssl));
}

// One call with `token` (none when empty) in the authorization header.
class Caller {
 public:
  explicit Caller(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::KvBroker::NewStub(channel)) {}

  grpc::Status Capacity(const std::string& token, const std::string& pool) {
    auto ctx = Context(token);
    v1::CapacityRequest req;
    req.set_pool(pool);
    v1::CapacityResponse resp;
    return stub_->Capacity(ctx.get(), req, &resp);
  }
  grpc::Status Alloc(const std::string& token, const std::string& pool,
                     int64_t n, v1::AllocResponse* resp) {
    auto ctx = Context(token);
    v1::AllocRequest req;
    req.set_pool(pool);
    req.set_num_blocks(n);
    return stub_->Alloc(ctx.get(), req, resp);
  }
  grpc::Status Create(const std::string& token, const std::string& pool) {
    auto ctx = Context(token);
    v1::CreatePoolRequest req;
    *req.mutable_pool() = Spec(pool, MiB(2), KiB(512), 16);
    v1::CreatePoolResponse resp;
    return stub_->CreatePool(ctx.get(), req, &resp);
  }
  grpc::Status List(const std::string& token, std::vector<std::string>* names) {
    auto ctx = Context(token);
    v1::ListPoolsResponse resp;
    grpc::Status s = stub_->ListPools(ctx.get(), v1::ListPoolsRequest(), &resp);
    names->clear();
    for (const v1::PoolInfo& p : resp.pools()) {
      names->push_back(p.spec().name());
    }
    return s;
  }
  grpc::Status Watch(const std::string& token, const std::string& pool) {
    auto ctx = Context(token);
    v1::WatchCapacityRequest req;
    req.set_pool(pool);
    auto reader = stub_->WatchCapacity(ctx.get(), req);
    v1::WatchCapacityResponse first;
    if (reader->Read(&first)) ctx->TryCancel();
    return reader->Finish();
  }

 private:
  static std::unique_ptr<grpc::ClientContext> Context(
      const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(30));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
  std::unique_ptr<v1::KvBroker::Stub> stub_;
};

class GrpcAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(rig_.daemon, nullptr);
    Caller admin(TlsChannel(rig_));
    ASSERT_TRUE(admin.Create(kAdmin, "mine").ok());
    ASSERT_TRUE(admin.Create(kAdmin, "theirs").ok());
  }
  Rig rig_{SecureRig()};
};

TEST_F(GrpcAuth, MutualTlsWithScopedTokens) {
  Caller c(TlsChannel(rig_));
  EXPECT_TRUE(c.Capacity(kAdmin, "theirs").ok());
  EXPECT_TRUE(c.Capacity(kEngine, "mine").ok());
  v1::AllocResponse got;
  ASSERT_TRUE(c.Alloc(kEngine, "mine", 3, &got).ok());
  EXPECT_EQ(got.num_blocks(), 3);

  // Another pool: refused, typed, and nothing changed there.
  auto allocated = [&](const std::string& pool) {
    return rig_.broker()
        ->GetPool(pool)
        .value()
        ->Capacity()
        .value()
        .allocated_blocks.value();
  };
  const int64_t before = allocated("theirs");
  grpc::Status s = c.Alloc(kEngine, "theirs", 1, &got);
  EXPECT_TRUE(IsRefusal(s, FailureReason::kPermissionDenied))
      << s.error_message();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  std::map<std::string, std::string> md = Metadata(s);
  EXPECT_EQ(md["pool"], "theirs");
  EXPECT_EQ(md["token_name"], "engine-0");
  EXPECT_EQ(md["method"], "Alloc");
  EXPECT_EQ(s.error_message().find(kEngine), std::string::npos);
  EXPECT_EQ(allocated("theirs"), before);
  EXPECT_TRUE(IsRefusal(c.Capacity(kEngine, "theirs"),
                        FailureReason::kPermissionDenied));
  EXPECT_TRUE(
      IsRefusal(c.Watch(kEngine, "theirs"), FailureReason::kPermissionDenied));
  EXPECT_TRUE(
      IsRefusal(c.Create(kEngine, "new"), FailureReason::kPermissionDenied));

  // ListPools shows a token its own pools.
  std::vector<std::string> names;
  ASSERT_TRUE(c.List(kEngine, &names).ok());
  EXPECT_EQ(names, std::vector<std::string>({"mine"}));
  ASSERT_TRUE(c.List(kAdmin, &names).ok());
  EXPECT_EQ(names.size(), 2u);
}

TEST_F(GrpcAuth, MissingOrUnknownTokensAreUnauthenticated) {
  Caller c(TlsChannel(rig_));
  for (const std::string& token :
       {std::string(), std::string("not-a-token-at-all")}) {
    grpc::Status s = c.Capacity(token, "mine");
    EXPECT_TRUE(IsRefusal(s, FailureReason::kUnauthenticated))
        << token << ": " << s.error_message();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    std::vector<std::string> names;
    EXPECT_TRUE(
        IsRefusal(c.List(token, &names), FailureReason::kUnauthenticated));
    EXPECT_TRUE(
        IsRefusal(c.Watch(token, "mine"), FailureReason::kUnauthenticated));
  }
}

TEST_F(GrpcAuth, TwoAuthorizationHeadersAreRefused) {
  auto stub = v1::KvBroker::NewStub(TlsChannel(rig_));
  // A valid token and another: which one counts would be ambiguous.
  for (const char* second : {kAdmin, kEngine}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdmin);
    ctx.AddMetadata("authorization", std::string("Bearer ") + second);
    v1::CapacityRequest req;
    req.set_pool("theirs");
    v1::CapacityResponse resp;
    grpc::Status s = stub->Capacity(&ctx, req, &resp);
    EXPECT_TRUE(IsRefusal(s, FailureReason::kUnauthenticated))
        << s.error_message();
  }
}

TEST_F(GrpcAuth, HealthNeedsNoToken) {
  auto health = grpc::health::v1::Health::NewStub(TlsChannel(rig_));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("kvbroker.v1.KvBroker");
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(GrpcAuth, TcpRefusesPlaintextAndClientsWithoutCertificates) {
  for (auto channel :
       {TlsChannel(rig_, /*client_cert=*/false),
        grpc::CreateChannel(rig_.daemon->tcp_address(),
                            grpc::InsecureChannelCredentials())}) {
    Caller c(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    v1::CapacityRequest req;
    req.set_pool("mine");
    req.set_max_pages(0);
    v1::CapacityResponse resp;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdmin);
    grpc::Status s = v1::KvBroker::NewStub(channel)->Capacity(&ctx, req, &resp);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
}

TEST_F(GrpcAuth, UnixSocketTakesTheSameTokens) {
  Caller c(rig_.Channel(Transport::kUnix));
  EXPECT_TRUE(c.Capacity(kEngine, "mine").ok());
  EXPECT_TRUE(IsRefusal(c.Capacity(kEngine, "theirs"),
                        FailureReason::kPermissionDenied));
  EXPECT_TRUE(
      IsRefusal(c.Capacity("", "mine"), FailureReason::kUnauthenticated));
}

// ===========================================================================
// Client certificate identities: certificates from tests/testdata, all
// signed by one test CA; the SAN decides.

std::string ReadIdentityFile(const std::string& name) {
  std::ifstream in("tests/testdata/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

RigOptions IdentityRig(bool with_tokens) {
  RigOptions o;
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = ReadIdentityFile("ca.pem");
  ssl.pem_key_cert_pairs.push_back(
      {ReadIdentityFile("server.key"), ReadIdentityFile("server.pem")});
  o.tcp_credentials = grpc::SslServerCredentials(ssl);
  v1::AuthTokensFile file;
  if (with_tokens) {
    v1::AuthToken* admin = file.add_tokens();
    admin->set_name("admin");
    admin->set_token(kAdmin);
    admin->add_pools("*");
  }
  v1::ClientIdentity* scheduler = file.add_identities();
  scheduler->set_name("scheduler");
  scheduler->set_san("scheduler.kvbroker.test");
  scheduler->add_pools("*");
  v1::ClientIdentity* engine = file.add_identities();
  engine->set_name("engine-0");
  engine->set_san("spiffe://kvbroker.test/engine-0");
  engine->add_pools("mine");
  absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(file);
  EXPECT_TRUE(p.ok()) << p.status();
  o.access = std::make_shared<const AccessPolicy>(*std::move(p));
  return o;
}

// A TLS channel presenting `who`.pem from tests/testdata.
std::shared_ptr<grpc::Channel> IdentityChannel(const Rig& rig,
                                               const std::string& who) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadIdentityFile("ca.pem");
  ssl.pem_private_key = ReadIdentityFile(who + ".key");
  ssl.pem_cert_chain = ReadIdentityFile(who + ".pem");
  return ConnectedChannel(rig.daemon->tcp_address(), grpc::SslCredentials(ssl));
}

TEST(GrpcIdentities, ACertificateFromTheRightCaIsNotEnoughByItself) {
  Rig rig(IdentityRig(/*with_tokens=*/false));
  ASSERT_NE(rig.daemon, nullptr);
  Caller scheduler(IdentityChannel(rig, "scheduler"));
  ASSERT_TRUE(scheduler.Create("", "mine").ok());
  ASSERT_TRUE(scheduler.Create("", "theirs").ok());
  EXPECT_TRUE(scheduler.Capacity("", "theirs").ok());

  // Signed by the same CA, but its SAN is listed nowhere.
  Caller stranger(IdentityChannel(rig, "stranger"));
  grpc::Status s = stranger.Capacity("", "mine");
  EXPECT_TRUE(IsRefusal(s, FailureReason::kUnauthenticated))
      << s.error_message();
  std::vector<std::string> names;
  EXPECT_TRUE(
      IsRefusal(stranger.List("", &names), FailureReason::kUnauthenticated));

  // A URI SAN scoped to one pool.
  Caller engine(IdentityChannel(rig, "engine"));
  v1::AllocResponse a;
  EXPECT_TRUE(engine.Alloc("", "mine", 2, &a).ok());
  s = engine.Alloc("", "theirs", 1, &a);
  EXPECT_TRUE(IsRefusal(s, FailureReason::kPermissionDenied))
      << s.error_message();
  EXPECT_EQ(Metadata(s)["identity_name"], "engine-0");
  EXPECT_TRUE(
      IsRefusal(engine.Create("", "new"), FailureReason::kPermissionDenied));
  ASSERT_TRUE(engine.List("", &names).ok());
  EXPECT_EQ(names, std::vector<std::string>({"mine"}));

  // The Unix socket carries no certificate: file permissions guard it.
  Caller local(rig.Channel(Transport::kUnix));
  EXPECT_TRUE(local.Capacity("", "theirs").ok());
}

TEST(GrpcIdentities, WithTokensBothMustAllowThePool) {
  Rig rig(IdentityRig(/*with_tokens=*/true));
  ASSERT_NE(rig.daemon, nullptr);
  Caller scheduler(IdentityChannel(rig, "scheduler"));
  ASSERT_TRUE(scheduler.Create(kAdmin, "mine").ok());
  ASSERT_TRUE(scheduler.Create(kAdmin, "theirs").ok());
  EXPECT_TRUE(IsRefusal(scheduler.Capacity("", "mine"),
                        FailureReason::kUnauthenticated));
  // The admin token allows every pool; the engine's certificate does not.
  Caller engine(IdentityChannel(rig, "engine"));
  EXPECT_TRUE(engine.Capacity(kAdmin, "mine").ok());
  EXPECT_TRUE(IsRefusal(engine.Capacity(kAdmin, "theirs"),
                        FailureReason::kPermissionDenied));
  // The stranger's certificate is refused even with the admin token.
  Caller stranger(IdentityChannel(rig, "stranger"));
  EXPECT_TRUE(IsRefusal(stranger.Capacity(kAdmin, "mine"),
                        FailureReason::kUnauthenticated));
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
