// The client library against the real daemon wiring (tests/grpc_test_util's
// Rig: server/daemon over a fault-injecting host backend), over TCP and the
// Unix socket: every SPEC 6 reason a client can provoke comes back as a typed
// KvbError with its metadata, and retries happen exactly where they should.
// (UNAUTHENTICATED and PERMISSION_DENIED need the daemon's bearer tokens,
// which the rig does not configure.)

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "allocator/clock.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/units.h"
#include "client/kvbroker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using testing::Rig;
using testing::RigOptions;
using testing::Transport;

v1::PoolSpec PoolSpecOf(const std::string& name, int64_t page, int64_t block,
                        int64_t max_blocks) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_page_size(page);
  spec.set_block_bytes(block);
  spec.set_max_blocks(max_blocks);
  spec.set_min_idle_pages(0);
  spec.set_max_idle_pages(0);
  return spec;
}

// The seed case of SPEC 1: 14 MiB pages, 6 MiB blocks, 5 block ids.
v1::PoolSpec Seed() { return PoolSpecOf("demo", 14 * kMiB, 6 * kMiB, 5); }

// The reason, code and metadata of a failed call.
KvbError ErrorOf(const absl::Status& status) {
  EXPECT_FALSE(status.ok());
  return GetKvbError(status).value_or(KvbError());
}

// The scheduler loop of client/README.md, verbatim.
absl::StatusOr<std::vector<int64_t>> Admit(KvBrokerClient& kvb,
                                           const std::string& pool,
                                           const std::string& request_id,
                                           int64_t need) {
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<v1::CapacitySnapshot> cap = kvb.Capacity(pool);
    if (!cap.ok()) return cap.status();  // e.g. UNAVAILABLE after retries
    if (need > cap->total_blocks()) {
      return absl::OutOfRangeError("never fits this pool");  // refuse for good
    }
    if (need > cap->available_blocks()) {
      return absl::ResourceExhaustedError("no room now");  // queue or route
    }
    AllocOptions options;
    options.request_id = request_id;  // our own retries stay idempotent
    options.expected_generation = cap->generation();
    absl::StatusOr<v1::AllocResponse> blocks = kvb.Alloc(pool, need, options);
    if (blocks.ok()) return BlockIds(*blocks);
    // Someone else changed the pool since our read: read again. Anything
    // else (POOL_EXHAUSTED: frees will help; GPU_MEMORY_EXHAUSTED: the device
    // is full, see retry_delay; SHRINK_PENDING: a lower limit is draining the
    // pool) goes back to the caller.
    if (GetKvbReason(blocks.status()) != v1::GENERATION_MISMATCH) {
      return blocks.status();
    }
  }
  return absl::AbortedError("pool too busy");
}

// When the request finishes:
absl::Status Release(KvBrokerClient& kvb, const std::string& pool,
                     const std::string& request_id,
                     const std::vector<int64_t>& ids) {
  FreeOptions free;
  free.request_id = request_id + "/free";
  // All or nothing: BLOCK_NOT_ALLOCATED means nothing was freed.
  return kvb.Free(pool, ids, free).status();
}

class ClientServerTest : public ::testing::TestWithParam<Transport> {
 protected:
  void Start(RigOptions options = {}) {
    rig_ = std::make_unique<Rig>(options);
    ASSERT_NE(rig_->daemon, nullptr);
    client_ = Connect();
  }

  std::unique_ptr<KvBrokerClient> Connect(ClientOptions options = {}) {
    options.target = GetParam() == Transport::kTcp
                         ? rig_->daemon->tcp_address()
                         : rig_->daemon->unix_address();
    options.retry.initial_backoff = absl::Milliseconds(1);
    auto client = KvBrokerClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  void Create(const v1::PoolSpec& spec) {
    absl::StatusOr<v1::PoolInfo> info = client_->CreatePool(spec);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  int64_t Available(const std::string& pool) {
    absl::StatusOr<v1::CapacitySnapshot> c = client_->Capacity(pool);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->available_blocks() : -1;
  }

  std::unique_ptr<Rig> rig_;
  std::unique_ptr<KvBrokerClient> client_;
};

INSTANTIATE_TEST_SUITE_P(Transports, ClientServerTest,
                         ::testing::Values(Transport::kTcp, Transport::kUnix),
                         testing::TransportName);

TEST_P(ClientServerTest, SeedCase) {
  ASSERT_NO_FATAL_FAILURE(Start());
  absl::StatusOr<v1::PoolInfo> info = client_->CreatePool(Seed());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->total_usable_blocks(), 3);
  EXPECT_EQ(info->page_count(), 3);
  EXPECT_EQ(Available("demo"), 3);

  const int64_t maps = rig_->backend.map_calls();
  absl::StatusOr<v1::AllocResponse> four = client_->Alloc("demo", 4);
  KvbError e = ErrorOf(four.status());
  EXPECT_EQ(e.reason, v1::REQUEST_TOO_LARGE);
  EXPECT_EQ(e.code, grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(e.metadata["requested_blocks"], "4");
  EXPECT_EQ(e.metadata["pool_total_blocks"], "3");
  EXPECT_EQ(e.metadata["pool"], "demo");
  EXPECT_EQ(rig_->backend.map_calls(), maps);

  absl::StatusOr<v1::AllocResponse> three = client_->Alloc("demo", 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_THAT(BlockIds(*three), ElementsAre(0, 1, 3));
  ASSERT_EQ(three->pages_size(), 2);
  EXPECT_EQ(three->pages(0).page_id(), 0);
  EXPECT_EQ(three->pages(1).page_id(), 1);
  EXPECT_EQ(three->pages_mapped(), 2);
  EXPECT_EQ(Available("demo"), 0);
}

TEST_P(ClientServerTest, PoolLifecycleReasons) {
  ASSERT_NO_FATAL_FAILURE(Start());

  KvbError e = ErrorOf(
      client_->CreatePool(PoolSpecOf("g4", 2 * kMiB, 3 * kMiB, 4)).status());
  EXPECT_EQ(e.reason, v1::INVALID_GEOMETRY);
  EXPECT_EQ(e.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(e.metadata["min_page_size_bytes"], "4194304");
  ASSERT_FALSE(e.field_violations.empty());
  EXPECT_EQ(e.field_violations[0].field(), "page_size");

  e = ErrorOf(client_->CreatePool(PoolSpecOf("", 2 * kMiB, kMiB, 4)).status());
  EXPECT_EQ(e.reason, v1::INVALID_ARGUMENT);
  ASSERT_FALSE(e.field_violations.empty());

  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  e = ErrorOf(client_->CreatePool(Seed()).status());
  EXPECT_EQ(e.reason, v1::POOL_ALREADY_EXISTS);
  EXPECT_EQ(e.code, grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(e.metadata["pool"], "demo");

  for (const absl::Status& s :
       {client_->GetPool("nope").status(), client_->Capacity("nope").status(),
        client_->DeletePool("nope"), client_->Alloc("nope", 1).status()}) {
    e = ErrorOf(s);
    EXPECT_EQ(e.reason, v1::POOL_NOT_FOUND);
    EXPECT_EQ(e.code, grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(e.metadata["pool"], "nope");
  }

  ASSERT_TRUE(client_->Alloc("demo", 1).ok());
  e = ErrorOf(client_->DeletePool("demo"));
  EXPECT_EQ(e.reason, v1::POOL_NOT_EMPTY);
  EXPECT_EQ(e.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(client_->DeletePool("demo", /*force=*/true).ok());
  absl::StatusOr<std::vector<v1::PoolInfo>> pools = client_->ListPools();
  ASSERT_TRUE(pools.ok());
  EXPECT_TRUE(pools->empty());
}

TEST_P(ClientServerTest, CapacityRefusalsAreTypedAndNotRetried) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  ASSERT_TRUE(client_->Alloc("demo", 3).ok());
  ASSERT_TRUE(client_->Free("demo", {3}).ok());

  // C5: POOL_EXHAUSTED with the available count.
  const int64_t maps = rig_->backend.map_calls();
  KvbError e = ErrorOf(client_->Alloc("demo", 2).status());
  EXPECT_EQ(e.reason, v1::POOL_EXHAUSTED);
  EXPECT_EQ(e.code, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(e.metadata["available_blocks"], "1");
  EXPECT_EQ(e.metadata["requested_blocks"], "2");
  EXPECT_EQ(rig_->backend.map_calls(), maps);

  // C12: GPU_MEMORY_EXHAUSTED carries a 1 s RetryInfo; the client does not
  // wait for it, because a capacity refusal is never retried.
  ASSERT_NO_FATAL_FAILURE(Create(PoolSpecOf("c12", 2 * kMiB, kMiB, 20)));
  rig_->LeaveFree(0, Bytes(6 * kMiB));
  EXPECT_EQ(Available("c12"), 6);
  const absl::Time start = absl::Now();
  e = ErrorOf(client_->Alloc("c12", 7).status());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_EQ(e.reason, v1::GPU_MEMORY_EXHAUSTED);
  EXPECT_EQ(e.metadata["available_blocks"], "6");
  EXPECT_EQ(e.retry_delay, absl::Seconds(1));
  rig_->LeaveFree(0, Bytes(1024 * kMiB));

  // S4: SHRINK_PENDING while a lower limit is deferred.
  ASSERT_NO_FATAL_FAILURE(Create(PoolSpecOf("s", 2 * kMiB, kMiB, 20)));
  ASSERT_TRUE(client_->Alloc("s", 4).ok());  // two full pages
  absl::StatusOr<v1::SetMemoryLimitResponse> limit =
      client_->SetMemoryLimit("s", 2 * kMiB, 1);
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->outcome(), v1::DEFERRED);
  e = ErrorOf(client_->Alloc("s", 1).status());
  EXPECT_EQ(e.reason, v1::SHRINK_PENDING);
  EXPECT_EQ(e.code, grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_P(ClientServerTest, FreeReasons) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  ASSERT_TRUE(client_->Alloc("demo", 2).ok());  // 0, 1

  // V3: a straddling id; nothing is freed.
  KvbError e = ErrorOf(client_->Free("demo", {0, 2}).status());
  EXPECT_EQ(e.reason, v1::BLOCK_NOT_ALLOCATED);
  EXPECT_EQ(e.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(e.metadata["block_id"], "2");
  EXPECT_EQ(client_->Capacity("demo")->allocated_blocks(), 2);

  // V4: the same id twice in one call.
  e = ErrorOf(client_->Free("demo", {1, 1}).status());
  EXPECT_EQ(e.reason, v1::INVALID_ARGUMENT);

  // V1: a negative count names num_blocks.
  e = ErrorOf(client_->Alloc("demo", -1).status());
  EXPECT_EQ(e.reason, v1::INVALID_ARGUMENT);
  ASSERT_FALSE(e.field_violations.empty());
  EXPECT_EQ(e.field_violations[0].field(), "num_blocks");

  // BLOCK_IN_RESERVATION.
  absl::StatusOr<v1::ReserveResponse> res = client_->Reserve("demo", 1);
  ASSERT_TRUE(res.ok()) << res.status();
  e = ErrorOf(client_->Free("demo", BlockIds(*res)).status());
  EXPECT_EQ(e.reason, v1::BLOCK_IN_RESERVATION);
  EXPECT_EQ(e.code, grpc::StatusCode::FAILED_PRECONDITION);

  absl::StatusOr<v1::FreeResponse> freed = client_->Free("demo", {0, 1});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 2);
}

TEST_P(ClientServerTest, ReservationReasons) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));

  KvbError e = ErrorOf(client_->ReleaseReservation("demo", "bogus").status());
  EXPECT_EQ(e.reason, v1::RESERVATION_NOT_FOUND);
  EXPECT_EQ(e.code, grpc::StatusCode::NOT_FOUND);

  absl::StatusOr<v1::ReserveResponse> res = client_->Reserve("demo", 2);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_TRUE(client_->Alloc("demo", 1).ok());  // the last free block
  AllocOptions from;
  from.reservation_id = res->reservation_id();
  e = ErrorOf(client_->Alloc("demo", 3, from).status());
  EXPECT_EQ(e.reason, v1::RESERVATION_TOO_SMALL);
  EXPECT_EQ(e.metadata["reservation_id"], res->reservation_id());

  absl::StatusOr<v1::AllocResponse> two = client_->Alloc("demo", 2, from);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(BlockIds(*two), BlockIds(*res));
  absl::StatusOr<v1::ReleaseReservationResponse> released =
      client_->ReleaseReservation("demo", res->reservation_id());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_blocks(), 0);
}

TEST_P(ClientServerTest, ReservationExpired) {
  ManualClock clock;
  RigOptions options;
  options.clock = &clock;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  ReserveOptions ttl;
  ttl.ttl = absl::Seconds(10);
  absl::StatusOr<v1::ReserveResponse> res = client_->Reserve("demo", 2, ttl);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->expire_time().seconds(),
            absl::ToUnixSeconds(clock.Now() + absl::Seconds(10)));
  clock.Advance(absl::Seconds(11));
  AllocOptions from;
  from.reservation_id = res->reservation_id();
  KvbError e = ErrorOf(client_->Alloc("demo", 1, from).status());
  EXPECT_EQ(e.reason, v1::RESERVATION_EXPIRED);
  EXPECT_EQ(e.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(e.metadata["reservation_id"], res->reservation_id());
  client_.reset();
  rig_.reset();  // before `clock` goes
}

TEST_P(ClientServerTest, GenerationAndRequestIdReasons) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(PoolSpecOf("ten", 2 * kMiB, kMiB, 10)));
  const uint64_t generation = client_->Capacity("ten")->generation();

  AllocOptions stale;
  stale.expected_generation = generation + 1;
  KvbError e = ErrorOf(client_->Alloc("ten", 1, stale).status());
  EXPECT_EQ(e.reason, v1::GENERATION_MISMATCH);
  EXPECT_EQ(e.code, grpc::StatusCode::ABORTED);

  AllocOptions id;
  id.request_id = "req-1";
  absl::StatusOr<v1::AllocResponse> first = client_->Alloc("ten", 3, id);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->replayed());
  absl::StatusOr<v1::AllocResponse> again = client_->Alloc("ten", 3, id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed());
  EXPECT_EQ(BlockIds(*again), BlockIds(*first));
  e = ErrorOf(client_->Alloc("ten", 4, id).status());
  EXPECT_EQ(e.reason, v1::REQUEST_ID_REUSED);
  EXPECT_EQ(e.metadata["request_id"], "req-1");
  EXPECT_EQ(client_->Capacity("ten")->allocated_blocks(), 3);
}

TEST_P(ClientServerTest, MappingFailedIsRetriedWithTheSameRequestId) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = PoolSpecOf("r", 2 * kMiB, 512 * 1024, 64);
  ASSERT_NO_FATAL_FAILURE(Create(spec));

  // One driver error: the client's retry succeeds, and the pool holds the
  // blocks once (the first attempt was rolled back).
  rig_->backend.AddFault({BackendOp::kMap, FaultKind::kError, 1});
  absl::StatusOr<v1::AllocResponse> r = client_->Alloc("r", 8);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_blocks(), 8);
  EXPECT_EQ(rig_->backend.injected(BackendOp::kMap), 1);
  EXPECT_EQ(client_->Capacity("r")->allocated_blocks(), 8);

  // Every map fails: MAPPING_FAILED after max_attempts, one map per attempt.
  ClientOptions three;
  three.retry.max_attempts = 3;
  auto client = Connect(three);
  rig_->backend.AddFault({BackendOp::kMap, FaultKind::kError, 0});
  KvbError e = ErrorOf(client->Alloc("r", 8).status());
  EXPECT_EQ(e.reason, v1::MAPPING_FAILED);
  EXPECT_EQ(e.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(rig_->backend.injected(BackendOp::kMap), 1 + 3);
  EXPECT_EQ(client_->Capacity("r")->allocated_blocks(), 8);
  rig_->backend.ClearFaults();
}

TEST_P(ClientServerTest, PoolFailedIsTypedAndNotRetried) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(PoolSpecOf("a", 2 * kMiB, 512 * 1024, 64)));
  // R4: the second map fails and so does the rollback's unmap.
  rig_->backend.AddFault({BackendOp::kMap, FaultKind::kError, 2});
  rig_->backend.AddFault({BackendOp::kUnmap, FaultKind::kError, 1});
  KvbError e = ErrorOf(client_->Alloc("a", 8).status());
  EXPECT_EQ(e.reason, v1::POOL_FAILED);
  EXPECT_EQ(e.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(client_->Capacity("a")->healthy());
  const int64_t maps = rig_->backend.map_calls();
  e = ErrorOf(client_->Alloc("a", 1).status());
  EXPECT_EQ(e.reason, v1::POOL_FAILED);
  EXPECT_EQ(e.metadata["pool"], "a");
  EXPECT_EQ(rig_->backend.map_calls(), maps);
}

TEST_P(ClientServerTest, LimitTrimAndOccupancy) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::PoolSpec spec = PoolSpecOf("p", 2 * kMiB, kMiB, 8);
  spec.set_max_idle_pages(4);
  ASSERT_NO_FATAL_FAILURE(Create(spec));
  absl::StatusOr<v1::AllocResponse> r = client_->Alloc("p", 3);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<std::vector<v1::PageOccupancy>> occ =
      client_->GetPageOccupancy("p", {0, 1});
  ASSERT_TRUE(occ.ok()) << occ.status();
  ASSERT_EQ(occ->size(), 2u);
  EXPECT_EQ((*occ)[0].allocated_blocks(), 2);
  EXPECT_EQ((*occ)[1].allocated_blocks(), 1);
  EXPECT_EQ(ErrorOf(client_->GetPageOccupancy("p", {99}).status()).reason,
            v1::INVALID_ARGUMENT);

  ASSERT_TRUE(client_->Free("p", BlockIds(*r)).ok());
  absl::StatusOr<v1::TrimResponse> trim = client_->Trim("p");
  ASSERT_TRUE(trim.ok()) << trim.status();
  EXPECT_EQ(trim->pages_unmapped(), 2);

  absl::StatusOr<v1::SetMemoryLimitResponse> l =
      client_->SetMemoryLimit("p", 4 * kMiB, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->outcome(), v1::APPLIED);
  l = client_->SetMemoryLimit("p", 4 * kMiB, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->outcome(), v1::STALE);
  EXPECT_EQ(client_->Capacity("p")->total_blocks(), 4);
}

TEST_P(ClientServerTest, WatchCapacityIterator) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  std::unique_ptr<CapacityWatch> watch = client_->WatchCapacity("demo", 10);
  v1::CapacitySnapshot snap;
  ASSERT_TRUE(watch->Next(&snap));
  EXPECT_EQ(snap.available_blocks(), 3);
  EXPECT_EQ(snap.page_list_size(), 2);

  ASSERT_TRUE(client_->Alloc("demo", 1).ok());
  // Coalesced: read until the allocation shows.
  while (snap.allocated_blocks() != 1) ASSERT_TRUE(watch->Next(&snap));
  EXPECT_EQ(snap.available_blocks(), 2);

  ASSERT_TRUE(client_->DeletePool("demo", /*force=*/true).ok());
  while (watch->Next(&snap)) {
  }
  absl::Status end = watch->Finish();
  EXPECT_EQ(GetKvbReason(end), v1::POOL_NOT_FOUND) << end;
}

TEST_P(ClientServerTest, WatchCapacityCallbackAndCancel) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  std::vector<int64_t> seen;
  absl::Status s =
      client_->WatchCapacity("demo", 0, [&](const v1::CapacitySnapshot& c) {
        seen.push_back(c.available_blocks());
        return false;
      });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(seen, ElementsAre(3));

  // Cancel from another thread ends a blocked Next.
  std::unique_ptr<CapacityWatch> watch = client_->WatchCapacity("demo");
  v1::CapacitySnapshot snap;
  ASSERT_TRUE(watch->Next(&snap));
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    watch->Cancel();
  });
  EXPECT_FALSE(watch->Next(&snap));
  canceller.join();
  EXPECT_EQ(watch->Finish().code(), absl::StatusCode::kCancelled);

  // A deadline ends a watch too.
  watch = client_->WatchCapacity(
      "demo", 0, CallOptions::WithTimeout(absl::Milliseconds(100)));
  while (watch->Next(&snap)) {
  }
  EXPECT_EQ(watch->Finish().code(), absl::StatusCode::kDeadlineExceeded);

  // A missing pool.
  watch = client_->WatchCapacity("nope");
  EXPECT_FALSE(watch->Next(&snap));
  EXPECT_EQ(GetKvbReason(watch->Finish()), v1::POOL_NOT_FOUND);
}

TEST_P(ClientServerTest, SchedulerLoopFromReadme) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Create(Seed()));
  EXPECT_EQ(Admit(*client_, "demo", "r1", 4).status().code(),
            absl::StatusCode::kOutOfRange);
  absl::StatusOr<std::vector<int64_t>> a = Admit(*client_, "demo", "r1", 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(0, 1));
  EXPECT_EQ(Admit(*client_, "demo", "r2", 2).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<std::vector<int64_t>> b = Admit(*client_, "demo", "r3", 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(3));
  EXPECT_TRUE(Release(*client_, "demo", "r1", *a).ok());
  EXPECT_TRUE(Release(*client_, "demo", "r1", *a).ok());  // replayed
  EXPECT_EQ(Available("demo"), 2);
  EXPECT_EQ(GetKvbReason(Release(*client_, "demo", "r9", *a)),
            v1::BLOCK_NOT_ALLOCATED);
}

}  // namespace
}  // namespace kvbroker
