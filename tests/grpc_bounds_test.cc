// Request bounds and reply sizes over real channels (SPEC 9): every
// caller-given string and list past its documented bound is refused with
// INVALID_ARGUMENT and changes nothing; a reply that could exceed gRPC's
// default 4 MiB message size is refused before anything is allocated; an
// error never grows past what a default client can receive.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/status_convert.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

using ::testing::TestWithParam;
using ::testing::Values;

class GrpcBounds : public TestWithParam<Transport> {
 protected:
  void SetUp() override {
    rig_ = std::make_unique<Rig>();
    ASSERT_NE(rig_->daemon, nullptr);
    client_ = std::make_unique<Client>(rig_->Channel(GetParam()));
    ASSERT_TRUE(c().CreatePool(Spec("p", MiB(2), KiB(512), 16)).ok());
  }

  Client& c() { return *client_; }

  // The refusal is INVALID_ARGUMENT naming `field`, with a small error.
  void ExpectTooLong(const grpc::Status& status, const std::string& field) {
    EXPECT_TRUE(IsRefusal(status, FailureReason::kInvalidArgument))
        << status.error_code() << " " << status.error_message().substr(0, 200);
    EXPECT_EQ(Metadata(status)["field"], field);
    EXPECT_LE(status.error_details().size(), kMaxErrorDetailsBytes);
    EXPECT_LE(status.error_message().size(), kMaxErrorMessageBytes + 32);
  }

  // Nothing changed in pool "p".
  void ExpectUnchanged(uint64_t generation) {
    const v1::CapacitySnapshot cap = c().Cap("p");
    EXPECT_EQ(cap.generation(), generation);
    EXPECT_EQ(cap.allocated_blocks(), 0);
    EXPECT_EQ(cap.reserved_blocks(), 0);
  }

  std::unique_ptr<Rig> rig_;
  std::unique_ptr<Client> client_;
};

INSTANTIATE_TEST_SUITE_P(Transports, GrpcBounds,
                         Values(Transport::kTcp, Transport::kUnix),
                         TransportName);

TEST_P(GrpcBounds, RequestIdsAreBounded) {
  const uint64_t generation = c().Cap("p").generation();
  // 1 MiB ids used to be remembered by the idempotency window, each.
  auto r = c().Alloc("p", 1, std::string(1 << 20, 'r'));
  ExpectTooLong(r.status, "request_id");
  EXPECT_EQ(Metadata(r.status)["length_bytes"], "1048576");
  EXPECT_EQ(Metadata(r.status)["max_bytes"], "256");
  ExpectTooLong(c().Free("p", {0}, std::string(257, 'r')).status, "request_id");
  ExpectTooLong(
      c().Reserve("p", 1, absl::Seconds(30), std::string(257, 'r')).status,
      "request_id");
  ExpectUnchanged(generation);
  // At the bound: accepted.
  auto ok = c().Alloc("p", 1, std::string(256, 'r'));
  ASSERT_TRUE(ok.ok()) << ok.status.error_message();
  EXPECT_EQ(ok->num_blocks(), 1);
}

TEST_P(GrpcBounds, PoolNamesAndReservationIdsAreBounded) {
  const uint64_t generation = c().Cap("p").generation();
  const std::string name(100000, 'n');
  // Past ~1,500 characters the echoed name used to overflow the client's
  // metadata limit: RESOURCE_EXHAUSTED instead of the typed reason.
  ExpectTooLong(c().Capacity(name).status, "pool");
  ExpectTooLong(c().GetPool(name).status, "pool");
  ExpectTooLong(c().DeletePool(name).status, "pool");
  ExpectTooLong(c().Alloc(name, 1).status, "pool");
  ExpectTooLong(c().Trim(name).status, "pool");
  ExpectTooLong(c().SetLimit(name, MiB(2), 1).status, "pool");
  ExpectTooLong(c().Occupancy(name, {0}).status, "pool");
  ExpectTooLong(c().CreatePool(Spec(name, MiB(2), KiB(512), 16)).status,
                "pool.name");
  ExpectTooLong(c().Release("p", std::string(129, 'x')).status,
                "reservation_id");
  ExpectTooLong(c().Alloc("p", 1, "", std::string(129, 'x')).status,
                "reservation_id");
  EXPECT_TRUE(IsRefusal(c().Capacity(std::string(128, 'n')).status,
                        FailureReason::kPoolNotFound));
  ExpectUnchanged(generation);
}

TEST_P(GrpcBounds, ListsAreBounded) {
  const uint64_t generation = c().Cap("p").generation();
  ExpectTooLong(c().Free("p", std::vector<int64_t>((1 << 20) + 1, 0)).status,
                "block_ids");
  ExpectTooLong(c().Occupancy("p", std::vector<int64_t>(65537, 0)).status,
                "page_ids");
  // The page list's bound is the daemon's --max_page_list (4096 here).
  ExpectTooLong(c().Capacity("p", 4097).status, "max_pages");
  EXPECT_TRUE(c().Capacity("p", 4096).ok());

  // 100,000 bad devices took 4.7 s and a 10.7 MB error.
  v1::PoolSpec spec = Spec("many", MiB(2), KiB(512), 16);
  for (int i = 0; i < 100000; ++i) spec.add_devices(1000 + i);
  auto created = c().CreatePool(spec);
  ExpectTooLong(created.status, "pool.devices");
  EXPECT_EQ(Metadata(created.status)["max_entries"], "16");
  ExpectUnchanged(generation);
  EXPECT_EQ(c().ListPools()->pools_size(), 1);
}

// Block runs over gRPC: an Alloc that asks for them is answered with one
// (first, count) pair per stretch of consecutive ids; a Free naming runs beside
// ids frees both, and runs that are malformed or name more blocks than a
// call may free are refused with nothing freed.
TEST_P(GrpcBounds, BlockRunsAreExpandedWithinTheBound) {
  v1::AllocRequest alloc;
  alloc.set_pool("p");
  alloc.set_num_blocks(6);
  alloc.set_block_runs(true);
  auto got = c().Alloc(alloc);
  ASSERT_TRUE(got.ok()) << got.status.error_message();
  // 4 blocks per page: page 0 whole and 2 of page 1, as one run.
  EXPECT_EQ(got->pages_size(), 0);
  EXPECT_EQ(got->num_blocks(), 6);
  EXPECT_EQ(std::vector<int64_t>(got->block_runs().begin(),
                                 got->block_runs().end()),
            (std::vector<int64_t>{0, 6}));
  const uint64_t generation = c().Cap("p").generation();

  auto free_of = [](std::vector<int64_t> ids, std::vector<int64_t> runs) {
    v1::FreeRequest r;
    r.set_pool("p");
    r.mutable_block_ids()->Add(ids.begin(), ids.end());
    r.mutable_block_runs()->Add(runs.begin(), runs.end());
    return r;
  };
  auto refused_as = [&](const v1::FreeRequest& r, FailureReason reason) {
    auto reply = c().Free(r);
    EXPECT_TRUE(IsRefusal(reply.status, reason))
        << reply.status.error_code() << " " << reply.status.error_message();
    return Metadata(reply.status)["field"];
  };
  EXPECT_EQ(refused_as(free_of({}, {0, 2, 4}), FailureReason::kInvalidArgument),
            "block_runs");
  EXPECT_EQ(refused_as(free_of({}, {0, 0}), FailureReason::kInvalidArgument),
            "block_runs");
  EXPECT_EQ(refused_as(free_of({5}, {0, 1 << 20}),
                       FailureReason::kInvalidArgument),
            "block_runs");
  ExpectTooLong(
      c().Free(free_of({}, std::vector<int64_t>((2 << 20) + 2, 1))).status,
      "block_runs");
  refused_as(free_of({0}, {0, 2}), FailureReason::kInvalidArgument);
  refused_as(free_of({}, {0, 7}), FailureReason::kBlockNotAllocated);
  const v1::CapacitySnapshot unchanged = c().Cap("p");
  EXPECT_EQ(unchanged.generation(), generation);
  EXPECT_EQ(unchanged.allocated_blocks(), 6);

  auto freed = c().Free(free_of({5}, {0, 3, 3, 2}));
  ASSERT_TRUE(freed.ok()) << freed.status.error_message();
  EXPECT_EQ(freed->freed_blocks(), 6);
  ExpectUnchanged(c().Cap("p").generation());
}

TEST_P(GrpcBounds, ReservationTtlIsBounded) {
  const uint64_t generation = c().Cap("p").generation();
  v1::ReserveRequest r;
  r.set_pool("p");
  r.set_num_blocks(2);
  r.mutable_ttl()->set_seconds(INT64_MAX);
  for (auto [seconds, nanos] : std::vector<std::pair<int64_t, int32_t>>{
           {INT64_MAX, 0}, {86400, 1}, {86401, 0}, {1, -5}, {0, 1000000000}}) {
    r.mutable_ttl()->set_seconds(seconds);
    r.mutable_ttl()->set_nanos(nanos);
    grpc::ClientContext ctx;
    v1::ReserveResponse resp;
    ExpectTooLong(c().stub()->Reserve(&ctx, r, &resp), "ttl");
  }
  ExpectUnchanged(generation);

  // At the bound: a valid expiry a day away.
  r.mutable_ttl()->set_seconds(86400);
  r.mutable_ttl()->set_nanos(0);
  grpc::ClientContext ctx;
  v1::ReserveResponse resp;
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  ASSERT_TRUE(c().stub()->Reserve(&ctx, r, &resp).ok());
  EXPECT_GE(resp.expire_time().nanos(), 0);
  EXPECT_LT(resp.expire_time().nanos(), 1000000000);
  EXPECT_GE(resp.expire_time().seconds(), now + 86400);
  EXPECT_LE(resp.expire_time().seconds(), now + 86400 + 60);
}

TEST_P(GrpcBounds, AReplyThatCouldNotFitIsRefusedBeforeAnyChange) {
  // 2-byte blocks: 1,048,576 per 2 MiB page, 2,000,000 blocks on 2 pages.
  // Each id needs 3 bytes, so Alloc(1,500,000) answers ~4.5 MB.
  ASSERT_TRUE(c().CreatePool(Spec("tiny", MiB(2), Bytes(2), 2000000)).ok());
  const uint64_t generation = c().Cap("tiny").generation();
  const int64_t maps = rig_->backend.map_calls();

  auto r = c().Alloc("tiny", 1500000);
  ExpectTooLong(r.status, "num_blocks");
  // 512 + 3 n + 2 pages * 14 <= 4 MiB.
  EXPECT_EQ(Metadata(r.status)["max_blocks_per_call"], "1397921");
  ExpectTooLong(c().Reserve("tiny", 1500000).status, "num_blocks");
  EXPECT_EQ(rig_->backend.map_calls(), maps);
  const v1::CapacitySnapshot cap = c().Cap("tiny");
  EXPECT_EQ(cap.generation(), generation);
  EXPECT_EQ(cap.allocated_blocks(), 0);
  EXPECT_EQ(cap.pages().free_pages(), 2);

  // The largest allowed call is answered in full by a default client.
  auto most = c().Alloc("tiny", 1397921);
  ASSERT_TRUE(most.ok()) << most.status.error_message();
  EXPECT_EQ(most->num_blocks(), 1397921);
  EXPECT_EQ(Ids(most->pages()).size(), 1397921u);
  EXPECT_LE(most->ByteSizeLong(), 4u * 1024 * 1024);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
