// Tests of the sequence lock (seqlock.h) that publishes a pool's counters
// and each device's budget figures: what Read returns, that a publication
// equal to the last one stores nothing, and that a reader racing a writer
// that changes some words and not others never accepts a mixed value.

#include "allocator/seqlock.h"

#include <atomic>
#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

// Words that a consistent publication keeps in a fixed relation; `same`
// never changes after the first publication, `half` only every other time.
struct Value {
  int64_t count = 0;
  int64_t same = 0;
  int64_t half = 0;      // count / 2
  int64_t negated = 0;   // -count
  int64_t padding[6] = {};
};

Value Make(int64_t k) {
  Value v;
  v.count = k;
  v.same = 7;
  v.half = k / 2;
  v.negated = -k;
  return v;
}

bool Consistent(const Value& v) {
  return v.same == (v.count == 0 ? 0 : 7) && v.half == v.count / 2 &&
         v.negated == -v.count;
}

TEST(SeqLockTest, ReadsWhatWasPublished) {
  SeqLock<Value> lock;
  EXPECT_EQ(lock.Read().count, 0);
  lock.Publish(Make(5));
  const Value got = lock.Read();
  EXPECT_EQ(got.count, 5);
  EXPECT_EQ(got.same, 7);
  EXPECT_EQ(got.half, 2);
  EXPECT_EQ(got.negated, -5);
  EXPECT_EQ(lock.last().count, 5);
  lock.Publish(Make(6));  // only count, half and negated change
  EXPECT_EQ(lock.Read().half, 3);
  EXPECT_EQ(lock.Read().same, 7);
}

TEST(SeqLockTest, RepublishingTheSameValueStoresNothing) {
  SeqLock<Value> lock;
  lock.Publish(Make(3));
  const uint64_t seq = lock.sequence_for_testing();
  lock.Publish(Make(3));
  EXPECT_EQ(lock.sequence_for_testing(), seq);
  lock.Publish(Make(4));
  EXPECT_EQ(lock.sequence_for_testing(), seq + 2);
}

TEST(SeqLockTest, ReadersNeverAcceptAMixedValue) {
  SeqLock<Value> lock;
  lock.Publish(Make(1));
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0};
  std::atomic<int64_t> bad{0};
  std::thread reader([&] {
    int64_t last = 0;
    while (!done.load(std::memory_order_relaxed)) {
      const Value v = lock.Read();
      if (!Consistent(v) || v.count < last) bad.fetch_add(1);
      last = v.count;
      reads.fetch_add(1, std::memory_order_relaxed);
    }
  });
  for (int64_t k = 2; k < 400000; ++k) lock.Publish(Make(k));
  // Let the reader see the last value at least once.
  const int64_t before = reads.load();
  while (reads.load() < before + 100) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(lock.Read().count, 399999);
}

}  // namespace
}  // namespace kvbroker
