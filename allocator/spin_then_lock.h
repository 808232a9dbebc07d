// SpinThenLock: the pool lock. A thread that finds it held spins for a
// bounded time (with the CPU's pause hint) before it parks in an
// absl::Mutex; and a holder between two steps of a long walk can hand it to
// a thread that waits (docs/design.md, "Locking").
//
// The bound is a time, process-wide (SetSpinBound; kvbrokerd's
// --pool_lock_spin): about what parking and being woken costs, so that a
// waiter never burns more CPU spinning than the hand-off it avoids, and
// the same on every CPU whatever its pause instruction takes.
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
#include "absl/time/clock.h"
#include "absl/time/time.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvbroker {

class ABSL_LOCKABLE SpinThenLock {
 public:
  // How long a waiter spins before it parks, unless SetSpinBound says
  // otherwise (bench/RESULTS.md has the measurements behind it).
  static constexpr int64_t kDefaultSpinBoundNs = 10'000;

  // Sets the spin bound of every SpinThenLock in the process; zero parks at
  // once. Meant to be called at start-up (a lock spinning meanwhile keeps
  // the bound it read).
  static void SetSpinBound(absl::Duration bound) {
    spin_ns_.store(
        bound <= absl::ZeroDuration() ? 0 : absl::ToInt64Nanoseconds(bound),
        std::memory_order_relaxed);
  }
  static absl::Duration spin_bound() {
    return absl::Nanoseconds(spin_ns_.load(std::memory_order_relaxed));
  }

  SpinThenLock() = default;
  SpinThenLock(const SpinThenLock&) = delete;
  SpinThenLock& operator=(const SpinThenLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (mu_.TryLock()) return;
    ++contended_on_this_thread_;
    waiters_.fetch_add(1, std::memory_order_relaxed);
    if (!SpinUntil([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return mu_.TryLock();
        })) {
      mu_.Lock();
    }
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

  // How many times the calling thread found a SpinThenLock held when it
  // asked for it (any lock of the process): lets a benchmark tell the calls
  // that waited from those that did not.
  static int64_t contended_on_this_thread() {
    return contended_on_this_thread_;
  }

  // Whether a thread has found the lock held and is waiting for it (spinning
  // or parked in Lock; not one parked in Await). A hint: a thread that
  // arrives just after it was read is seen at the holder's next look.
  bool HasWaiters() const {
    return waiters_.load(std::memory_order_relaxed) > 0;
  }

  // Releases the lock and takes it again; a thread that was waiting for it
  // gets it in between (the caller spins, bounded, until one has).
  void Yield()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const int64_t waiting = waiters_.load(std::memory_order_relaxed);
    mu_.Unlock();
    if (waiting > 0) {
      SpinUntil(
          [&] { return waiters_.load(std::memory_order_relaxed) < waiting; });
    }
    Lock();
  }

 private:
  // Pauses until `done()` holds or the spin bound has passed; returns
  // whether it held. The clock is read once per kPausesPerClockRead pauses
  // (a vDSO read costs a few tens of nanoseconds, a pause about as much).
  template <typename Done>
  static bool SpinUntil(Done&& done) {
    const int64_t bound = spin_ns_.load(std::memory_order_relaxed);
    if (bound == 0) return false;
    const int64_t until = absl::GetCurrentTimeNanos() + bound;
    while (true) {
      for (int i = 0; i < kPausesPerClockRead; ++i) {
        Pause();
        if (done()) return true;
      }
      if (absl::GetCurrentTimeNanos() >= until) return false;
    }
  }
  static constexpr int kPausesPerClockRead = 16;

  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  // The spin bound in nanoseconds, for every lock of the process.
  static inline std::atomic<int64_t> spin_ns_{kDefaultSpinBoundNs};
  static inline thread_local int64_t contended_on_this_thread_ = 0;

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
