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
// An Alloc or Reserve that maps pages holds them in flight between taking its
// blocks and committing (docs/design.md, "The mapping transaction"), and a
// concurrent Capacity may observe that state. So a successful such call may
// also be linearized as two steps inside its interval: Begin (the model's
// BeginAcquire) and Commit (CommitAcquire), with other operations between
// them; the state key of the memoized search includes every begun call.
// Unmapping mirrors this: a Free, ReleaseReservation or SetMemoryLimit that
// unmaps pages may be linearized as its state change (its pages in flight:
// neither available nor free, still charged to the budget) and, later in
// its interval, their landing; between the two, the pages are not available
// to other calls and no call may set the limit or map pages. Pages bound
// for the FREE list land at its back in the order their unmaps finish (the
// landing steps' order), as the pool lands them; until then the model keeps
// them behind every landed page.
//
// Thread safety: none; histories are checked after they are recorded.

#ifndef KVBROKER_TESTS_RELIABILITY_LINEARIZABILITY_H_
#define KVBROKER_TESTS_RELIABILITY_LINEARIZABILITY_H_

#include <cstdint>
#include <map>
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
  // Equal for equal states (pending two-step calls included), different
  // otherwise.
  virtual std::string Fingerprint() const = 0;
  // The first of two steps of history operation `index`: returns true when
  // `op` may start in flight here (the state then holds it pending).
  virtual bool Begin(int index, const Operation& op) {
    (void)index;
    (void)op;
    return false;
  }
  // The second step. REQUIRES: Begin(index, op) returned true earlier.
  // Returns true when the recorded outcome is what the state predicts.
  virtual bool Commit(int index, const Operation& op) {
    (void)index;
    (void)op;
    return false;
  }
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
  // A successful Alloc (not from a reservation) or Reserve that would map:
  // BeginAcquire, whose taken blocks must all be among the recorded ids.
  // Or an operation that unmaps pages: Apply, with those pages in flight.
  bool Begin(int index, const Operation& op) override;
  // CommitAcquire must return exactly the recorded ids; an unmap lands.
  bool Commit(int index, const Operation& op) override;

 private:
  struct Pending {
    reference::MInFlight in_flight;
    std::string reservation;  // a Reserve's recorded id
  };
  bool ApplyToModel(const Operation& op);
  // Apply while pages are being unmapped: the model shows them landed, the
  // pool does not have them.
  bool ApplyDuringUnmap(const Operation& op);
  // Capacity's available blocks, with pages being unmapped taken out.
  int64_t AvailableBlocks() const;
  bool BeginUnmap(int index, const Operation& op);
  // An id the model holds, or a begun Reserve will record.
  bool ReservationIdTaken(const std::string& id) const;

  reference::ReferenceModel model_;
  // Calls begun and not yet committed, by history index.
  std::map<int, Pending> pending_;
  // Pages being unmapped, by history index of the call; the model already
  // shows them landed.
  std::map<int, std::vector<int64_t>> unmapping_;
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
