#include "tests/reliability/linearizability.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvbroker {
namespace lin {

using reference::MLimitResult;
using reference::MOutcome;

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAlloc: return "Alloc";
    case OpKind::kFree: return "Free";
    case OpKind::kReserve: return "Reserve";
    case OpKind::kRelease: return "ReleaseReservation";
    case OpKind::kSetMemoryLimit: return "SetMemoryLimit";
    case OpKind::kCapacity: return "Capacity";
  }
  return "?";
}

std::string Operation::DebugString() const {
  std::string args;
  switch (kind) {
    case OpKind::kAlloc:
      args = absl::StrCat(num_blocks, reservation_id.empty() ? "" : " from ",
                          reservation_id);
      break;
    case OpKind::kFree: args = absl::StrJoin(block_ids, " "); break;
    case OpKind::kReserve: args = absl::StrCat(num_blocks); break;
    case OpKind::kRelease: args = reservation_id; break;
    case OpKind::kSetMemoryLimit:
      args = absl::StrCat(limit_bytes, " rev ", revision);
      break;
    case OpKind::kCapacity: break;
  }
  std::string out;
  if (!ok()) {
    out = std::string(ReasonName(reason));
  } else {
    switch (kind) {
      case OpKind::kAlloc:
        out = absl::StrCat("[", absl::StrJoin(result_ids, " "), "]");
        break;
      case OpKind::kReserve:
        out = absl::StrCat(result_reservation, " [",
                           absl::StrJoin(result_ids, " "), "]");
        break;
      case OpKind::kRelease: out = absl::StrCat(result_count, " blocks"); break;
      case OpKind::kSetMemoryLimit:
        out = absl::StrCat("outcome ", static_cast<int>(limit_outcome),
                           " target ", target_pages);
        break;
      case OpKind::kCapacity:
        out = absl::StrCat("available ", available_blocks, " allocated ",
                           allocated_blocks, " reserved ", reserved_blocks);
        break;
      case OpKind::kFree: out = "ok"; break;
    }
  }
  return absl::StrCat("client ", client, " [", invoke, ", ", response, "] ",
                      OpKindName(kind), "(", args, ") -> ", out);
}

std::string DebugString(const History& history) {
  std::vector<const Operation*> ops;
  for (const Operation& op : history) ops.push_back(&op);
  std::sort(ops.begin(), ops.end(), [](const Operation* a, const Operation* b) {
    return a->invoke < b->invoke;
  });
  std::string out;
  for (const Operation* op : ops)
    absl::StrAppend(&out, op->DebugString(), "\n");
  return out;
}

// ---------------------------------------------------------------------------
// PoolSpec

namespace {

// The model's refusal reasons for capacity are a best guess (reference
// model); every other reason must match exactly.
bool SameRefusal(FailureReason observed, FailureReason predicted) {
  if (IsCapacityReason(observed) && IsCapacityReason(predicted)) return true;
  return observed == predicted;
}

bool Matches(const Operation& op, const MOutcome& want) {
  if (!op.ok() || !want.ok()) {
    return !op.ok() && !want.ok() && SameRefusal(op.reason, want.reason);
  }
  return op.result_ids == want.ids;
}

}  // namespace

bool PoolSpec::Apply(const Operation& op) {
  return unmapping_.empty() ? ApplyToModel(op) : ApplyDuringUnmap(op);
}

bool PoolSpec::ApplyDuringUnmap(const Operation& op) {
  switch (op.kind) {
    case OpKind::kCapacity: return ApplyToModel(op);
    // The pool's SetMemoryLimit waits for every unmap in flight.
    case OpKind::kSetMemoryLimit: return false;
    case OpKind::kFree:
    case OpKind::kRelease: {
      // Only a call that unmaps nothing itself (else it is one more unmap,
      // in two steps).
      const int64_t mapped = model_.MappedPages();
      return ApplyToModel(op) && model_.MappedPages() == mapped;
    }
    case OpKind::kAlloc:
    case OpKind::kReserve: {
      // The pages in flight are not available: a capacity refusal is right
      // when the call needs more than the rest offers (a refusal changes
      // nothing) ...
      if (!op.ok() && IsCapacityReason(op.reason)) {
        int64_t need = op.num_blocks;
        if (op.kind == OpKind::kAlloc && !op.reservation_id.empty()) {
          auto it = model_.reservations().find(op.reservation_id);
          if (it != model_.reservations().end()) {
            need -= static_cast<int64_t>(it->second.size());
          }
        }
        if (need > AvailableBlocks()) return true;
      }
      // ... and a call served never gets a block of theirs.
      if (!ApplyToModel(op)) return false;
      for (int64_t b : op.result_ids) {
        for (const auto& [index, pages] : unmapping_) {
          if (std::find(pages.begin(), pages.end(), model_.page_of(b)) !=
              pages.end()) {
            return false;
          }
        }
      }
      return true;
    }
  }
  return false;
}

bool PoolSpec::ApplyToModel(const Operation& op) {
  switch (op.kind) {
    case OpKind::kAlloc:
      return Matches(op, op.reservation_id.empty()
                             ? model_.Alloc(op.num_blocks)
                             : model_.AllocFromReservation(op.reservation_id,
                                                           op.num_blocks));
    case OpKind::kReserve: {
      // The model takes the id the pool assigned; an id it already holds
      // cannot be a new reservation's.
      if (op.ok() && ReservationIdTaken(op.result_reservation)) return false;
      return Matches(op, model_.Reserve(op.num_blocks, op.result_reservation));
    }
    case OpKind::kFree: {
      const MOutcome want = model_.Free(op.block_ids);
      return op.ok() == want.ok();
    }
    case OpKind::kRelease: {
      const MOutcome want = model_.Release(op.reservation_id);
      if (!op.ok() || !want.ok()) {
        return !op.ok() && !want.ok() && SameRefusal(op.reason, want.reason);
      }
      return op.result_count == static_cast<int64_t>(want.ids.size());
    }
    case OpKind::kSetMemoryLimit: {
      // The pool's SetMemoryLimit waits until no call has pages in flight.
      if (!pending_.empty()) return false;
      const MLimitResult want =
          model_.SetMemoryLimit(op.limit_bytes, op.revision);
      if (!want.ok || !op.ok()) {
        return !want.ok && op.reason == FailureReason::kInvalidArgument;
      }
      return op.limit_outcome == want.outcome &&
             op.target_pages == want.target_pages;
    }
    case OpKind::kCapacity:
      return op.ok() && op.available_blocks == AvailableBlocks() &&
             op.allocated_blocks == model_.AllocatedBlocks() &&
             op.reserved_blocks == model_.ReservedBlocks();
  }
  return false;
}

bool PoolSpec::ReservationIdTaken(const std::string& id) const {
  if (model_.reservations().count(id)) return true;
  for (const auto& [index, p] : pending_) {
    if (p.in_flight.owner == reference::MBlock::kReserved &&
        p.reservation == id) {
      return true;
    }
  }
  return false;
}

int64_t PoolSpec::AvailableBlocks() const {
  if (unmapping_.empty()) return model_.AvailableBlocks();
  // Pages in flight are off every list and still charged to the budget.
  std::vector<int64_t> away;
  for (const auto& [index, pages] : unmapping_) {
    away.insert(away.end(), pages.begin(), pages.end());
  }
  int64_t total = 0;
  for (int64_t p = 0; p < model_.page_count(); ++p) {
    if (model_.page_state(p) == reference::MPage::kOpen) {
      total += model_.free_blocks(p);
    }
    if (model_.page_state(p) == reference::MPage::kIdle) {
      total += model_.usable(p);
    }
  }
  int64_t affordable = std::max<int64_t>(
      0, model_.Affordable() - static_cast<int64_t>(away.size()));
  for (int64_t p : model_.free_list()) {
    if (affordable == 0) break;
    if (std::find(away.begin(), away.end(), p) != away.end()) continue;
    total += model_.usable(p);
    --affordable;
  }
  return total;
}

bool PoolSpec::BeginUnmap(int index, const Operation& op) {
  if (op.kind != OpKind::kFree && op.kind != OpKind::kRelease &&
      op.kind != OpKind::kSetMemoryLimit) {
    return false;
  }
  std::vector<bool> mapped(model_.page_count());
  for (int64_t p = 0; p < model_.page_count(); ++p) {
    const reference::MPage s = model_.page_state(p);
    mapped[p] = s == reference::MPage::kIdle || s == reference::MPage::kOpen ||
                s == reference::MPage::kFull;
  }
  // (SetMemoryLimit waits for the unmaps in flight.)
  if (op.kind == OpKind::kSetMemoryLimit && !unmapping_.empty()) return false;
  if (!ApplyToModel(op)) return false;
  std::vector<int64_t> pages;
  for (int64_t p = 0; p < model_.page_count(); ++p) {
    const reference::MPage s = model_.page_state(p);
    if (mapped[p] &&
        (s == reference::MPage::kFree || s == reference::MPage::kReclaimed)) {
      pages.push_back(p);
    }
  }
  if (pages.empty()) return false;
  unmapping_[index] = std::move(pages);
  return true;
}

bool PoolSpec::Begin(int index, const Operation& op) {
  if (BeginUnmap(index, op)) return true;
  if (!unmapping_.empty()) return false;
  const bool alloc = op.kind == OpKind::kAlloc && op.reservation_id.empty();
  if (!op.ok() || (!alloc && op.kind != OpKind::kReserve)) return false;
  if (op.kind == OpKind::kReserve &&
      ReservationIdTaken(op.result_reservation)) {
    return false;
  }
  if (!model_.WouldMap(op.num_blocks)) return false;
  reference::MInFlight f =
      model_.BeginAcquire(op.num_blocks, alloc ? reference::MBlock::kAllocated
                                               : reference::MBlock::kReserved);
  for (int64_t b : f.taken) {
    if (!std::binary_search(op.result_ids.begin(), op.result_ids.end(), b)) {
      return false;
    }
  }
  pending_[index] = {std::move(f), alloc ? "" : op.result_reservation};
  return true;
}

bool PoolSpec::Commit(int index, const Operation& op) {
  if (auto u = unmapping_.find(index); u != unmapping_.end()) {
    // Pages reach the back of the FREE list as their unmaps finish, so the
    // landing pages go there, behind every page still in flight: those go
    // behind again, in their order, and land later.
    for (int64_t p : u->second) model_.RequeueFreeAtBack(p);
    unmapping_.erase(u);
    for (const auto& [other, pages] : unmapping_) {
      for (int64_t p : pages) model_.RequeueFreeAtBack(p);
    }
    return true;
  }
  auto it = pending_.find(index);
  if (it == pending_.end()) return false;
  const MOutcome got =
      model_.CommitAcquire(it->second.in_flight, it->second.reservation);
  pending_.erase(it);
  return got.ids == op.result_ids;
}

std::string PoolSpec::Fingerprint() const {
  std::string f;
  f.reserve(64 + model_.page_count() * 2);
  for (int64_t p = 0; p < model_.page_count(); ++p) {
    f.push_back(
        static_cast<char>('a' + static_cast<int>(model_.page_state(p))));
  }
  f.push_back('|');
  for (int64_t b = 0; b < model_.range_end(model_.page_count() - 1); ++b) {
    f.push_back(
        static_cast<char>('a' + static_cast<int>(model_.block_state(b))));
  }
  absl::StrAppend(&f, "|F", absl::StrJoin(model_.free_list(), ","), "|I",
                  absl::StrJoin(model_.idle_list(), ","), "|R",
                  absl::StrJoin(model_.reclaimed_list(), ","), "|L",
                  static_cast<int>(model_.limit_state()), ",",
                  model_.limit_revision(), ",", model_.limit_bytes(), ",",
                  model_.target_pages());
  for (const auto& [id, blocks] : model_.reservations()) {
    absl::StrAppend(&f, "|", id, ":", absl::StrJoin(blocks, ","));
  }
  for (const auto& [index, pages] : unmapping_) {
    absl::StrAppend(&f, "|U", index, ":", absl::StrJoin(pages, ","));
  }
  for (const auto& [index, p] : pending_) {
    const reference::MInFlight& g = p.in_flight;
    absl::StrAppend(
        &f, "|P", index, ":", static_cast<int>(g.owner), ":",
        absl::StrJoin(g.taken, ","), ":", absl::StrJoin(g.from_idle, ","), ":",
        absl::StrJoin(g.pages, ","), ":", g.fresh_need, ":", p.reservation);
  }
  return f;
}

// ---------------------------------------------------------------------------
// The search

namespace {

// One call or return event, in a doubly linked list ordered by time.
struct Event {
  int op = 0;
  bool is_call = false;
  int64_t time = 0;
  Event* match = nullptr;  // a call's return
  Event* prev = nullptr;
  Event* next = nullptr;
};

// Unlinks a call and its return (the call is linearized).
void Lift(Event* call) {
  call->prev->next = call->next;
  call->next->prev = call->prev;
  Event* ret = call->match;
  ret->prev->next = ret->next;
  if (ret->next != nullptr) ret->next->prev = ret->prev;
}

// Undoes Lift, in reverse.
void Unlift(Event* call) {
  Event* ret = call->match;
  ret->prev->next = ret;
  if (ret->next != nullptr) ret->next->prev = ret;
  call->prev->next = call;
  call->next->prev = call;
}

}  // namespace

CheckResult CheckLinearizable(const History& history, const Spec& initial) {
  CheckResult result;
  const int n = static_cast<int>(history.size());
  std::vector<Event> events(2 * n + 1);
  Event* head = &events[2 * n];  // sentinel before the first event
  std::vector<Event*> sorted;
  for (int i = 0; i < n; ++i) {
    Event* call = &events[2 * i];
    Event* ret = &events[2 * i + 1];
    *call = {i, true, history[i].invoke, ret};
    *ret = {i, false, history[i].response, nullptr};
    sorted.push_back(call);
    sorted.push_back(ret);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const Event* a, const Event* b) { return a->time < b->time; });
  Event* prev = head;
  for (Event* e : sorted) {
    prev->next = e;
    e->prev = prev;
    prev = e;
  }

  // linearized[i]: '0' pending, 'b' begun (first of two steps done), '1'
  // linearized. A call stays in the list until it is linearized.
  struct Frame {
    Event* call;
    int choice;                   // 0: one step or commit; 1: begin
    char before;                  // linearized[call->op] before the step
    std::unique_ptr<Spec> state;  // the state before the step
  };
  std::vector<Frame> stack;
  std::unique_ptr<Spec> state = initial.Clone();
  std::string linearized(n, '0');
  std::unordered_set<std::string> seen;

  Event* entry = head->next;
  int choice = 0;
  while (head->next != nullptr) {
    const int i = entry->op;
    const bool begun = linearized[i] == 'b';
    if (entry->is_call && choice == 1 && begun) choice = 2;
    if (entry->is_call && choice < 2) {
      std::unique_ptr<Spec> next = state->Clone();
      bool ok = false;
      if (choice == 0) {
        ok = begun ? next->Commit(i, history[i]) : next->Apply(history[i]);
      } else if (!begun) {
        ok = next->Begin(i, history[i]);
      }
      if (ok) {
        const char before = linearized[i];
        linearized[i] = choice == 0 ? '1' : 'b';
        std::string key = absl::StrCat(linearized, "#", next->Fingerprint());
        if (seen.insert(std::move(key)).second) {
          ++result.explored;
          stack.push_back({entry, choice, before, std::move(state)});
          state = std::move(next);
          if (choice == 0) Lift(entry);
          entry = head->next;
          choice = 0;
          continue;
        }
        linearized[i] = before;
      }
      ++choice;
      continue;
    }
    if (entry->is_call) {
      entry = entry->next;
      choice = 0;
      continue;
    }
    // A return whose call is not linearized yet: undo the last step and try
    // that call's next choice.
    if (stack.empty()) return result;
    Frame frame = std::move(stack.back());
    stack.pop_back();
    state = std::move(frame.state);
    linearized[frame.call->op] = frame.before;
    if (frame.choice == 0) Unlift(frame.call);
    entry = frame.call;
    choice = frame.choice + 1;
  }
  result.linearizable = true;
  for (const Frame& f : stack) {
    if (f.choice == 0) result.order.push_back(f.call->op);
  }
  return result;
}

}  // namespace lin
}  // namespace kvbroker
