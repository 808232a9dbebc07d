// What kvbrokerd serves besides the scenario rows, over real channels:
// server reflection (v1 and v1alpha) resolving google.rpc.ErrorInfo, health
// Check and Watch, WatchCapacity, deadlines, idempotent retries across
// transports, draining, and SIGTERM on a real kvbrokerd process.

#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "allocator/units.h"
#include "client/error_codec.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/grpc_test_util.h"
#include "tests/http_exchange.h"

namespace kvbroker {
namespace testing {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
using ::testing::TestWithParam;
using ::testing::Values;

#define ASSERT_REPLY_OK(reply) \
  ASSERT_TRUE((reply).ok()) << (reply).status.error_message()

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(absl::ToInt64Microseconds(d));
}

class GrpcDaemon : public TestWithParam<Transport> {
 protected:
  void Start(RigOptions options = {}) {
    rig_ = std::make_unique<Rig>(options);
    ASSERT_NE(rig_->daemon, nullptr);
    channel_ = rig_->Channel(GetParam());
    client_ = std::make_unique<Client>(channel_);
  }

  Rig& rig() { return *rig_; }
  Client& c() { return *client_; }

  std::unique_ptr<Rig> rig_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Client> client_;
};

INSTANTIATE_TEST_SUITE_P(Transports, GrpcDaemon,
                         Values(Transport::kTcp, Transport::kUnix),
                         TransportName);

// ===========================================================================
// Server reflection

using ReflectionStream =
    grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>;

// Opens a reflection stream of version v1 or v1alpha. The two protocols'
// messages are identical on the wire, so v1alpha is spoken with the v1
// message types on the v1alpha method path (Debian ships no v1alpha stub).
std::unique_ptr<ReflectionStream> OpenReflection(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx,
    bool v1alpha) {
  static const grpc::internal::RpcMethod kV1Alpha(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  if (!v1alpha) {
    return grpc::reflection::v1::ServerReflection::NewStub(channel)
        ->ServerReflectionInfo(ctx);
  }
  return std::unique_ptr<ReflectionStream>(
      grpc::internal::ClientReaderWriterFactory<
          ServerReflectionRequest,
          ServerReflectionResponse>::Create(channel.get(), kV1Alpha, ctx));
}

ServerReflectionResponse Ask(ReflectionStream* stream,
                             const ServerReflectionRequest& request) {
  ServerReflectionResponse response;
  EXPECT_TRUE(stream->Write(request));
  EXPECT_TRUE(stream->Read(&response));
  return response;
}

// Builds a pool from the FileDescriptorProtos of a reflection answer: it
// resolves only if the answer carried every transitive import.
class ReflectedPool {
 public:
  explicit ReflectedPool(const ServerReflectionResponse& response)
      : pool_(&database_) {
    for (const std::string& bytes :
         response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      EXPECT_TRUE(file.ParseFromString(bytes));
      if (std::count(names_.begin(), names_.end(), file.name()) > 0) {
        ++duplicates_;  // allowed by the protocol; v1alpha sends some
        continue;
      }
      names_.push_back(file.name());
      database_.Add(file);
    }
  }
  const google::protobuf::DescriptorPool& pool() const { return pool_; }
  const std::vector<std::string>& names() const { return names_; }
  int duplicates() const { return duplicates_; }

 private:
  int duplicates_ = 0;
  google::protobuf::SimpleDescriptorDatabase database_;
  google::protobuf::DescriptorPool pool_;
  std::vector<std::string> names_;
};

TEST_P(GrpcDaemon, ReflectionV1AndV1AlphaListServicesAndResolveErrorInfo) {
  ASSERT_NO_FATAL_FAILURE(Start());
  for (bool v1alpha : {false, true}) {
    SCOPED_TRACE(v1alpha ? "v1alpha" : "v1");
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(30)));
    std::unique_ptr<ReflectionStream> stream =
        OpenReflection(channel_, &ctx, v1alpha);

    ServerReflectionRequest list;
    list.set_list_services("");
    ServerReflectionResponse listed = Ask(stream.get(), list);
    std::set<std::string> services;
    for (const auto& s : listed.list_services_response().service()) {
      services.insert(s.name());
    }
    for (const char* expected :
         {"kvbroker.v1.KvBroker", "grpc.health.v1.Health",
          "grpc.reflection.v1.ServerReflection",
          "grpc.reflection.v1alpha.ServerReflection"}) {
      EXPECT_EQ(services.count(expected), 1u) << expected;
    }

    // google.rpc.ErrorInfo resolves, with its imports, so grpcurl can decode
    // error details.
    ServerReflectionRequest error_info;
    error_info.set_file_containing_symbol("google.rpc.ErrorInfo");
    ReflectedPool details(Ask(stream.get(), error_info));
    ASSERT_FALSE(details.names().empty());
    EXPECT_EQ(details.names()[0], "google/rpc/error_details.proto");
    const google::protobuf::Descriptor* info =
        details.pool().FindMessageTypeByName("google.rpc.ErrorInfo");
    ASSERT_NE(info, nullptr);
    EXPECT_NE(info->FindFieldByName("metadata"), nullptr);
    EXPECT_NE(details.pool().FindMessageTypeByName("google.rpc.QuotaFailure"),
              nullptr);

    ServerReflectionRequest status;
    status.set_file_by_filename("google/rpc/status.proto");
    ReflectedPool status_pool(Ask(stream.get(), status));
    EXPECT_NE(status_pool.pool().FindMessageTypeByName("google.rpc.Status"),
              nullptr);

    // The API itself, with its well-known-type imports.
    ServerReflectionRequest api;
    api.set_file_containing_symbol("kvbroker.v1.KvBroker.Alloc");
    ReflectedPool api_pool(Ask(stream.get(), api));
    if (!v1alpha) {
      EXPECT_EQ(api_pool.duplicates(), 0);
    }
    const google::protobuf::ServiceDescriptor* service =
        api_pool.pool().FindServiceByName("kvbroker.v1.KvBroker");
    ASSERT_NE(service, nullptr);
    EXPECT_NE(service->FindMethodByName("WatchCapacity"), nullptr);
    EXPECT_EQ(
        service->FindMethodByName("Capacity")->options().idempotency_level(),
        google::protobuf::MethodOptions::NO_SIDE_EFFECTS);
    const google::protobuf::EnumDescriptor* reason =
        api_pool.pool().FindEnumTypeByName("kvbroker.v1.Reason");
    ASSERT_NE(reason, nullptr);
    EXPECT_EQ(reason->FindValueByName("POOL_EXHAUSTED")->number(), 1);

    ServerReflectionRequest health;
    health.set_file_containing_symbol("grpc.health.v1.Health");
    EXPECT_TRUE(Ask(stream.get(), health).has_file_descriptor_response());

    ServerReflectionRequest unknown;
    unknown.set_file_containing_symbol("no.such.Symbol");
    ServerReflectionResponse missing = Ask(stream.get(), unknown);
    ASSERT_TRUE(missing.has_error_response());
    EXPECT_EQ(missing.error_response().error_code(),
              grpc::StatusCode::NOT_FOUND);

    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
}

// ===========================================================================
// Health

HealthCheckResponse::ServingStatus Check(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    grpc::Status* status = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s =
      grpc::health::v1::Health::NewStub(channel)->Check(&ctx, req, &resp);
  if (status != nullptr) *status = s;
  return resp.status();
}

TEST_P(GrpcDaemon, HealthCheckAndWatchFollowDraining) {
  ASSERT_NO_FATAL_FAILURE(Start());
  EXPECT_EQ(Check(channel_, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check(channel_, "kvbroker.v1.KvBroker"),
            HealthCheckResponse::SERVING);
  grpc::Status unknown;
  Check(channel_, "no.such.Service", &unknown);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  HealthCheckRequest req;
  req.set_service("kvbroker.v1.KvBroker");
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
      stub->Watch(&ctx, req);
  HealthCheckResponse resp;
  ASSERT_TRUE(watch->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);

  std::thread drain([&] { rig().daemon->Drain(); });
  ASSERT_TRUE(watch->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  ctx.TryCancel();  // let the drain finish at once
  drain.join();

  // Drained: new calls are refused by the transport, not by kvbroker.
  auto after = c().Capacity("any");
  EXPECT_FALSE(after.ok());
  EXPECT_FALSE(GetErrorInfo(after.status).has_value());
  struct stat st;
  EXPECT_NE(stat(rig().unix_path.c_str(), &st), 0) << "socket file left";
}

// ===========================================================================
// WatchCapacity

using WatchReader = grpc::ClientReader<v1::WatchCapacityResponse>;

std::unique_ptr<WatchReader> Watch(Client& c, grpc::ClientContext* ctx,
                                   const std::string& pool,
                                   int64_t max_pages = 0) {
  v1::WatchCapacityRequest req;
  req.set_pool(pool);
  req.set_max_pages(max_pages);
  return c.stub()->WatchCapacity(ctx, req);
}

TEST_P(GrpcDaemon, WatchCapacitySendsSnapshotsCoalescedUntilDeleted) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_REPLY_OK(c().CreatePool(Spec("w", MiB(2), MiB(1), 200)));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  std::unique_ptr<WatchReader> watch = Watch(c(), &ctx, "w");

  v1::WatchCapacityResponse msg;
  ASSERT_TRUE(watch->Read(&msg));
  EXPECT_EQ(msg.capacity().pool(), "w");
  EXPECT_EQ(msg.capacity().available_blocks(), 200);
  uint64_t generation = msg.capacity().generation();

  ASSERT_REPLY_OK(c().Alloc("w", 3));
  ASSERT_TRUE(watch->Read(&msg));
  EXPECT_GT(msg.capacity().generation(), generation);
  EXPECT_EQ(msg.capacity().allocated_blocks(), 3);
  generation = msg.capacity().generation();

  // Changes while the reader is away: snapshots arrive in generation order
  // and the last one is the final state.
  for (int i = 0; i < 20; ++i) ASSERT_REPLY_OK(c().Alloc("w", 1));
  const uint64_t final_generation = c().Cap("w").generation();
  while (msg.capacity().generation() < final_generation) {
    ASSERT_TRUE(watch->Read(&msg));
    EXPECT_GT(msg.capacity().generation(), generation);
    generation = msg.capacity().generation();
  }
  EXPECT_EQ(msg.capacity().generation(), final_generation);
  EXPECT_EQ(msg.capacity().allocated_blocks(), 3 + 20);

  // Deleting the pool ends the stream with the pool's failure.
  ASSERT_REPLY_OK(c().DeletePool("w", /*force=*/true));
  while (watch->Read(&msg)) {
  }
  grpc::Status end = watch->Finish();
  EXPECT_TRUE(IsRefusal(end, FailureReason::kPoolNotFound))
      << end.error_message();
}

TEST_P(GrpcDaemon, WatchCapacityCoalescesWhileTheReaderIsSlow) {
  // One block per page and the per-page list in every snapshot (about
  // 400 KiB each): an unread stream fills the HTTP/2 window and the socket
  // buffers after a few snapshots, and the server has to coalesce.
  constexpr int64_t kPages = 32768;
  RigOptions options;
  options.limits.max_page_list = kPages;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  ASSERT_REPLY_OK(c().CreatePool(Spec("w", MiB(2), MiB(2), kPages)));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(60)));
  std::unique_ptr<WatchReader> watch = Watch(c(), &ctx, "w", kPages);
  v1::WatchCapacityResponse msg;
  ASSERT_TRUE(watch->Read(&msg));
  EXPECT_EQ(msg.capacity().page_list_size(), kPages);

  constexpr int kChanges = 60;
  for (int i = 0; i < kChanges; ++i) ASSERT_REPLY_OK(c().Alloc("w", 1));
  const uint64_t final_generation = c().Cap("w").generation();
  int snapshots = 0;
  while (msg.capacity().generation() < final_generation) {
    ASSERT_TRUE(watch->Read(&msg));
    ++snapshots;
  }
  EXPECT_EQ(msg.capacity().allocated_blocks(), kChanges);
  // FULL pages are not in the consumption order.
  EXPECT_EQ(msg.capacity().page_list_size(), kPages - kChanges);
  std::printf("WatchCapacity: %d snapshots for %d changes\n", snapshots,
              kChanges);
  EXPECT_LT(snapshots, kChanges / 2) << "no coalescing";
  ctx.TryCancel();
}

// The first (only) BadRequest field of a refusal.
std::string BadField(const grpc::Status& status) {
  std::optional<google::rpc::BadRequest> bad =
      GetDetail<google::rpc::BadRequest>(status);
  if (!bad.has_value() || bad->field_violations_size() != 1) return "";
  return bad->field_violations(0).field();
}

TEST_P(GrpcDaemon, PageListsAndWatchesPerCallerAreBounded) {
  RigOptions options;
  options.limits.max_page_list = 8;
  options.watch.max_watches_per_caller = 2;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  ASSERT_REPLY_OK(c().CreatePool(Spec("b", MiB(2), MiB(1), 40)));

  Reply<v1::CapacityResponse> over = c().Capacity("b", 9);
  EXPECT_TRUE(IsRefusal(over.status, FailureReason::kInvalidArgument));
  EXPECT_EQ(BadField(over.status), "max_pages");
  Reply<v1::CapacityResponse> at = c().Capacity("b", 8);
  ASSERT_REPLY_OK(at);
  EXPECT_EQ(at.response.capacity().page_list_size(), 8);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(30)));
    std::unique_ptr<WatchReader> watch = Watch(c(), &ctx, "b", 9);
    v1::WatchCapacityResponse msg;
    EXPECT_FALSE(watch->Read(&msg));
    grpc::Status end = watch->Finish();
    EXPECT_TRUE(IsRefusal(end, FailureReason::kInvalidArgument));
    EXPECT_EQ(BadField(end), "max_pages");
  }

  // Two streams from this caller are served; the third is refused.
  grpc::ClientContext ctx1, ctx2, ctx3;
  for (grpc::ClientContext* ctx : {&ctx1, &ctx2, &ctx3}) {
    ctx->set_deadline(In(absl::Seconds(30)));
  }
  std::unique_ptr<WatchReader> w1 = Watch(c(), &ctx1, "b", 8);
  std::unique_ptr<WatchReader> w2 = Watch(c(), &ctx2, "b");
  v1::WatchCapacityResponse msg;
  ASSERT_TRUE(w1->Read(&msg));
  EXPECT_EQ(msg.capacity().page_list_size(), 8);
  ASSERT_TRUE(w2->Read(&msg));
  EXPECT_EQ(msg.capacity().page_list_size(), 0);
  std::unique_ptr<WatchReader> w3 = Watch(c(), &ctx3, "b");
  EXPECT_FALSE(w3->Read(&msg));
  grpc::Status refused = w3->Finish();
  EXPECT_TRUE(IsRefusal(refused, FailureReason::kInvalidArgument));
  EXPECT_EQ(BadField(refused), "pool");
  std::optional<google::rpc::ErrorInfo> info = GetErrorInfo(refused);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->metadata().at("max_watches_per_caller"), "2");

  // The two served streams still follow the pool.
  ASSERT_REPLY_OK(c().Alloc("b", 1));
  const uint64_t generation = c().Cap("b").generation();
  for (WatchReader* w : {w1.get(), w2.get()}) {
    do {
      ASSERT_TRUE(w->Read(&msg));
    } while (msg.capacity().generation() < generation);
    EXPECT_EQ(msg.capacity().allocated_blocks(), 1);
  }
  ctx1.TryCancel();
  ctx2.TryCancel();
}

TEST_P(GrpcDaemon, WatchCapacityOfAnUnknownPoolIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start());
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  std::unique_ptr<WatchReader> watch = Watch(c(), &ctx, "nope");
  v1::WatchCapacityResponse msg;
  EXPECT_FALSE(watch->Read(&msg));
  EXPECT_TRUE(IsRefusal(watch->Finish(), FailureReason::kPoolNotFound));
}

TEST_P(GrpcDaemon, WatchCapacityEndsCleanlyWhenTheServerDrains) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_REPLY_OK(c().CreatePool(Spec("w", MiB(2), MiB(1), 20)));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  std::unique_ptr<WatchReader> watch = Watch(c(), &ctx, "w");
  v1::WatchCapacityResponse msg;
  ASSERT_TRUE(watch->Read(&msg));
  const absl::Time start = absl::Now();
  rig().daemon->Drain();
  // The stream was ended by the drain, not cut at the drain deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_FALSE(watch->Read(&msg));
  EXPECT_TRUE(watch->Finish().ok());
}

// ===========================================================================
// Deadlines and cancellation

TEST_P(GrpcDaemon, ExpiredDeadlineChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_REPLY_OK(c().CreatePool(Spec("d", MiB(2), MiB(1), 20)));
  v1::AllocRequest req;
  req.set_pool("d");
  req.set_num_blocks(4);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() -
                   std::chrono::milliseconds(1));
  v1::AllocResponse resp;
  grpc::Status s = c().stub()->Alloc(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  v1::CapacitySnapshot cap = c().Cap("d");
  EXPECT_EQ(cap.allocated_blocks(), 0);
  EXPECT_EQ(cap.available_blocks(), 20);
}

TEST_P(GrpcDaemon, WatchCapacityDeadlineEndsTheStream) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_REPLY_OK(c().CreatePool(Spec("d", MiB(2), MiB(1), 20)));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Milliseconds(300)));
  std::unique_ptr<WatchReader> watch = Watch(c(), &ctx, "d");
  v1::WatchCapacityResponse msg;
  ASSERT_TRUE(watch->Read(&msg));
  EXPECT_FALSE(watch->Read(&msg));  // nothing changes; the deadline passes
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server let go of the stream: later changes are fine.
  ASSERT_REPLY_OK(c().Alloc("d", 1));
  EXPECT_EQ(c().Cap("d").allocated_blocks(), 1);
}

// ===========================================================================
// Idempotent retries

TEST_P(GrpcDaemon, RetriesWithTheSameRequestIdReplayAcrossTransports) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_REPLY_OK(c().CreatePool(Spec("i", MiB(2), MiB(1), 20)));
  // The retry arrives over the other transport, as after a reconnect.
  Client other(rig().Channel(GetParam() == Transport::kTcp ? Transport::kUnix
                                                           : Transport::kTcp));

  auto alloc = c().Alloc("i", 5, "alloc-1");
  ASSERT_REPLY_OK(alloc);
  auto alloc_again = other.Alloc("i", 5, "alloc-1");
  ASSERT_REPLY_OK(alloc_again);
  EXPECT_TRUE(alloc_again->replayed());
  EXPECT_EQ(Ids(alloc_again->pages()), Ids(alloc->pages()));

  auto reserve = c().Reserve("i", 4, absl::Seconds(60), "reserve-1");
  ASSERT_REPLY_OK(reserve);
  auto reserve_again = other.Reserve("i", 4, absl::Seconds(60), "reserve-1");
  ASSERT_REPLY_OK(reserve_again);
  EXPECT_TRUE(reserve_again->replayed());
  EXPECT_EQ(reserve_again->reservation_id(), reserve->reservation_id());

  const std::vector<int64_t> ids = Ids(alloc->pages());
  auto freed = c().Free("i", ids, "free-1");
  ASSERT_REPLY_OK(freed);
  EXPECT_EQ(freed->freed_blocks(), 5);
  auto freed_again = other.Free("i", ids, "free-1");
  ASSERT_REPLY_OK(freed_again);
  EXPECT_TRUE(freed_again->replayed());

  v1::CapacitySnapshot cap = c().Cap("i");
  EXPECT_EQ(cap.allocated_blocks(), 0);
  EXPECT_EQ(cap.reserved_blocks(), 4);
  EXPECT_TRUE(IsRefusal(other.Free("i", ids, "free-2").status,
                        FailureReason::kBlockNotAllocated));
  EXPECT_TRUE(IsRefusal(other.Free("i", {ids[0]}, "free-1").status,
                        FailureReason::kRequestIdReused));
}

// ===========================================================================
// SIGTERM on a real kvbrokerd

// A child process whose stdout the test reads.
class Kvbrokerd {
 public:
  explicit Kvbrokerd(const std::vector<std::string>& args) {
    int out[2];
    if (pipe(out) != 0) return;
    std::vector<char*> argv;
    std::string binary = Binary();
    argv.push_back(binary.data());
    // The test's mode first: a flag the test passes itself wins.
    std::vector<std::string> copy = {TestServerThreadingFlag()};
    copy.insert(copy.end(), args.begin(), args.end());
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    stdout_ = out[0];
  }

  ~Kvbrokerd() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_ >= 0) close(stdout_);
  }

  // The next line of the child's stdout, or "" after `timeout`.
  std::string ReadLine(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string line;
    while (absl::Now() < deadline) {
      pollfd p = {stdout_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char ch;
      if (read(stdout_, &ch, 1) != 1) break;
      if (ch == '\n') return line;
      line.push_back(ch);
    }
    return "";
  }

  // The exit status, or -1 if it did not exit within `timeout`.
  int WaitExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

  pid_t pid() const { return pid_; }

 private:
  static std::string Binary() {
    if (const char* path = std::getenv("KVBROKERD")) return path;
    const char* srcdir = std::getenv("TEST_SRCDIR");
    if (srcdir != nullptr) {
      return absl::StrCat(srcdir, "/kvbroker/server/kvbrokerd");
    }
    return "server/kvbrokerd";
  }

  pid_t pid_ = -1;
  int stdout_ = -1;
};

// KVB_TEST_BACKEND=cuda runs the daemon on the GPUs (tools/gpu-run); the
// default is the host backend. KVBROKERD overrides the binary's path.
std::string BackendFlag() {
  const char* backend = std::getenv("KVB_TEST_BACKEND");
  return absl::StrCat("--backend=", backend != nullptr ? backend : "host");
}

TEST(KvbrokerdProcess, SigtermDrainsAndExitsZero) {
  const std::string socket = NewSocketPath();
  Kvbrokerd daemon({BackendFlag(), "--listen=127.0.0.1:0",
                    absl::StrCat("--unix_socket=", socket),
                    "--pools=examples/pools.textproto", "--min_idle_pages=0",
                    "--host_device_memory=64GiB", "--drain_timeout=5s",
                    "--metrics_listen=127.0.0.1:0"});
  ASSERT_GT(daemon.pid(), 0);
  const std::string line = daemon.ReadLine(absl::Seconds(30));
  ASSERT_TRUE(absl::StrContains(line, "serving kvbroker.v1.KvBroker")) << line;
  std::printf("%s\n", line.c_str());
  // "... on 127.0.0.1:PORT and unix:/tmp/..."
  const size_t at = line.find("127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << line;
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      line.substr(at + 10, line.find(' ', at) - (at + 10)), &port))
      << line;
  EXPECT_TRUE(absl::StrContains(line, absl::StrCat("unix:", socket))) << line;

  auto tcp = std::make_unique<Client>(
      ConnectedChannel(absl::StrCat("127.0.0.1:", port)));
  auto unix =
      std::make_unique<Client>(ConnectedChannel(absl::StrCat("unix:", socket)));
  // The example pools file's seed case.
  EXPECT_EQ(tcp->Cap("demo").available_blocks(), 3);
  EXPECT_TRUE(IsRefusal(unix->Alloc("demo", 4).status,
                        FailureReason::kRequestTooLarge));
  auto r = unix->Alloc("demo", 3);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(tcp->GetPool("llama3-8b")->pool().bundle_bytes(), 128 * kMiB);
  // The pools file's export_at_map reaches the pool; unset, it is off.
  EXPECT_TRUE(tcp->GetPool("llama3-8b")->pool().spec().export_at_map());
  EXPECT_FALSE(tcp->GetPool("demo")->pool().spec().export_at_map());

  // "...; metrics on http://127.0.0.1:PORT/metrics": the same state there.
  const size_t m = line.find("metrics on http://127.0.0.1:");
  ASSERT_NE(m, std::string::npos) << line;
  int metrics_port = 0;
  const size_t port_at = m + std::strlen("metrics on http://127.0.0.1:");
  ASSERT_TRUE(absl::SimpleAtoi(
      line.substr(port_at, line.find('/', port_at) - port_at), &metrics_port))
      << line;
  const std::string scrape =
      HttpExchange(metrics_port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(scrape, " 200 ")) << scrape;
  EXPECT_TRUE(absl::StrContains(
      scrape, "\nkvbroker_pool_allocated_blocks{pool=\"demo\"} 3\n"))
      << scrape;
  EXPECT_TRUE(absl::StrContains(scrape,
                                "\nkvbroker_pool_outcomes_total{pool=\"demo\","
                                "reason=\"REQUEST_TOO_LARGE\"} "
                                "1\n"))
      << scrape;
  EXPECT_TRUE(absl::StrContains(
      scrape, "\nkvbroker_device_budget_bytes{device=\"0\"} "))
      << scrape;

  {
    grpc::ClientContext watch_ctx;
    watch_ctx.set_deadline(In(absl::Seconds(30)));
    std::unique_ptr<WatchReader> watch = Watch(*tcp, &watch_ctx, "demo");
    v1::WatchCapacityResponse msg;
    ASSERT_TRUE(watch->Read(&msg));
    EXPECT_EQ(msg.capacity().allocated_blocks(), 3);

    // The open stream ends cleanly (OK) as soon as the drain starts.
    ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
    EXPECT_FALSE(watch->Read(&msg));
    EXPECT_TRUE(watch->Finish().ok());
  }
  // The server's shutdown also waits for clients to drop their connections
  // after its GOAWAY; an idle sync client only notices on its next poll, so
  // close ours and expect an exit well before the 5 s drain deadline.
  tcp.reset();
  unix.reset();
  const absl::Time signalled = absl::Now();
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 0);
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(4));
  struct stat st;
  EXPECT_NE(stat(socket.c_str(), &st), 0) << "socket file left behind";
  RemoveSocketPath(socket);
}

TEST(KvbrokerdProcess, BadFlagsFailClearly) {
  if (BackendFlag() != "--backend=cuda") {  // no GPU here: cuda must fail
    Kvbrokerd daemon({"--backend=cuda", "--listen=127.0.0.1:0"});
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 1);
  }
  {
    Kvbrokerd daemon({"--backend=tpu", "--listen=127.0.0.1:0"});
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 1);
  }
  {
    Kvbrokerd daemon(
        {BackendFlag(), "--pools=/nonexistent", "--listen=127.0.0.1:0"});
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 1);
  }
  for (const char* flag :
       {"--server_threading=threads", "--poller_workers=0",
        "--poller_workers=-3", "--pool_lock_spin=-1us",
        "--pool_lock_spin=2ms", "--pool_lock_spin=fast"}) {
    Kvbrokerd daemon({BackendFlag(), "--listen=127.0.0.1:0", flag});
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 1) << flag;
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
