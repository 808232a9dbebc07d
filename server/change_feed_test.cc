// ChangeFeed over real pools: snapshots built once per pool and length per
// pass, whatever the number of watchers and changes; per-caller bounds;
// deleted pools; closing; concurrent churn with the notifier thread running.

#include "server/change_feed.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocator/broker.h"
#include "allocator/failure.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

class Recorder : public ChangeFeed::Subscriber {
 public:
  void OnSnapshot(ChangeFeed::Snapshot snapshot) override {
    absl::MutexLock lock(&mu);
    snapshots.push_back(std::move(snapshot));
  }
  void OnEnd(const absl::Status& failure) override {
    absl::MutexLock lock(&mu);
    ends.push_back(failure);
  }
  void OnClose() override { ++closes; }

  int count() {
    absl::MutexLock lock(&mu);
    return static_cast<int>(snapshots.size());
  }
  const v1::WatchCapacityResponse* first() {
    absl::MutexLock lock(&mu);
    return snapshots.empty() ? nullptr : snapshots.front().get();
  }
  uint64_t last_generation() {
    absl::MutexLock lock(&mu);
    return snapshots.back()->capacity().generation();
  }

  absl::Mutex mu;
  std::vector<ChangeFeed::Snapshot> snapshots ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> ends ABSL_GUARDED_BY(mu);
  std::atomic<int> closes{0};
};

// A broker whose changes reach `feed`.
class FeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Init(ChangeFeed::Options{1024, absl::ZeroDuration(), 0, false});
  }

  void Init(ChangeFeed::Options options) {
    feed_ = std::make_shared<ChangeFeed>(options);
    BrokerOptions bo;
    bo.gpu_memory_utilization = 1.0;
    bo.min_idle_pages = 0;
    bo.max_idle_pages = 0;
    bo.start_worker = false;
    bo.on_change = [feed = feed_](const std::string& pool) {
      feed->Publish(pool);
    };
    broker_ = *Broker::Create(&host_, bo);
    p_ = NewPool("p");
    q_ = NewPool("q");
  }

  std::shared_ptr<PagePool> NewPool(const std::string& name) {
    PoolConfig config;
    config.name = name;
    config.page_size = MiB(2);
    config.block_bytes = KiB(512);
    config.max_blocks = 64;
    absl::StatusOr<std::shared_ptr<PagePool>> pool =
        broker_->CreatePool(config);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return *pool;
  }

  absl::Status Watch(const std::shared_ptr<PagePool>& pool, int64_t max_pages,
                     const std::string& caller,
                     const std::shared_ptr<Recorder>& r) {
    return feed_->Subscribe(ChangeFeed::Watch{pool, max_pages, caller}, r);
  }

  HostBackend host_{HostBackendOptions{1, Bytes(kGiB), MiB(2)}};
  std::shared_ptr<ChangeFeed> feed_;
  std::unique_ptr<Broker> broker_;
  std::shared_ptr<PagePool> p_, q_;
};

TEST_F(FeedTest, OneSnapshotPerPoolAndLengthPerPass) {
  std::vector<std::shared_ptr<Recorder>> plain, listed, other;
  for (int i = 0; i < 100; ++i) {
    plain.push_back(std::make_shared<Recorder>());
    ASSERT_TRUE(Watch(p_, 0, "c", plain.back()).ok());
  }
  for (int i = 0; i < 3; ++i) {
    listed.push_back(std::make_shared<Recorder>());
    ASSERT_TRUE(Watch(p_, 2, "c", listed.back()).ok());
  }
  other.push_back(std::make_shared<Recorder>());
  ASSERT_TRUE(Watch(q_, 0, "c", other.back()).ok());

  // The first pass: p with 0 and with 2 pages, q with 0.
  ChangeFeed::PassStats first = feed_->NotifyPass();
  EXPECT_EQ(first.built, 3);
  EXPECT_EQ(first.offered, 104);
  EXPECT_EQ(first.first_offered, 104);
  EXPECT_EQ(feed_->NotifyPass().built, 0);  // nothing changed since
  for (auto& r : plain) EXPECT_EQ(r->count(), 1);
  // Every plain watcher got the very same message.
  EXPECT_EQ(plain[0]->first(), plain[99]->first());
  {
    absl::MutexLock lock(&listed[0]->mu);
    EXPECT_EQ(listed[0]->snapshots[0]->capacity().page_list_size(), 2);
  }

  // Fifty Alloc+Free pairs on p between two passes: coalesced into one
  // snapshot per length, of the latest state.
  for (int i = 0; i < 50; ++i) {
    AllocRequest alloc;
    alloc.num_blocks = 3;
    absl::StatusOr<AllocResult> a = p_->Alloc(alloc);
    ASSERT_TRUE(a.ok()) << a.status();
    std::vector<BlockId> ids;
    for (const PageBlocks& page : a->pages) {
      ids.insert(ids.end(), page.block_ids.begin(), page.block_ids.end());
    }
    FreeRequest free;
    free.block_ids = ids;
    ASSERT_TRUE(p_->Free(free).ok());
  }
  ChangeFeed::PassStats second = feed_->NotifyPass();
  EXPECT_EQ(second.built, 2);
  EXPECT_EQ(second.offered, 103);
  EXPECT_EQ(second.first_offered, 0);  // paced: these are re-offers
  for (auto& r : plain) {
    ASSERT_EQ(r->count(), 2);
    EXPECT_EQ(r->last_generation(), p_->generation());
  }
  for (auto& r : listed) EXPECT_EQ(r->count(), 2);
  EXPECT_EQ(other[0]->count(), 1);
}

TEST_F(FeedTest, UnchangedGenerationIsNotOfferedAgain) {
  auto r = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", r).ok());
  EXPECT_EQ(feed_->NotifyPass().built, 1);
  feed_->Publish("p");  // a change notification without a change
  ChangeFeed::PassStats same = feed_->NotifyPass();
  EXPECT_EQ(same.built, 0);  // the generation did not move: nothing to read
  EXPECT_EQ(same.offered, 0);
  EXPECT_EQ(r->count(), 1);
  // A new watcher of the same pool gets the current snapshot; the old one
  // does not get it twice.
  auto late = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", late).ok());
  EXPECT_EQ(feed_->NotifyPass().built, 1);
  EXPECT_EQ(late->count(), 1);
  EXPECT_EQ(r->count(), 1);
}

// NotifyFirsts serves subscriptions never offered a snapshot and leaves the
// dirty marks: the next NotifyPass still offers the change to the others.
TEST_F(FeedTest, FirstsPassServesOnlyNewSubscriptions) {
  auto old = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", old).ok());
  ASSERT_EQ(feed_->NotifyPass().offered, 1);
  AllocRequest alloc;
  alloc.num_blocks = 1;
  ASSERT_TRUE(p_->Alloc(alloc).ok());  // p is dirty
  auto fresh = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", fresh).ok());
  ChangeFeed::PassStats firsts = feed_->NotifyFirsts();
  EXPECT_EQ(firsts.offered, 1);
  EXPECT_EQ(firsts.first_offered, 1);
  EXPECT_EQ(fresh->count(), 1);
  EXPECT_EQ(old->count(), 1);
  EXPECT_EQ(feed_->NotifyFirsts().offered, 0);
  ChangeFeed::PassStats full = feed_->NotifyPass();
  EXPECT_EQ(full.offered, 1);  // the old watcher; the new one has it
  EXPECT_EQ(old->count(), 2);
  EXPECT_EQ(fresh->count(), 1);
  EXPECT_EQ(old->last_generation(), fresh->last_generation());
}

// With the notifier thread pacing itself for hours after a pass of
// re-offers, a new subscription still gets its first snapshot: it wakes the
// notifier for a pass of first snapshots.
TEST_F(FeedTest, NewSubscriptionIsServedDuringThePause) {
  Init(ChangeFeed::Options{1024, absl::ZeroDuration(), 0.001, true});
  auto old = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", old).ok());
  // Waits (a minute at most) until `r` holds `n` snapshots.
  auto offered = [](Recorder* r, int n) {
    std::pair<Recorder*, int> want(r, n);
    absl::MutexLock lock(&r->mu);
    return r->mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::pair<Recorder*, int>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return static_cast<int>(a->first->snapshots.size()) >= a->second;
            },
            &want),
        absl::Seconds(60));
  };
  ASSERT_TRUE(offered(old.get(), 1));  // a first snapshot: not paced
  AllocRequest alloc;
  alloc.num_blocks = 1;
  ASSERT_TRUE(p_->Alloc(alloc).ok());
  ASSERT_TRUE(offered(old.get(), 2));  // a re-offer: 1000 s of pause follow
  auto fresh = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", fresh).ok());
  EXPECT_TRUE(offered(fresh.get(), 1));
  EXPECT_EQ(old->count(), 2);
}

TEST_F(FeedTest, WatchesPerCallerAreBounded) {
  Init(ChangeFeed::Options{2, absl::ZeroDuration(), 0, false});
  auto a1 = std::make_shared<Recorder>();
  auto a2 = std::make_shared<Recorder>();
  auto a3 = std::make_shared<Recorder>();
  auto b1 = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "a", a1).ok());
  ASSERT_TRUE(Watch(q_, 0, "a", a2).ok());
  const absl::Status third = Watch(p_, 0, "a", a3);
  EXPECT_EQ(third.code(), absl::StatusCode::kInvalidArgument);
  std::optional<Failure> f = GetFailure(third);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, FailureReason::kInvalidArgument);
  ASSERT_EQ(f->violations.size(), 1u);
  EXPECT_EQ(f->violations[0].field, "pool");
  EXPECT_EQ(f->metadata["max_watches_per_caller"], "2");
  EXPECT_EQ(f->metadata["caller"], "a");
  EXPECT_EQ(feed_->subscribers_of("a"), 2);
  // Another caller is not affected; a caller that lets one go may watch
  // again.
  EXPECT_TRUE(Watch(p_, 0, "b", b1).ok());
  feed_->Unsubscribe(a1.get());
  EXPECT_EQ(feed_->subscribers_of("a"), 1);
  EXPECT_TRUE(Watch(p_, 0, "a", a3).ok());
  EXPECT_EQ(feed_->subscribers(), 3);
  // The refused subscriber was never registered: the pass offers it nothing.
  feed_->NotifyPass();
  EXPECT_EQ(a1->count(), 0);
  EXPECT_EQ(a3->count(), 1);
}

TEST_F(FeedTest, WatchersOfADeletedPoolEndWithItsFailure) {
  auto r = std::make_shared<Recorder>();
  auto s = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", r).ok());
  ASSERT_TRUE(Watch(q_, 0, "c", s).ok());
  feed_->NotifyPass();
  ASSERT_TRUE(broker_->DeletePool("p", false).ok());  // publishes ""
  EXPECT_EQ(feed_->NotifyPass().built, 2);
  absl::MutexLock lock(&r->mu);
  ASSERT_EQ(r->ends.size(), 1u);
  EXPECT_EQ(GetReason(r->ends[0]), FailureReason::kPoolNotFound);
  absl::MutexLock lock_s(&s->mu);
  EXPECT_TRUE(s->ends.empty());
}

TEST_F(FeedTest, CloseNotifiesOnceAndRefusesNewSubscribers) {
  auto r = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", r).ok());
  feed_->Close();
  feed_->Close();
  EXPECT_EQ(r->closes, 1);
  feed_->Publish("p");
  EXPECT_EQ(feed_->NotifyPass().built, 0);
  EXPECT_EQ(r->count(), 0);
  auto late = std::make_shared<Recorder>();
  EXPECT_EQ(Watch(p_, 0, "c", late).code(), absl::StatusCode::kUnavailable);
}

TEST_F(FeedTest, DestroyedSubscribersAreSkipped) {
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 0, "c", a).ok());
  ASSERT_TRUE(Watch(p_, 0, "c", b).ok());
  feed_->Unsubscribe(a.get());
  feed_->Unsubscribe(a.get());  // no-op
  EXPECT_EQ(feed_->subscribers(), 1);
  b.reset();  // gone without unsubscribing: the weak_ptr expires
  EXPECT_EQ(feed_->NotifyPass().built, 0);
  EXPECT_EQ(a->count(), 0);
}

// A subscriber may unsubscribe from inside its own callback (the feed holds
// no lock while calling out).
class SelfRemoving : public Recorder {
 public:
  explicit SelfRemoving(ChangeFeed* feed) : feed_(feed) {}
  void OnSnapshot(ChangeFeed::Snapshot snapshot) override {
    Recorder::OnSnapshot(std::move(snapshot));
    feed_->Unsubscribe(this);
  }

 private:
  ChangeFeed* feed_;
};

TEST_F(FeedTest, SubscriberMayUnsubscribeFromItsCallback) {
  auto s = std::make_shared<SelfRemoving>(feed_.get());
  ASSERT_TRUE(Watch(p_, 0, "c", s).ok());
  feed_->NotifyPass();
  EXPECT_EQ(s->count(), 1);
  EXPECT_EQ(feed_->subscribers(), 0);
  EXPECT_EQ(feed_->subscribers_of("c"), 0);
}

// The notifier thread, changes and subscription churn at once; every live
// watcher ends up offered the pool's final generation.
TEST_F(FeedTest, ConcurrentChangesChurnAndTheNotifierThread) {
  Init(ChangeFeed::Options{1 << 20, absl::ZeroDuration(), 0, true});
  auto steady = std::make_shared<Recorder>();
  ASSERT_TRUE(Watch(p_, 1, "c", steady).ok());
  std::atomic<bool> stop{false};
  std::thread changer([&] {
    while (!stop) {
      AllocRequest alloc;
      alloc.num_blocks = 1;
      absl::StatusOr<AllocResult> a = p_->Alloc(alloc);
      ASSERT_TRUE(a.ok()) << a.status();
      FreeRequest free;
      free.block_ids = a->pages[0].block_ids;
      ASSERT_TRUE(p_->Free(free).ok());
    }
  });
  for (int i = 0; i < 2000; ++i) {
    auto s = std::make_shared<Recorder>();
    ASSERT_TRUE(Watch(i % 2 ? p_ : q_, i % 3, "c", s).ok());
    if (i % 2 == 0) feed_->Unsubscribe(s.get());
  }
  stop = true;
  changer.join();
  const uint64_t final_generation = p_->generation();
  // Waits (untimed) for the notifier to catch up.
  while (steady->count() == 0 ||
         steady->last_generation() != final_generation) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(steady->last_generation(), final_generation);
}

}  // namespace
}  // namespace kvbroker
