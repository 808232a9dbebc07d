// Outbox: a session's single queue of the frames the daemon starts
// (PagesMapped, Revoke, and the SessionEnd of a deleted pool), and the
// session's PageListener (allocator/page_listener.h).
//
// Ordering is what makes page delivery correct: a pool announces a page to
// every listener before any block on it is handed out, and each listener
// only queues here; the session thread sends everything queued before it
// sends a reply (Drain). So an engine always receives PagesMapped for a page
// before the reply that gives it a block on that page, and the snapshot of
// an attach (queued atomically with the registration) before any later
// announcement.
//
// Fds: the pool lends its exported fds for the duration of the
// announcement; the outbox keeps a close-on-exec duplicate per queued fd
// until the frame is sent (then the engine has its own copy) or the outbox
// is destroyed. A duplicate that cannot be made (EMFILE) marks the outbox
// broken: the session must end, as its engine can no longer learn every
// page.
//
// Thread safety: OnPagesMapped and the Queue calls from any thread; Drain
// from the session's thread only. The eventfd is readable while frames wait
// (from the first frame queued after a Drain to the next Drain); Drain reads
// it only then, so a Drain with nothing queued makes no syscall and takes no
// lock: it reads one atomic flag. That read is enough for the ordering
// above: a listener sets the flag before the pool hands out a block on the
// announced page, and the session thread's pool call that receives such a
// block synchronizes with the pool's lock, so its next Drain sees the flag.

#ifndef KVBROKER_ATTACH_OUTBOX_H_
#define KVBROKER_ATTACH_OUTBOX_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/page_listener.h"
#include "attach/frame.h"
#include "attach/unique_fd.h"
#include "proto/kvbroker/v1/attach.pb.h"

namespace kvbroker::attach {

class Outbox : public PageListener {
 public:
  Outbox();

  // The eventfd the session thread polls; invalid if it could not be made.
  int event_fd() const { return event_.get(); }

  // Which of the pool's devices (indices into its device list) this session
  // maps, in the order of its layout. REQUIRES: called before the outbox is
  // registered as a listener.
  void SetDevices(std::vector<int> device_indices);

  // PagesMapped frames (seq 0) for `pages`.
  void OnPagesMapped(absl::Span<const MappedPage> pages) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same with `seq` (an attach's snapshot); returns the pages queued.
  int64_t QueueSnapshot(absl::Span<const MappedPage> pages, uint64_t seq)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A Revoke frame (seq 0) for the pool's revocation.
  void OnPagesRevoked(uint64_t revocation_id, absl::Span<const PageId> pages,
                      absl::Time deadline) override ABSL_LOCKS_EXCLUDED(mu_);
  // The pool is being deleted: a SessionEnd (seq 0, POOL_DELETED), queued
  // after the Revoke of every page this session knows.
  void OnPoolClosed() override ABSL_LOCKS_EXCLUDED(mu_);
  // Any other frame the daemon starts.
  void Queue(v1::Frame frame) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends every queued frame, in order. Stops at the first failed send
  // (the peer is gone or stuck; the session ends on its next receive) and
  // returns its error; the frames left are dropped with their fds.
  absl::Status Drain(FrameChannel& channel) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether anything was queued (or the outbox broke) since the last Drain;
  // no lock, no syscall. False means Drain has nothing to send.
  bool pending() const { return signaled_.load(std::memory_order_acquire); }
  // A duplicate fd could not be made: the engine missed a page.
  bool broken() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages sent in PagesMapped frames so far.
  int64_t pages_sent() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages named in Revoke frames sent so far.
  int64_t pages_revoked() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the pool-deleted SessionEnd has been sent.
  bool pool_closed_sent() const {
    return pool_closed_sent_.load(std::memory_order_acquire);
  }

 private:
  struct Outgoing {
    v1::Frame frame;
    std::vector<UniqueFd> fds;
  };

  void QueuePagesLocked(absl::Span<const MappedPage> pages, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SignalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UniqueFd event_;
  // Written once before registration, then only read.
  std::vector<int> devices_;

  mutable absl::Mutex mu_;
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // Whether the eventfd's counter is non-zero: set by the first signal
  // after a Drain, cleared (and the counter read) by Drain, both under mu_;
  // read without it by pending(). Every queued frame was queued with it set
  // or is being sent by the running Drain. Once broken_, it stays set.
  std::atomic<bool> signaled_{false};
  int64_t pages_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pages_revoked_ ABSL_GUARDED_BY(mu_) = 0;
  // Written by Drain (the session's thread).
  std::atomic<bool> pool_closed_sent_{false};
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_OUTBOX_H_
