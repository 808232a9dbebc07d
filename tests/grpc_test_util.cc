#include "tests/grpc_test_util.h"

#include <grpc/grpc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "client/error_codec.h"

namespace kvbroker {
namespace testing {

std::shared_ptr<const AccessPolicy> PolicyOf(
    const std::vector<TokenGrant>& grants) {
  v1::AuthTokensFile file;
  for (const TokenGrant& g : grants) {
    v1::AuthToken* t = file.add_tokens();
    t->set_name(g.name);
    t->set_token(g.token);
    for (const std::string& pool : g.pools) t->add_pools(pool);
  }
  absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(file);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::make_shared<const AccessPolicy>(*std::move(p));
}

std::string TransportName(const ::testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::kTcp ? "Tcp" : "Unix";
}

std::string NewSocketPath() {
  // Short (Unix socket paths are limited to 107 bytes, which Bazel's
  // TEST_TMPDIR can exceed) and unique across processes: tests run in
  // parallel, each in its own PID namespace, so a pid is not unique.
  char dir[] = "/tmp/kvbt-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return "";
  }
  return absl::StrCat(dir, "/kvbrokerd.sock");
}

void RemoveSocketPath(const std::string& path) {
  unlink(path.c_str());
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos) rmdir(path.substr(0, slash).c_str());
}

namespace {

template <typename Request, typename Response>
Reply<Response> Call(grpc::Status (v1::KvBroker::Stub::*method)(
                         grpc::ClientContext*, const Request&, Response*),
                     v1::KvBroker::Stub* stub, const Request& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  Reply<Response> reply;
  reply.status = (stub->*method)(&context, request, &reply.response);
  return reply;
}

}  // namespace

ServerThreading TestServerThreading() {
  const char* env = std::getenv("KVB_TEST_SERVER_THREADING");
  if (env == nullptr) return ServerThreading::kCallback;
  absl::StatusOr<ServerThreading> threading = ParseServerThreading(env);
  if (!threading.ok()) {
    ADD_FAILURE() << "KVB_TEST_SERVER_THREADING: " << threading.status();
    return ServerThreading::kCallback;
  }
  return *threading;
}

std::string TestServerThreadingFlag() {
  return absl::StrCat("--server_threading=",
                      ServerThreadingName(TestServerThreading()));
}

Rig::Rig(RigOptions options)
    : host(options.host), backend(&host), unix_path(NewSocketPath()) {
  // Keep gRPC initialised for the whole test process: otherwise the last
  // object of a test shuts it down, and grpc_shutdown may wait up to 10 s
  // for connections that are still closing.
  static const bool kGrpcKeptAlive = (grpc_init(), true);
  (void)kGrpcKeptAlive;
  BrokerOptions broker_options;
  broker_options.gpu_memory_utilization = options.gpu_memory_utilization;
  broker_options.min_idle_pages = options.min_idle_pages;
  broker_options.max_idle_pages = options.max_idle_pages;
  broker_options.start_worker = options.start_worker;
  broker_options.clock = options.clock;
  broker_options.between_steps = options.between_steps;
  broker_options.free_one_step_blocks = options.free_one_step_blocks;
  DaemonOptions daemon_options;
  daemon_options.listen = "127.0.0.1:0";
  daemon_options.unix_socket = unix_path;
  daemon_options.drain_timeout = options.drain_timeout;
  daemon_options.health_interval = absl::Milliseconds(20);
  daemon_options.tcp_credentials = options.tcp_credentials;
  daemon_options.access = options.access;
  daemon_options.limits = options.limits;
  daemon_options.watch = options.watch;
  daemon_options.sessions = options.sessions;
  daemon_options.threading = TestServerThreading();
  absl::StatusOr<std::unique_ptr<Daemon>> created =
      Daemon::Create(&backend, broker_options, daemon_options);
  if (!created.ok()) {
    ADD_FAILURE() << created.status();
    return;
  }
  if (absl::Status s = (*created)->Start(); !s.ok()) {
    ADD_FAILURE() << s;
    return;
  }
  daemon = *std::move(created);
}

Rig::~Rig() {
  daemon.reset();
  RemoveSocketPath(unix_path);
}

std::shared_ptr<grpc::Channel> ConnectedChannel(
    const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  // A connection of its own, not shared with other channels to the target.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      target,
      credentials != nullptr ? std::move(credentials)
                             : grpc::InsecureChannelCredentials(),
      args);
  // Handed out connected. The tests are about calls: a call on a channel
  // whose first connection attempt failed fails at once with UNAVAILABLE
  // until the reconnect backoff has passed, and under CI load one such
  // attempt failed ("failed to connect to all addresses ... No such file
  // or directory"), in concurrency_test and in sigterm_load_test. Here a
  // failed attempt is retried; a daemon that cannot be reached for 30 s
  // still fails the test.
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::seconds(30);
  if (!channel->WaitForConnected(deadline)) {
    ADD_FAILURE() << "no connection to " << target << " within 30 s (state "
                  << channel->GetState(false) << ")";
  }
  return channel;
}

std::shared_ptr<grpc::Channel> Rig::Channel(Transport transport) const {
  return ConnectedChannel(transport == Transport::kTcp
                              ? daemon->tcp_address()
                              : daemon->unix_address());
}

void Rig::LeaveFree(int device, Bytes free) {
  const Bytes total = host.QueryMemory(device)->total;
  host.SetExternalUse(device, total - host.created_bytes(device) - free);
  absl::Status s = broker()->budgets()->RefreshAll();
  EXPECT_TRUE(s.ok()) << s;
}

Client::Client(std::shared_ptr<grpc::Channel> channel)
    : stub_(v1::KvBroker::NewStub(std::move(channel))) {}

Reply<v1::CreatePoolResponse> Client::CreatePool(const v1::PoolSpec& spec) {
  v1::CreatePoolRequest r;
  *r.mutable_pool() = spec;
  return Call(&v1::KvBroker::Stub::CreatePool, stub(), r);
}

Reply<v1::GetPoolResponse> Client::GetPool(const std::string& pool) {
  v1::GetPoolRequest r;
  r.set_pool(pool);
  return Call(&v1::KvBroker::Stub::GetPool, stub(), r);
}

Reply<v1::ListPoolsResponse> Client::ListPools() {
  return Call(&v1::KvBroker::Stub::ListPools, stub(), v1::ListPoolsRequest());
}

Reply<v1::DeletePoolResponse> Client::DeletePool(const std::string& pool,
                                                 bool force) {
  v1::DeletePoolRequest r;
  r.set_pool(pool);
  r.set_force(force);
  return Call(&v1::KvBroker::Stub::DeletePool, stub(), r);
}

Reply<v1::CapacityResponse> Client::Capacity(const std::string& pool,
                                             int64_t max_pages) {
  v1::CapacityRequest r;
  r.set_pool(pool);
  r.set_max_pages(max_pages);
  return Call(&v1::KvBroker::Stub::Capacity, stub(), r);
}

Reply<v1::AllocResponse> Client::Alloc(const std::string& pool, int64_t n,
                                       const std::string& request_id,
                                       const std::string& reservation_id) {
  v1::AllocRequest r;
  r.set_pool(pool);
  r.set_num_blocks(n);
  r.set_request_id(request_id);
  r.set_reservation_id(reservation_id);
  return Alloc(r);
}

Reply<v1::AllocResponse> Client::Alloc(const v1::AllocRequest& request) {
  return Call(&v1::KvBroker::Stub::Alloc, stub(), request);
}

Reply<v1::FreeResponse> Client::Free(const std::string& pool,
                                     const std::vector<int64_t>& ids,
                                     const std::string& request_id) {
  v1::FreeRequest r;
  r.set_pool(pool);
  r.mutable_block_ids()->Add(ids.begin(), ids.end());
  r.set_request_id(request_id);
  return Call(&v1::KvBroker::Stub::Free, stub(), r);
}

Reply<v1::FreeResponse> Client::Free(const v1::FreeRequest& request) {
  return Call(&v1::KvBroker::Stub::Free, stub(), request);
}

Reply<v1::ReserveResponse> Client::Reserve(const std::string& pool, int64_t n,
                                           absl::Duration ttl,
                                           const std::string& request_id) {
  v1::ReserveRequest r;
  r.set_pool(pool);
  r.set_num_blocks(n);
  const int64_t nanos = absl::ToInt64Nanoseconds(ttl);
  r.mutable_ttl()->set_seconds(nanos / 1000000000);
  r.mutable_ttl()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  r.set_request_id(request_id);
  return Call(&v1::KvBroker::Stub::Reserve, stub(), r);
}

Reply<v1::ReleaseReservationResponse> Client::Release(const std::string& pool,
                                                      const std::string& id) {
  v1::ReleaseReservationRequest r;
  r.set_pool(pool);
  r.set_reservation_id(id);
  return Call(&v1::KvBroker::Stub::ReleaseReservation, stub(), r);
}

Reply<v1::SetMemoryLimitResponse> Client::SetLimit(const std::string& pool,
                                                   Bytes limit,
                                                   int64_t revision) {
  v1::SetMemoryLimitRequest r;
  r.set_pool(pool);
  r.set_limit_bytes(limit.value());
  r.set_revision(revision);
  return Call(&v1::KvBroker::Stub::SetMemoryLimit, stub(), r);
}

Reply<v1::TrimResponse> Client::Trim(const std::string& pool,
                                     int64_t max_pages) {
  v1::TrimRequest r;
  r.set_pool(pool);
  r.set_max_pages(max_pages);
  return Call(&v1::KvBroker::Stub::Trim, stub(), r);
}

Reply<v1::GetPageOccupancyResponse> Client::Occupancy(
    const std::string& pool, const std::vector<int64_t>& page_ids) {
  v1::GetPageOccupancyRequest r;
  r.set_pool(pool);
  r.mutable_page_ids()->Add(page_ids.begin(), page_ids.end());
  return Call(&v1::KvBroker::Stub::GetPageOccupancy, stub(), r);
}

v1::CapacitySnapshot Client::Cap(const std::string& pool, int64_t max_pages) {
  Reply<v1::CapacityResponse> r = Capacity(pool, max_pages);
  EXPECT_TRUE(r.ok()) << r.status.error_message();
  return r->capacity();
}

v1::PoolSpec Spec(const std::string& name, Bytes page, Bytes block,
                  int64_t max_blocks) {
  v1::PoolSpec s;
  s.set_name(name);
  s.set_page_size(page.value());
  s.set_block_bytes(block.value());
  s.set_max_blocks(max_blocks);
  s.set_min_idle_pages(0);
  s.set_max_idle_pages(0);
  return s;
}

std::vector<int64_t> Ids(
    const google::protobuf::RepeatedPtrField<v1::PageBlocks>& pages) {
  std::vector<int64_t> ids;
  for (const v1::PageBlocks& p : pages) {
    ids.insert(ids.end(), p.block_ids().begin(), p.block_ids().end());
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::map<int64_t, std::vector<int64_t>> ByPage(
    const google::protobuf::RepeatedPtrField<v1::PageBlocks>& pages) {
  std::map<int64_t, std::vector<int64_t>> out;
  for (const v1::PageBlocks& p : pages) {
    out[p.page_id()].assign(p.block_ids().begin(), p.block_ids().end());
  }
  return out;
}

std::map<std::string, std::string> Metadata(const grpc::Status& status) {
  std::optional<google::rpc::ErrorInfo> info = GetErrorInfo(status);
  if (!info.has_value()) return {};
  return {info->metadata().begin(), info->metadata().end()};
}

::testing::AssertionResult IsRefusal(const grpc::Status& status,
                                     FailureReason reason) {
  if (status.ok()) {
    return ::testing::AssertionFailure()
           << "succeeded; expected " << ReasonName(reason);
  }
  const auto code = static_cast<int>(ReasonCode(reason));
  if (static_cast<int>(status.error_code()) != code) {
    return ::testing::AssertionFailure()
           << "code " << status.error_code() << " (" << status.error_message()
           << "); expected " << code << " for " << ReasonName(reason);
  }
  std::optional<google::rpc::Status> rpc = GetRpcStatus(status);
  if (!rpc.has_value() || rpc->details_size() == 0 ||
      !rpc->details(0).Is<google::rpc::ErrorInfo>()) {
    return ::testing::AssertionFailure()
           << "no google.rpc.Status with a leading ErrorInfo in the details";
  }
  if (rpc->code() != code || rpc->message() != status.error_message()) {
    return ::testing::AssertionFailure()
           << "google.rpc.Status disagrees with the gRPC status";
  }
  // Decoded as every client decodes it.
  std::optional<KvbError> e = DecodeError(status);
  if (!e.has_value() || e->reason_name != ReasonName(reason) ||
      static_cast<int>(e->reason) != static_cast<int>(reason)) {
    return ::testing::AssertionFailure()
           << "decoded reason " << (e.has_value() ? e->reason_name : "<none>")
           << "; expected " << ReasonName(reason) << " ("
           << status.error_message() << ")";
  }
  return ::testing::AssertionSuccess();
}

grpc::Status RefusedBeforeMapping(Rig& rig, FailureReason reason,
                                  const std::function<grpc::Status()>& call) {
  const int64_t before = rig.backend.map_calls();
  grpc::Status status = call();
  EXPECT_TRUE(IsRefusal(status, reason));
  EXPECT_EQ(rig.backend.map_calls(), before)
      << "the backend saw Create/Map/SetAccess during a refusal";
  return status;
}

}  // namespace testing
}  // namespace kvbroker
