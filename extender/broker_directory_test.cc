// BrokerDirectory against FakeKubeApi's pod lists: which pod serves a node,
// on which port, and what a failed relist keeps. No broker is dialled (the
// channels connect lazily).

#include "extender/broker_directory.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "extender/kube_client.h"
#include "extender/testing/fake_kube_api.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {
namespace {

using nlohmann::json;
using testing::FakeKubeApi;

json BrokerPod(const std::string& name, const std::string& node,
               const std::string& ip, const json& ports, bool ready,
               const std::string& phase = "Running",
               const std::string& created = "2026-01-01T00:00:00Z") {
  return {{"metadata",
           {{"name", name},
            {"namespace", "kvbroker"},
            {"creationTimestamp", created}}},
          {"spec",
           {{"nodeName", node},
            {"containers", {{{"name", "kvbrokerd"}, {"ports", ports}}}}}},
          {"status",
           {{"phase", phase},
            {"podIP", ip},
            {"conditions",
             {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}}}}};
}

class DirectoryTest : public ::testing::Test {
 protected:
  DirectoryTest() : api_("token-0123456789") {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string token =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/directory-token";
    std::ofstream(token) << "token-0123456789";
    KubeClientOptions options;
    options.api_server = api_.url();
    options.token_file = token;
    kube_ = KubeClient::Create(options).value();
  }

  std::unique_ptr<BrokerDirectory> Directory(
      absl::Duration min_refresh = absl::ZeroDuration()) {
    BrokerDirectoryOptions options;
    options.namespace_ = FakeKubeApi::kBrokerNamespace;
    options.label_selector = FakeKubeApi::kBrokerSelector;
    options.default_port = 7000;
    options.min_refresh_interval = min_refresh;
    return std::make_unique<BrokerDirectory>(kube_.get(), options);
  }

  FakeKubeApi api_;
  std::unique_ptr<KubeClient> kube_;
};

TEST_F(DirectoryTest, PicksTheReadyNewerPodAndItsNamedPort) {
  const json grpc_port = {{{"name", "grpc"}, {"containerPort", 50051}}};
  // node-1: an old ready pod and a newer one that is not ready yet (a
  // rolling update): the ready one serves.
  api_.AddBrokerPod(BrokerPod("old", "node-1", "10.0.0.1", grpc_port, true,
                              "Running", "2026-01-01T00:00:00Z"));
  api_.AddBrokerPod(BrokerPod("new", "node-1", "10.0.0.2", grpc_port, false,
                              "Running", "2026-01-02T00:00:00Z"));
  // node-2: two ready pods: the newer.
  api_.AddBrokerPod(BrokerPod("a", "node-2", "10.0.0.3", grpc_port, true,
                              "Running", "2026-01-01T00:00:00Z"));
  api_.AddBrokerPod(BrokerPod("b", "node-2", "10.0.0.4", grpc_port, true,
                              "Running", "2026-01-03T00:00:00Z"));
  // node-3: no port named grpc: the default port; IPv6 in brackets.
  api_.AddBrokerPod(BrokerPod("c", "node-3", "fd00::5",
                              {{{"name", "metrics"}, {"containerPort", 9400}}},
                              true));
  // node-4: pending, and node-5 without an IP: not brokers.
  api_.AddBrokerPod(
      BrokerPod("d", "node-4", "10.0.0.6", grpc_port, false, "Pending"));
  api_.AddBrokerPod(BrokerPod("e", "node-5", "", grpc_port, false));

  auto directory = Directory();
  ASSERT_TRUE(directory->Refresh().ok());
  EXPECT_EQ(directory->size(), 3u);
  EXPECT_EQ(directory->Find("node-1").value()->target, "10.0.0.1:50051");
  EXPECT_EQ(directory->Find("node-1").value()->pod, "kvbroker/old");
  EXPECT_EQ(directory->Find("node-2").value()->target, "10.0.0.4:50051");
  EXPECT_EQ(directory->Find("node-3").value()->target, "[fd00::5]:7000");
  EXPECT_EQ(directory->Find("node-4").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(directory->Find("node-5").status().message(),
            "no running kvbroker pod on node node-5");
  EXPECT_TRUE(api_.violations().empty());
}

TEST_F(DirectoryTest, AMissRelistsAndAFailedRelistKeepsTheMap) {
  const json grpc_port = {{{"name", "grpc"}, {"containerPort", 50051}}};
  api_.AddBrokerPod(BrokerPod("a", "node-1", "10.0.0.1", grpc_port, true));
  auto directory = Directory();
  ASSERT_TRUE(directory->Refresh().ok());
  std::shared_ptr<const Broker> first = directory->Find("node-1").value();
  // A new node's broker is found by the first lookup that misses.
  api_.AddBrokerPod(BrokerPod("b", "node-2", "10.0.0.2", grpc_port, true));
  EXPECT_EQ(directory->Find("node-2").value()->target, "10.0.0.2:50051");
  // Unchanged brokers keep their channel across relists.
  EXPECT_EQ(directory->Find("node-1").value(), first);
  // The API fails: the map stays.
  api_.FailBrokerList(true);
  EXPECT_EQ(directory->Refresh().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(directory->size(), 2u);
  EXPECT_EQ(directory->refresh_failures(), 1);
  EXPECT_EQ(directory->Find("node-1").value(), first);
}

// A pod as the API returns it carries hundreds of JSON values (managed
// fields, the container's spec, statuses); a cluster of a few thousand GPU
// nodes lists thousands of broker pods.
json BulkyBrokerPod(int i) {
  json pod = BrokerPod(absl::StrCat("kvbroker-", i), absl::StrCat("node-", i),
                       absl::StrCat("10.1.", i / 250, ".", i % 250),
                       {{{"name", "grpc"}, {"containerPort", 50051}}}, true);
  pod["metadata"]["managedFields"] = json(std::vector<int>(400, 0));
  return pod;
}

TEST_F(DirectoryTest, ListsBrokersInPagesThatEachFitTheParser) {
  // 1,300 pods of 400-odd values each are past the 500,000 values a reply
  // may hold (kMaxJsonValues) in one list, not in pages of 500.
  constexpr int kBrokers = 1300;
  for (int i = 0; i < kBrokers; ++i) api_.AddBrokerPod(BulkyBrokerPod(i));
  auto directory = Directory();
  absl::Status listed = directory->Refresh();
  ASSERT_TRUE(listed.ok()) << listed;
  EXPECT_EQ(directory->size(), static_cast<size_t>(kBrokers));
  EXPECT_EQ(directory->Find("node-1299").value()->target, "10.1.5.49:50051");
  EXPECT_EQ(api_.broker_list_pages(), 3);
  EXPECT_EQ(api_.largest_broker_list_page(), BrokerDirectory::kListPage);
  EXPECT_TRUE(api_.violations().empty());
}

TEST_F(DirectoryTest, AnExpiredContinueTokenStartsTheListAgain) {
  constexpr int kBrokers = 1200;
  for (int i = 0; i < kBrokers; ++i) api_.AddBrokerPod(BulkyBrokerPod(i));
  auto directory = Directory();
  // Once: the list starts over and completes.
  api_.ExpireContinueTokens(1);
  ASSERT_TRUE(directory->Refresh().ok());
  EXPECT_EQ(directory->size(), static_cast<size_t>(kBrokers));
  EXPECT_EQ(api_.broker_list_pages(), 1 + 3);
  // Every time: the relist fails and the map stays as it was.
  api_.AddBrokerPod(BulkyBrokerPod(kBrokers));
  api_.ExpireContinueTokens(1000);
  EXPECT_EQ(directory->Refresh().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(directory->size(), static_cast<size_t>(kBrokers));
  EXPECT_EQ(directory->refresh_failures(), 1);
  EXPECT_TRUE(api_.violations().empty());
}

TEST_F(DirectoryTest, ALookupWaitsForARelistOnlyUntilItsDeadline) {
  const json grpc_port = {{{"name", "grpc"}, {"containerPort", 50051}}};
  absl::Notification looked_up;  // outlives the directory's worker
  auto directory = Directory();
  ASSERT_TRUE(directory->Refresh().ok());
  api_.AddBrokerPod(BrokerPod("b", "node-2", "10.0.0.2", grpc_port, true));
  // The API holds the relist the miss asks for until the lookup is over.
  api_.OnRequest([&](const HttpRequest&) {
    looked_up.WaitForNotificationWithTimeout(absl::Seconds(10));
  });
  absl::StatusOr<std::shared_ptr<const Broker>> missed =
      directory->Find("node-2", absl::Now() + absl::Milliseconds(100));
  looked_up.Notify();
  EXPECT_EQ(missed.status().code(), absl::StatusCode::kNotFound);
  // The relist went on: a lookup without a deadline waits for it.
  EXPECT_EQ(directory->Find("node-2").value()->target, "10.0.0.2:50051");
  api_.OnRequest(nullptr);
  EXPECT_EQ(directory->refreshes(), 2);
}

TEST_F(DirectoryTest, MissesAreThrottled) {
  auto directory = Directory(absl::Hours(1));
  ASSERT_TRUE(directory->Refresh().ok());
  const int64_t lists = directory->refreshes();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(directory->Find("node-x").ok());
  EXPECT_EQ(directory->refreshes(), lists);
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker
