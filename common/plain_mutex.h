// PlainMutex: a std::mutex that clang's thread-safety analysis understands
// (ABSL_GUARDED_BY works with it), for locks taken on a hot path. absl::Mutex
// as Debian builds it tracks lock order on every acquisition, which cost
// more than the rest of the call's own work where it was measured (the
// engine session's lock; the attach session's send lock, bench/RESULTS.md).
#ifndef KVBROKER_COMMON_PLAIN_MUTEX_H_
#define KVBROKER_COMMON_PLAIN_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvbroker {

class ABSL_LOCKABLE PlainMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return mu_.try_lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a PlainMutex for a scope, as absl::MutexLock.
class ABSL_SCOPED_LOCKABLE PlainMutexLock {
 public:
  explicit PlainMutexLock(PlainMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->Lock();
  }
  ~PlainMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  PlainMutexLock(const PlainMutexLock&) = delete;
  PlainMutexLock& operator=(const PlainMutexLock&) = delete;

 private:
  PlainMutex* const mu_;
};

}  // namespace kvbroker

#endif  // KVBROKER_COMMON_PLAIN_MUTEX_H_
