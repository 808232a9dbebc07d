#include "server/change_feed.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

class CountingSubscriber : public ChangeFeed::Subscriber {
 public:
  void OnPoolChanged() override { ++changes; }
  void OnClose() override { ++closes; }
  std::atomic<int> changes{0};
  std::atomic<int> closes{0};
};

TEST(ChangeFeedTest, PublishReachesTheSubscribersOfThatPool) {
  ChangeFeed feed;
  auto a = std::make_shared<CountingSubscriber>();
  auto b = std::make_shared<CountingSubscriber>();
  ASSERT_TRUE(feed.Subscribe("a", a));
  ASSERT_TRUE(feed.Subscribe("b", b));
  feed.Publish("a");
  feed.Publish("a");
  feed.Publish("c");
  EXPECT_EQ(a->changes, 2);
  EXPECT_EQ(b->changes, 0);
  feed.Publish("");  // the set of pools changed: everyone looks
  EXPECT_EQ(a->changes, 3);
  EXPECT_EQ(b->changes, 1);
}

TEST(ChangeFeedTest, UnsubscribedAndDestroyedSubscribersAreSkipped) {
  ChangeFeed feed;
  auto a = std::make_shared<CountingSubscriber>();
  auto b = std::make_shared<CountingSubscriber>();
  ASSERT_TRUE(feed.Subscribe("p", a));
  ASSERT_TRUE(feed.Subscribe("p", b));
  EXPECT_EQ(feed.subscribers(), 2);
  feed.Unsubscribe(a.get());
  feed.Unsubscribe(a.get());  // no-op
  EXPECT_EQ(feed.subscribers(), 1);
  b.reset();  // gone without unsubscribing: the weak_ptr expires
  feed.Publish("p");
  EXPECT_EQ(a->changes, 0);
}

TEST(ChangeFeedTest, CloseNotifiesOnceAndRefusesNewSubscribers) {
  ChangeFeed feed;
  auto a = std::make_shared<CountingSubscriber>();
  ASSERT_TRUE(feed.Subscribe("p", a));
  feed.Close();
  feed.Close();
  EXPECT_EQ(a->closes, 1);
  feed.Publish("p");
  EXPECT_EQ(a->changes, 0);
  auto late = std::make_shared<CountingSubscriber>();
  EXPECT_FALSE(feed.Subscribe("p", late));
}

// A subscriber may unsubscribe from inside its own callback (the feed holds
// no lock while calling out).
class SelfRemoving : public ChangeFeed::Subscriber {
 public:
  explicit SelfRemoving(ChangeFeed* feed) : feed_(feed) {}
  void OnPoolChanged() override {
    ++changes;
    feed_->Unsubscribe(this);
  }
  void OnClose() override {}
  int changes = 0;

 private:
  ChangeFeed* feed_;
};

TEST(ChangeFeedTest, SubscriberMayUnsubscribeFromItsCallback) {
  ChangeFeed feed;
  auto s = std::make_shared<SelfRemoving>(&feed);
  ASSERT_TRUE(feed.Subscribe("p", s));
  feed.Publish("p");
  feed.Publish("p");
  EXPECT_EQ(s->changes, 1);
  EXPECT_EQ(feed.subscribers(), 0);
}

TEST(ChangeFeedTest, ConcurrentPublishSubscribeAndDestroy) {
  ChangeFeed feed;
  std::atomic<bool> stop{false};
  std::thread publisher([&] {
    while (!stop) feed.Publish("p");
  });
  for (int i = 0; i < 2000; ++i) {
    auto s = std::make_shared<CountingSubscriber>();
    ASSERT_TRUE(feed.Subscribe("p", s));
    if (i % 2 == 0) feed.Unsubscribe(s.get());
  }
  stop = true;
  publisher.join();
}

}  // namespace
}  // namespace kvbroker
