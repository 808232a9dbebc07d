// Draining under load (SPEC 9): while the daemon drains, a call already
// running finishes (OK) and a call that arrives gets a typed DRAINING
// refusal (UNAVAILABLE with RetryInfo), never CANCELLED.
//
// A backend whose Map blocks until the test releases it holds an Alloc in
// flight for as long as the test needs, so the order of events is fixed.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/backend.h"
#include "allocator/failure.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "proto/google/rpc/error_details.pb.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/daemon.h"
#include "server/status_convert.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

// The host backend, except that Map waits while the gate is held.
class GatedBackend final : public Backend {
 public:
  GatedBackend() : host_(HostBackendOptions{}) {}

  void Hold() { held_ = std::make_unique<absl::Notification>(); }
  void Release() { held_->Notify(); }
  // Blocks until a Map call is waiting at the gate.
  void AwaitMapWaiting() { map_waiting_.WaitForNotification(); }

  std::string name() const override { return host_.name(); }
  int device_count() const override { return host_.device_count(); }
  Bytes granularity(int device) const override {
    return host_.granularity(device);
  }
  absl::StatusOr<VirtualRange> ReserveRange(int device, Bytes size) override {
    return host_.ReserveRange(device, size);
  }
  absl::Status FreeRange(int device, VirtualRange range) override {
    return host_.FreeRange(device, range);
  }
  absl::StatusOr<PhysicalHandle> Create(int device, Bytes size) override {
    return host_.Create(device, size);
  }
  absl::Status Map(int device, uint64_t address, Bytes size,
                   PhysicalHandle handle) override {
    if (held_ != nullptr) {
      if (!map_waiting_.HasBeenNotified()) map_waiting_.Notify();
      held_->WaitForNotification();
    }
    return host_.Map(device, address, size, handle);
  }
  absl::Status SetAccess(int device, uint64_t address, Bytes size) override {
    return host_.SetAccess(device, address, size);
  }
  absl::Status Unmap(int device, uint64_t address, Bytes size) override {
    return host_.Unmap(device, address, size);
  }
  absl::Status Release(int device, PhysicalHandle handle) override {
    return host_.Release(device, handle);
  }
  absl::StatusOr<MemoryInfo> QueryMemory(int device) override {
    return host_.QueryMemory(device);
  }

 private:
  HostBackend host_;
  std::unique_ptr<absl::Notification> held_;
  absl::Notification map_waiting_;
};

TEST(Drain, InFlightCallsFinishAndArrivingCallsGetDraining) {
  GatedBackend backend;
  BrokerOptions broker_options;
  broker_options.start_worker = false;
  broker_options.min_idle_pages = 0;
  broker_options.max_idle_pages = 0;
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.threading = TestServerThreading();
  options.drain_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Daemon>> daemon =
      Daemon::Create(&backend, broker_options, options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_TRUE((*daemon)->Start().ok());
  auto channel = ConnectedChannel((*daemon)->tcp_address());
  Client c(channel);
  ASSERT_TRUE(c.CreatePool(Spec("p", MiB(2), KiB(512), 16)).ok());
  // The Alloc below holds p's lock while it maps; the test probes q.
  ASSERT_TRUE(c.CreatePool(Spec("q", MiB(2), KiB(512), 16)).ok());

  // An Alloc that must map a page: it waits inside the pool.
  backend.Hold();
  Reply<v1::AllocResponse> in_flight;
  std::thread alloc([&] { in_flight = c.Alloc("p", 4); });
  backend.AwaitMapWaiting();

  std::thread drain([&] { (*daemon)->Drain(); });
  // Calls arriving now: answered until the drain starts, then DRAINING.
  grpc::Status refused;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    refused = c.Capacity("q").status;
    if (!refused.ok()) break;
  }
  EXPECT_TRUE(IsRefusal(refused, FailureReason::kDraining))
      << refused.error_code() << " " << refused.error_message();
  std::optional<google::rpc::RetryInfo> retry =
      GetDetail<google::rpc::RetryInfo>(refused);
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->retry_delay().seconds(), 1);
  EXPECT_TRUE(IsRefusal(c.Alloc("q", 1).status, FailureReason::kDraining));

  // The call in flight completes normally.
  backend.Release();
  alloc.join();
  ASSERT_TRUE(in_flight.ok()) << in_flight.status.error_code() << " "
                              << in_flight.status.error_message();
  EXPECT_EQ(in_flight->num_blocks(), 4);
  drain.join();
  daemon->reset();
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
