// Pool incarnations over real channels (SPEC 5): a pool re-created under the
// same name, in the same daemon or after a restart, has a new pool_uid and
// a generation above anything the old one reached; calls that hold blocks or
// reservations of the old incarnation are refused (POOL_NOT_FOUND, both
// uids in metadata) and change nothing. A CreatePool whose pool is deleted
// before its reply is written still reports the creation.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "allocator/failure.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

using ::testing::TestWithParam;
using ::testing::Values;

class PoolUid : public TestWithParam<Transport> {
 protected:
  void SetUp() override { Restart(); }

  // A fresh daemon, as after a restart.
  void Restart() {
    client_.reset();
    rig_.reset();
    rig_ = std::make_unique<Rig>();
    ASSERT_NE(rig_->daemon, nullptr);
    client_ = std::make_unique<Client>(rig_->Channel(GetParam()));
  }

  // Creates pool "p" and returns its uid.
  std::string Create() {
    auto r = c().CreatePool(Spec("p", MiB(2), KiB(512), 16));
    EXPECT_TRUE(r.ok()) << r.status.error_message();
    const std::string uid = r->pool().capacity().pool_uid();
    EXPECT_EQ(uid.size(), 32u) << uid;
    return uid;
  }

  void ExpectStale(const grpc::Status& s, const std::string& stale,
                   const std::string& current) {
    EXPECT_TRUE(IsRefusal(s, FailureReason::kPoolNotFound))
        << s.error_message();
    std::map<std::string, std::string> m = Metadata(s);
    EXPECT_EQ(m["expected_pool_uid"], stale);
    EXPECT_EQ(m["current_pool_uid"], current);
    EXPECT_EQ(m["pool"], "p");
  }

  Client& c() { return *client_; }

  std::unique_ptr<Rig> rig_;
  std::unique_ptr<Client> client_;
};

INSTANTIATE_TEST_SUITE_P(Transports, PoolUid,
                         Values(Transport::kTcp, Transport::kUnix),
                         TransportName);

TEST_P(PoolUid, EveryDescriptionCarriesTheUid) {
  const std::string uid = Create();
  EXPECT_EQ(c().Cap("p").pool_uid(), uid);
  EXPECT_EQ(c().GetPool("p")->pool().capacity().pool_uid(), uid);
  EXPECT_EQ(c().ListPools()->pools(0).capacity().pool_uid(), uid);
  auto a = c().Alloc("p", 2);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->pool_uid(), uid);
  auto r = c().Reserve("p", 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pool_uid(), uid);
}

TEST_P(PoolUid, AStaleFreeDoesNotFreeTheNewOwnersBlocks) {
  const std::string old_uid = Create();
  auto old_blocks = c().Alloc("p", 4);
  ASSERT_TRUE(old_blocks.ok());
  const uint64_t old_generation = c().Cap("p").generation();
  ASSERT_TRUE(c().DeletePool("p", /*force=*/true).ok());

  const std::string uid = Create();
  EXPECT_NE(uid, old_uid);
  auto blocks = c().Alloc("p", 4);
  ASSERT_TRUE(blocks.ok());
  // The same ids again: only the uid tells the owners apart.
  ASSERT_EQ(Ids(blocks->pages()), Ids(old_blocks->pages()));
  const v1::CapacitySnapshot before = c().Cap("p");
  EXPECT_GT(before.generation(), old_generation);

  v1::FreeRequest free;
  free.set_pool("p");
  for (int64_t id : Ids(old_blocks->pages())) free.add_block_ids(id);
  free.set_pool_uid(old_uid);
  {
    grpc::ClientContext ctx;
    v1::FreeResponse resp;
    ExpectStale(c().stub()->Free(&ctx, free, &resp), old_uid, uid);
  }
  v1::GetPageOccupancyRequest occupancy;
  occupancy.set_pool("p");
  occupancy.add_page_ids(0);
  occupancy.set_pool_uid(old_uid);
  {
    grpc::ClientContext ctx;
    v1::GetPageOccupancyResponse resp;
    ExpectStale(c().stub()->GetPageOccupancy(&ctx, occupancy, &resp), old_uid,
                uid);
  }
  const v1::CapacitySnapshot after = c().Cap("p");
  EXPECT_EQ(after.generation(), before.generation());
  EXPECT_EQ(after.allocated_blocks(), 4);

  // The holder of the current incarnation frees them.
  free.set_pool_uid(uid);
  grpc::ClientContext ctx;
  v1::FreeResponse resp;
  ASSERT_TRUE(c().stub()->Free(&ctx, free, &resp).ok());
  EXPECT_EQ(resp.freed_blocks(), 4);
}

TEST_P(PoolUid, AStaleReservationIsRefused) {
  const std::string old_uid = Create();
  auto reserved = c().Reserve("p", 2);
  ASSERT_TRUE(reserved.ok());
  ASSERT_TRUE(c().DeletePool("p", /*force=*/true).ok());
  const std::string uid = Create();
  auto again = c().Reserve("p", 2);
  ASSERT_TRUE(again.ok());
  const uint64_t generation = c().Cap("p").generation();

  v1::ReleaseReservationRequest release;
  release.set_pool("p");
  release.set_reservation_id(reserved->reservation_id());
  release.set_pool_uid(old_uid);
  {
    grpc::ClientContext ctx;
    v1::ReleaseReservationResponse resp;
    ExpectStale(c().stub()->ReleaseReservation(&ctx, release, &resp), old_uid,
                uid);
  }
  v1::AllocRequest alloc;
  alloc.set_pool("p");
  alloc.set_num_blocks(2);
  alloc.set_reservation_id(reserved->reservation_id());
  alloc.set_pool_uid(old_uid);
  {
    grpc::ClientContext ctx;
    v1::AllocResponse resp;
    ExpectStale(c().stub()->Alloc(&ctx, alloc, &resp), old_uid, uid);
  }
  EXPECT_EQ(c().Cap("p").generation(), generation);
  EXPECT_EQ(c().Cap("p").reserved_blocks(), 2);
}

TEST_P(PoolUid, AfterARestartTheUidIsNewAndTheGenerationHigher) {
  const std::string old_uid = Create();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(c().Alloc("p", 0, "").ok());
  for (int i = 0; i < 5; ++i) {
    auto a = c().Alloc("p", 1);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(c().Free("p", Ids(a->pages())).ok());
  }
  const uint64_t old_generation = c().Cap("p").generation();

  Restart();
  const std::string uid = Create();
  EXPECT_NE(uid, old_uid);
  EXPECT_GT(c().Cap("p").generation(), old_generation);
}

// A DeletePool that runs between the pool's publication and the CreatePool
// reply (3 in 4,798 calls under load) used to turn the reply into
// POOL_NOT_FOUND although the pool had been created. The broker's change
// hook runs exactly there, so the race is reproduced deterministically.
TEST(CreatePoolRace, ADeleteBeforeTheReplyDoesNotUndoTheAnswer) {
  HostBackend host(HostBackendOptions{});
  std::atomic<Broker*> broker{nullptr};
  std::atomic<bool> armed{false};
  BrokerOptions broker_options;
  broker_options.start_worker = false;
  broker_options.min_idle_pages = 0;
  broker_options.max_idle_pages = 0;
  broker_options.on_change = [&](const std::string& pool) {
    if (pool.empty() && armed.exchange(false)) {
      ASSERT_TRUE(broker.load()->DeletePool("racy", /*force=*/true).ok());
    }
  };
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.threading = TestServerThreading();
  absl::StatusOr<std::unique_ptr<Daemon>> daemon =
      Daemon::Create(&host, broker_options, options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_TRUE((*daemon)->Start().ok());
  broker = (*daemon)->broker();
  Client c(ConnectedChannel((*daemon)->tcp_address()));

  armed = true;
  auto created = c.CreatePool(Spec("racy", MiB(2), KiB(512), 16));
  ASSERT_TRUE(created.ok()) << created.status.error_message();
  EXPECT_FALSE(armed.load()) << "the delete ran";
  EXPECT_EQ(created->pool().spec().name(), "racy");
  EXPECT_EQ(created->pool().capacity().available_blocks(), 16);
  EXPECT_EQ(created->pool().capacity().pool_uid().size(), 32u);
  EXPECT_TRUE(
      IsRefusal(c.Capacity("racy").status, FailureReason::kPoolNotFound));
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
