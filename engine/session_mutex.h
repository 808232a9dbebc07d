// SessionMutex: the engine Session's lock, a std::mutex that clang's
// thread-safety analysis understands (ABSL_GUARDED_BY works with it). The
// lock is taken on every call of an engine's hot path; absl::Mutex as
// Debian builds it tracks lock order on every acquisition, which cost more
// there than the rest of the call's own work in the process.

#ifndef KVBROKER_ENGINE_SESSION_MUTEX_H_
#define KVBROKER_ENGINE_SESSION_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvbroker::engine {

class ABSL_LOCKABLE SessionMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE SessionLock {
 public:
  explicit SessionLock(SessionMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->Lock();
  }
  ~SessionLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

  SessionLock(const SessionLock&) = delete;
  SessionLock& operator=(const SessionLock&) = delete;

 private:
  SessionMutex* const mu_;
};

}  // namespace kvbroker::engine

#endif  // KVBROKER_ENGINE_SESSION_MUTEX_H_
