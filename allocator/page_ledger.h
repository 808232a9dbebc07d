// PageLedger: the bookkeeping of one pool's pages and blocks, and nothing
// else. It owns the page records, the per-block owner and free bitmaps, the
// OPEN best-fit index, the IDLE, FREE and RECLAIMED lists, the set of pages
// in flight, and every counter Capacity reads. It knows no backend, budget,
// clock, limit or Status: the pool decides, the ledger records (see
// docs/design.md, "Page states" and "The pool in parts").
//
// Page states (PageState; the enum and the per-state counters live here, so
// a new state is added in one place):
//   FREE       unmapped, allocatable, on the FIFO FREE list
//   MAPPING    in flight: a driver call runs on the page without the pool
//              lock, either mapping it (taken off FREE for one call) or
//              unmapping it (on its way to FREE or RECLAIMED). Counted
//              neither available nor allocated; counted mapped (it holds, or
//              is about to hold, device memory)
//   IDLE       mapped, no allocated or reserved block, on the IDLE list
//   OPEN       mapped, some blocks allocated or reserved, some free
//   FULL       mapped, every usable block allocated or reserved
//   RECLAIMED  unmapped and above the memory limit: not allocatable
//   EMPTY      usable(p) == 0: never mapped, never counted, never listed
//
// Invariants (Check() verifies every one by a full walk):
//   per mapped page:    free + allocated + reserved == usable
//   per other page:     free == allocated == reserved == 0
//   open_free     == Σ free over OPEN pages
//   idle_usable   == Σ usable over IDLE pages
//   allocated     == Σ allocated over pages - null_blocks
//   reserved      == Σ reserved over pages
//   reclaimed_usable == Σ usable over RECLAIMED pages and pages in flight
//                       to RECLAIMED
//   the OPEN index, the IDLE, FREE and RECLAIMED lists and the in-flight set
//     hold exactly the pages of their state, each once
//   a block's free bit is set <=> it is usable, on a mapped page, unowned.
//
// Thread safety: none. The owning pool's lock guards every call.

#ifndef KVBROKER_ALLOCATOR_PAGE_LEDGER_H_
#define KVBROKER_ALLOCATOR_PAGE_LEDGER_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "allocator/free_list.h"
#include "allocator/geometry.h"
#include "allocator/open_index.h"
#include "allocator/stretches.h"
#include "allocator/units.h"

namespace kvbroker {

enum class PageState : uint8_t {
  kFree = 0,
  kMapping,
  kIdle,
  kOpen,
  kFull,
  kReclaimed,
  kEmpty,
};
inline constexpr int kPageStates = 7;

// The bits of word `word` of a per-block bitmap (64 blocks a word) that
// stand for blocks in [first, end). REQUIRES: the word overlaps the range.
inline uint64_t WordMask(int64_t word, BlockId first, BlockId end) {
  uint64_t mask = ~uint64_t{0};
  if ((word << 6) < first) mask &= ~uint64_t{0} << (first & 63);
  if (((word + 1) << 6) > end) mask &= ~uint64_t{0} >> (64 - (end & 63));
  return mask;
}
const char* PageStateName(PageState s);

// Who holds a block. Free blocks of mapped pages also have their free bit set.
enum class BlockOwner : uint8_t { kNone = 0, kAllocated, kReserved, kNull };

// Where a page being unmapped lands when its unmap completes.
enum class Landing : uint8_t {
  kNone = 0,        // not being unmapped
  kFreeBack,        // the back of the FREE list
  kReclaimedFront,  // the front of the RECLAIMED list (lowering a limit)
  kReclaimedBack,   // the back of the RECLAIMED list (emptied over a limit)
};

// Pages one call touched: usually a few (an engine's Alloc of 256 blocks
// of 64 KiB on 2 MiB pages touches eight), so kept off the heap.
using PageIds = absl::InlinedVector<PageId, 8>;

class PageLedger {
 public:
  struct Page {
    PageState state = PageState::kFree;
    Landing landing = Landing::kNone;  // pages in flight only
    // Where the page sits in in_flight_ while it is MAPPING; -1 otherwise.
    int32_t in_flight_at = -1;
    BlockId begin = 0;  // range(p), cached
    BlockId end = 0;
    int64_t usable = 0;
    int64_t free = 0;       // mapped pages only
    int64_t allocated = 0;  // including the null block
    int64_t reserved = 0;
    // The pool's null block is on the page (set when taken; a null block
    // is never returned, so the page never empties).
    bool holds_null = false;
  };

  // Every page with a usable block FREE, listed in id order; the others
  // EMPTY. `geometry` must outlive the ledger.
  explicit PageLedger(const Geometry* geometry);

  PageLedger(const PageLedger&) = delete;
  PageLedger& operator=(const PageLedger&) = delete;

  // ---- reading ----
  const Geometry& geometry() const { return *geometry_; }
  const Page& page(PageId p) const { return pages_[p]; }
  BlockOwner owner(BlockId b) const { return owner_[b]; }
  // Whether every block of [first, end) is owned by `o`.
  bool AllOwnedBy(BlockId first, BlockId end, BlockOwner o) const {
    return CountOwnedBy(first, end, o) == end - first;
  }
  // How many blocks of [first, end) are owned by `o`.
  int64_t CountOwnedBy(BlockId first, BlockId end, BlockOwner o) const;
  // Whether every block of [first, end), all on page p, is allocated. For
  // the whole of a FULL page the counts say it at once (none reserved, no
  // null block); otherwise the owners are counted. (Not "no free block":
  // a page in flight has none either, and owns nothing.)
  bool AllAllocated(PageId p, BlockId first, BlockId end) const {
    const Page& page = pages_[p];
    if (first == page.begin && end == page.end &&
        page.state == PageState::kFull && page.reserved == 0 &&
        !page.holds_null) {
      return true;
    }
    return AllOwnedBy(first, end, BlockOwner::kAllocated);
  }
  PageCount pages(PageState s) const {
    return PageCount(state_pages_[static_cast<int>(s)]);
  }
  // IDLE + OPEN + FULL + in flight.
  PageCount mapped_pages() const {
    return pages(PageState::kIdle) + pages(PageState::kOpen) +
           pages(PageState::kFull) + pages(PageState::kMapping);
  }
  // Pages the memory limit counts: mapped + FREE, less pages in flight to
  // RECLAIMED. (Inline: the pool asks for each page a Free empties.)
  PageCount admitted_pages() const {
    return PageCount(mapped_pages().value() + free_pages().value() - leaving_);
  }
  PageCount pages_in_flight() const {
    return PageCount(static_cast<int64_t>(in_flight_.size()));
  }
  // In flight towards a mapping (as opposed to an unmap).
  PageCount maps_in_flight() const { return PageCount(maps_in_flight_); }
  PageCount free_pages() const { return PageCount(free_.size()); }
  PageCount idle_pages_listed() const { return PageCount(idle_.size()); }

  BlockCount open_free() const { return BlockCount(open_free_); }
  BlockCount idle_usable() const { return BlockCount(idle_usable_); }
  // Blocks on mapped pages that a call can take without mapping.
  BlockCount mapped_supply() const {
    return BlockCount(open_free_ + idle_usable_);
  }
  // Σ usable over the first `a` FREE pages (all of them when a >= |FREE|).
  BlockCount FreePrefix(PageCount a) const {
    return BlockCount(free_.PrefixSum(a.value()));
  }
  // Fewest FREE pages, front first, holding `n` blocks; |FREE| + 1 when the
  // whole list is not enough.
  PageCount FreePagesToCover(BlockCount n) const {
    return PageCount(free_.PagesToCover(n.value()));
  }
  BlockCount allocated() const { return BlockCount(allocated_); }
  BlockCount reserved() const { return BlockCount(reserved_); }
  BlockCount null_blocks() const { return BlockCount(null_blocks_); }
  BlockCount reclaimed_usable() const { return BlockCount(reclaimed_usable_); }
  // What the pool could hold if every admitted page were mapped: the
  // usable blocks of all pages but RECLAIMED ones, less the null block.
  BlockCount admitted_usable() const;

  // The page of block b; `hint` (a page id or -1) is tried first.
  PageId PageOf(BlockId b, PageId hint) const;

  // Lists, for snapshots (consumption order).
  const internal::OpenIndex& open_index() const { return open_; }
  const std::deque<PageId>& idle_list() const { return idle_; }
  const internal::FreeList& free_list() const { return free_; }
  const std::deque<PageId>& reclaimed_list() const { return reclaimed_; }
  // The pages in flight, ascending (a copy: the set itself is unordered).
  std::vector<PageId> in_flight_ascending() const;

  // ---- taking blocks (REQUIRES owner != kNone) ----

  // Takes `n` blocks of mapped pages in consumption order: OPEN best fit
  // (fewest free blocks that still cover the rest, else most free; ties
  // lowest id), then IDLE pages front first; ascending within a page.
  // Appends the blocks to `out` (a page's as stretches, ascending) and the
  // IDLE pages it drew from, in order, to `from_idle`.
  // REQUIRES: n <= mapped_supply().
  void TakeMapped(BlockCount n, BlockOwner owner, Stretches* out,
                  PageIds* from_idle);
  // Undoes TakeMapped: OPEN pages get their blocks back (the same place in
  // the index), and the pages in `from_idle` return to the front of the
  // IDLE list in order; exact when nothing else touched those pages. A page
  // that other calls emptied meanwhile is returned detached, as ReturnBlocks
  // returns one, for the caller to file.
  PageIds UntakeMapped(absl::Span<const BlockId> ascending,
                       absl::Span<const PageId> from_idle);
  // Moves allocated blocks to reserved or back. REQUIRES: every block is
  // owned by the other one of the two.
  void Reassign(absl::Span<const BlockId> ids, BlockOwner to);

  // ---- mapping in flight ----

  // Takes the first `k` FREE pages off the list; they are in flight.
  // REQUIRES: k <= |FREE|.
  std::vector<PageId> BeginMapFront(PageCount k);
  // Puts pages taken by BeginMapFront back at the front of the FREE list,
  // pages[0] first: exactly where they were if nothing was pushed in front
  // of the list meanwhile.
  void AbortMap(absl::Span<const PageId> pages);
  // An in-flight page is now mapped: takes up to `n` of its blocks for
  // `owner` (appending them to `out`; null when n == 0) and files it as
  // IDLE (back of the list), OPEN or FULL. Returns the blocks taken.
  BlockCount CommitMap(PageId p, BlockCount n, BlockOwner owner,
                       Stretches* out);

  // ---- returning blocks and unmapping in flight ----

  // Returns allocated or reserved blocks (strictly ascending ids) to their
  // pages.
  // Pages left with no allocated or reserved block are returned in order,
  // detached from every list: the caller passes each to KeepIdle or
  // BeginUnmap before anything else reads the ledger.
  PageIds ReturnBlocks(absl::Span<const BlockId> ascending);
  // The same for blocks named by (first, count) pairs, each run starting
  // past the end of the one before, one range at a time: no list of ids.
  // REQUIRES: every block named is a usable block of a mapped page, owned
  // allocated or reserved.
  PageIds ReturnRuns(absl::Span<const int64_t> runs);
  // A page returned by ReturnBlocks joins the back of the IDLE list.
  void KeepIdle(PageId p);
  // A page returned by ReturnBlocks, or at the front or back of the IDLE
  // list, goes in flight to be unmapped; its blocks stop being free.
  void BeginUnmap(PageId p, Landing to);
  // Its unmap finished: the page lands where BeginUnmap said.
  void FinishUnmap(PageId p);
  // A page still being unmapped will land at `to` instead.
  void Redirect(PageId p, Landing to);
  // Its unmap failed: the page is mapped again, at the back of the IDLE list.
  void AbortUnmap(PageId p);

  // ---- the memory limit's moves ----

  // The back FREE page moves to the front of the RECLAIMED list.
  void ReclaimFreeBack();
  // Up to `room` pages move from the front of the RECLAIMED list to the
  // front of the FREE list, keeping their order. Returns how many moved.
  PageCount AdmitReclaimed(PageCount room);

  // Walks every page and block; "" when every invariant above holds, else
  // the first violation.
  std::string Check() const;

 private:
  void ChangeState(PageId p, PageState to);
  void AddInFlight(PageId p);
  void RemoveInFlight(PageId p);
  // Removes a mapped page from the OPEN index or the IDLE counters.
  void Detach(PageId p);
  // Returns [first, end), on page p and detached, to the free blocks.
  void ReturnRange(PageId p, BlockId first, BlockId end);
  // Files the pages a return touched (detached, in order): those left
  // with no owned block are returned, the others attached again.
  PageIds FileReturned(const PageIds& touched);
  // Files a mapped, detached page by its counts; IDLE pages join the back.
  void Attach(PageId p);
  int64_t TakeFromPage(PageId p, int64_t n, BlockOwner owner, Stretches* out);
  // Every block of an IDLE page, taken off the IDLE list already (most of
  // a large Alloc): the page goes FULL with no per-word search. Returns
  // the blocks taken.
  int64_t TakeIdlePage(PageId p, BlockOwner owner, Stretches* out);
  void SetFreeBits(PageId p, bool on);
  void SetOwner(BlockId first, BlockId end, BlockOwner o);
  // `n` blocks of `page` went to `owner`: its counts and the ledger's.
  void CountTaken(Page* page, BlockOwner owner, int64_t n);

  const Geometry* const geometry_;
  std::vector<Page> pages_;
  std::vector<BlockOwner> owner_;
  // Bit b set <=> block b is usable, on a mapped page, and owned by nobody.
  std::vector<uint64_t> free_bits_;
  internal::OpenIndex open_;
  std::deque<PageId> idle_;
  internal::FreeList free_;
  std::deque<PageId> reclaimed_;
  // Every MAPPING page once, in no order (Page::in_flight_at indexes it):
  // a hand-over of 64 pages inserts and erases 64 times under the pool
  // lock, which an ordered set made the longest step of a mapping Alloc.
  std::vector<PageId> in_flight_;

  std::array<int64_t, kPageStates> state_pages_ = {};
  int64_t open_free_ = 0;
  int64_t idle_usable_ = 0;
  int64_t allocated_ = 0;  // excludes the null block
  int64_t reserved_ = 0;
  int64_t null_blocks_ = 0;
  int64_t reclaimed_usable_ = 0;
  int64_t maps_in_flight_ = 0;
  int64_t leaving_ = 0;  // in flight to RECLAIMED
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PAGE_LEDGER_H_
