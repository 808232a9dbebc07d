// The fixture and helpers shared by the acceptance scenarios over gRPC
// (tests/grpc_scenarios_test.cc: geometry, capacity, budget, rollback,
// arguments; grpc_scenarios_limits_test.cc: memory limits and the pool
// lifecycle's refusals). One binary, grpc_scenarios_test; the suite is
// instantiated once per transport in grpc_scenarios_test.cc.

#ifndef KVBROKER_TESTS_GRPC_SCENARIOS_FIXTURE_H_
#define KVBROKER_TESTS_GRPC_SCENARIOS_FIXTURE_H_

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/clock.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/units.h"
#include "client/error_codec.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/grpc_test_util.h"

namespace kvbroker::testing {

using ::testing::TestWithParam;
using ::testing::Values;
using Groups = std::map<int64_t, std::vector<int64_t>>;
using IdList = std::vector<int64_t>;

class GrpcScenarios : public TestWithParam<Transport> {
 protected:
  // Starts the daemon; tests that need other settings call it themselves.
  void Start(RigOptions options = {}) {
    rig_ = std::make_unique<Rig>(options);
    ASSERT_NE(rig_->daemon, nullptr);
    client_ = std::make_unique<Client>(rig_->Channel(GetParam()));
  }

  // Creates a pool that must succeed.
  void Create(const v1::PoolSpec& spec) {
    Reply<v1::CreatePoolResponse> r = client_->CreatePool(spec);
    ASSERT_TRUE(r.ok()) << r.status.error_message();
  }

  Rig& rig() { return *rig_; }
  Client& c() { return *client_; }

  std::unique_ptr<Rig> rig_;
  std::unique_ptr<Client> client_;
};

#define ASSERT_REPLY_OK(reply) \
  ASSERT_TRUE((reply).ok()) << (reply).status.error_message()

// C1's pool: 14 MiB pages, 6 MiB blocks, 5 block ids (3 usable).
inline v1::PoolSpec C1() { return Spec("c1", MiB(14), MiB(6), 5); }

// A pool of ten 1 MiB blocks on 2 MiB pages.
inline v1::PoolSpec Ten() { return Spec("ten", MiB(2), MiB(1), 10); }

// What the client can observe of a pool, for before/after comparisons.
inline std::string Observable(const v1::CapacitySnapshot& cap) {
  v1::CapacitySnapshot copy = cap;
  copy.clear_devices();  // refresh counters move on a mapping failure
  return copy.SerializeAsString();
}

}  // namespace kvbroker::testing

#endif  // KVBROKER_TESTS_GRPC_SCENARIOS_FIXTURE_H_
