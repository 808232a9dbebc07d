// A linearizability checker for concurrent histories of pool operations, in
// the style of Wing & Gong with Lowe's memoization (as in Porcupine).
//
// A History is what several clients observed: each Operation with its
// arguments, its outcome, and the logical times at which it was invoked and
// at which its response arrived (one counter shared by all clients, read
// before sending and after receiving, so an operation whose response time
// precedes another's invoke time really finished before that one started).
//
// CheckLinearizable searches for a total order of the operations that
//   - respects real time (if a responded before b was invoked, a comes
//     first), and
//   - under which a sequential specification, started from its initial
//     state, predicts every recorded outcome;
// and reports whether one exists. The search walks the history's call and
// return events in time order, tries to linearize each pending call in turn,
// backtracks when it meets a return whose call could not be placed, and
// skips (operations linearized so far, specification state) pairs it has
// already explored.
//
// The sequential specification here is PoolSpec: the allocator's reference
// model (allocator/testing/reference_model.h) of one pool, with these
// comparisons:
//   Alloc / Reserve    the same block ids, or both refused (capacity
//                      refusals as one class; others by reason);
//   Free               both succeed, or both refuse;
//   ReleaseReservation the same number of blocks returned, or both refuse;
//   SetMemoryLimit     the same outcome and target pages;
//   Capacity           the same available, allocated and reserved blocks.
//
// Thread safety: none; histories are checked after they are recorded.

#ifndef KVBROKER_TESTS_RELIABILITY_LINEARIZABILITY_H_
#define KVBROKER_TESTS_RELIABILITY_LINEARIZABILITY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocator/failure.h"
#include "allocator/testing/reference_model.h"

namespace kvbroker {
namespace lin {

enum class OpKind {
  kAlloc,
  kFree,
  kReserve,
  kRelease,
  kSetMemoryLimit,
  kCapacity,
};
const char* OpKindName(OpKind kind);

struct Operation {
  int client = 0;
  int64_t invoke = 0;    // logical time the request was sent
  int64_t response = 0;  // logical time the response arrived; > invoke
  OpKind kind = OpKind::kCapacity;

  // Arguments.
  int64_t num_blocks = 0;          // Alloc, Reserve
  std::vector<int64_t> block_ids;  // Free
  std::string reservation_id;      // Alloc (optional), ReleaseReservation
  int64_t limit_bytes = 0;         // SetMemoryLimit
  int64_t revision = 0;            // SetMemoryLimit

  // Outcome. reason == kUnspecified: the call succeeded.
  FailureReason reason = FailureReason::kUnspecified;
  std::vector<int64_t> result_ids;  // Alloc, Reserve: every id, ascending
  std::string result_reservation;   // Reserve
  int64_t result_count = 0;         // ReleaseReservation: blocks returned
  reference::MLimitOutcome limit_outcome = reference::MLimitOutcome::kApplied;
  int64_t target_pages = 0;      // SetMemoryLimit
  int64_t available_blocks = 0;  // Capacity
  int64_t allocated_blocks = 0;  // Capacity
  int64_t reserved_blocks = 0;   // Capacity

  bool ok() const { return reason == FailureReason::kUnspecified; }
  std::string DebugString() const;
};

using History = std::vector<Operation>;

// A sequential specification: a state that an operation either moves on
// (when the recorded outcome is the one the state predicts) or rejects.
class Spec {
 public:
  virtual ~Spec() = default;
  virtual std::unique_ptr<Spec> Clone() const = 0;
  // Applies `op` and returns true when its recorded outcome is what this
  // state predicts; otherwise returns false (the state is then unspecified
  // and the caller discards it).
  virtual bool Apply(const Operation& op) = 0;
  // Equal for equal states, different otherwise.
  virtual std::string Fingerprint() const = 0;
};

// One pool, as the reference model sees it.
class PoolSpec final : public Spec {
 public:
  explicit PoolSpec(const reference::ModelConfig& config) : model_(config) {}
  std::unique_ptr<Spec> Clone() const override {
    return std::make_unique<PoolSpec>(*this);
  }
  bool Apply(const Operation& op) override;
  std::string Fingerprint() const override;

 private:
  reference::ReferenceModel model_;
};

struct CheckResult {
  bool linearizable = false;
  // States explored (cache misses); a measure of the search's cost.
  int64_t explored = 0;
  // When linearizable: indices into the history, in a witnessing order.
  std::vector<int> order;
};

// REQUIRES: every operation's invoke < response, and all times distinct.
CheckResult CheckLinearizable(const History& history, const Spec& initial);

// The history, one operation per line, in invoke order.
std::string DebugString(const History& history);

}  // namespace lin
}  // namespace kvbroker

#endif  // KVBROKER_TESTS_RELIABILITY_LINEARIZABILITY_H_
