// SessionDirectory: what the daemon's operator surfaces (the ListSessions
// RPC, metrics, `kvbrokerctl sessions` and `top`) learn about the engines
// attached on the attach socket, without depending on how sessions are
// served. The attach server implements it; SessionDirectorySlot lets the
// gRPC service and the metrics listener, which start before the attach
// server, report its sessions once it runs.

#ifndef KVBROKER_ATTACH_SESSION_DIRECTORY_H_
#define KVBROKER_ATTACH_SESSION_DIRECTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvbroker::attach {

// One attached engine, or a holder between sessions (session_id 0,
// in_grace). A snapshot: every field was read at one moment under the attach
// server's lock.
struct SessionInfo {
  uint64_t session_id = 0;
  std::string holder;
  int64_t pid = 0;
  std::string pool;  // empty until attached
  // Pages the daemon has sent this engine to map and not revoked since.
  int64_t mapped_pages = 0;
  // Blocks the holder owns.
  int64_t blocks = 0;
  // Revocations sent and not yet acknowledged, within their deadline.
  int64_t pending_revocations = 0;
  // Pages whose revocation deadline passed unacknowledged (quarantined until
  // the acknowledgement or the session's end).
  int64_t quarantined_pages = 0;
  absl::Time attached_since = absl::InfinitePast();  // hello
  absl::Duration reattach_grace = absl::ZeroDuration();
  bool in_grace = false;
  absl::Time grace_ends = absl::InfinitePast();  // when in_grace
};

class SessionDirectory {
 public:
  virtual ~SessionDirectory() = default;
  // Every live session and every holder in grace, ordered by pool, then
  // holder, then session id.
  virtual std::vector<SessionInfo> ListSessions() const = 0;
};

// A SessionDirectory that forwards to another one set later (or reports no
// sessions while none is set). Set(nullptr) waits for listings in progress,
// so the directory it unset may be destroyed right after. Thread-safe.
class SessionDirectorySlot final : public SessionDirectory {
 public:
  void Set(const SessionDirectory* directory) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    directory_ = directory;
  }
  std::vector<SessionInfo> ListSessions() const override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::ReaderMutexLock lock(&mu_);
    if (directory_ == nullptr) return {};
    return directory_->ListSessions();
  }

 private:
  mutable absl::Mutex mu_;
  const SessionDirectory* directory_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_SESSION_DIRECTORY_H_
