// PageListener: how a pool tells the world outside the allocator that its
// pages became mapped, so that engines sharing the memory (SPEC section 10)
// can map them too. The allocator knows nothing about who listens; the
// daemon's attach server implements this interface per session.

#ifndef KVBROKER_ALLOCATOR_PAGE_LISTENER_H_
#define KVBROKER_ALLOCATOR_PAGE_LISTENER_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/units.h"

namespace kvbroker {

// A mapped page and its physical handles, exported.
struct MappedPage {
  PageId page = 0;
  // One fd per device of the pool, in the pool's device order. Borrowed from
  // the pool: valid only during the call that passes it; dup what you keep.
  std::vector<int> fds;
};

// A revocation names at most this many pages: a pool that unmaps more at
// once (a trim, a lowered limit, a delete) revokes them in several, so that
// a listener can pass each on whole in one bounded message (the attach
// protocol's Revoke frame, at most 10 bytes a page id, fits its 128 KiB).
inline constexpr int64_t kMaxRevocationPages = 8192;

class PageListener {
 public:
  virtual ~PageListener() = default;

  // `pages` were just mapped on every device of the pool. Called after the
  // mapping succeeded and before any block on them is handed out (before
  // the call that mapped them returns, or the prealloc worker files them
  // IDLE), on the thread that mapped them, without the pool lock but with
  // the pool's announcement lock held: it must not call into the pool, and
  // should only queue work (it delays that mapping call).
  virtual void OnPagesMapped(absl::Span<const MappedPage> pages) = 0;

  // `pages` were just mapped but could not be passed on: exporting one of
  // their handles failed (the daemon out of file descriptors, or a driver
  // refusal). The listener cannot map them, and blocks on them may be
  // handed to its holder next, so it must stop handing out blocks (the
  // attach server ends the session with PAGE_NOT_PASSED). Called after the
  // OnPagesMapped of the same mapping, if any. Same calling rules as
  // OnPagesMapped.
  virtual void OnPagesNotPassed(absl::Span<const PageId> pages) = 0;

  // The pool wants to unmap `pages`, which this listener knows as mapped.
  // The listener has its engine unmap them and then calls
  // PagePool::AckRevocation(this, revocation_id); leaving (RemovePageListener)
  // counts as acknowledging. Until every listener told has acknowledged,
  // the pages are out of use: REVOKING, and QUARANTINED once `deadline`
  // (pool clock) has passed. Same calling rules as OnPagesMapped.
  virtual void OnPagesRevoked(uint64_t revocation_id,
                              absl::Span<const PageId> pages,
                              absl::Time deadline) = 0;

  // The pool is being deleted (PagePool::Shutdown). Called once, after
  // every page the listener knows was revoked (OnPagesRevoked), so a
  // listener that queues what it hears keeps that order. The pool answers
  // every call with POOL_NOT_FOUND from now on; the revoked pages are
  // unmapped and released as acknowledgements (or RemovePageListener)
  // come. Same calling rules as OnPagesMapped.
  virtual void OnPoolClosed() {}
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PAGE_LISTENER_H_
