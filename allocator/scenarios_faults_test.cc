// Acceptance scenarios of the physical budget (P) and of failures and
// rollback (R), over the rig of scenarios_rig.h and its fault injection.

#include "allocator/scenarios_rig.h"

namespace kvbroker::scenarios {
namespace {

// ===========================================================================
// Physical budget (DeviceBudgets over the test backend, its memory set with
// OverrideMemory)

const Bytes kP1Bundle = MiB(2 * 32 * 2);  // P = 2 MiB, L = 32, K = 2

// P1 and P2 are arithmetic over DeviceBudgets: no pool, nothing mapped. The
// device reports total 80 GiB and the row's free memory from the first query.
#define BUDGET_BACKEND_OR_SKIP(backend, free)                     \
  std::string backend##_why;                                      \
  std::unique_ptr<TestBackend> backend##_target =                 \
      TestBackend::Make(1, &backend##_why);                       \
  if (backend##_target == nullptr) GTEST_SKIP() << backend##_why; \
  FaultInjectingBackend backend(backend##_target->backend());     \
  backend.OverrideMemory(0, MemoryInfo{(free), kDeviceTotal})

TEST(Scenarios, P1_FortyEightBundlesAffordable) {
  // 80 GiB, 70 GiB used by other processes.
  BUDGET_BACKEND_OR_SKIP(backend, Bytes(10 * kGiB));
  DeviceBudgets budgets(&backend, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.Snapshot(0).headroom, Bytes(4 * kGiB));
  EXPECT_EQ(budgets.AffordableBundles({0}, kP1Bundle), 48);
  EXPECT_EQ(backend.map_calls(), 0);
}

TEST(Scenarios, P2_NothingAffordableNeverNegative) {
  // 80 GiB, 77 GiB used by other processes.
  BUDGET_BACKEND_OR_SKIP(backend, Bytes(3 * kGiB));
  DeviceBudgets budgets(&backend, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, kP1Bundle), 0);
  EXPECT_EQ(budgets.Snapshot(0).budget, Bytes(0));
  EXPECT_EQ(backend.map_calls(), 0);
}

// Needs two real devices: the pool maps a bundle on each (2 x 128 MiB per
// device at most).
TEST(Scenarios, P3_TwoDevicesAffordTheMinimum) {
  RIG_OR_SKIP_WITH(rig, /*devices=*/2, /*utilization=*/0.95);
  const Bytes headroom(4 * kGiB);
  rig.LeaveFree(0, headroom + kP1Bundle * 10 + MiB(64));
  rig.LeaveFree(1, headroom + kP1Bundle * 2 + (kP1Bundle - Bytes(1)));
  EXPECT_EQ(rig.budgets.AffordableBundles({0, 1}, kP1Bundle), 2);
  EXPECT_EQ(rig.budgets.AffordableBundles({0}, kP1Bundle), 10);

  // A pool on both devices counts two pages' worth.
  PoolConfig config = Geo(MiB(2), MiB(2), 20);
  config.num_layers = 32;
  config.num_kv_buffers = 2;
  config.devices = {0, 1};
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, config));
  CapacitySnapshot c = Cap(*pool);
  EXPECT_EQ(c.affordable_bundles, 2);
  EXPECT_EQ(c.available_blocks, BlockCount(2));
  (void)RefusedBeforeMapping(rig, FailureReason::kGpuMemoryExhausted,
                             [&] { return Alloc(*pool, 3); });
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 2));
  EXPECT_EQ(rig.backend.created_bytes(0), kP1Bundle * 2);
  EXPECT_EQ(rig.backend.created_bytes(1), kP1Bundle * 2);
}

// ===========================================================================
// Failures and rollback

// R1's pool: 4 blocks per page, 16 pages, nothing mapped.
PoolConfig R1Pool() { return Geo(MiB(2), KiB(512), 64); }

TEST(Scenarios, R1_OutOfMemoryOnSecondPageRollsBack) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool()));
  const std::string before = Observable(*pool);
  rig.backend.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 2});
  const CallDelta d(rig.backend);
  absl::StatusOr<AllocResult> r = Alloc(*pool, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kGpuMemoryExhausted)
      << r.status();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  // The page this call mapped was unmapped and released.
  EXPECT_EQ(d.calls(BackendOp::kCreate), 2);
  EXPECT_EQ(d.done(BackendOp::kMap), 1);
  EXPECT_EQ(d.calls(BackendOp::kUnmap), 1);
  EXPECT_EQ(d.calls(BackendOp::kRelease), 1);
  ExpectFullyUnwound(d);
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(rig.backend.created_bytes(0), Bytes(0));
  EXPECT_EQ(rig.budgets.Snapshot(0).charged, Bytes(0));
  // Allocated blocks, page states and the generation are as before.
  EXPECT_EQ(Observable(*pool), before);
  EXPECT_TRUE(pool->healthy());
}

TEST(Scenarios, R2_AfterTheFaultClearsAllocSucceeds) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool()));
  rig.backend.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, 2});
  ASSERT_FALSE(Alloc(*pool, 8).ok());
  rig.backend.ClearFaults();
  const CallDelta d(rig.backend);
  ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool, 8));
  EXPECT_EQ(r.pages_mapped, 2);
  EXPECT_EQ(d.calls(BackendOp::kCreate), 2);
  EXPECT_EQ(ByPage(r), (std::map<PageId, std::vector<BlockId>>{
                           {0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}}));
  EXPECT_EQ(rig.backend.live_handles(), 2);
}

TEST(Scenarios, R3_DriverErrorOnThirdMapRollsBack) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool()));
  const std::string before = Observable(*pool);
  rig.backend.AddFault({BackendOp::kMap, FaultKind::kError, 3});
  const CallDelta d(rig.backend);
  absl::StatusOr<AllocResult> r = Alloc(*pool, 12);  // three pages
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kMappingFailed) << r.status();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.calls(BackendOp::kMap), 3);
  ExpectFullyUnwound(d);
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(Observable(*pool), before);
  CapacitySnapshot c = Cap(*pool);
  EXPECT_TRUE(c.healthy);
  EXPECT_EQ(c.available_blocks, BlockCount(64));
  ASSERT_OK_AND_ASSIGN(AllocResult again, Alloc(*pool, 12));
  EXPECT_EQ(again.pages_mapped, 3);
  EXPECT_EQ(rig.backend.live_handles(), 3);
}

TEST(Scenarios, R4_FailedRollbackFailsOnlyThatPool) {
  RIG_OR_SKIP(rig);
  BrokerOptions options;
  options.start_worker = false;
  options.min_idle_pages = 0;
  options.max_idle_pages = 0;
  options.gpu_memory_utilization = 1.0;
  options.clock = &rig.clock;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Broker> broker,
                       Broker::Create(&rig.backend, options));
  PoolConfig a_config = R1Pool();
  a_config.name = "a";
  PoolConfig b_config = R1Pool();
  b_config.name = "b";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<PagePool> a,
                       broker->CreatePool(a_config));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<PagePool> b,
                       broker->CreatePool(b_config));

  // The second page's map fails, and so does the unmap that would roll the
  // first page back.
  rig.backend.AddFault({BackendOp::kMap, FaultKind::kError, 2});
  rig.backend.AddFault({BackendOp::kUnmap, FaultKind::kError, 1});
  absl::StatusOr<AllocResult> r = Alloc(*a, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kPoolFailed) << r.status();
  EXPECT_EQ(rig.backend.injected(BackendOp::kUnmap), 1);

  CapacitySnapshot c = Cap(*a);
  EXPECT_FALSE(c.healthy);
  EXPECT_FALSE(c.failure.empty());
  EXPECT_EQ(c.available_blocks, BlockCount(0));
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kPoolFailed,
                                        [&] { return Alloc(*a, 1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // The pool failed on its own; the device was not lost.
  EXPECT_TRUE(broker->healthy());
  EXPECT_FALSE(a->device_lost());

  // The broker keeps serving its other pool.
  ASSERT_OK_AND_ASSIGN(AllocResult other, Alloc(*b, 1));
  EXPECT_EQ(Ids(other), (std::vector<BlockId>{0}));
  EXPECT_TRUE(Cap(*b).healthy);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<PagePool> looked_up,
                       broker->GetPool("b"));
  EXPECT_EQ(looked_up, b);
}

TEST(Scenarios, R5_PreallocFatalErrorVisibleInNextCapacity) {
  RIG_OR_SKIP(rig);
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, R1Pool(),
                                           Quiet(/*min_idle=*/1,
                                                 /*max_idle=*/1)));
  rig.backend.AddFault({BackendOp::kCreate, FaultKind::kFatal, 1});
  const CallDelta d(rig.backend);
  EXPECT_FALSE(Checked(*pool, pool->PreallocStep()));
  EXPECT_EQ(d.calls(BackendOp::kCreate), 1);
  EXPECT_EQ(rig.backend.injected(BackendOp::kCreate), 1);

  CapacitySnapshot c = Cap(*pool);
  EXPECT_FALSE(c.healthy);
  EXPECT_FALSE(c.failure.empty());
  EXPECT_FALSE(pool->healthy());
  EXPECT_TRUE(pool->device_lost());  // a fatal error: the backend failed
  absl::Status s = RefusedBeforeMapping(rig, FailureReason::kPoolFailed,
                                        [&] { return Alloc(*pool, 1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // The worker does not keep trying on a failed pool.
  EXPECT_FALSE(Checked(*pool, pool->PreallocStep()));
  EXPECT_EQ(d.calls(BackendOp::kCreate), 1);
}

// Needs two real devices: device 0 really maps before device 1 fails.
TEST(Scenarios, R6_SecondDeviceFailureUnmapsTheFirst) {
  RIG_OR_SKIP_WITH(rig, /*devices=*/2, /*utilization=*/1.0);
  PoolConfig config = R1Pool();
  config.devices = {0, 1};
  ASSERT_OK_AND_ASSIGN(auto pool, MakePool(rig, config));
  const std::string before = Observable(*pool);

  // Map fails on device 1, after device 0's page was created, mapped and
  // made accessible.
  FaultRule rule{BackendOp::kMap, FaultKind::kError, 1, /*device=*/1};
  rig.backend.AddFault(rule);
  const CallDelta d(rig.backend);
  absl::StatusOr<AllocResult> r = Alloc(*pool, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(GetReason(r.status()), FailureReason::kMappingFailed) << r.status();
  EXPECT_EQ(d.done(BackendOp::kMap), 1);  // device 0's
  ExpectFullyUnwound(d);
  EXPECT_EQ(rig.backend.created_bytes(0), Bytes(0));
  EXPECT_EQ(rig.backend.created_bytes(1), Bytes(0));
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(Observable(*pool), before);

  // Out of memory on device 1's Create: same outcome, GPU_MEMORY_EXHAUSTED.
  rig.backend.AddFault(
      FaultRule{BackendOp::kCreate, FaultKind::kOutOfMemory, 1, 1});
  const CallDelta d2(rig.backend);
  r = Alloc(*pool, 4);
  EXPECT_EQ(GetReason(r.status()), FailureReason::kGpuMemoryExhausted)
      << r.status();
  ExpectFullyUnwound(d2);
  EXPECT_EQ(rig.backend.live_handles(), 0);
  EXPECT_EQ(Observable(*pool), before);

  // Healthy throughout: both devices map on the next try.
  ASSERT_OK_AND_ASSIGN(AllocResult ok, Alloc(*pool, 4));
  EXPECT_EQ(rig.backend.created_bytes(0), MiB(2));
  EXPECT_EQ(rig.backend.created_bytes(1), MiB(2));
}

}  // namespace
}  // namespace kvbroker::scenarios
