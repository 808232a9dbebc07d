// Fanout runs every index exactly once, in parallel, also from several
// callers at once.

#include "extender/fanout.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace extender {
namespace {

TEST(Fanout, RunsEveryIndexOnce) {
  Fanout fanout(4);
  std::vector<std::atomic<int>> hits(100);
  fanout.Run(hits.size(), [&](size_t i) { hits[i]++; });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  fanout.Run(0, [&](size_t) { ADD_FAILURE() << "called for n = 0"; });
}

TEST(Fanout, CallsRunConcurrently) {
  // Eight calls that each wait for all eight: finishes only if they overlap.
  Fanout fanout(7);
  absl::Barrier* barrier = new absl::Barrier(8);
  std::atomic<int> done{0};
  fanout.Run(8, [&](size_t) {
    if (barrier->Block()) delete barrier;
    done++;
  });
  EXPECT_EQ(done.load(), 8);
}

TEST(Fanout, NoWorkersRunsOnTheCaller) {
  Fanout fanout(0);
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  fanout.Run(5, [&](size_t) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    ++calls;
  });
  EXPECT_EQ(calls, 5);
}

TEST(Fanout, SeveralCallersShareTheWorkers) {
  Fanout fanout(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        fanout.Run(10, [&](size_t i) { total += static_cast<int>(i); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 45);
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker
