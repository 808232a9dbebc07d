// SpinThenLock: the pool lock. A thread that finds it held spins for a
// bounded time (with the CPU's pause hint) before it parks in an
// absl::Mutex; and a holder between two steps of a long walk can hand it to
// a thread that waits (docs/design.md, "Locking").
//
// Why: what the pool does under its lock is short (microseconds), and on a
// busy machine the wake-up of a parked thread costs far more than the wait
// itself. A waiter that spins takes the lock as soon as it is released; it
// parks only when the hold is long, and then costs no CPU. A holder that
// releases the lock between steps and takes it straight back would win the
// race against a waiter every time; Yield lets the waiter in first.
//
// Thread safety: thread-safe. Annotated for clang's thread-safety analysis
// (ABSL_LOCKABLE), so fields guarded by it are checked like those guarded
// by an absl::Mutex; its own members are not analysed (they implement the
// capability on top of the absl::Mutex).

#ifndef KVBROKER_ALLOCATOR_SPIN_THEN_LOCK_H_
#define KVBROKER_ALLOCATOR_SPIN_THEN_LOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvbroker {

class ABSL_LOCKABLE SpinThenLock {
 public:
  // Tries before parking, each after a pause hint: the time this takes
  // depends on the CPU (121 us where a pause takes 60 ns; docs/design.md).
  static constexpr int kSpins = 2000;

  SpinThenLock() = default;
  SpinThenLock(const SpinThenLock&) = delete;
  SpinThenLock& operator=(const SpinThenLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (mu_.TryLock()) return;
    waiters_.fetch_add(1, std::memory_order_relaxed);
    bool got = false;
    for (int i = 0; i < kSpins && !got; ++i) {
      Pause();
      got = mu_.TryLock();
    }
    if (!got) mu_.Lock();
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }

  void Unlock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.Unlock();
  }

  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }

  // Releases the lock until `cond` holds (evaluated with the lock held),
  // as absl::Mutex::Await.
  void Await(const absl::Condition& cond)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.Await(cond);
  }

  // Releases the lock and takes it again; a thread that was waiting for it
  // gets it in between (the caller spins, bounded, until one has).
  void Yield()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const int64_t waiting = waiters_.load(std::memory_order_relaxed);
    mu_.Unlock();
    for (int i = 0; i < kSpins && waiting > 0 &&
                    waiters_.load(std::memory_order_relaxed) >= waiting;
         ++i) {
      Pause();
    }
    Lock();
  }

 private:
  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  absl::Mutex mu_;
  // Threads inside Lock() that did not get the lock at once.
  std::atomic<int64_t> waiters_{0};
};

// Holds a SpinThenLock for a scope, as absl::MutexLock.
class ABSL_SCOPED_LOCKABLE SpinThenLockGuard {
 public:
  explicit SpinThenLockGuard(SpinThenLock* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->Lock();
  }
  ~SpinThenLockGuard() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  SpinThenLockGuard(const SpinThenLockGuard&) = delete;
  SpinThenLockGuard& operator=(const SpinThenLockGuard&) = delete;

 private:
  SpinThenLock* const mu_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_SPIN_THEN_LOCK_H_
