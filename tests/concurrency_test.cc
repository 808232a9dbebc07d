// Many clients at once over several channels (TCP and Unix): allocations,
// frees, idempotent retries, reservations, capacity reads and
// WatchCapacity streams race against each other and against the broker's
// prealloc worker. Checks: no block id is ever held by two clients at once,
// every refusal is a typed capacity refusal, the watchers see generations
// only grow, and once everyone has freed everything the pool is back where
// it started and its invariants hold.

#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "allocator/units.h"
#include "client/error_codec.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/block_ledger.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

constexpr char kPool[] = "busy";
constexpr int kClients = 8;
constexpr int kChannels = 4;  // two TCP, two Unix
constexpr int kSteps = 250;
// The device holds kDeviceBytes / kPageBytes bundles, far fewer than the
// pool's 512 pages, so the device bounds what is available.
constexpr int64_t kDeviceBytes = 160 * kMiB;
constexpr int64_t kPageBytes = 2 * kMiB;
constexpr int64_t kBlockBytes = 256 * kKiB;

bool IsCapacityRefusal(const grpc::Status& s) {
  std::optional<KvbError> e = DecodeError(s);
  if (!e.has_value()) return false;
  switch (e->reason) {
    case v1::POOL_EXHAUSTED:
    case v1::GPU_MEMORY_EXHAUSTED:
    case v1::REQUEST_TOO_LARGE: return true;
    default: return false;
  }
}

void RunClient(int id, Client& client, BlockLedger& ledger,
               std::atomic<int64_t>& refusals) {
  std::mt19937_64 rng(id);
  std::vector<int64_t> held;
  for (int step = 0; step < kSteps; ++step) {
    const int op = rng() % 10;
    if (op < 5) {
      const std::string request_id = absl::StrCat("c", id, "-", step);
      const int64_t n = 1 + rng() % 32;
      auto r = client.Alloc(kPool, n, request_id);
      if (!r.ok()) {
        EXPECT_TRUE(IsCapacityRefusal(r.status)) << r.status.error_message();
        ++refusals;
        continue;
      }
      const std::vector<int64_t> ids = Ids(r->pages());
      EXPECT_EQ(static_cast<int64_t>(ids.size()), n);
      ledger.Take(id, ids);
      held.insert(held.end(), ids.begin(), ids.end());
      if (rng() % 4 == 0) {  // a retry must replay, not allocate again
        auto again = client.Alloc(kPool, n, request_id);
        EXPECT_TRUE(again.ok()) << again.status.error_message();
        EXPECT_TRUE(again->replayed());
        EXPECT_EQ(Ids(again->pages()), ids);
      }
    } else if (op < 8 && !held.empty()) {
      std::shuffle(held.begin(), held.end(), rng);
      const size_t n = 1 + rng() % held.size();
      std::vector<int64_t> ids(held.end() - n, held.end());
      held.resize(held.size() - n);
      ledger.Give(ids);
      auto r = client.Free(kPool, ids);
      EXPECT_TRUE(r.ok()) << r.status.error_message();
    } else if (op == 8) {
      const int64_t n = 1 + rng() % 8;
      auto res = client.Reserve(kPool, n, absl::Seconds(60));
      if (!res.ok()) {
        EXPECT_TRUE(IsCapacityRefusal(res.status))
            << res.status.error_message();
        ++refusals;
        continue;
      }
      const int64_t use = rng() % (n + 1);
      auto r = client.Alloc(kPool, use, "", res->reservation_id());
      EXPECT_TRUE(r.ok()) << r.status.error_message();
      const std::vector<int64_t> ids = Ids(r->pages());
      ledger.Take(id, ids);
      held.insert(held.end(), ids.begin(), ids.end());
      auto released = client.Release(kPool, res->reservation_id());
      if (released.ok()) {
        EXPECT_EQ(released->released_blocks(), n - use);
      } else {
        // A reservation used up completely may be gone already.
        EXPECT_EQ(use, n) << released.status.error_message();
      }
    } else {
      v1::CapacitySnapshot cap = client.Cap(kPool);
      EXPECT_GE(cap.available_blocks(), 0);
      EXPECT_LE(cap.allocated_blocks() + cap.reserved_blocks(),
                cap.total_blocks());
    }
  }
  ledger.Give(held);
  if (!held.empty()) {
    auto r = client.Free(kPool, held);
    EXPECT_TRUE(r.ok()) << r.status.error_message();
  }
}

TEST(ConcurrencyTest, ManyClientsOverSeveralChannels) {
  RigOptions options;
  options.host.device_total = Bytes(kDeviceBytes);
  options.start_worker = true;  // prealloc races with the clients
  options.min_idle_pages = 2;
  options.max_idle_pages = 4;
  Rig rig(options);
  ASSERT_NE(rig.daemon, nullptr);
  {
    Client admin(rig.Channel(Transport::kTcp));
    v1::PoolSpec spec =
        Spec(kPool, Bytes(kPageBytes), Bytes(kBlockBytes), 4096);
    spec.clear_min_idle_pages();
    spec.clear_max_idle_pages();
    ASSERT_TRUE(admin.CreatePool(spec).ok());
  }

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < kChannels; ++i) {
    channels.push_back(
        rig.Channel(i % 2 == 0 ? Transport::kTcp : Transport::kUnix));
  }
  Client observer(channels[0]);
  const v1::CapacitySnapshot start = observer.Cap(kPool);
  ASSERT_GT(start.available_blocks(), 0);

  // Watchers: generations only grow.
  std::vector<std::unique_ptr<grpc::ClientContext>> watch_contexts;
  std::vector<std::thread> watchers;
  std::atomic<int64_t> snapshots{0};
  for (int i = 0; i < 2; ++i) {
    watch_contexts.push_back(std::make_unique<grpc::ClientContext>());
    grpc::ClientContext* ctx = watch_contexts.back().get();
    watchers.emplace_back([ctx, &channels, &snapshots, i] {
      Client client(channels[i]);
      v1::WatchCapacityRequest req;
      req.set_pool(kPool);
      auto reader = client.stub()->WatchCapacity(ctx, req);
      v1::WatchCapacityResponse msg;
      uint64_t last = 0;
      while (reader->Read(&msg)) {
        EXPECT_GT(msg.capacity().generation(), last);
        last = msg.capacity().generation();
        ++snapshots;
      }
      grpc::Status end = reader->Finish();
      EXPECT_EQ(end.error_code(), grpc::StatusCode::CANCELLED)
          << end.error_message();
    });
  }

  BlockLedger ledger;
  std::atomic<int64_t> refusals{0};
  std::vector<std::thread> clients;
  const absl::Time begin = absl::Now();
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([i, &channels, &ledger, &refusals] {
      Client client(channels[i % kChannels]);
      RunClient(i, client, ledger, refusals);
    });
  }
  for (std::thread& t : clients) t.join();
  const absl::Duration elapsed = absl::Now() - begin;
  for (auto& ctx : watch_contexts) ctx->TryCancel();
  for (std::thread& t : watchers) t.join();

  // The prealloc worker may be mapping or unmapping a page right now, and
  // a page in flight is neither available nor allocated: stop it (the
  // join waits out its pass) so that the pool is at rest when it is read.
  rig.broker()->StopWorker();
  const v1::CapacitySnapshot end = observer.Cap(kPool);
  EXPECT_EQ(end.allocated_blocks(), 0);
  EXPECT_EQ(end.reserved_blocks(), 0);
  // At rest every page the device affords is available. (The start was
  // read with the worker running, so it may have missed a page in flight.)
  EXPECT_EQ(end.available_blocks(),
            (kDeviceBytes / kPageBytes) * (kPageBytes / kBlockBytes));
  EXPECT_LE(start.available_blocks(), end.available_blocks());
  EXPECT_EQ(end.pages().open_pages() + end.pages().full_pages(), 0);
  EXPECT_TRUE(end.healthy());
  absl::StatusOr<std::shared_ptr<PagePool>> pool = rig.broker()->GetPool(kPool);
  ASSERT_TRUE(pool.ok());
  absl::Status invariants = (*pool)->CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
  std::printf(
      "%d clients x %d steps over %d channels in %s: %lld capacity "
      "refusals, %lld watch snapshots\n",
      kClients, kSteps, kChannels, absl::FormatDuration(elapsed).c_str(),
      static_cast<long long>(refusals.load()),
      static_cast<long long>(snapshots.load()));
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
