// Makes absl::Mutex visible to ThreadSanitizer when Abseil itself is not
// instrumented (Debian's libabsl_synchronization.so is built without TSan).
//
// Why: absl::Mutex synchronizes with atomics and futex system calls inside
// the uninstrumented library, so TSan sees no happens-before edge between an
// Unlock and the next Lock and reports every access to mutex-guarded data as
// a race (verified with a ten-line program: two threads incrementing an int
// under absl::MutexLock are reported). A TSan build of the project therefore
// needs these edges from somewhere.
//
// How: this file defines the out-of-line absl::Mutex and absl::CondVar entry
// points in the test executable. The dynamic linker binds every caller
// (the project's shared libraries included) to these definitions, which
// forward to the library's own (found with dlsym(RTLD_NEXT)) and add
//   __tsan_acquire(mu) after the mutex is acquired,
//   __tsan_release(mu) before it is released,
// and wrap the Condition given to Await / LockWhen so that whichever thread
// absl evaluates it on (the waiter, or the thread unlocking on the waiter's
// behalf) acquires and releases the mutex around the evaluation.
// Extra edges can only hide races (never invent them); none is missing for
// code that follows the mutex discipline.
//
// It also turns on TSan's ignore_noninstrumented_modules: Abseil's own
// lock-order (deadlock) detector updates its graph under an internal
// SpinLock inside the uninstrumented library, and TSan would otherwise check
// the memmove calls it makes there. Abseil's deadlock detection stays on.
//
// Compiled only under TSan; otherwise this file is empty. Link it into a test
// with alwayslink so that the definitions land in the executable.

#if defined(__SANITIZE_THREAD__)
#define KVB_TSAN_SHIM 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVB_TSAN_SHIM 1
#endif
#endif

#ifdef KVB_TSAN_SHIM

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace {

#define KVB_SHIM_STR2(x) #x
#define KVB_SHIM_STR(x) KVB_SHIM_STR2(x)

// The library's definition of absl::<inline namespace>::<tail>.
void* Real(const char* tail) {
  const std::string ns = KVB_SHIM_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + tail;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found\n", name.c_str());
    std::abort();
  }
  return f;
}

template <typename F>
F RealAs(const char* tail) {
  return reinterpret_cast<F>(Real(tail));
}

// A Condition that brackets the caller's with the mutex's edges.
struct Bracket {
  const absl::Condition* cond;
  absl::Mutex* mu;
};

bool EvalBracketed(Bracket* b) {
  __tsan_acquire(b->mu);
  const bool r = b->cond->Eval();
  __tsan_release(b->mu);
  return r;
}

}  // namespace

// Defaults that TSAN_OPTIONS may still override.
extern "C" const char* __tsan_default_options() {
  return "ignore_noninstrumented_modules=1";
}

namespace absl {
ABSL_NAMESPACE_BEGIN

using CondFn = void (*)(Mutex*, const Condition&);
using CondTimeoutFn = bool (*)(Mutex*, const Condition&, Duration);
using CondDeadlineFn = bool (*)(Mutex*, const Condition&, Time);

void Mutex::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<void (*)(Mutex*)>("5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::TryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

void Mutex::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::ReaderTryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

void Mutex::Await(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondFn>("5Mutex5AwaitERKNS0_9ConditionE");
  Bracket b{&cond, this};
  const Condition wrapped(&EvalBracketed, &b);
  __tsan_release(this);
  real(this, wrapped);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond,
                             Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondTimeoutFn>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Bracket b{&cond, this};
  const Condition wrapped(&EvalBracketed, &b);
  __tsan_release(this);
  const bool r = real(this, wrapped, timeout);
  __tsan_acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond,
                              Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondDeadlineFn>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Bracket b{&cond, this};
  const Condition wrapped(&EvalBracketed, &b);
  __tsan_release(this);
  const bool r = real(this, wrapped, deadline);
  __tsan_acquire(this);
  return r;
}

void Mutex::LockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondFn>("5Mutex8LockWhenERKNS0_9ConditionE");
  Bracket b{&cond, this};
  real(this, Condition(&EvalBracketed, &b));
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      RealAs<CondFn>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Bracket b{&cond, this};
  real(this, Condition(&EvalBracketed, &b));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondTimeoutFn>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Bracket b{&cond, this};
  const bool r = real(this, Condition(&EvalBracketed, &b), timeout);
  __tsan_acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondTimeoutFn>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Bracket b{&cond, this};
  const bool r = real(this, Condition(&EvalBracketed, &b), timeout);
  __tsan_acquire(this);
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond,
                                 Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondDeadlineFn>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Bracket b{&cond, this};
  const bool r = real(this, Condition(&EvalBracketed, &b), deadline);
  __tsan_acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<CondDeadlineFn>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Bracket b{&cond, this};
  const bool r = real(this, Condition(&EvalBracketed, &b), deadline);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      RealAs<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu,
                              Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool r = real(this, mu, timeout);
  __tsan_acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu,
                               Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = RealAs<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool r = real(this, mu, deadline);
  __tsan_acquire(mu);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl

#endif  // KVB_TSAN_SHIM
