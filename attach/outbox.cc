// Outbox: a session's queue of daemon-started frames. Contract in outbox.h.

#include "attach/outbox.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace kvbroker::attach {

Outbox::Outbox() : event_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

void Outbox::SetDevices(std::vector<int> device_indices) {
  devices_ = std::move(device_indices);
}

void Outbox::SignalLocked() {
  if (signaled_.load(std::memory_order_relaxed)) return;
  const uint64_t one = 1;
  (void)!write(event_.get(), &one, sizeof(one));
  signaled_.store(true, std::memory_order_release);
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
          SignalLocked();
          return;
        }
        out.fds.push_back(std::move(dup));
      }
    }
    queue_.push_back(std::move(out));
  }
  SignalLocked();
}

void Outbox::OnPagesMapped(absl::Span<const MappedPage> pages) {
  absl::MutexLock lock(&mu_);
  QueuePagesLocked(pages, 0);
}

int64_t Outbox::QueueSnapshot(absl::Span<const MappedPage> pages,
                              uint64_t seq) {
  absl::MutexLock lock(&mu_);
  QueuePagesLocked(pages, seq);
  return static_cast<int64_t>(pages.size());
}

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
  absl::MutexLock lock(&mu_);
  queue_.push_back({std::move(frame), {}});
  SignalLocked();
}

absl::Status Outbox::Drain(FrameChannel& channel) {
  // Nothing queued since the last Drain: no lock, no syscall (the
  // session's hot path calls Drain before every reply).
  if (!pending()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (!broken_) {
      uint64_t count;
      (void)!read(event_.get(), &count, sizeof(count));
      signaled_.store(false, std::memory_order_relaxed);
    }
  }
  while (true) {
    Outgoing next;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return absl::OkStatus();
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    std::vector<int> fds;
    fds.reserve(next.fds.size());
    for (const UniqueFd& fd : next.fds) fds.push_back(fd.get());
    if (absl::Status s = channel.Send(next.frame, fds); !s.ok()) {
      absl::MutexLock lock(&mu_);
      queue_.clear();
      return s;
    }
    if (next.frame.has_pages_mapped()) {
      absl::MutexLock lock(&mu_);
      pages_sent_ += next.frame.pages_mapped().page_ids_size();
    } else if (next.frame.has_revoke()) {
      absl::MutexLock lock(&mu_);
      pages_revoked_ += next.frame.revoke().page_ids_size();
    } else if (next.frame.has_session_end()) {
      pool_closed_sent_.store(true, std::memory_order_release);
    }
  }
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
