// Every row of the product's acceptance scenarios, driven over gRPC: a
// daemon serving on 127.0.0.1:0 and on a Unix socket, each test run once per
// transport over a real channel. Refusals are checked as they arrive on the
// wire (the code, google.rpc.Status with ErrorInfo{domain "kvbroker", reason,
// metadata}) and "refused" means no Create/Map/SetAccess reached the backend
// during the call (the rig's FaultInjectingBackend counts them). This file
// holds geometry, capacity, budget, rollback and arguments;
// grpc_scenarios_limits_test.cc the memory limits and the pool lifecycle.
//
// The allocator's own C++ test of the same rows is
// allocator/scenarios_*test.cc; these prove the service carries them through
// unchanged.

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
#include "tests/grpc_scenarios_fixture.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Transports, GrpcScenarios,
                         Values(Transport::kTcp, Transport::kUnix),
                         TransportName);

// ===========================================================================
// Geometry

TEST_P(GrpcScenarios, G1_RangesOfFourteenMiBPagesAndSixMiBBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("g1", MiB(14), MiB(6), 15)));
  EXPECT_EQ(c().Cap("g1").available_blocks(), 11);
  auto r = c().Alloc("g1", 11);
  ASSERT_REPLY_OK(r);
  Groups g = ByPage(r->pages());
  EXPECT_EQ(g[0], (IdList{0, 1}));
  EXPECT_EQ(g[1], (IdList{3}));
  EXPECT_EQ(g[2], (IdList{5, 6}));
  EXPECT_EQ(g[3], (IdList{7, 8}));
  const IdList ids = Ids(r->pages());
  for (int64_t never : {2, 4, 9}) {
    EXPECT_EQ(std::count(ids.begin(), ids.end(), never), 0) << never;
  }
}

TEST_P(GrpcScenarios, G2_RangesOfSevenHundredSixtyEightKiBBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("g2", MiB(2), KiB(768), 16)));
  const int64_t all = c().Cap("g2").available_blocks();
  auto r = c().Alloc("g2", all);
  ASSERT_REPLY_OK(r);
  Groups g = ByPage(r->pages());
  EXPECT_EQ(g[0], (IdList{0, 1}));
  EXPECT_EQ(g[1], (IdList{3, 4}));
  EXPECT_EQ(g[2], (IdList{6, 7}));
  EXPECT_EQ(g[3], (IdList{8, 9}));
}

TEST_P(GrpcScenarios, G3_PagesOneAndFourHoldNoBlock) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("g3", MiB(2), KiB(1536), 8)));
  v1::CapacitySnapshot cap = c().Cap("g3");
  EXPECT_EQ(cap.pages().empty_pages(), 2);
  EXPECT_EQ(cap.available_blocks(), 4);
  auto r = c().Alloc("g3", 4);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(ByPage(r->pages()),
            (Groups{{0, {0}}, {2, {3}}, {3, {4}}, {5, {7}}}));
}

TEST_P(GrpcScenarios, G4_BlockLargerThanPageNamesFourMiB) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto r = c().CreatePool(Spec("g4", MiB(2), MiB(3), 8));
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kInvalidGeometry));
  EXPECT_EQ(Metadata(r.status)["min_page_size_bytes"], "4194304");
  EXPECT_TRUE(absl::StrContains(r.status.error_message(), "4 MiB"))
      << r.status.error_message();
  std::optional<google::rpc::BadRequest> bad =
      GetDetail<google::rpc::BadRequest>(r.status);
  ASSERT_TRUE(bad.has_value());
  ASSERT_GE(bad->field_violations_size(), 1);
  EXPECT_EQ(bad->field_violations(0).field(), "page_size");
  EXPECT_EQ(c().ListPools()->pools_size(), 0);
}

TEST_P(GrpcScenarios, G5_LastPageClippedKeepsBlockFour) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("g5", MiB(2), MiB(1), 5)));
  EXPECT_EQ(c().Cap("g5").available_blocks(), 5);
  auto r = c().Alloc("g5", 5);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(ByPage(r->pages())[2], (IdList{4}));
}

TEST_P(GrpcScenarios, G6_PageNotAMultipleOfTheGranularity) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto r = c().CreatePool(Spec("g6", MiB(3), MiB(1), 8));
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kInvalidGeometry));
  EXPECT_EQ(Metadata(r.status)["granularity_bytes"], "2097152");
}

// ===========================================================================
// Capacity and refusal before mapping


TEST_P(GrpcScenarios, C1_CapacityCountsOnlyWholeBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  v1::CapacitySnapshot cap = c().Cap("c1");
  EXPECT_EQ(cap.available_blocks(), 3);
  EXPECT_EQ(cap.total_blocks(), 3);
  EXPECT_EQ(cap.pages().empty_pages(), 1);
  EXPECT_EQ(cap.mapped_bytes(), 0);
}

TEST_P(GrpcScenarios, C2_AllocFourRefusedRequestTooLarge) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kRequestTooLarge,
                           [&] { return c().Alloc("c1", 4).status; });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  auto md = Metadata(s);
  EXPECT_EQ(md["requested_blocks"], "4");
  EXPECT_EQ(md["pool_total_blocks"], "3");
  EXPECT_EQ(md["pool"], "c1");
  std::optional<google::rpc::QuotaFailure> quota =
      GetDetail<google::rpc::QuotaFailure>(s);
  ASSERT_TRUE(quota.has_value());
  EXPECT_EQ(quota->violations(0).subject(), "pool:c1");
}

TEST_P(GrpcScenarios, C3_AllocThreeGroupsByPage) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  const int64_t creates = rig().backend.calls(BackendOp::kCreate);
  auto r = c().Alloc("c1", 3);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(ByPage(r->pages()), (Groups{{0, {0, 1}}, {1, {3}}}));
  EXPECT_EQ(r->num_blocks(), 3);
  EXPECT_EQ(r->pages_mapped(), 2);
  EXPECT_EQ(rig().backend.calls(BackendOp::kCreate) - creates, 2);
}

TEST_P(GrpcScenarios, C4_NullBlockIsNeverHandedOut) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = C1();
  spec.set_reserve_null_block(true);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  EXPECT_EQ(c().Cap("c1").available_blocks(), 2);
  RefusedBeforeMapping(rig(), FailureReason::kRequestTooLarge,
                       [&] { return c().Alloc("c1", 3).status; });
  auto r = c().Alloc("c1", 2);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{1, 3}));
}

TEST_P(GrpcScenarios, C5_FreedPageLeavesOneAvailable) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  ASSERT_REPLY_OK(c().Alloc("c1", 3));
  ASSERT_REPLY_OK(c().Free("c1", {3}));
  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kPoolExhausted,
                           [&] { return c().Alloc("c1", 2).status; });
  EXPECT_EQ(Metadata(s)["available_blocks"], "1");
  EXPECT_EQ(Metadata(s)["requested_blocks"], "2");
}

TEST_P(GrpcScenarios, C6_SevenBlocksCountFive) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("c6", MiB(14), MiB(6), 7)));
  EXPECT_EQ(c().Cap("c6").available_blocks(), 5);
  auto r = c().Alloc("c6", 5);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{0, 1, 3, 5, 6}));
}

v1::PoolSpec C7() { return Spec("c7", MiB(2), KiB(1536), 8); }

TEST_P(GrpcScenarios, C7_EmptyPagesAreNeverMapped) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C7()));
  EXPECT_EQ(c().Cap("c7").available_blocks(), 4);
  const int64_t creates = rig().backend.calls(BackendOp::kCreate);
  auto r = c().Alloc("c7", 4);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{0, 3, 4, 7}));
  EXPECT_EQ(r->pages_mapped(), 4);
  EXPECT_EQ(rig().backend.calls(BackendOp::kCreate) - creates, 4);
  auto occupancy = c().Occupancy("c7", {0, 1, 2, 3, 4, 5});
  ASSERT_REPLY_OK(occupancy);
  EXPECT_EQ(occupancy->pages(1).state(), v1::PAGE_STATE_EMPTY);
  EXPECT_EQ(occupancy->pages(4).state(), v1::PAGE_STATE_EMPTY);
  EXPECT_EQ(occupancy->pages(0).allocated_blocks(), 1);

  ASSERT_REPLY_OK(c().Free("c7", Ids(r->pages())));
  v1::CapacitySnapshot cap = c().Cap("c7");
  EXPECT_EQ(cap.pages().open_pages() + cap.pages().full_pages(), 0);
  EXPECT_EQ(cap.allocated_blocks(), 0);
  EXPECT_EQ(cap.available_blocks(), 4);
}

TEST_P(GrpcScenarios, C8_AllocFiveRefusedRequestTooLarge) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C7()));
  RefusedBeforeMapping(rig(), FailureReason::kRequestTooLarge,
                       [&] { return c().Alloc("c7", 5).status; });
}

TEST_P(GrpcScenarios, C9_SevenHundredSixtyEightKiBBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("c9", MiB(2), KiB(768), 8)));
  EXPECT_EQ(c().Cap("c9").available_blocks(), 6);
  auto r = c().Alloc("c9", 6);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{0, 1, 3, 4, 6, 7}));
}

TEST_P(GrpcScenarios, C10_EightMiBPagesSixMiBBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("c10", MiB(8), MiB(6), 6)));
  EXPECT_EQ(c().Cap("c10").available_blocks(), 3);
  auto r = c().Alloc("c10", 3);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{0, 3, 4}));
}

TEST_P(GrpcScenarios, C11_CapacityFollowsConsumptionOrderAndBudget) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = Spec("c11", MiB(14), MiB(6), 15);
  spec.set_max_idle_pages(2);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  // Map all 7 pages; free page 5, then 4, then the rest: IDLE [5, 4], FREE
  // [0, 1, 2, 3, 6].
  auto all = c().Alloc("c11", 11);
  ASSERT_REPLY_OK(all);
  ASSERT_EQ(all->pages_mapped(), 7);
  ASSERT_REPLY_OK(c().Free("c11", {12, 13}));
  ASSERT_REPLY_OK(c().Free("c11", {10}));
  ASSERT_REPLY_OK(c().Free("c11", {0, 1, 3, 5, 6, 7, 8, 14}));
  ASSERT_EQ(rig().host.live_handles(), 2);
  // One more bundle affordable (and 13 MiB that buys nothing).
  rig().LeaveFree(0, MiB(14 + 13));

  v1::CapacitySnapshot cap = c().Cap("c11", 10);
  EXPECT_EQ(cap.affordable_bundles(), 1);
  EXPECT_EQ(cap.available_blocks(), 2 + 1 + 2);
  std::vector<std::pair<int64_t, v1::PageState>> order;
  std::vector<bool> counted;
  for (const v1::PageInfo& p : cap.page_list()) {
    order.push_back({p.page_id(), p.state()});
    counted.push_back(p.counted());
  }
  EXPECT_EQ(order, (std::vector<std::pair<int64_t, v1::PageState>>{
                       {5, v1::PAGE_STATE_IDLE},
                       {4, v1::PAGE_STATE_IDLE},
                       {0, v1::PAGE_STATE_FREE},
                       {1, v1::PAGE_STATE_FREE},
                       {2, v1::PAGE_STATE_FREE},
                       {3, v1::PAGE_STATE_FREE},
                       {6, v1::PAGE_STATE_FREE}}));
  EXPECT_EQ(counted,
            (std::vector<bool>{true, true, true, false, false, false, false}));
  // The per-page list is capped at the caller's length.
  EXPECT_EQ(c().Cap("c11", 3).page_list_size(), 3);

  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kGpuMemoryExhausted,
                           [&] { return c().Alloc("c11", 6).status; });
  EXPECT_EQ(Metadata(s)["available_blocks"], "5");
  EXPECT_TRUE(GetDetail<google::rpc::RetryInfo>(s).has_value());
  auto r = c().Alloc("c11", 5);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{0, 1, 10, 12, 13}));
}

TEST_P(GrpcScenarios, C12_BudgetOfThreeBundles) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("c12", MiB(2), MiB(1), 20)));
  rig().LeaveFree(0, MiB(6));
  EXPECT_EQ(c().Cap("c12").available_blocks(), 6);
  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kGpuMemoryExhausted,
                           [&] { return c().Alloc("c12", 7).status; });
  EXPECT_EQ(Metadata(s)["available_blocks"], "6");
  EXPECT_EQ(Metadata(s)["requested_blocks"], "7");
}

TEST_P(GrpcScenarios, C13_SixteenKiBBlocksSixtyFiveThousand) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("c13", MiB(2), KiB(16), 65536)));
  EXPECT_EQ(c().Cap("c13").available_blocks(), 65536);
  auto r = c().Alloc("c13", 256);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(c().Cap("c13").available_blocks(), 65280);
  ASSERT_REPLY_OK(c().Free("c13", Ids(r->pages())));
  EXPECT_EQ(c().Cap("c13").available_blocks(), 65536);
}

bool IsCapacityRefusal(const grpc::Status& s) {
  for (FailureReason r :
       {FailureReason::kPoolExhausted, FailureReason::kGpuMemoryExhausted,
        FailureReason::kShrinkPending, FailureReason::kRequestTooLarge}) {
    if (IsRefusal(s, r)) return true;
  }
  return false;
}

TEST_P(GrpcScenarios, C14_CapacityIsExactAfterEveryStep) {
  RigOptions options;
  options.host.device_total = MiB(96);  // the budget runs out sometimes
  ASSERT_NO_FATAL_FAILURE(Start(options));
  std::mt19937_64 rng(GetParam() == Transport::kTcp ? 14 : 41);
  const int64_t kPages[] = {2, 4, 6, 14};
  const int64_t kBlocksKiB[] = {512, 768, 1024, 1536, 2048, 6144};
  for (int round = 0; round < 4; ++round) {
    const std::string name = absl::StrCat("c14-", round);
    const Bytes page = MiB(kPages[rng() % 4]);
    Bytes block = KiB(kBlocksKiB[rng() % 6]);
    if (block > page) block = page;
    v1::PoolSpec spec = Spec(name, page, block, 8 + rng() % 40);
    spec.set_max_idle_pages(rng() % 3);
    ASSERT_NO_FATAL_FAILURE(Create(spec));
    std::vector<int64_t> held;
    std::vector<std::string> reservations;
    int64_t revision = 0;
    for (int step = 0; step < 30; ++step) {
      const int op = rng() % 6;
      const int64_t avail = c().Cap(name).available_blocks();
      if (op == 0 || op == 1) {
        auto r = c().Alloc(name, avail == 0 ? 0 : 1 + rng() % avail);
        ASSERT_REPLY_OK(r);
        for (int64_t id : Ids(r->pages())) held.push_back(id);
      } else if (op == 2 && !held.empty()) {
        std::shuffle(held.begin(), held.end(), rng);
        const size_t n = 1 + rng() % held.size();
        std::vector<int64_t> ids(held.end() - n, held.end());
        held.resize(held.size() - n);
        ASSERT_REPLY_OK(c().Free(name, ids));
      } else if (op == 3 && avail > 0) {
        auto r = c().Reserve(name, 1 + rng() % avail);
        ASSERT_REPLY_OK(r);
        reservations.push_back(r->reservation_id());
      } else if (op == 4 && !reservations.empty()) {
        ASSERT_REPLY_OK(c().Release(name, reservations.back()));
        reservations.pop_back();
      } else if (op == 5) {
        const int64_t bundle = page.value();
        auto r = c().SetLimit(name, Bytes(bundle * (rng() % 8)), ++revision);
        ASSERT_REPLY_OK(r);
        if (rng() % 2) {
          ASSERT_REPLY_OK(c().Trim(name));
        }
      }
      // The contract: Alloc(c + 1) is refused before mapping, Alloc(c)
      // succeeds.
      const int64_t cap = c().Cap(name).available_blocks();
      const int64_t maps = rig().backend.map_calls();
      grpc::Status over = c().Alloc(name, cap + 1).status;
      EXPECT_TRUE(IsCapacityRefusal(over))
          << "step " << step << ": " << over.error_message();
      EXPECT_EQ(rig().backend.map_calls(), maps) << "step " << step;
      auto exact = c().Alloc(name, cap);
      ASSERT_REPLY_OK(exact) << " step " << step;
      if (cap > 0) {
        ASSERT_REPLY_OK(c().Free(name, Ids(exact->pages())));
      }
    }
    ASSERT_REPLY_OK(c().DeletePool(name, /*force=*/true));
  }
}

// ===========================================================================
// Physical budget

TEST_P(GrpcScenarios, P1_FortyEightBundlesAffordable) {
  RigOptions options;
  options.gpu_memory_utilization = 0.95;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  v1::PoolSpec spec = Spec("p1", MiB(2), MiB(2), 100);
  spec.set_num_layers(32);
  spec.set_num_kv_buffers(2);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  rig().LeaveFree(0, Bytes(10 * kGiB));
  v1::CapacitySnapshot cap = c().Cap("p1");
  EXPECT_EQ(cap.affordable_bundles(), 48);
  EXPECT_EQ(cap.available_blocks(), 48);
  ASSERT_EQ(cap.devices_size(), 1);
  EXPECT_EQ(cap.devices(0).headroom_bytes(), 4 * kGiB);
  EXPECT_EQ(cap.devices(0).total_bytes(), 80 * kGiB);
}

TEST_P(GrpcScenarios, P2_NothingAffordableNeverNegative) {
  RigOptions options;
  options.gpu_memory_utilization = 0.95;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  v1::PoolSpec spec = Spec("p2", MiB(2), MiB(2), 100);
  spec.set_num_layers(32);
  spec.set_num_kv_buffers(2);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  rig().LeaveFree(0, Bytes(3 * kGiB));
  v1::CapacitySnapshot cap = c().Cap("p2");
  EXPECT_EQ(cap.affordable_bundles(), 0);
  EXPECT_EQ(cap.available_blocks(), 0);
  EXPECT_EQ(cap.devices(0).budget_bytes(), 0);
  RefusedBeforeMapping(rig(), FailureReason::kGpuMemoryExhausted,
                       [&] { return c().Alloc("p2", 1).status; });
}

TEST_P(GrpcScenarios, P3_TwoDevicesAffordTheMinimum) {
  RigOptions options;
  options.host.device_count = 2;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  v1::PoolSpec spec = Spec("p3", MiB(2), MiB(1), 40);
  spec.add_devices(0);
  spec.add_devices(1);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  rig().LeaveFree(0, MiB(2 * 10));
  rig().LeaveFree(1, MiB(2 * 2));
  v1::CapacitySnapshot cap = c().Cap("p3");
  EXPECT_EQ(cap.affordable_bundles(), 2);
  EXPECT_EQ(cap.available_blocks(), 4);
  ASSERT_EQ(cap.devices_size(), 2);
  EXPECT_EQ(cap.devices(0).budget_bytes(), MiB(20).value());
  EXPECT_EQ(cap.devices(1).budget_bytes(), MiB(4).value());
}

// ===========================================================================
// Failures and rollback

v1::PoolSpec R1() { return Spec("r1", MiB(2), KiB(512), 64); }

TEST_P(GrpcScenarios, R1_OutOfMemoryOnSecondPageRollsBack) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(R1()));
  const std::string before = Observable(c().Cap("r1", 100));
  rig().backend.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 2});
  const int64_t releases = rig().backend.calls(BackendOp::kRelease);
  auto r = c().Alloc("r1", 8);
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kGpuMemoryExhausted));
  EXPECT_EQ(rig().backend.calls(BackendOp::kRelease) - releases, 1);
  EXPECT_EQ(rig().host.live_handles(), 0);
  EXPECT_EQ(rig().host.created_bytes(0), Bytes(0));
  EXPECT_EQ(Observable(c().Cap("r1", 100)), before);
}

TEST_P(GrpcScenarios, R2_AfterTheFaultClearsAllocSucceeds) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(R1()));
  rig().backend.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 2});
  ASSERT_FALSE(c().Alloc("r1", 8).ok());
  rig().backend.ClearFaults();
  auto r = c().Alloc("r1", 8);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(r->pages_mapped(), 2);
  EXPECT_EQ(ByPage(r->pages()), (Groups{{0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}}));
}

TEST_P(GrpcScenarios, R3_DriverErrorOnThirdMapRollsBack) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(R1()));
  const std::string before = Observable(c().Cap("r1", 100));
  rig().backend.AddFault({BackendOp::kMap, FaultKind::kError, 3});
  auto r = c().Alloc("r1", 12);
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kMappingFailed));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  std::optional<google::rpc::RetryInfo> retry =
      GetDetail<google::rpc::RetryInfo>(r.status);
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->retry_delay().nanos(), 100000000);
  EXPECT_EQ(rig().host.live_handles(), 0);
  v1::CapacitySnapshot cap = c().Cap("r1", 100);
  EXPECT_EQ(Observable(cap), before);
  EXPECT_TRUE(cap.healthy());
  auto again = c().Alloc("r1", 12);
  ASSERT_REPLY_OK(again);
  EXPECT_EQ(again->pages_mapped(), 3);
}

grpc::health::v1::HealthCheckResponse::ServingStatus HealthOf(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.status();
}

TEST_P(GrpcScenarios, R4_FailedRollbackFailsOnlyThatPool) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec a = R1();
  a.set_name("a");
  v1::PoolSpec b = R1();
  b.set_name("b");
  ASSERT_NO_FATAL_FAILURE(Create(a));
  ASSERT_NO_FATAL_FAILURE(Create(b));
  auto channel = rig().Channel(GetParam());
  rig().daemon->RefreshHealth();
  EXPECT_EQ(HealthOf(channel, ""),
            grpc::health::v1::HealthCheckResponse::SERVING);

  // The second page's map fails, and so does the unmap that would roll the
  // first page back.
  rig().backend.AddFault({BackendOp::kMap, FaultKind::kError, 2});
  rig().backend.AddFault({BackendOp::kUnmap, FaultKind::kError, 1});
  auto r = c().Alloc("a", 8);
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kPoolFailed));

  v1::CapacitySnapshot cap = c().Cap("a");
  EXPECT_FALSE(cap.healthy());
  EXPECT_FALSE(cap.failure().empty());
  EXPECT_EQ(cap.available_blocks(), 0);
  grpc::Status s = RefusedBeforeMapping(rig(), FailureReason::kPoolFailed, [&] {
    return c().Alloc("a", 1).status;
  });
  EXPECT_EQ(Metadata(s)["pool"], "a");
  EXPECT_TRUE(GetDetail<google::rpc::PreconditionFailure>(s).has_value());

  // The daemon keeps serving the other pool; the device itself is fine, so
  // health stays SERVING (a lost device turns it off: R5).
  auto other = c().Alloc("b", 1);
  ASSERT_REPLY_OK(other);
  EXPECT_EQ(Ids(other->pages()), (IdList{0}));
  rig().daemon->RefreshHealth();
  EXPECT_EQ(HealthOf(channel, ""),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(HealthOf(channel, "kvbroker.v1.KvBroker"),
            grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_P(GrpcScenarios, R5_PreallocFatalErrorVisibleInNextCapacity) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = R1();
  spec.set_min_idle_pages(1);
  spec.set_max_idle_pages(1);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  rig().backend.AddFault({BackendOp::kCreate, FaultKind::kFatal, 1});
  rig().broker()->RunMaintenance();  // the worker's pass, in the background
  EXPECT_EQ(rig().backend.injected(BackendOp::kCreate), 1);
  v1::CapacitySnapshot cap = c().Cap("r1");
  EXPECT_FALSE(cap.healthy());
  EXPECT_FALSE(cap.failure().empty());
  RefusedBeforeMapping(rig(), FailureReason::kPoolFailed,
                       [&] { return c().Alloc("r1", 1).status; });
  // A fatal device error means the backend has failed: health says so.
  auto channel = rig().Channel(GetParam());
  rig().daemon->RefreshHealth();
  EXPECT_EQ(HealthOf(channel, ""),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(HealthOf(channel, "kvbroker.v1.KvBroker"),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST_P(GrpcScenarios, R6_SecondDeviceFailureUnmapsTheFirst) {
  RigOptions options;
  options.host.device_count = 2;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  v1::PoolSpec spec = R1();
  spec.add_devices(0);
  spec.add_devices(1);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  const std::string before = Observable(c().Cap("r1", 100));
  rig().backend.AddFault(
      FaultRule{BackendOp::kMap, FaultKind::kError, 1, /*device=*/1});
  auto r = c().Alloc("r1", 4);
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kMappingFailed));
  EXPECT_EQ(rig().host.created_bytes(0), Bytes(0));
  EXPECT_EQ(rig().host.live_handles(), 0);
  EXPECT_EQ(Observable(c().Cap("r1", 100)), before);

  rig().backend.AddFault(
      FaultRule{BackendOp::kCreate, FaultKind::kOutOfMemory, 1, /*device=*/1});
  r = c().Alloc("r1", 4);
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kGpuMemoryExhausted));
  EXPECT_EQ(rig().host.created_bytes(0), Bytes(0));
  EXPECT_EQ(rig().host.live_handles(), 0);
  ASSERT_REPLY_OK(c().Alloc("r1", 4));
}

// ===========================================================================
// Arguments and frees

TEST_P(GrpcScenarios, V1_NegativeCountNamesNumBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kInvalidArgument,
                           [&] { return c().Alloc("c1", -1).status; });
  std::optional<google::rpc::BadRequest> bad =
      GetDetail<google::rpc::BadRequest>(s);
  ASSERT_TRUE(bad.has_value());
  ASSERT_EQ(bad->field_violations_size(), 1);
  EXPECT_EQ(bad->field_violations(0).field(), "num_blocks");
}

TEST_P(GrpcScenarios, V2_AllocZeroSucceedsEmpty) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  const int64_t maps = rig().backend.map_calls();
  auto r = c().Alloc("c1", 0);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(r->pages_size(), 0);
  EXPECT_EQ(r->num_blocks(), 0);
  EXPECT_EQ(rig().backend.map_calls(), maps);
}

TEST_P(GrpcScenarios, V3_FreeOfUnallocatedIdsFreesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("v3", MiB(14), MiB(6), 15)));
  auto r = c().Alloc("v3", 3);
  ASSERT_REPLY_OK(r);
  ASSERT_EQ(Ids(r->pages()), (IdList{0, 1, 3}));
  // Never allocated (5), straddling (2), out of range (15).
  for (int64_t bad : {5, 2, 15}) {
    auto f = c().Free("v3", {0, bad, 3});
    EXPECT_TRUE(IsRefusal(f.status, FailureReason::kBlockNotAllocated)) << bad;
    EXPECT_EQ(Metadata(f.status)["block_id"], absl::StrCat(bad));
    std::optional<google::rpc::PreconditionFailure> pre =
        GetDetail<google::rpc::PreconditionFailure>(f.status);
    ASSERT_TRUE(pre.has_value());
    EXPECT_EQ(pre->violations(0).subject(), absl::StrCat("block:", bad));
    EXPECT_EQ(c().Cap("v3").allocated_blocks(), 3) << bad;
  }
  ASSERT_REPLY_OK(c().Free("v3", {0, 1, 3}));
}

TEST_P(GrpcScenarios, V4_DuplicateAndDoubleFrees) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  ASSERT_REPLY_OK(c().Alloc("c1", 3));
  auto dup = c().Free("c1", {0, 0});
  EXPECT_TRUE(IsRefusal(dup.status, FailureReason::kInvalidArgument));
  EXPECT_EQ(c().Cap("c1").allocated_blocks(), 3);
  ASSERT_REPLY_OK(c().Free("c1", {0}));
  auto twice = c().Free("c1", {0});
  EXPECT_TRUE(IsRefusal(twice.status, FailureReason::kBlockNotAllocated));
  EXPECT_EQ(c().Cap("c1").allocated_blocks(), 2);
}

TEST_P(GrpcScenarios, V5_TwoReservationsOfFive) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Ten()));
  EXPECT_EQ(c().Cap("ten").available_blocks(), 10);
  auto a = c().Reserve("ten", 5);
  auto b = c().Reserve("ten", 5);
  ASSERT_REPLY_OK(a);
  ASSERT_REPLY_OK(b);
  EXPECT_NE(a->reservation_id(), b->reservation_id());
  std::set<int64_t> ids;
  for (int64_t id : Ids(a->pages())) ids.insert(id);
  for (int64_t id : Ids(b->pages())) ids.insert(id);
  EXPECT_EQ(ids.size(), 10u);
  v1::CapacitySnapshot cap = c().Cap("ten");
  EXPECT_EQ(cap.available_blocks(), 0);
  EXPECT_EQ(cap.reserved_blocks(), 10);
  EXPECT_GT(a->expire_time().seconds(), 0);
}

TEST_P(GrpcScenarios, V6_AllocFromReservationThenRelease) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Ten()));
  auto res = c().Reserve("ten", 5);
  ASSERT_REPLY_OK(res);
  const IdList reserved = Ids(res->pages());
  auto r = c().Alloc("ten", 3, "", res->reservation_id());
  ASSERT_REPLY_OK(r);
  for (int64_t id : Ids(r->pages())) {
    EXPECT_TRUE(std::count(reserved.begin(), reserved.end(), id)) << id;
  }
  auto released = c().Release("ten", res->reservation_id());
  ASSERT_REPLY_OK(released);
  EXPECT_EQ(released->released_blocks(), 2);
  v1::CapacitySnapshot cap = c().Cap("ten");
  EXPECT_EQ(cap.reserved_blocks(), 0);
  EXPECT_EQ(cap.allocated_blocks(), 3);
  EXPECT_EQ(cap.available_blocks(), 7);
  auto gone = c().Release("ten", res->reservation_id());
  EXPECT_TRUE(IsRefusal(gone.status, FailureReason::kReservationNotFound));
}

TEST_P(GrpcScenarios, V7_ReservationExpiresAfterItsTtl) {
  ManualClock clock;
  RigOptions options;
  options.clock = &clock;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  ASSERT_NO_FATAL_FAILURE(Create(Ten()));
  auto res = c().Reserve("ten", 5, absl::Seconds(10));
  ASSERT_REPLY_OK(res);
  EXPECT_EQ(res->expire_time().seconds(),
            absl::ToUnixSeconds(clock.Now() + absl::Seconds(10)));
  clock.Advance(absl::Seconds(11));
  v1::CapacitySnapshot cap = c().Cap("ten");
  EXPECT_EQ(cap.reserved_blocks(), 0);
  EXPECT_EQ(cap.available_blocks(), 10);
  auto r = c().Alloc("ten", 1, "", res->reservation_id());
  EXPECT_TRUE(IsRefusal(r.status, FailureReason::kReservationExpired));
  EXPECT_EQ(Metadata(r.status)["reservation_id"], res->reservation_id());
  rig_.reset();  // before `clock` goes
}

TEST_P(GrpcScenarios, V8_RetriedAllocIsIdempotent) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Ten()));
  auto first = c().Alloc("ten", 3, "req-1");
  ASSERT_REPLY_OK(first);
  EXPECT_FALSE(first->replayed());
  auto retry = c().Alloc("ten", 3, "req-1");
  ASSERT_REPLY_OK(retry);
  EXPECT_TRUE(retry->replayed());
  EXPECT_EQ(Ids(retry->pages()), Ids(first->pages()));
  EXPECT_EQ(c().Cap("ten").allocated_blocks(), 3);
  auto reused = c().Alloc("ten", 4, "req-1");
  EXPECT_TRUE(IsRefusal(reused.status, FailureReason::kRequestIdReused));
  EXPECT_EQ(Metadata(reused.status)["request_id"], "req-1");
  EXPECT_EQ(c().Cap("ten").allocated_blocks(), 3);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
