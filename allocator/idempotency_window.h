// IdempotencyWindow: the outcomes of recent request ids of one pool, so that
// a retried Alloc, Free or Reserve is answered from memory instead of being
// applied twice (the request_id of Alloc, Free and Reserve). An entry is kept for `window` after it
// was stored, and at most `capacity` entries are kept (oldest forgotten
// first). A request id whose call is still running (its pages in flight) is
// *pending*: the pool makes a retry wait for it rather than run it again.
//
// Thread safety: none. The owning pool's lock guards every call.

#ifndef KVBROKER_ALLOCATOR_IDEMPOTENCY_WINDOW_H_
#define KVBROKER_ALLOCATOR_IDEMPOTENCY_WINDOW_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "allocator/pool_types.h"

namespace kvbroker {

class IdempotencyWindow {
 public:
  using Outcome = std::variant<AllocResult, FreeResult, ReservationInfo>;

  struct Entry {
    std::string fingerprint;  // what the request asked for
    Outcome outcome;
    absl::Time at;
  };

  IdempotencyWindow(absl::Duration window, int64_t capacity);

  // Forgets entries older than the window at `now` (and any over capacity),
  // then returns the entry of `request_id`, or nullptr.
  const Entry* Recall(const std::string& request_id, absl::Time now);
  // Stores the outcome of `request_id` at `now`, replacing any entry.
  void Remember(const std::string& request_id, std::string fingerprint,
                Outcome outcome, absl::Time now);

  // A call under `request_id` is running; a retry must wait for it.
  void MarkPending(const std::string& request_id) {
    pending_.insert(request_id);
  }
  void ClearPending(const std::string& request_id) {
    pending_.erase(request_id);
  }
  bool IsPending(const std::string& request_id) const {
    return pending_.count(request_id) > 0;
  }

  size_t size() const { return entries_.size(); }

 private:
  const absl::Duration window_;
  const int64_t capacity_;
  absl::flat_hash_map<std::string, Entry> entries_;
  std::deque<std::pair<absl::Time, std::string>> order_;
  absl::flat_hash_set<std::string> pending_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_IDEMPOTENCY_WINDOW_H_
