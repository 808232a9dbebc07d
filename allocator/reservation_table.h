// ReservationTable: the reservations of one pool (Reserve): which
// blocks each holds, when each expires, and which ids expired recently (so
// that a late Alloc or Release hears RESERVATION_EXPIRED, not NOT_FOUND).
// It owns ids and times only; the blocks themselves are the ledger's, and the
// pool moves them (docs/design.md, "The pool in parts").
//
// Invariant: every live reservation has exactly one entry in the expiry
// index, at its expiry time.
//
// Thread safety: none. The owning pool's lock guards every call.

#ifndef KVBROKER_ALLOCATOR_RESERVATION_TABLE_H_
#define KVBROKER_ALLOCATOR_RESERVATION_TABLE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/units.h"

namespace kvbroker {

struct Reservation {
  std::string id;
  std::vector<BlockId> blocks;  // remaining, ascending
  absl::Time expires;
};

class ReservationTable {
 public:
  // Remembers at most `expired_remembered` expired ids, oldest forgotten
  // first.
  explicit ReservationTable(int64_t expired_remembered);

  // Adds a reservation of `blocks` (ascending) under a fresh id
  // ("res-1", "res-2", ...).
  const Reservation& Add(std::vector<BlockId> blocks, absl::Time expires);
  // nullptr when `id` is not live.
  Reservation* Find(const std::string& id);
  // Whether `id` expired (and is still remembered).
  bool WasExpired(const std::string& id) const {
    return expired_.count(id) > 0;
  }
  // Removes a live reservation and returns it. REQUIRES: Find(id) != null.
  Reservation Remove(const std::string& id);
  // The earliest expiry, if any reservation is live.
  std::optional<absl::Time> next_expiry() const;
  // Removes the reservations whose expiry is at or before `now`, remembers
  // their ids as expired, and returns them (earliest first).
  std::vector<Reservation> TakeExpired(absl::Time now);

  // Takes the first `n` (smallest) blocks of a reservation.
  // REQUIRES: n <= r.blocks.size().
  static std::vector<BlockId> TakeFront(Reservation& r, int64_t n);
  // Gives back blocks TakeFront took (ascending, all smaller than the rest).
  static void PutFront(Reservation& r, absl::Span<const BlockId> ascending);

  // Σ |blocks| over live reservations, and a walk for invariant checks.
  int64_t total_blocks() const;
  const std::map<std::string, Reservation>& live() const { return live_; }

 private:
  const int64_t expired_remembered_;
  std::map<std::string, Reservation> live_;
  std::set<std::pair<absl::Time, std::string>> expiry_;
  std::set<std::string> expired_;
  std::deque<std::string> expired_order_;
  uint64_t next_id_ = 1;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_RESERVATION_TABLE_H_
