// Revocations under concurrency (run under TSan by tools/test): callers
// allocate and free on a pool that unmaps every emptied page, while one
// listener acknowledges every revocation from its own thread (often while
// the unmapping call still runs: an early acknowledgement) and a second
// one, which never acknowledges, keeps attaching and leaving. When all has
// stopped and the listeners are gone, every page is unmapped and released,
// nothing is charged, and the invariants hold.

#include <atomic>
#include <deque>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "allocator/device_budget.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

// Queues the revocations it is told of; Take hands them to the acker.
class QueueListener : public PageListener {
 public:
  void OnPagesMapped(absl::Span<const MappedPage>) override {}
  void OnPagesNotPassed(absl::Span<const PageId>) override {}
  void OnPagesRevoked(uint64_t id, absl::Span<const PageId>,
                      absl::Time) override {
    absl::MutexLock lock(&mu_);
    ids_.push_back(id);
  }
  std::vector<uint64_t> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> out(ids_.begin(), ids_.end());
    ids_.clear();
    return out;
  }

 private:
  absl::Mutex mu_;
  std::deque<uint64_t> ids_ ABSL_GUARDED_BY(mu_);
};

TEST(RevocationStressTest, EveryPageComesBackOnceAllLetGo) {
  HostBackendOptions ho;
  ho.device_count = 2;
  ho.device_total = Bytes(256 * kMiB);
  ho.granularity = MiB(2);
  HostBackend host(ho);
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  ManualClock clock;
  PoolConfig c;
  c.name = "stress";
  c.page_size = MiB(2);
  c.block_bytes = KiB(512);
  c.max_blocks = 64;  // 16 pages on 2 devices
  c.devices = {0, 1};
  PoolOptions o;
  o.min_idle_pages = 0;
  o.max_idle_pages = 0;
  auto pool_or = PagePool::Create(c, &host, &budgets, &clock, o);
  ASSERT_TRUE(pool_or.ok()) << pool_or.status();
  PagePool& pool = **pool_or;

  QueueListener acking, silent;
  ASSERT_TRUE(pool.AddPageListener(&acking, [](auto) {}).ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> acks{0}, ack_errors{0};
  std::thread acker([&] {
    while (!stop.load()) {
      for (uint64_t id : acking.Take()) {
        if (pool.AckRevocation(&acking, id).ok()) {
          ++acks;
        } else {
          ++ack_errors;
        }
      }
      std::this_thread::yield();
    }
  });
  std::thread toggler([&] {
    for (int i = 0; !stop.load(); ++i) {
      if (i % 2 == 0) {
        (void)pool.AddPageListener(&silent, [](auto) {});
      } else {
        pool.RemovePageListener(&silent);
        (void)silent.Take();
      }
      std::this_thread::yield();
    }
    pool.RemovePageListener(&silent);
  });
  std::vector<std::thread> callers;
  std::atomic<int64_t> freed{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 400; ++i) {
        AllocRequest a;
        a.num_blocks = 1 + rng() % 6;
        absl::StatusOr<AllocResult> r = pool.Alloc(a);
        if (!r.ok()) continue;  // the pool is full for now
        std::vector<BlockId> ids;
        for (const auto& pb : r->pages) {
          ids.insert(ids.end(), pb.block_ids.begin(), pb.block_ids.end());
        }
        FreeRequest f;
        f.block_ids = ids;
        if (pool.Free(f).ok()) freed += static_cast<int64_t>(ids.size());
      }
    });
  }
  for (std::thread& t : callers) t.join();
  stop = true;
  toggler.join();
  acker.join();
  // Whatever the acker had not reached yet.
  for (uint64_t id : acking.Take()) {
    if (pool.AckRevocation(&acking, id).ok()) ++acks;
  }
  pool.RemovePageListener(&acking);

  EXPECT_EQ(ack_errors.load(), 0);
  EXPECT_GT(acks.load(), 0);
  EXPECT_GT(freed.load(), 0);
  const CapacitySnapshot cap = *pool.Capacity();
  EXPECT_EQ(cap.allocated_blocks.value(), 0);
  EXPECT_EQ(cap.available_blocks.value(), 64);
  EXPECT_EQ(cap.pages_free.value(), 16);
  EXPECT_EQ(
      (cap.pages_revoking + cap.pages_quarantined + cap.pages_mapping).value(),
      0);
  EXPECT_EQ(pool.pending_revocations(), 0);
  EXPECT_EQ(pool.announced_pages(), 0);
  EXPECT_EQ(budgets.Snapshot(0).charged.value(), 0);
  EXPECT_EQ(budgets.Snapshot(1).charged.value(), 0);
  EXPECT_EQ(pool.Stats().pages_mapped_total, pool.Stats().pages_unmapped_total);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvbroker
