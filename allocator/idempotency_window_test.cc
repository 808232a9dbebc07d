// IdempotencyWindow: recall within the window, forgetting by age and by
// capacity, and pending request ids.

#include "allocator/idempotency_window.h"

#include <variant>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

FreeResult Freed(int64_t n) {
  FreeResult r;
  r.freed_blocks = n;
  return r;
}

TEST(IdempotencyWindowTest, RecallsWithinTheWindowOnly) {
  IdempotencyWindow w(absl::Minutes(10), 100);
  EXPECT_EQ(w.Recall("a", kT0), nullptr);
  w.Remember("a", "free/1", Freed(1), kT0);
  const IdempotencyWindow::Entry* e = w.Recall("a", kT0 + absl::Minutes(10));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->fingerprint, "free/1");
  EXPECT_EQ(std::get<FreeResult>(e->outcome).freed_blocks, 1);
  EXPECT_EQ(w.Recall("a", kT0 + absl::Minutes(10) + absl::Seconds(1)), nullptr);
  EXPECT_EQ(w.size(), 0u);
}

TEST(IdempotencyWindowTest, ForgetsTheOldestOverCapacity) {
  IdempotencyWindow w(absl::Minutes(10), 2);
  w.Remember("a", "x", Freed(1), kT0);
  w.Remember("b", "x", Freed(2), kT0);
  w.Remember("c", "x", Freed(3), kT0);
  EXPECT_EQ(w.Recall("a", kT0), nullptr);
  ASSERT_NE(w.Recall("b", kT0), nullptr);
  ASSERT_NE(w.Recall("c", kT0), nullptr);
  EXPECT_EQ(w.size(), 2u);
}

TEST(IdempotencyWindowTest, PendingIdsAreTrackedUntilCleared) {
  IdempotencyWindow w(absl::Minutes(10), 2);
  EXPECT_FALSE(w.IsPending("a"));
  w.MarkPending("a");
  EXPECT_TRUE(w.IsPending("a"));
  EXPECT_FALSE(w.IsPending("b"));
  w.ClearPending("a");
  EXPECT_FALSE(w.IsPending("a"));
}

}  // namespace
}  // namespace kvbroker
