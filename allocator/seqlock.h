// SeqLock<T>: a value of trivially copyable T published by one writer at a
// time and read by anyone without a lock (a sequence lock). The pool's
// counters (published_counters.h) and each device's budget figures
// (device_budget.h) travel through it, so that Capacity reads both without
// taking a lock (docs/design.md, "Capacity without the lock").
//
// Protocol: the writer makes `seq_` odd, stores every word (release), and
// makes it even again (release); a reader takes an even `seq_` (acquire),
// loads every word (acquire, so that the second look at `seq_` cannot move
// before them), and accepts them if `seq_` did not move. A reader that saw
// a word of a newer publication sees `seq_` odd or moved. Every word is an
// atomic, so a torn read is detected, never undefined; no fences, which TSan
// does not model.
//
// Layout: the words readers load sit on cache lines of their own, apart
// from the writer's copy and from whatever the owner places next to this
// object (its lock word, its statistics), so that the writer's other stores
// do not take the readers' lines away from them (false sharing).
//
// Thread safety: Publish and last() require the owner's lock (one writer at
// a time); Read is thread-safe.

#ifndef KVBROKER_ALLOCATOR_SEQLOCK_H_
#define KVBROKER_ALLOCATOR_SEQLOCK_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kvbroker {

inline constexpr size_t kCacheLine = 64;

template <typename T>
class SeqLock {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(sizeof(T) % sizeof(int64_t) == 0);

 public:
  static constexpr size_t kWords = sizeof(T) / sizeof(int64_t);

  SeqLock() : last_() { Store(last_); }
  SeqLock(const SeqLock&) = delete;
  SeqLock& operator=(const SeqLock&) = delete;

  // Makes `v` what Read returns. Skips the stores when `v` equals what was
  // last published (bytewise), so that readers retry only on real changes.
  // REQUIRES: the owner's lock.
  void Publish(const T& v) {
    if (std::memcmp(&v, &last_, sizeof(T)) == 0) return;
    last_ = v;
    Store(v);
  }

  // What the writer last published. REQUIRES: the owner's lock.
  const T& last() const { return last_; }

  // The sequence number: even while no publication is under way, moved by
  // two by each one that changed something.
  uint64_t sequence_for_testing() const {
    return shared_.seq.load(std::memory_order_acquire);
  }

  // The last published value, consistent as a whole.
  T Read() const {
    std::array<int64_t, kWords> w;
    for (;;) {
      const uint64_t s1 = shared_.seq.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      for (size_t i = 0; i < kWords; ++i) {
        w[i] = shared_.words[i].load(std::memory_order_acquire);
      }
      if (shared_.seq.load(std::memory_order_relaxed) == s1) break;
    }
    T v;
    std::memcpy(static_cast<void*>(&v), w.data(), sizeof(T));
    return v;
  }

 private:
  void Store(const T& v) {
    std::array<int64_t, kWords> w;
    std::memcpy(w.data(), &v, sizeof(T));
    const uint64_t s = shared_.seq.load(std::memory_order_relaxed);
    shared_.seq.store(s + 1, std::memory_order_relaxed);
    for (size_t i = 0; i < kWords; ++i) {
      shared_.words[i].store(w[i], std::memory_order_release);
    }
    shared_.seq.store(s + 2, std::memory_order_release);
  }

  // What readers load, on lines of its own.
  struct alignas(kCacheLine) Shared {
    std::atomic<uint64_t> seq{0};
    std::array<std::atomic<int64_t>, kWords> words = {};
  };
  Shared shared_;
  alignas(kCacheLine) T last_;  // the writer's copy
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_SEQLOCK_H_
