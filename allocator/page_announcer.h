// PageAnnouncer: which of a pool's pages its listeners (page_listener.h) know
// as mapped, and the delivery of that news. It is the pool's hook for
// engines (docs/design.md, "Pages and engines"):
//   - Announce: a page's mapping transaction succeeded on every device; the
//     page is still in flight, held by the calling thread, so no block on it
//     has been handed out. Every listener gets it (with its exported fds)
//     before Announce returns, or, when a handle cannot be exported, hears
//     that the page was not passed (PageListener::OnPagesNotPassed).
//   - Withdraw: a page is about to be unmapped (in flight, held by the
//     calling thread); from now on no snapshot names it and its fds may
//     close.
//   - AddListener: registers a listener and hands it, atomically with the
//     registration, the snapshot of every announced page. A page is thus
//     either in a listener's snapshot or announced to it later, never both
//     and never neither.
//   - Revoke: pages are about to be unmapped, but listeners know them: each
//     listener is told (one revocation id per call, or per part of at
//     most kMaxRevocationPages pages of a larger one) and the pages wait,
//     out of use, until every one of them acknowledges (Ack) or leaves
//     (RemoveListener); those calls return the pages that are then free to
//     unmap. Pages no listener knows are returned at once.
// Handles are exported lazily: the first time a page is announced while a
// listener exists, or named in a snapshot. A pool nobody listens to never
// exports, unless it exports at map time (PoolConfig::export_at_map): then
// the mapping exported every handle and announcing only lends its fds.
//
// Locking: one mutex, taken without the pool's lock held (the pool calls
// Announce and Withdraw from its unlocked mapping steps). Listeners are
// called with it held. Order: pool lock (never held here) ; announcer ->
// the listener's own locks. Exporting, a backend call, runs under this
// mutex; it never runs under the pool lock.

#ifndef KVBROKER_ALLOCATOR_PAGE_ANNOUNCER_H_
#define KVBROKER_ALLOCATOR_PAGE_ANNOUNCER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/bundle_mapper.h"
#include "allocator/geometry.h"
#include "allocator/page_listener.h"

namespace kvbroker {

class PageAnnouncer {
 public:
  // `geometry` and `mapper` must outlive the announcer.
  // A revocation names at most `max_revocation_pages` pages (values below
  // 1 read as 1).
  PageAnnouncer(const Geometry* geometry, BundleMapper* mapper,
                int64_t max_revocation_pages = kMaxRevocationPages);

  PageAnnouncer(const PageAnnouncer&) = delete;
  PageAnnouncer& operator=(const PageAnnouncer&) = delete;

  // REQUIRES: each page is mapped and held in flight by the caller.
  void Announce(absl::Span<const PageId> pages) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: each page is mapped and held in flight by the caller, which
  // unmaps it next.
  void Withdraw(absl::Span<const PageId> pages) ABSL_LOCKS_EXCLUDED(mu_);

  // Of `pages` (each mapped, announced or not, and held in flight by the
  // caller, which meant to unmap it), withdraws them all and returns those
  // the caller may unmap now; the others wait for acknowledgements, in
  // revocations of at most max_revocation_pages pages each.
  std::vector<PageId> Revoke(absl::Span<const PageId> pages,
                             absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // `listener` acknowledges revocation `id`. Returns the pages now free to
  // unmap (empty while other listeners have yet to answer). NOT_FOUND when
  // `id` is not pending for `listener`.
  absl::StatusOr<std::vector<PageId>> Ack(PageListener* listener, uint64_t id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The pool is shutting down (after revoking every announced page): every
  // listener hears OnPoolClosed, and AddListener refuses from now on.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // Revocations `listener` has yet to acknowledge, and how many of their
  // pages are past their deadline at `now`.
  int64_t pending_revocations(const PageListener* listener) const
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t overdue_pages(const PageListener* listener, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Revocations `listener` has yet to acknowledge whose deadline has not
  // passed at `now`.
  int64_t revocations_in_time(const PageListener* listener,
                              absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  // Revocations waiting for any listener.
  int64_t revocations() const ABSL_LOCKS_EXCLUDED(mu_);

  // Registers `listener` and calls `snapshot` (with the lock held, so no
  // page is announced or withdrawn meanwhile) with every announced page in
  // ascending order. Errors: the backend's export error, POOL_NOT_FOUND
  // after Close (nothing is registered). `listener` must stay valid until
  // RemoveListener.
  absl::Status AddListener(
      PageListener* listener,
      absl::FunctionRef<void(absl::Span<const MappedPage>)> snapshot)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After it returns, `listener` is never called again. Its pending
  // revocations count as acknowledged: returns the pages now free to unmap.
  std::vector<PageId> RemoveListener(PageListener* listener)
      ABSL_LOCKS_EXCLUDED(mu_);

  int64_t listeners() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t announced_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages whose handles could not be exported when announced (listeners
  // heard OnPagesNotPassed; logged).
  int64_t export_failures() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status ExportLocked(PageId p, MappedPage* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Geometry* const geometry_;
  BundleMapper* const mapper_;

  mutable absl::Mutex mu_;
  // announced_[p]: page p is mapped and its listeners know it (or learn it
  // from their snapshot). Set by Announce, cleared by Withdraw.
  std::vector<bool> announced_ ABSL_GUARDED_BY(mu_);
  int64_t announced_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t export_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PageListener*> listeners_ ABSL_GUARDED_BY(mu_);
  // Set by Close: the pool is gone; no listener joins.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  // A revocation waits for the listeners in `waiting`; its pages are
  // unmapped when none is left.
  struct Revocation {
    std::vector<PageId> pages;
    std::vector<PageListener*> waiting;
    absl::Time deadline;
  };
  const int64_t max_revocation_pages_;
  uint64_t next_revocation_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Ordered by id: revocations completed together land oldest first.
  std::map<uint64_t, Revocation> revocations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PAGE_ANNOUNCER_H_
