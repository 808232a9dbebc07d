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
// Protocol: one writer at a time (the pool lock serialises them). The writer
// makes `seq_` odd, stores every word (release), and makes it even again
// (release); a reader takes an even `seq_` (acquire), loads every word
// (acquire, so that the second look at `seq_` cannot move before them), and
// accepts them if `seq_` did not move. A reader that saw a word of a newer
// publication sees `seq_` odd or moved. Every word is an atomic, so a torn
// read is detected, never undefined; no fences, which TSan does not model.
//
// Thread safety: Publish requires the owner's lock; Read is thread-safe.

#ifndef KVBROKER_ALLOCATOR_PUBLISHED_COUNTERS_H_
#define KVBROKER_ALLOCATOR_PUBLISHED_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "allocator/page_ledger.h"

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
  // Pages held for engines' acknowledgements (revoking or quarantined);
  // while any are, Capacity takes the lock to tell the two apart.
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

class PublishedCounters {
 public:
  static constexpr size_t kWords = sizeof(PoolCounters) / sizeof(int64_t);

  PublishedCounters() { Store(last_); }

  // Makes `c` what Read returns. Skips the stores when `c` equals what was
  // last published, so that readers retry only on real changes.
  // REQUIRES: the owner's lock (one writer at a time).
  void Publish(const PoolCounters& c) {
    if (c == last_) return;
    last_ = c;
    Store(c);
  }

  // What the writer last published. REQUIRES: the owner's lock.
  const PoolCounters& last() const { return last_; }

  // The last published counters, consistent as a whole.
  PoolCounters Read() const {
    std::array<int64_t, kWords> w;
    for (;;) {
      const uint64_t s1 = seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      for (size_t i = 0; i < kWords; ++i) {
        w[i] = words_[i].load(std::memory_order_acquire);
      }
      if (seq_.load(std::memory_order_relaxed) == s1) break;
    }
    PoolCounters c;
    std::memcpy(static_cast<void*>(&c), w.data(), sizeof(c));
    return c;
  }

 private:
  void Store(const PoolCounters& c) {
    std::array<int64_t, kWords> w;
    std::memcpy(w.data(), &c, sizeof(c));
    const uint64_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    for (size_t i = 0; i < kWords; ++i) {
      words_[i].store(w[i], std::memory_order_release);
    }
    seq_.store(s + 2, std::memory_order_release);
  }

  std::atomic<uint64_t> seq_{0};
  std::array<std::atomic<int64_t>, kWords> words_ = {};
  PoolCounters last_;  // the writer's copy
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PUBLISHED_COUNTERS_H_
