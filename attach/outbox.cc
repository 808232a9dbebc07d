// Outbox: a session's queue of daemon-started frames. Contract in outbox.h.

#include "attach/outbox.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

namespace kvbroker::attach {

void Outbox::SetDevices(std::vector<int> device_indices) {
  devices_ = std::move(device_indices);
}

void Outbox::QueuePagesLocked(absl::Span<const MappedPage> pages,
                              uint64_t seq) {
  if (devices_.empty() || pages.empty()) return;
  const size_t per_frame =
      std::max<size_t>(1, kMaxFdsPerFrame / devices_.size());
  for (size_t first = 0; first < pages.size(); first += per_frame) {
    Outgoing out;
    out.frame.set_seq(seq);
    v1::PagesMapped* pm = out.frame.mutable_pages_mapped();
    const size_t end = std::min(pages.size(), first + per_frame);
    for (size_t i = first; i < end; ++i) {
      pm->add_page_ids(pages[i].page);
      for (int d : devices_) {
        UniqueFd dup(fcntl(pages[i].fds[d], F_DUPFD_CLOEXEC, 0));
        if (!dup.valid()) {
          broken_ = true;
          pending_.store(true, std::memory_order_seq_cst);
          return;
        }
        out.fds.push_back(std::move(dup));
      }
    }
    queue_.push_back(std::move(out));
  }
  pending_.store(true, std::memory_order_seq_cst);
}

void Outbox::OnPagesMapped(absl::Span<const MappedPage> pages) {
  {
    absl::MutexLock lock(&mu_);
    QueuePagesLocked(pages, 0);
  }
  DeliverIfWaiting();
}

int64_t Outbox::QueueSnapshot(absl::Span<const MappedPage> pages,
                              uint64_t seq) {
  // Queued, not delivered: the attach's reply goes first (the session
  // thread sends both).
  absl::MutexLock lock(&mu_);
  QueuePagesLocked(pages, seq);
  return static_cast<int64_t>(pages.size());
}

void Outbox::OnPagesNotPassed(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&mu_);
  broken_ = true;
  pending_.store(true, std::memory_order_seq_cst);
}

// A Revoke of a whole revocation goes out in one frame: its packed page
// ids (at most 10 bytes each), the id and the deadline fit.
static_assert(kMaxRevocationPages * 10 + 64 <= kMaxFrameBytes);

void Outbox::OnPagesRevoked(uint64_t revocation_id,
                            absl::Span<const PageId> pages,
                            absl::Time deadline) {
  v1::Frame f;
  v1::Revoke* r = f.mutable_revoke();
  r->set_revoke_id(revocation_id);
  for (PageId p : pages) r->add_page_ids(p);
  const int64_t ns = absl::ToUnixNanos(deadline);
  r->mutable_deadline()->set_seconds(ns / 1000000000);
  r->mutable_deadline()->set_nanos(static_cast<int32_t>(ns % 1000000000));
  Queue(std::move(f));
}

void Outbox::OnPoolClosed() {
  v1::Frame f;
  f.mutable_session_end()->set_reason(v1::POOL_DELETED);
  f.mutable_session_end()->set_message(
      "the pool was deleted; its pages were revoked");
  Queue(std::move(f));
}

void Outbox::Queue(v1::Frame frame) {
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back({std::move(frame), {}});
    pending_.store(true, std::memory_order_seq_cst);
  }
  DeliverIfWaiting();
}

void Outbox::DeliverIfWaiting() {
  // Either the session thread sees pending_ before it waits, or this sees
  // it waiting (outbox.h). A send already under way sends this frame too,
  // or leaves it to the session thread, which looks again before it waits
  // and before every reply.
  if (!waiting_.load(std::memory_order_seq_cst)) return;
  if (!send_mu_.TryLock()) return;
  (void)SendQueuedLocked(/*dont_wait=*/true);
  send_mu_.Unlock();
}

void Outbox::BeginWait() {
  waiting_.store(true, std::memory_order_seq_cst);
  if (!pending()) return;
  PlainMutexLock send(&send_mu_);
  (void)SendQueuedLocked(/*dont_wait=*/true);
}

absl::Status Outbox::Drain() {
  // Nothing queued: no lock, no syscall (the session's hot path calls
  // Drain before every reply).
  if (!pending()) return absl::OkStatus();
  PlainMutexLock send(&send_mu_);
  return SendQueuedLocked(/*dont_wait=*/false);
}

absl::Status Outbox::SendAfterQueued(const v1::Frame& frame) {
  PlainMutexLock send(&send_mu_);
  if (pending()) {
    if (absl::Status s = SendQueuedLocked(/*dont_wait=*/false); !s.ok()) {
      return s;
    }
  }
  return Checked(channel_->Send(frame));
}

absl::Status Outbox::Send(const v1::Frame& frame) {
  PlainMutexLock send(&send_mu_);
  if (pending() && failed()) return FailedSend();
  return Checked(channel_->Send(frame));
}

absl::Status Outbox::FailedSend() {
  return absl::UnavailableError("an earlier send to the engine failed");
}

absl::Status Outbox::Checked(absl::Status sent) {
  if (sent.ok()) return sent;
  {
    absl::MutexLock lock(&mu_);
    failed_ = true;
    queue_.clear();
    pending_.store(true, std::memory_order_seq_cst);
  }
  // The engine missed a frame, so nothing later may reach it either; and
  // the session thread, which may be waiting to receive, must end.
  shutdown(channel_->fd(), SHUT_RDWR);
  return sent;
}

absl::Status Outbox::SendQueuedLocked(bool dont_wait) {
  while (true) {
    // The front frame is read under mu_ and sent without it: only the
    // holder of send_mu_ takes frames off the queue, and others only add
    // to its back (deque references stay valid across push_back).
    Outgoing* next;
    {
      absl::MutexLock lock(&mu_);
      if (failed_) return FailedSend();
      if (broken_) return absl::OkStatus();  // the session thread ends it
      if (queue_.empty()) {
        pending_.store(false, std::memory_order_seq_cst);
        return absl::OkStatus();
      }
      next = &queue_.front();
    }
    std::vector<int> fds;
    fds.reserve(next->fds.size());
    for (const UniqueFd& fd : next->fds) fds.push_back(fd.get());
    absl::Status s = dont_wait ? channel_->TrySend(next->frame, fds)
                               : channel_->Send(next->frame, fds);
    if (dont_wait && absl::IsResourceExhausted(s)) {
      return absl::OkStatus();  // would block: stays queued, still pending
    }
    if (!s.ok()) return Checked(s);
    absl::MutexLock lock(&mu_);
    const v1::Frame& f = next->frame;
    if (f.has_pages_mapped()) {
      pages_sent_ += f.pages_mapped().page_ids_size();
    } else if (f.has_revoke()) {
      pages_revoked_ += f.revoke().page_ids_size();
    } else if (f.has_session_end()) {
      pool_closed_sent_.store(true, std::memory_order_release);
    }
    queue_.pop_front();
  }
}

bool Outbox::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

bool Outbox::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

int64_t Outbox::pages_sent() const {
  absl::MutexLock lock(&mu_);
  return pages_sent_;
}

int64_t Outbox::pages_revoked() const {
  absl::MutexLock lock(&mu_);
  return pages_revoked_;
}

}  // namespace kvbroker::attach
