// The checker itself (linearizability.h), on hand-built histories of one
// small pool: it accepts histories that some real-time-respecting order
// explains, including ones where only a reordering of overlapping calls
// does, and rejects those that no order explains.
//
// The pool: 2 MiB pages, 1 MiB blocks, 6 blocks (3 pages of 2 blocks),
// nothing kept IDLE, so blocks go out 0, 1, 2, ... and a freed page is
// unmapped to the back of the FREE list.

#include <random>

#include "allocator/testing/reference_model.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "tests/reliability/linearizability.h"

namespace kvbroker {
namespace lin {
namespace {

reference::ModelConfig Config() {
  reference::ModelConfig c;
  c.page_size = 2 * kMiB;
  c.block_bytes = kMiB;
  c.max_blocks = 6;
  c.budget_bundles = 100;
  return c;
}

Operation Alloc(int client, int64_t t0, int64_t t1, int64_t n,
                std::vector<int64_t> ids) {
  Operation op;
  op.client = client;
  op.invoke = t0;
  op.response = t1;
  op.kind = OpKind::kAlloc;
  op.num_blocks = n;
  op.result_ids = std::move(ids);
  return op;
}

Operation Refused(Operation op, FailureReason reason) {
  op.result_ids.clear();
  op.reason = reason;
  return op;
}

Operation Capacity(int client, int64_t t0, int64_t t1, int64_t available,
                   int64_t allocated) {
  Operation op;
  op.client = client;
  op.invoke = t0;
  op.response = t1;
  op.kind = OpKind::kCapacity;
  op.available_blocks = available;
  op.allocated_blocks = allocated;
  return op;
}

Operation Free(int client, int64_t t0, int64_t t1, std::vector<int64_t> ids) {
  Operation op;
  op.client = client;
  op.invoke = t0;
  op.response = t1;
  op.kind = OpKind::kFree;
  op.block_ids = std::move(ids);
  return op;
}

bool Check(const History& h) {
  return CheckLinearizable(h, PoolSpec(Config())).linearizable;
}

TEST(Checker, AcceptsASequentialHistory) {
  const History h = {Alloc(0, 1, 2, 1, {0}), Alloc(0, 3, 4, 2, {1, 2}),
                     Capacity(1, 5, 6, 3, 3)};
  const CheckResult r = CheckLinearizable(h, PoolSpec(Config()));
  EXPECT_TRUE(r.linearizable);
  EXPECT_EQ(r.order, (std::vector<int>{0, 1, 2}));
}

TEST(Checker, AcceptsOverlappingCallsInTheOtherOrder) {
  // Client 0 invoked first but received the second block: only the order
  // (client 1, client 0) explains it, and the calls overlap.
  const History h = {Alloc(0, 1, 4, 1, {1}), Alloc(1, 2, 3, 1, {0})};
  const CheckResult r = CheckLinearizable(h, PoolSpec(Config()));
  EXPECT_TRUE(r.linearizable);
  EXPECT_EQ(r.order, (std::vector<int>{1, 0}));
}

TEST(Checker, RejectsAReorderingThatRealTimeForbids) {
  // The same outcomes, but client 0's call returned before client 1's
  // began: block 1 cannot have gone out first.
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 1, {1}), Alloc(1, 3, 4, 1, {0})}));
}

TEST(Checker, RejectsAStaleRead) {
  // Capacity began after Alloc(2) returned, yet saw the empty pool.
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 2, {0, 1}), Capacity(1, 3, 4, 6, 0)}));
  // Overlapping, the same reading is the state before the Alloc.
  EXPECT_TRUE(Check({Alloc(0, 1, 3, 2, {0, 1}), Capacity(1, 2, 4, 6, 0)}));
}

TEST(Checker, RejectsABlockHandedOutTwice) {
  EXPECT_FALSE(Check({Alloc(0, 1, 3, 1, {0}), Alloc(1, 2, 4, 1, {0})}));
}

TEST(Checker, RejectsARefusalThatNoOrderExplains) {
  // Six blocks, two calls of three, one after the other: the second cannot
  // be refused. (Overlapping, it can: the first holds two pages in flight.)
  EXPECT_FALSE(
      Check({Alloc(0, 1, 2, 3, {0, 1, 2}),
             Refused(Alloc(1, 3, 4, 3, {}), FailureReason::kPoolExhausted)}));
  EXPECT_TRUE(
      Check({Alloc(0, 1, 3, 3, {0, 1, 2}),
             Refused(Alloc(1, 2, 4, 3, {}), FailureReason::kPoolExhausted)}));
  // With a third call taking a block concurrently, one order refuses it.
  EXPECT_TRUE(
      Check({Alloc(0, 1, 5, 3, {0, 1, 2}),
             Refused(Alloc(1, 2, 6, 3, {}), FailureReason::kPoolExhausted),
             Alloc(2, 3, 4, 1, {3})}));
}

TEST(Checker, AFreeMakesItsBlockAvailableOnlyAfterIt) {
  // Freeing page 0 unmaps it to the back of the FREE list (no IDLE pages
  // kept), so the next Alloc(1) gets block 4 (page 2), not block 0.
  EXPECT_TRUE(Check({Alloc(0, 1, 2, 4, {0, 1, 2, 3}), Free(0, 3, 4, {0, 1}),
                     Alloc(1, 5, 6, 1, {4})}));
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 4, {0, 1, 2, 3}), Free(0, 3, 4, {0, 1}),
                      Alloc(1, 5, 6, 1, {0})}));
  // A refused Free of a block that was never allocated.
  EXPECT_FALSE(Check({Free(0, 1, 2, {5})}));
  Operation refused = Free(0, 1, 2, {5});
  refused.reason = FailureReason::kBlockNotAllocated;
  EXPECT_TRUE(Check({refused}));
}

TEST(Checker, ACapacityMaySeeAnAllocBetweenTakeAndCommit) {
  // After Alloc(1) -> [0], Alloc(3) takes block 1 of the OPEN page 0 and
  // maps page 1. In between, page 1 is in flight: only page 2 is available
  // (2 blocks) and blocks 0 and 1 are allocated. Before the call the pool
  // reports 5 and 1, after it 2 and 4.
  const History h = {Alloc(0, 1, 2, 1, {0}), Alloc(0, 3, 6, 3, {1, 2, 3}),
                     Capacity(1, 4, 5, 2, 2)};
  const CheckResult r = CheckLinearizable(h, PoolSpec(Config()));
  EXPECT_TRUE(r.linearizable);
  EXPECT_EQ(r.order, (std::vector<int>{0, 2, 1}));
  // A state no step of the call produces: block 1 taken, yet page 1
  // counted as available.
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 1, {0}), Alloc(0, 3, 6, 3, {1, 2, 3}),
                      Capacity(1, 4, 5, 4, 2)}));
  // The in-flight reading after the call returned.
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 1, {0}), Alloc(0, 3, 4, 3, {1, 2, 3}),
                      Capacity(1, 5, 6, 2, 2)}));
}

TEST(Checker, ACapacityMaySeeAFreeBeforeItsPageLands) {
  // Free(0, 1) empties page 0; while it is being unmapped it is neither
  // free nor available: 2 available (page 2), 2 allocated. Landed at the
  // back of the FREE list it makes 4 available.
  EXPECT_TRUE(Check({Alloc(0, 1, 2, 4, {0, 1, 2, 3}), Free(0, 3, 6, {0, 1}),
                     Capacity(1, 4, 5, 2, 2)}));
  EXPECT_TRUE(Check({Alloc(0, 1, 2, 4, {0, 1, 2, 3}), Free(0, 3, 6, {0, 1}),
                     Capacity(1, 4, 5, 4, 2)}));
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 4, {0, 1, 2, 3}), Free(0, 3, 6, {0, 1}),
                      Capacity(1, 4, 5, 3, 2)}));
  EXPECT_FALSE(Check({Alloc(0, 1, 2, 4, {0, 1, 2, 3}), Free(0, 3, 4, {0, 1}),
                      Capacity(1, 5, 6, 2, 2)}));
  // A full pool: while page 0 is being unmapped an Alloc(1) is refused;
  // once the Free returned it cannot be.
  const Operation all = Alloc(0, 1, 2, 6, {0, 1, 2, 3, 4, 5});
  EXPECT_TRUE(
      Check({all, Free(0, 3, 6, {0, 1}),
             Refused(Alloc(1, 4, 5, 1, {}), FailureReason::kPoolExhausted)}));
  EXPECT_FALSE(
      Check({all, Free(0, 3, 4, {0, 1}),
             Refused(Alloc(1, 5, 6, 1, {}), FailureReason::kPoolExhausted)}));
}

TEST(Checker, UnmapsLandInTheOrderTheyFinish) {
  // Free A empties page 0 (seen in flight by the Capacity before Free B
  // starts), Free B empties page 1 and returns first: page 1 lands at the
  // back of the FREE list ahead of page 0, still in flight, so the next
  // Alloc(2) gets page 1's blocks. (Found by a 10,000-history campaign.)
  const Operation all = Alloc(0, 1, 2, 6, {0, 1, 2, 3, 4, 5});
  EXPECT_TRUE(Check({all, Free(0, 3, 20, {0, 1}), Capacity(1, 5, 6, 0, 4),
                     Free(1, 7, 10, {2, 3}), Alloc(2, 11, 12, 2, {2, 3})}));
  // Page 0 may also have landed before Free B began.
  EXPECT_TRUE(Check({all, Free(0, 3, 20, {0, 1}), Capacity(1, 5, 6, 0, 4),
                     Free(1, 7, 10, {2, 3}), Alloc(2, 11, 12, 2, {0, 1})}));
}

// Many operations from a sequential run of the model, given overlapping
// windows: the true order is always a witness. Changing one outcome must
// make the history fail.
TEST(Checker, LargeGeneratedHistories) {
  std::mt19937_64 rng(7);
  int rejected = 0;
  for (int round = 0; round < 50; ++round) {
    reference::ReferenceModel model(Config());
    History h;
    std::vector<int64_t> held;
    for (int i = 0; i < 24; ++i) {
      Operation op;
      op.client = i % 4;
      // Each call overlaps the two before and after it.
      op.invoke = 10 * i;
      op.response = 10 * i + 25;
      if (held.empty() || rng() % 2 == 0) {
        op.kind = OpKind::kAlloc;
        op.num_blocks = 1 + rng() % 2;
        reference::MOutcome out = model.Alloc(op.num_blocks);
        op.reason = out.reason;
        op.result_ids = out.ids;
        held.insert(held.end(), out.ids.begin(), out.ids.end());
      } else {
        op.kind = OpKind::kFree;
        op.block_ids = {held.back()};
        held.pop_back();
        EXPECT_TRUE(model.Free(op.block_ids).ok());
      }
      h.push_back(op);
    }
    ASSERT_TRUE(Check(h)) << DebugString(h);
    // Corrupt one successful Alloc: it claims the block after its own.
    for (Operation& op : h) {
      if (op.kind == OpKind::kAlloc && op.ok()) {
        op.result_ids.back() += 1;
        break;
      }
    }
    if (!Check(h)) ++rejected;
  }
  EXPECT_EQ(rejected, 50);
}

}  // namespace
}  // namespace lin
}  // namespace kvbroker
