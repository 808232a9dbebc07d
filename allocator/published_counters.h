// PublishedCounters: the counters a pool's Capacity reads, published by the
// holder of the pool lock and read by anyone without it (a sequence lock).
//
// The pool publishes before every release of its lock (docs/design.md,
// "Capacity without the lock"), so whenever the lock is free the published
// values are the pool's state; while a call holds the lock they are the
// state at the last release, which is the state before that call's current
// step. A reader never waits for the pool lock: it only retries while a
// publication (a few dozen stores) is under way.
//
// The sequence lock itself (its protocol and layout) is seqlock.h.
//
// Thread safety: Publish requires the owner's lock; Read is thread-safe.

#ifndef KVBROKER_ALLOCATOR_PUBLISHED_COUNTERS_H_
#define KVBROKER_ALLOCATOR_PUBLISHED_COUNTERS_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "allocator/page_ledger.h"
#include "allocator/seqlock.h"

namespace kvbroker {

// What Capacity needs besides the device budget; all of it O(1) to read.
// Plain int64 words so that the whole struct travels through the sequence
// lock. Equality is word by word.
struct PoolCounters {
  int64_t generation = 0;
  int64_t shut_down = 0;  // 0 or 1
  int64_t failed = 0;     // 0 or 1
  int64_t mapped_supply = 0;
  int64_t free_pages = 0;
  int64_t free_total = 0;  // usable blocks of the whole FREE list
  int64_t reserved = 0;
  int64_t allocated = 0;
  int64_t admitted_usable = 0;
  int64_t mapped_pages = 0;
  int64_t pages_by_state[kPageStates] = {};  // indexed by PageState
  int64_t limit_state = 0;                   // LimitState
  int64_t limit_bytes = 0;
  int64_t limit_revision = -1;
  int64_t target_pages = 0;
  // Pages engines were asked to let go of and have not yet (revoking or
  // quarantined); while any are, Capacity takes the lock to tell the two
  // apart. Pages their unmapping call still owns are not counted here.
  int64_t revoking = 0;
  // The earliest reservation expiry in Unix nanoseconds; kNoExpiry when no
  // reservation is live.
  int64_t next_expiry_ns = kNoExpiry;

  static constexpr int64_t kNoExpiry = std::numeric_limits<int64_t>::max();

  bool operator==(const PoolCounters& o) const {
    return std::memcmp(this, &o, sizeof(*this)) == 0;
  }
  bool operator!=(const PoolCounters& o) const { return !(*this == o); }
};
static_assert(std::is_trivially_copyable_v<PoolCounters>);
static_assert(sizeof(PoolCounters) % sizeof(int64_t) == 0);

// Written under the pool lock, read by anyone without it (seqlock.h).
using PublishedCounters = SeqLock<PoolCounters>;

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PUBLISHED_COUNTERS_H_
