// Acceptance scenarios over gRPC, memory limits (S, L), and the pool
// lifecycle's refusals on the wire; the fixture and the transports are
// grpc_scenarios_fixture.h's and grpc_scenarios_test.cc's.

#include "tests/grpc_scenarios_fixture.h"

namespace kvbroker {
namespace testing {
namespace {

// ===========================================================================
// Memory limits

v1::PoolSpec S1Pool() { return Spec("s", MiB(2), MiB(1), 20); }
const Bytes kS1Bundle = MiB(2);

// Pages 0..3 each hold one block (0, 2, 4, 6).
void FourPagesOneBlockEach(Client& c) {
  auto r = c.Alloc("s", 8);
  ASSERT_REPLY_OK(r);
  ASSERT_EQ(Ids(r->pages()), (IdList{0, 1, 2, 3, 4, 5, 6, 7}));
  ASSERT_REPLY_OK(c.Free("s", {1, 3, 5, 7}));
  ASSERT_EQ(c.Cap("s").pages().open_pages(), 4);
}

void RunS1(Client& c) {
  ASSERT_NO_FATAL_FAILURE(FourPagesOneBlockEach(c));
  auto l = c.SetLimit("s", kS1Bundle * 2, 1);
  ASSERT_REPLY_OK(l);
  EXPECT_EQ(l->outcome(), v1::DEFERRED);
  EXPECT_EQ(l->limit().state(), v1::LIMIT_STATE_DEFERRED);
  EXPECT_EQ(l->limit().target_pages(), 2);
  EXPECT_EQ(l->mapped_bytes(), (kS1Bundle * 4).value());
  EXPECT_EQ(l->limit().overage_bytes(), (kS1Bundle * 2).value());

  ASSERT_REPLY_OK(c.Free("s", {0}));
  v1::CapacitySnapshot cap = c.Cap("s");
  EXPECT_EQ(cap.limit().state(), v1::LIMIT_STATE_DEFERRED);
  EXPECT_EQ(cap.pages().open_pages() + cap.pages().full_pages(), 3);

  ASSERT_REPLY_OK(c.Free("s", {2}));
  cap = c.Cap("s");
  EXPECT_EQ(cap.limit().state(), v1::LIMIT_STATE_APPLIED);
  EXPECT_EQ(cap.limit().target_pages(), 2);
  EXPECT_EQ(cap.limit().effective_bytes(), (kS1Bundle * 2).value());
  EXPECT_EQ(cap.mapped_bytes(), (kS1Bundle * 2).value());
}

TEST_P(GrpcScenarios, S1_DeferredShrinkCompletesOnFree) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(S1Pool()));
  ASSERT_NO_FATAL_FAILURE(RunS1(c()));
}

TEST_P(GrpcScenarios, S2_RaisingTheLimitNeverHandsAPageOutTwice) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(S1Pool()));
  ASSERT_NO_FATAL_FAILURE(RunS1(c()));
  ASSERT_REPLY_OK(c().Free("s", {4, 6}));  // S1's pool, idle
  auto six = c().SetLimit("s", kS1Bundle * 6, 2);
  ASSERT_REPLY_OK(six);
  EXPECT_EQ(six->outcome(), v1::APPLIED);
  auto ten = c().SetLimit("s", kS1Bundle * 10, 3);
  ASSERT_REPLY_OK(ten);
  EXPECT_EQ(ten->outcome(), v1::APPLIED);
  EXPECT_EQ(c().Cap("s").available_blocks(), 20);
  auto r = c().Alloc("s", 20);
  ASSERT_REPLY_OK(r);
  IdList expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  EXPECT_EQ(Ids(r->pages()), expected);
  EXPECT_EQ(r->pages_size(), 10);  // distinct pages, 2 blocks each
  for (const v1::PageBlocks& p : r->pages()) EXPECT_EQ(p.block_ids_size(), 2);
}

TEST_P(GrpcScenarios, S3_TargetIsKeptInPagesNotBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Spec("s", MiB(14), MiB(6), 15)));
  auto r = c().Alloc("s", 5);  // pages 0, 1, 2
  ASSERT_REPLY_OK(r);
  ASSERT_EQ(r->pages_mapped(), 3);
  auto l = c().SetLimit("s", MiB(14) * 2, 1);
  ASSERT_REPLY_OK(l);
  EXPECT_EQ(l->outcome(), v1::DEFERRED);
  ASSERT_REPLY_OK(c().Free("s", Ids(r->pages())));
  v1::CapacitySnapshot cap = c().Cap("s");
  EXPECT_EQ(cap.limit().state(), v1::LIMIT_STATE_APPLIED);
  EXPECT_EQ(cap.limit().target_pages(), 2);
  EXPECT_EQ(cap.pages().reclaimed_pages(), 5);
}

TEST_P(GrpcScenarios, S4_DeferredRefusesNewPagesNotOpenBlocks) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(S1Pool()));
  ASSERT_NO_FATAL_FAILURE(FourPagesOneBlockEach(c()));
  auto l = c().SetLimit("s", kS1Bundle * 3, 1);
  ASSERT_REPLY_OK(l);
  ASSERT_EQ(l->outcome(), v1::DEFERRED);
  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kShrinkPending,
                           [&] { return c().Alloc("s", 5).status; });
  EXPECT_EQ(Metadata(s)["available_blocks"], "4");
  const int64_t maps = rig().backend.map_calls();
  auto r = c().Alloc("s", 4);
  ASSERT_REPLY_OK(r);
  EXPECT_EQ(Ids(r->pages()), (IdList{1, 3, 5, 7}));
  EXPECT_EQ(rig().backend.map_calls(), maps);
}

const Bytes kLBundle = MiB(8);
v1::PoolSpec LPool() {
  v1::PoolSpec s = Spec("l", MiB(2), MiB(1), 32);
  s.set_num_layers(2);
  s.set_num_kv_buffers(2);
  return s;
}

void RunL2(Client& c) {
  auto r = c.Alloc("l", 8);
  ASSERT_REPLY_OK(r);
  ASSERT_EQ(r->pages_mapped(), 4);
  auto l = c.SetLimit("l", kLBundle * 2, 8);
  ASSERT_REPLY_OK(l);
  EXPECT_EQ(l->outcome(), v1::DEFERRED);
  EXPECT_EQ(l->mapped_bytes(), (kLBundle * 4).value());
  EXPECT_EQ(l->limit().overage_bytes(), (kLBundle * 2).value());
  EXPECT_EQ(l->limit().revision(), 8);
}

void RunL3(Client& c) {
  ASSERT_NO_FATAL_FAILURE(RunL2(c));
  auto l = c.SetLimit("l", kLBundle * 32, 9);
  ASSERT_REPLY_OK(l);
  EXPECT_EQ(l->outcome(), v1::APPLIED);
  EXPECT_EQ(l->limit().target_pages(), 16);
  EXPECT_EQ(l->limit().effective_bytes(), (kLBundle * 16).value());
  EXPECT_EQ(l->limit().limit_bytes(), (kLBundle * 32).value());
}

TEST_P(GrpcScenarios, L1_LimitRoundsDownToWholeBundles) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = LPool();
  spec.set_max_idle_pages(2);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  ASSERT_EQ(c().GetPool("l")->pool().bundle_bytes(), kLBundle.value());
  ASSERT_EQ(c().GetPool("l")->pool().page_count(), 16);
  ASSERT_REPLY_OK(c().Alloc("l", 6));
  ASSERT_REPLY_OK(c().Free("l", {2, 3, 4, 5}));
  v1::CapacitySnapshot cap = c().Cap("l");
  ASSERT_EQ(cap.pages().full_pages(), 1);
  ASSERT_EQ(cap.pages().idle_pages(), 2);
  auto l = c().SetLimit("l", kLBundle * 3 + Bytes(123), 7);
  ASSERT_REPLY_OK(l);
  EXPECT_EQ(l->outcome(), v1::APPLIED);
  EXPECT_EQ(l->limit().effective_bytes(), (kLBundle * 3).value());
  EXPECT_EQ(l->limit().target_pages(), 3);
  EXPECT_EQ(l->limit().limit_bytes(), (kLBundle * 3).value() + 123);
}

TEST_P(GrpcScenarios, L2_LowerThanInUseIsDeferredWithOverage) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(LPool()));
  ASSERT_NO_FATAL_FAILURE(RunL2(c()));
  EXPECT_EQ(c().Cap("l").limit().state(), v1::LIMIT_STATE_DEFERRED);
}

TEST_P(GrpcScenarios, L3_LimitClampedToPageCount) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(LPool()));
  ASSERT_NO_FATAL_FAILURE(RunL3(c()));
  EXPECT_EQ(c().Cap("l").available_blocks(), 24);
}

TEST_P(GrpcScenarios, L4_RevisionsAreIdempotentConflictingOrStale) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(LPool()));
  ASSERT_NO_FATAL_FAILURE(RunL3(c()));
  const std::string before = Observable(c().Cap("l", 100));
  auto same = c().SetLimit("l", kLBundle * 32, 9);
  ASSERT_REPLY_OK(same);
  EXPECT_EQ(same->outcome(), v1::APPLIED);
  EXPECT_EQ(same->limit().revision(), 9);
  auto conflict = c().SetLimit("l", kLBundle * 3, 9);
  ASSERT_REPLY_OK(conflict);
  EXPECT_EQ(conflict->outcome(), v1::CONFLICT);
  EXPECT_EQ(conflict->limit().limit_bytes(), (kLBundle * 32).value());
  auto stale = c().SetLimit("l", kLBundle * 2, 8);
  ASSERT_REPLY_OK(stale);
  EXPECT_EQ(stale->outcome(), v1::STALE);
  EXPECT_EQ(stale->limit().revision(), 9);
  EXPECT_EQ(Observable(c().Cap("l", 100)), before);
}

// ===========================================================================
// Lifecycle refusals (SPEC 6) on the wire.

TEST_P(GrpcScenarios, PoolLifecycleRefusals) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  auto exists = c().CreatePool(C1());
  EXPECT_TRUE(IsRefusal(exists.status, FailureReason::kPoolAlreadyExists));
  std::optional<google::rpc::ResourceInfo> res =
      GetDetail<google::rpc::ResourceInfo>(exists.status);
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->resource_type(), "kvbroker.v1.Pool");
  EXPECT_EQ(res->resource_name(), "c1");

  auto missing = c().Capacity("nope");
  EXPECT_TRUE(IsRefusal(missing.status, FailureReason::kPoolNotFound));
  EXPECT_EQ(Metadata(missing.status)["pool"], "nope");
  EXPECT_TRUE(
      IsRefusal(c().Alloc("nope", 1).status, FailureReason::kPoolNotFound));

  ASSERT_REPLY_OK(c().Alloc("c1", 1));
  auto busy = c().DeletePool("c1");
  EXPECT_TRUE(IsRefusal(busy.status, FailureReason::kPoolNotEmpty));
  EXPECT_EQ(Metadata(busy.status)["allocated_blocks"], "1");
  ASSERT_REPLY_OK(c().DeletePool("c1", /*force=*/true));
  EXPECT_EQ(rig().host.live_handles(), 0);
  EXPECT_TRUE(
      IsRefusal(c().GetPool("c1").status, FailureReason::kPoolNotFound));

  auto bad = c().CreatePool(Spec("", MiB(2), MiB(1), 0));
  EXPECT_TRUE(IsRefusal(bad.status, FailureReason::kInvalidArgument));
  std::optional<google::rpc::BadRequest> fields =
      GetDetail<google::rpc::BadRequest>(bad.status);
  ASSERT_TRUE(fields.has_value());
  EXPECT_GE(fields->field_violations_size(), 2);  // name and max_blocks
}

TEST_P(GrpcScenarios, GetAndListPoolsDescribeTheGeometry) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(C1()));
  ASSERT_NO_FATAL_FAILURE(Create(LPool()));
  auto got = c().GetPool("c1");
  ASSERT_REPLY_OK(got);
  const v1::PoolInfo& info = got->pool();
  EXPECT_EQ(info.spec().name(), "c1");
  EXPECT_EQ(info.spec().page_size(), MiB(14).value());
  EXPECT_EQ(info.spec().tokens_per_block(), 1);
  EXPECT_EQ(info.spec().devices_size(), 1);
  EXPECT_EQ(info.page_count(), 3);
  EXPECT_EQ(info.total_usable_blocks(), 3);
  EXPECT_EQ(info.virtual_bytes_per_device(), MiB(42).value());
  EXPECT_EQ(info.capacity().available_blocks(), 3);
  auto list = c().ListPools();
  ASSERT_REPLY_OK(list);
  ASSERT_EQ(list->pools_size(), 2);
  EXPECT_EQ(list->pools(0).spec().name(), "c1");
  EXPECT_EQ(list->pools(1).spec().name(), "l");
  EXPECT_EQ(list->pools(1).block_stride_bytes(), MiB(4).value());
}

TEST_P(GrpcScenarios, GenerationMismatchAborts) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Ten()));
  const uint64_t generation = c().Cap("ten").generation();
  v1::AllocRequest req;
  req.set_pool("ten");
  req.set_num_blocks(1);
  req.set_expected_generation(generation);
  ASSERT_REPLY_OK(c().Alloc(req));  // moves the generation
  grpc::Status s =
      RefusedBeforeMapping(rig(), FailureReason::kGenerationMismatch,
                           [&] { return c().Alloc(req).status; });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(Metadata(s)["expected_generation"], absl::StrCat(generation));
}

TEST_P(GrpcScenarios, TrimUnmapsIdlePages) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = Ten();
  spec.set_max_idle_pages(5);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  auto r = c().Alloc("ten", 6);
  ASSERT_REPLY_OK(r);
  ASSERT_REPLY_OK(c().Free("ten", Ids(r->pages())));
  EXPECT_EQ(c().Cap("ten").pages().idle_pages(), 3);
  auto one = c().Trim("ten", 1);
  ASSERT_REPLY_OK(one);
  EXPECT_EQ(one->pages_unmapped(), 1);
  auto rest = c().Trim("ten");
  ASSERT_REPLY_OK(rest);
  EXPECT_EQ(rest->pages_unmapped(), 2);
  EXPECT_EQ(rig().host.live_handles(), 0);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
