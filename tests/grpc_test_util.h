// End-to-end test rig: a Daemon (the same wiring kvbrokerd uses) on a
// HostBackend wrapped in a FaultInjectingBackend, serving on 127.0.0.1:0 and
// on a Unix socket at once, plus a small client over real channels.
//
// The rig counts the backend's calls, so a test can prove that a refusal
// happened before any page was mapped, and injects faults mid-scenario. Its
// defaults are those of the acceptance scenarios (allocator/scenarios_rig.h):
// one 80 GiB device, gpu_memory_utilization 1.0, min_idle_pages =
// max_idle_pages = 0, and the broker's background worker off (tests drive
// maintenance by hand).

#ifndef KVBROKER_TESTS_GRPC_TEST_UTIL_H_
#define KVBROKER_TESTS_GRPC_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "allocator/clock.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/access.h"
#include "server/daemon.h"

namespace kvbroker {
namespace testing {

// The mode every daemon of the test serves in: $KVB_TEST_SERVER_THREADING
// ("callback" or "poller"; unset: callback). tests/server_test.bzl declares
// each gRPC test once per mode; an unknown value fails the test.
ServerThreading TestServerThreading();
// The same as a kvbrokerd flag, "--server_threading=...".
std::string TestServerThreadingFlag();

// One entry of a tokens file: a name, its bearer token and the pools it may
// use ("*" for all).
struct TokenGrant {
  std::string name;
  std::string token;
  std::vector<std::string> pools;
};

// The access policy of a tokens file holding `grants`; fails the test if the
// file is refused.
std::shared_ptr<const AccessPolicy> PolicyOf(
    const std::vector<TokenGrant>& grants);

// A fresh Unix socket path, /tmp/kvbt-XXXXXX/kvbrokerd.sock (short, and
// unique across the test processes Bazel runs in parallel); and its removal,
// directory included.
std::string NewSocketPath();
void RemoveSocketPath(const std::string& path);

// A new channel to `target` ("host:port" or "unix:path") on a connection of
// its own, already connected: a failed first attempt is retried for up to
// 30 s, then reported with ADD_FAILURE. Plaintext unless `credentials`.
std::shared_ptr<grpc::Channel> ConnectedChannel(
    const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

enum class Transport { kTcp, kUnix };
std::string TransportName(const ::testing::TestParamInfo<Transport>& info);

struct RigOptions {
  HostBackendOptions host;
  double gpu_memory_utilization = 1.0;
  int64_t min_idle_pages = 0;
  int64_t max_idle_pages = 0;
  bool start_worker = false;
  Clock* clock = nullptr;  // nullptr: the real clock
  absl::Duration drain_timeout = absl::Seconds(5);
  // DaemonOptions::tcp_credentials and ::access.
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  std::shared_ptr<const AccessPolicy> access;
  // DaemonOptions::limits and ::watch.
  ServiceLimits limits;
  ChangeFeed::Options watch;
  // DaemonOptions::sessions (ListSessions).
  std::shared_ptr<const attach::SessionDirectory> sessions;
  // BrokerOptions::between_steps and ::free_one_step_blocks.
  std::function<void()> between_steps;
  int64_t free_one_step_blocks = PoolOptions{}.free_one_step_blocks;
};

// A started daemon. Construction failures are reported with ADD_FAILURE and
// leave `daemon` null.
class Rig {
 public:
  explicit Rig(RigOptions options = {});
  ~Rig();

  // A new channel to the daemon over `transport`, already connected (a
  // failed first attempt is retried for up to 30 s).
  std::shared_ptr<grpc::Channel> Channel(Transport transport) const;

  // Leaves exactly `free` bytes of `device` unused by "other processes" and
  // refreshes the broker's view of it.
  void LeaveFree(int device, Bytes free);

  Broker* broker() { return daemon->broker(); }

  HostBackend host;
  FaultInjectingBackend backend;
  std::string unix_path;
  std::unique_ptr<Daemon> daemon;
};

// A finished unary call: its wire status and its response.
template <typename Response>
struct Reply {
  grpc::Status status;
  Response response;
  bool ok() const { return status.ok(); }
  const Response* operator->() const { return &response; }
};

// The KvBroker stub with one helper per RPC; every call has a 30 s deadline.
class Client {
 public:
  explicit Client(std::shared_ptr<grpc::Channel> channel);

  Reply<v1::CreatePoolResponse> CreatePool(const v1::PoolSpec& spec);
  Reply<v1::GetPoolResponse> GetPool(const std::string& pool);
  Reply<v1::ListPoolsResponse> ListPools();
  Reply<v1::DeletePoolResponse> DeletePool(const std::string& pool,
                                           bool force = false);
  Reply<v1::CapacityResponse> Capacity(const std::string& pool,
                                       int64_t max_pages = 0);
  Reply<v1::AllocResponse> Alloc(const std::string& pool, int64_t n,
                                 const std::string& request_id = "",
                                 const std::string& reservation_id = "");
  Reply<v1::AllocResponse> Alloc(const v1::AllocRequest& request);
  Reply<v1::FreeResponse> Free(const std::string& pool,
                               const std::vector<int64_t>& ids,
                               const std::string& request_id = "");
  Reply<v1::FreeResponse> Free(const v1::FreeRequest& request);
  Reply<v1::ReserveResponse> Reserve(const std::string& pool, int64_t n,
                                     absl::Duration ttl = absl::Seconds(30),
                                     const std::string& request_id = "");
  Reply<v1::ReleaseReservationResponse> Release(const std::string& pool,
                                                const std::string& id);
  Reply<v1::SetMemoryLimitResponse> SetLimit(const std::string& pool,
                                             Bytes limit, int64_t revision);
  Reply<v1::TrimResponse> Trim(const std::string& pool, int64_t max_pages = 0);
  Reply<v1::GetPageOccupancyResponse> Occupancy(
      const std::string& pool, const std::vector<int64_t>& page_ids);

  // Capacity that must succeed (a failure is reported and yields {}).
  v1::CapacitySnapshot Cap(const std::string& pool, int64_t max_pages = 0);

  v1::KvBroker::Stub* stub() { return stub_.get(); }

 private:
  std::unique_ptr<v1::KvBroker::Stub> stub_;
};

// A pool spec with L = K = 1, one device, and prealloc off for the pool.
v1::PoolSpec Spec(const std::string& name, Bytes page, Bytes block,
                  int64_t max_blocks);

// Every block id of a reply, ascending.
std::vector<int64_t> Ids(
    const google::protobuf::RepeatedPtrField<v1::PageBlocks>& pages);
// page_id -> block ids.
std::map<int64_t, std::vector<int64_t>> ByPage(
    const google::protobuf::RepeatedPtrField<v1::PageBlocks>& pages);

// ErrorInfo.metadata of a refusal ({} when there is none).
std::map<std::string, std::string> Metadata(const grpc::Status& status);

// Success iff `status` is the kvbroker refusal `reason` as SPEC 6 puts it on
// the wire: the reason's code, a google.rpc.Status in the details whose
// first detail is ErrorInfo{domain "kvbroker", reason}, the same code and
// message inside, and the same reason when decoded by client/error_codec.h
// (whose v1::Reason numbers equal FailureReason's).
::testing::AssertionResult IsRefusal(const grpc::Status& status,
                                     FailureReason reason);

// Runs `call` and checks that it was refused with `reason` and that the
// backend saw no Create, Map or SetAccess call meanwhile ("refused before
// mapping"). Returns the call's status.
grpc::Status RefusedBeforeMapping(Rig& rig, FailureReason reason,
                                  const std::function<grpc::Status()>& call);

}  // namespace testing
}  // namespace kvbroker

#endif  // KVBROKER_TESTS_GRPC_TEST_UTIL_H_
