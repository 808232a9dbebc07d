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
// Delivery without a wake-up (attach/README.md, "PagesMapped"): the
// session thread waits for the engine on its socket alone, with no poll.
// While it waits (BeginWait .. EndWait), whoever queues a frame sends it
// itself, without blocking; the rest of the time the session thread sends
// what is queued before each reply (SendAfterQueued). One send lock makes
// every send on the channel, and the order of the queue, exclusive. A
// frame that would block (the engine's socket buffer is full: it is not
// reading) stays queued; the session thread sends it before its next
// reply, or when its wait times out (the session's receive timeout).
//
// Thread safety: OnPagesMapped and the Queue calls from any thread;
// BeginWait, EndWait and the Send calls from the session's thread only.
// The check that nothing is queued reads one atomic flag: no lock, no
// syscall. That read is enough for the ordering above: a listener sets the
// flag before the pool hands out a block on the announced page, and the
// session thread's pool call that receives such a block synchronizes with
// the pool's lock, so the reply's send sees the flag. Between a queuing
// thread and a waiting session thread the flag and `waiting_` are a
// Dekker pair (both sequentially consistent): either the session thread
// sees the frame before it waits, or the queuing thread sees it waiting
// and sends.

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
#include "common/plain_mutex.h"
#include "proto/kvbroker/v1/attach.pb.h"

namespace kvbroker::attach {

class Outbox : public PageListener {
 public:
  // Frames go out on `channel`, which outlives the outbox.
  explicit Outbox(FrameChannel* channel) : channel_(channel) {}

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
  // The engine cannot learn of these pages: the outbox breaks (broken()),
  // and the session ends with PAGE_NOT_PASSED before its next reply.
  void OnPagesNotPassed(absl::Span<const PageId> pages) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // A Revoke frame (seq 0) for the pool's revocation.
  void OnPagesRevoked(uint64_t revocation_id, absl::Span<const PageId> pages,
                      absl::Time deadline) override ABSL_LOCKS_EXCLUDED(mu_);
  // The pool is being deleted: a SessionEnd (seq 0, POOL_DELETED), queued
  // after the Revoke of every page this session knows.
  void OnPoolClosed() override ABSL_LOCKS_EXCLUDED(mu_);
  // Any other frame the daemon starts.
  void Queue(v1::Frame frame) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends every queued frame, in order, blocking while the socket is full
  // (up to its send timeout).
  //
  // A send that fails (the peer is gone, or did not read for the send
  // timeout) fails the outbox for good: the frames left are dropped with
  // their fds, the socket is shut down both ways (so the session thread's
  // receive ends), pending() stays true, failed() becomes true and every
  // later send is refused. The engine missed a frame (a page, a
  // revocation, a reply): nothing sent after it could be trusted.
  absl::Status Drain() ABSL_LOCKS_EXCLUDED(mu_, send_mu_);
  // Drain, then `frame` (a reply: it follows everything queued before it).
  absl::Status SendAfterQueued(const v1::Frame& frame)
      ABSL_LOCKS_EXCLUDED(mu_, send_mu_);
  // `frame` alone, blocking; what is queued stays queued.
  absl::Status Send(const v1::Frame& frame) ABSL_LOCKS_EXCLUDED(mu_, send_mu_);

  // The session thread is about to wait for the engine: from now on a
  // queued frame is sent by the thread that queues it. Sends what is
  // queued already, without blocking.
  void BeginWait() ABSL_LOCKS_EXCLUDED(mu_, send_mu_);
  // The wait is over (a frame came, or the receive timed out).
  void EndWait() { waiting_.store(false, std::memory_order_seq_cst); }

  // Whether anything was queued (or the outbox broke) and not yet sent; no
  // lock, no syscall. False means Drain has nothing to send.
  bool pending() const { return pending_.load(std::memory_order_seq_cst); }
  // A duplicate fd could not be made, or the pool could not export a page:
  // the engine missed a page.
  bool broken() const ABSL_LOCKS_EXCLUDED(mu_);
  // A send failed (Drain): the session must end.
  bool failed() const ABSL_LOCKS_EXCLUDED(mu_);
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
  // After a frame was queued: sends it now if the session thread waits.
  void DeliverIfWaiting() ABSL_LOCKS_EXCLUDED(mu_, send_mu_);
  // Sends queued frames in order until none is left, or (dont_wait) one
  // would block; a failed send drops the rest. REQUIRES: send_mu_.
  absl::Status SendQueuedLocked(bool dont_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  // `sent` (the status of a send on channel_), failing the outbox when it
  // is an error (Drain). REQUIRES: send_mu_.
  absl::Status Checked(absl::Status sent) ABSL_LOCKS_EXCLUDED(mu_);
  static absl::Status FailedSend();

  FrameChannel* const channel_;
  // Written once before registration, then only read.
  std::vector<int> devices_;

  // The send lock: held for every send on channel_, and for taking frames
  // off the queue (a frame leaves the queue only once it is sent). Taken
  // before mu_. A PlainMutex: every reply takes it.
  PlainMutex send_mu_;
  mutable absl::Mutex mu_;
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  // Whether the queue may hold frames: set under mu_ with every frame
  // queued, cleared under mu_ by a send that found the queue empty; read
  // without a lock by pending(). Once broken_ or failed_, it stays set.
  std::atomic<bool> pending_{false};
  // The session thread waits for the engine (BeginWait .. EndWait).
  std::atomic<bool> waiting_{false};
  int64_t pages_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pages_revoked_ ABSL_GUARDED_BY(mu_) = 0;
  // Written by Drain (the session's thread).
  std::atomic<bool> pool_closed_sent_{false};
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_OUTBOX_H_
