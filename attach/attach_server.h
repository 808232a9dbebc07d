// AttachServer: kvbrokerd's --attach_socket (SPEC section 10). Engines on
// the node connect over AF_UNIX SOCK_SEQPACKET, say hello, attach to a pool
// and allocate and free blocks on the session (proto/kvbroker/v1/attach.proto;
// transport in frame.h).
//
// Sessions: one thread per connection reads frames and answers each in
// order. A session moves through
//   new --Hello--> greeted --AttachRequest--> attached --SessionEnd/EOF-->
//   ended
// and anything out of order is refused with UNEXPECTED_MESSAGE; every bad
// frame gets a typed Error (seq 0 when its seq could not be read) and the
// session carries on. Access: with an AccessPolicy, Hello's token must be
// known (UNAUTHENTICATED) and AttachRequest's pool within its grant
// (PERMISSION_DENIED), the same tokens and checks as over gRPC.
//
// Holders: blocks allocated on a session belong to the holder Hello named.
// Only that holder may free them (BLOCK_NOT_ALLOCATED otherwise, nothing
// freed). Request ids of session calls live in a namespace per holder, so
// one holder's retry can never replay another's outcome. When a session
// ends, its holder's blocks are freed at once if it asked
// (SessionEnd.release) or chose no grace; otherwise they are kept for the
// grace and handed to the next session that says hello with the same holder
// name and the same token (HelloReply.reattached; PERMISSION_DENIED for
// another token, or once the token may no longer use the holder's pool),
// or freed when the grace runs out. A holder
// has at most one live session (HOLDER_BUSY).
//
// Ending: an engine's SessionEnd that carries a seq is answered with a
// SessionEnd of the same seq once the holder's blocks have been freed or
// parked, so an engine that waits for it can reattach at once under the
// same holder name without meeting its own old session (HOLDER_BUSY).
//
// Listener: the path is claimed as the gRPC socket's is
// (common/unix_socket.h): an existing socket file is replaced only when
// nobody answers on it, a live server on the path is never taken over
// (FAILED_PRECONDITION naming its pid), two servers racing for a free path
// cannot both have it, and Stop removes the socket file only while the path
// still names it.
//
// Thread safety: thread-safe. `broker` must outlive the server.

#ifndef KVBROKER_ATTACH_ATTACH_SERVER_H_
#define KVBROKER_ATTACH_ATTACH_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/broker.h"
#include "attach/block_set.h"
#include "attach/frame.h"
#include "attach/session_directory.h"
#include "attach/unique_fd.h"
#include "common/unix_socket.h"
#include "server/access.h"

namespace kvbroker::attach {

struct AttachServerOptions {
  std::string socket_path;
  // Null: every session is admitted (no --auth_tokens).
  std::shared_ptr<const AccessPolicy> access;
  // Live sessions at most. A connection beyond it takes the place of the
  // oldest one that has not said Hello yet (which is closed), or is closed
  // at once when every session has said Hello.
  int max_sessions = 256;
  // A connection that has not said Hello this long after it was accepted
  // is ended (a SessionEnd saying why, then the socket is closed).
  absl::Duration hello_timeout = absl::Seconds(5);
  // Longest reattach grace a Hello may ask for.
  absl::Duration max_reattach_grace = absl::Hours(1);
  // How often expired graces are reaped.
  absl::Duration reap_interval = absl::Milliseconds(100);
  // How long a send may wait for an engine that does not read its socket;
  // a send that fails (this, or a closed peer) ends the session as a
  // dropped connection, its holder's grace applying.
  absl::Duration send_timeout = absl::Seconds(10);
};

// Bounds of session requests (past them: INVALID_ARGUMENT, nothing changes).
// They keep every reply inside one frame.
inline constexpr int64_t kMaxSessionBlocks = 16384;   // Alloc, Reserve, Free
inline constexpr int64_t kMaxSessionPageList = 1024;  // Capacity.max_pages
inline constexpr size_t kMaxHolderLength = 128;

// What a holder left behind, for tests and operators.
struct HolderInfo {
  std::string holder;
  std::string pool;
  int64_t blocks = 0;
  bool live = false;  // has a session now; else waiting out its grace
};

class AttachServer final : public SessionDirectory {
 public:
  // Binds and starts accepting. UNAVAILABLE when the socket cannot be bound;
  // FAILED_PRECONDITION when a live server holds the path.
  static absl::StatusOr<std::unique_ptr<AttachServer>> Start(
      Broker* broker, AttachServerOptions options);
  // Stop().
  ~AttachServer();

  AttachServer(const AttachServer&) = delete;
  AttachServer& operator=(const AttachServer&) = delete;

  // Ends every session (SessionEnd to each engine), frees every holder's
  // blocks and removes the socket file. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& socket_path() const { return options_.socket_path; }
  // The live sessions, by session id.
  std::vector<SessionInfo> Sessions() const ABSL_LOCKS_EXCLUDED(mu_);
  // The live sessions and the holders in grace (SessionDirectory), for
  // ListSessions, metrics and `kvbrokerctl sessions`.
  std::vector<SessionInfo> ListSessions() const override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<HolderInfo> Holders() const ABSL_LOCKS_EXCLUDED(mu_);
  // How many times accepting a connection failed for want of fds or memory
  // (or another error that does not concern one connection); after each
  // the accept loop waits 100 ms instead of trying again at once.
  int64_t accept_failures() const {
    return accept_failures_.load(std::memory_order_relaxed);
  }
  // Frees the blocks of holders whose grace has passed (the accept thread
  // calls it every reap_interval).
  void ReapExpired() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Session;
  friend class Session;

  // A holder's blocks, which outlive its sessions for the grace.
  struct Holder {
    std::shared_ptr<PagePool> pool;
    BlockSet blocks;
    // The outcomes of the holder's recent Frees by request id (at most
    // 1024, none older than the pool's idempotency window). A retry is
    // answered from here, never sent to the pool: its blocks are no longer
    // the holder's and may be someone else's by now.
    struct RememberedFree {
      std::string fingerprint;  // the ids the Free named
      FreeResult result;
      absl::Time at;  // on the broker's clock
    };
    std::deque<std::string> free_request_ids;  // oldest first
    absl::flat_hash_map<std::string, RememberedFree> remembered_frees;
    Session* session = nullptr;  // the live session; null while in grace
    // The token grant of the session that made the holder (null without
    // tokens): only a session of the same grant may reattach.
    const AccessPolicy::Grant* grant = nullptr;
    absl::Time grace_ends;
    // Of the last session (for operators while in grace).
    int64_t pid = 0;
    absl::Time attached_since;
    absl::Duration grace;
  };
  // The live session `s` as operators see it.
  SessionInfo InfoOf(const Session& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AttachServer(Broker* broker, AttachServerOptions options, UniqueFd listener,
               UnixSocketFile socket_file, UniqueFd wake);
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a new connection may have a session: below max_sessions, or
  // after closing the oldest session that has not said Hello.
  bool MakeRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees `h`'s blocks in its pool (logging a failure) and forgets them.
  // Blocks freed behind the holder's back (over gRPC, which checks no
  // holder) do not keep the others from being freed: FreeStillAllocated.
  void FreeAll(const std::string& name, Holder& h)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the pool refused to free all of `ids` (BLOCK_NOT_ALLOCATED):
  // frees those of them still allocated, leaving out any that another
  // holder of the pool now owns, and logs what was gone.
  void FreeStillAllocated(const std::string& name, const Holder& h,
                          std::vector<BlockId> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called by a session's thread when it ends: frees or parks the holder's
  // blocks; returns what became of them, for the engine's SessionEnd reply.
  std::string Finished(Session* session) ABSL_LOCKS_EXCLUDED(mu_);

  Broker* const broker_;
  const AttachServerOptions options_;
  const UniqueFd listener_;
  // The path listener_ is reachable at; removed on Stop while still ours.
  const UnixSocketFile socket_file_;
  // Stop began; read without the lock by session threads.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  // eventfd: readable once Stop began; the accept loop polls it.
  const UniqueFd wake_;
  std::thread accept_thread_;
  std::atomic<int64_t> accept_failures_{0};

  mutable absl::Mutex mu_;
  // Set once, under mu_ (so that no session starts after Stop's
  // interruptions); read with or without it.
  std::atomic<bool> stopping_{false};
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // Sessions closed to make room for a new connection before their Hello
  // (AcceptLoop), until their thread ends: they no longer count.
  int evicted_ ABSL_GUARDED_BY(mu_) = 0;
  // Sessions whose thread has finished its work, joined and destroyed by
  // the accept loop or Stop.
  std::vector<std::unique_ptr<Session>> finished_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Holder> holders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_ATTACH_SERVER_H_
