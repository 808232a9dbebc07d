// PagePool: one KV pool. Exact capacity, all-or-nothing allocation, and the
// page lifecycle of SPEC sections 2-4 and 7.
//
// A pool reserves one virtual range per device (T bundles) at creation and
// maps page ids into it on demand: one physical allocation of P*L*K bytes per
// page id per device. Blocks are carved out of pages by the Geometry; a block
// straddling a page boundary is never handed out.
//
// Page states (PageState):
//   FREE       unmapped, allocatable, on the FIFO FREE list
//   MAPPING    unmapped -> IDLE in progress on the prealloc worker (the pool
//              lock is not held across that mapping)
//   IDLE       mapped, no allocated or reserved block
//   OPEN       mapped, some blocks allocated or reserved, some free
//   FULL       mapped, every usable block allocated or reserved
//   RECLAIMED  unmapped and above the memory limit: not allocatable. Kept in
//              a list: pages reclaimed by lowering the limit go to its front
//              (so the FREE list's back ends up first), pages emptied while
//              the pool is over its limit go to its back; raising the limit
//              re-admits from the front, in list order, ahead of every FREE
//              page
//   EMPTY      usable(p) == 0: never mapped, never counted, never listed
//
// Consumption order (Alloc and Reserve take capacity in this order, Capacity
// counts it in the same order):
//   1. the caller's reservation (Alloc only);
//   2. OPEN pages, best fit: the page with the fewest free blocks that still
//      covers the remaining need, else the one with the most free blocks
//      (ties: lowest page id);
//   3. IDLE pages, front of the list first (MAPPING pages count here: an
//      allocation that needs one waits for its mapping to finish, which is
//      bounded by one page's driver calls);
//   4. FREE pages, front of the list first, while every device of the pool
//      can afford one more bundle. The memory limit is enforced by the list
//      itself: under a limit of `target` pages, mapped + listed pages never
//      exceed `target`.
// Within a page, blocks go out in ascending id order.
//
// Capacity (SPEC 4):
//   available = open_free + idle_usable + mapping_usable
//             + FreeList.PrefixSum(min(affordable bundles, |FREE|))
// computed from counters and one prefix-sum lookup: O(devices), independent
// of the number of pages, and no driver call (DeviceBudgets keeps the
// driver's view).
//
// Invariants (CheckInvariants verifies every one; tests call it after every
// step):
//   per mapped page:   free + allocated + reserved == usable
//   per unmapped page: free == allocated == reserved == 0
//   open_free     == Σ free over OPEN pages
//   idle_usable   == Σ usable over IDLE pages
//   allocated_    == Σ allocated over pages - null_blocks
//   reserved_     == Σ reserved over pages == Σ |blocks| over reservations
//   mapped_pages  == |IDLE| + |OPEN| + |FULL| + |MAPPING|
//                 == backend handles held by this pool / devices
//   admitted      == mapped_pages + |FREE|;  admitted <= target_pages unless
//                    the limit is DEFERRED, in which case |FREE| == 0
//   every usable block is in exactly one of: free on a mapped page,
//     allocated, reserved by exactly one reservation, or on an unmapped page.
//
// Locking: one absl::Mutex per pool guards all mutable state. Alloc and
// Reserve that need new pages map them while holding it, which keeps them
// linearizable and makes their rollback exact (a mapping costs tens of
// microseconds per page on an H200, paid only by callers that grow the
// pool). The prealloc worker maps without the lock (MAPPING state). Free
// unmaps a page that leaves the IDLE quota while holding the lock. The lock
// order is pool -> DeviceBudgets -> backend; nothing is called back into a
// pool with its lock held.

#ifndef KVBROKER_ALLOCATOR_PAGE_POOL_H_
#define KVBROKER_ALLOCATOR_PAGE_POOL_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/backend.h"
#include "allocator/clock.h"
#include "allocator/device_budget.h"
#include "allocator/failure.h"
#include "allocator/free_list.h"
#include "allocator/geometry.h"
#include "allocator/stats.h"
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
const char* PageStateName(PageState s);

// State of the memory limit (SPEC 7).
enum class LimitState { kNone, kApplied, kDeferred };
// Outcome of one SetMemoryLimit call.
enum class LimitOutcome { kApplied, kDeferred, kStale, kConflict };
const char* LimitOutcomeName(LimitOutcome o);

struct LimitInfo {
  LimitState state = LimitState::kNone;
  Bytes limit_bytes;       // as requested
  int64_t revision = -1;   // -1 until the first SetMemoryLimit
  PageCount target_pages;  // min(floor(limit / (bundle * devices)), T)
  Bytes effective_bytes;   // target_pages * bundle * devices
  Bytes overage_bytes;     // max(0, mapped - effective) while DEFERRED
};

struct PageInfo {
  PageId page_id = 0;
  BlockCount usable_blocks;
  BlockCount free_blocks;
  BlockCount allocated_blocks;
  BlockCount reserved_blocks;
  PageState state = PageState::kFree;
  // For FREE pages: whether the current device budget counts it in
  // available_blocks.
  bool counted = true;
};

struct CapacityQuery {
  // Return at most this many entries of the per-page list (0: none).
  int64_t max_pages = 0;
};

struct CapacitySnapshot {
  std::string pool;
  std::string pool_uid;  // PoolOptions::uid
  uint64_t generation = 0;
  BlockCount available_blocks;
  int64_t available_tokens = 0;
  BlockCount reserved_blocks;
  BlockCount allocated_blocks;  // excludes the null block
  // What the pool could ever hold under its limit (REQUEST_TOO_LARGE bound).
  BlockCount total_blocks;
  PageCount pages_free, pages_mapping, pages_idle, pages_open, pages_full,
      pages_reclaimed, pages_empty;
  // Bundles every device of the pool can still afford.
  int64_t affordable_bundles = 0;
  Bytes mapped_bytes;   // over all devices of the pool
  Bytes virtual_bytes;  // over all devices of the pool
  std::vector<DeviceBudgetSnapshot> devices;
  LimitInfo limit;
  bool healthy = true;
  std::string failure;  // why the pool is FAILED
  // Consumption order: OPEN (fewest free first), IDLE, MAPPING, FREE.
  std::vector<PageInfo> pages;
};

struct PageBlocks {
  PageId page_id = 0;
  std::vector<BlockId> block_ids;  // ascending
};

struct AllocRequest {
  int64_t num_blocks = 0;
  std::string request_id;      // empty: no idempotency
  std::string reservation_id;  // empty: none
  std::optional<uint64_t> expected_generation;
};

struct AllocResult {
  std::vector<PageBlocks> pages;  // ascending page id
  int64_t num_blocks = 0;
  uint64_t generation = 0;
  bool replayed = false;     // a retry answered from the idempotency window
  int64_t pages_mapped = 0;  // pages this call mapped
};

struct FreeRequest {
  // Viewed, not copied (the RPC layer points it at the request message):
  // must stay valid until Free returns.
  absl::Span<const BlockId> block_ids;
  std::string request_id;
};

struct FreeResult {
  int64_t freed_blocks = 0;
  int64_t pages_unmapped = 0;
  uint64_t generation = 0;
  bool replayed = false;
};

struct ReserveRequest {
  int64_t num_blocks = 0;
  absl::Duration ttl = absl::Seconds(30);
  std::string request_id;
};

struct ReservationInfo {
  std::string reservation_id;
  std::vector<PageBlocks> pages;
  int64_t num_blocks = 0;
  absl::Time expires;
  uint64_t generation = 0;
  bool replayed = false;
};

struct ReleaseResult {
  int64_t released_blocks = 0;
  uint64_t generation = 0;
};

struct LimitResult {
  LimitOutcome outcome = LimitOutcome::kApplied;
  LimitInfo limit;
  Bytes mapped_bytes;
  uint64_t generation = 0;
};

struct TrimResult {
  int64_t pages_unmapped = 0;
  uint64_t generation = 0;
};

struct PageOccupancy {
  PageId page_id = 0;
  BlockCount usable_blocks;
  BlockCount allocated_blocks;
  BlockCount reserved_blocks;
  PageState state = PageState::kFree;
};

struct PoolOptions {
  int64_t min_idle_pages = 5;
  int64_t max_idle_pages = 10;
  // Retries of the same request_id are answered from memory for this long,
  // for at most this many request ids per pool.
  absl::Duration idempotency_window = absl::Minutes(10);
  int64_t idempotency_capacity = 65536;
  // Expired reservation ids remembered (RESERVATION_EXPIRED vs NOT_FOUND).
  int64_t expired_reservations_remembered = 65536;
  // Called (without any pool lock held) after the pool's generation changed.
  std::function<void(const std::string& pool)> on_change;
  // The generation the pool starts at (the broker makes it exceed every
  // generation an earlier incarnation of the name could have reached).
  uint64_t initial_generation = 1;
  // Names this incarnation of the pool (SPEC 5 pool_uid); reported in every
  // capacity snapshot. Empty: none.
  std::string uid;
  // Called (without any pool lock held) after a call left the pool below
  // min_idle_pages with pages it could map: wake the prealloc worker.
  std::function<void()> on_prealloc_needed;
};

class PagePool {
 public:
  // Validates `config` (see Geometry::Create), reserves the virtual ranges and,
  // with reserve_null_block, maps page 0 and allocates block 0. `backend`,
  // `budgets` and `clock` must outlive the pool.
  // Errors: those of Geometry::Create; GPU_MEMORY_EXHAUSTED / MAPPING_FAILED
  // when the null block's page cannot be mapped; UNAVAILABLE when the
  // address range cannot be reserved.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(
      const PoolConfig& config, Backend* backend, DeviceBudgets* budgets,
      Clock* clock, PoolOptions options);

  // Unmaps every page and frees the ranges (Shutdown(true)).
  ~PagePool();

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  const std::string& name() const { return geometry_.config().name; }
  // PoolOptions::uid: this incarnation of the name.
  const std::string& uid() const { return options_.uid; }
  const Geometry& geometry() const { return geometry_; }
  // Base address of the pool's range on `device` (an ordinal of the pool).
  uint64_t range_base(int device_index) const {
    return ranges_[device_index].base;
  }

  // SPEC 4. Read-only; never calls the driver.
  // Errors: POOL_NOT_FOUND after Shutdown.
  absl::StatusOr<CapacitySnapshot> Capacity(const CapacityQuery& query = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // All or nothing. Refusals happen before any page is mapped.
  // Errors: INVALID_ARGUMENT (num_blocks < 0), POOL_FAILED,
  //   REQUEST_ID_REUSED, GENERATION_MISMATCH, RESERVATION_NOT_FOUND,
  //   RESERVATION_EXPIRED, RESERVATION_TOO_SMALL (the reservation plus the
  //   pool cannot supply the request), REQUEST_TOO_LARGE, SHRINK_PENDING,
  //   GPU_MEMORY_EXHAUSTED, POOL_EXHAUSTED; after a mapping failure that was
  //   rolled back: GPU_MEMORY_EXHAUSTED (out of memory) or MAPPING_FAILED;
  //   POOL_FAILED when the rollback itself failed or the device is lost.
  absl::StatusOr<AllocResult> Alloc(const AllocRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // All or nothing: every id must be allocated (not reserved, not the null
  // block) and appear once.
  // Errors: INVALID_ARGUMENT (an id repeated), BLOCK_NOT_ALLOCATED,
  //   BLOCK_IN_RESERVATION, REQUEST_ID_REUSED.
  absl::StatusOr<FreeResult> Free(const FreeRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sets `num_blocks` blocks aside (mapped) until `ttl` passes or they are
  // released or allocated through Alloc(reservation_id). Same refusals as
  // Alloc; INVALID_ARGUMENT for num_blocks <= 0 or ttl <= 0.
  absl::StatusOr<ReservationInfo> Reserve(const ReserveRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the reservation's remaining blocks to the pool.
  // Errors: RESERVATION_NOT_FOUND, RESERVATION_EXPIRED.
  absl::StatusOr<ReleaseResult> ReleaseReservation(
      const std::string& reservation_id) ABSL_LOCKS_EXCLUDED(mu_);

  // SPEC 7. STALE and CONFLICT are outcomes, not errors.
  // Errors: INVALID_ARGUMENT for a negative limit or revision; POOL_FAILED
  //   when an unmap fails.
  absl::StatusOr<LimitResult> SetMemoryLimit(Bytes limit_bytes,
                                             int64_t revision)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Unmaps up to `max_pages` IDLE pages (all of them when max_pages <= 0),
  // front first; they go to the back of the FREE list.
  absl::StatusOr<TrimResult> Trim(int64_t max_pages = 0)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Allocated and reserved blocks of each page in `page_ids`.
  // Errors: INVALID_ARGUMENT for an id outside [0, T).
  absl::StatusOr<std::vector<PageOccupancy>> GetPageOccupancy(
      const std::vector<PageId>& page_ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Prealloc worker step: maps at most one page, without the pool lock held
  // across the driver calls, if fewer than min_idle_pages pages are IDLE or
  // MAPPING. Returns true if it mapped a page and more work may remain.
  // Called by the broker's background thread (and by tests, directly).
  bool PreallocStep() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the blocks of every reservation whose TTL has passed. Every other
  // entry point does this too, so expiry is exact from the caller's view.
  void ExpireReservations() ABSL_LOCKS_EXCLUDED(mu_);

  // Releases everything. Without `force`, refuses (POOL_NOT_EMPTY) while
  // blocks are allocated or reserved. After it succeeds every call returns
  // POOL_NOT_FOUND. Errors: POOL_NOT_EMPTY; INTERNAL when pages could not be
  // unmapped (they are then leaked, and logged).
  absl::Status Shutdown(bool force) ABSL_LOCKS_EXCLUDED(mu_);

  PoolStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  bool healthy() const ABSL_LOCKS_EXCLUDED(mu_);
  // True once a backend call of this pool reported a fatal device error
  // (INTERNAL): the device, not just this pool, is unusable.
  bool device_lost() const ABSL_LOCKS_EXCLUDED(mu_);

  // Walks every page and block and checks the invariants in this header.
  // O(T + N): for tests and debugging. Returns INTERNAL naming the first
  // violation.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Page {
    PageState state = PageState::kFree;
    BlockId begin = 0;  // geometry_.range(p), cached: no division per block
    BlockId end = 0;
    int64_t usable = 0;
    int64_t free = 0;       // free blocks (mapped pages only)
    int64_t allocated = 0;  // including the null block
    int64_t reserved = 0;
  };

  // Per-block ownership; free blocks of mapped pages also have their bit set
  // in free_bits_.
  enum class BlockOwner : uint8_t { kNone = 0, kAllocated, kReserved, kNull };

  struct Reservation {
    std::string id;
    std::vector<BlockId> blocks;  // remaining, ascending
    absl::Time expires;
  };

  // One remembered outcome of a request_id.
  struct Remembered {
    std::string fingerprint;
    std::variant<AllocResult, FreeResult, ReservationInfo> result;
    absl::Time at;
  };

  // Where the blocks of one acquisition come from; computed and checked
  // before anything is mapped.
  struct Plan {
    int64_t from_reservation = 0;
    int64_t from_pool = 0;  // OPEN + IDLE (+ fresh) pages
    int64_t new_pages = 0;  // FREE pages to map, front first
  };

  // A mapping's result: `status` of the failed step and whether every step
  // already done was unwound.
  struct MapOutcome {
    absl::Status status;
    bool unwound = true;
    absl::Duration took;  // of a successful mapping; the caller records it
  };

  PagePool(Geometry geometry, Backend* backend, DeviceBudgets* budgets,
           Clock* clock, PoolOptions options);

  absl::Status Init();

  // --- capacity and planning (REQUIRES mu_) ---
  int64_t AffordableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MappedSupplyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t AvailableLocked(int64_t affordable) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t TotalUnderLimitLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that `need` blocks (beyond `from_reservation`) can be supplied now
  // and returns the plan, or the typed refusal.
  absl::StatusOr<Plan> PlanLocked(int64_t requested, int64_t from_reservation,
                                  const Reservation* reservation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckUsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Shared body of Alloc and Reserve: maps plan.new_pages pages and takes
  // the blocks in consumption order, or changes nothing.
  absl::StatusOr<std::vector<BlockId>> AcquireLocked(const Plan& plan,
                                                     BlockOwner owner,
                                                     Reservation* reservation,
                                                     int64_t* pages_mapped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes up to `n` free blocks of mapped page p, ascending; appends them.
  int64_t TakeFromPageLocked(PageId p, int64_t n, BlockOwner owner,
                             std::vector<BlockId>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The page of block b; `hint` (a page id or -1) is tried first, which makes
  // walks over sorted ids division-free.
  PageId PageOfLocked(BlockId b, PageId hint) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns allocated or reserved blocks (ascending ids) to their pages,
  // settles emptied pages and the limit; returns the pages unmapped.
  int64_t ReturnBlocksLocked(absl::Span<const BlockId> ascending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A page whose last block was returned: IDLE, FREE or RECLAIMED.
  void OnPageEmptiedLocked(PageId p, int64_t* unmapped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After blocks were returned: completes a deferred shrink when possible.
  void SettleLimitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves RECLAIMED ids to the front of the FREE list until the pool admits
  // target pages again.
  void AdmitReclaimedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- page state bookkeeping (REQUIRES mu_) ---
  // Removes p from whatever state index holds it / adds it according to its
  // counts. Mapped pages only.
  void DetachMappedLocked(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AttachMappedLocked(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A freshly mapped page: all usable blocks free.
  void MarkMappedLocked(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An IDLE page about to be unmapped: clears its free blocks.
  void MarkUnmappedLocked(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetStateCountLocked(PageState s, int64_t delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChangeStateLocked(PageId p, PageState to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- backend transactions ---
  // Create -> Map -> SetAccess on every device of the pool, unwound in
  // reverse on failure. Touches only handles_ of page p, which the caller
  // owns exclusively (under mu_ or in MAPPING state), and no other member:
  // the prealloc worker calls it without the lock.
  MapOutcome MapPageUnlocked(PageId p) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Unmap -> release on every device of the pool, last device first.
  absl::Status UnmapPageLocked(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps an IDLE page under the lock and uncharges its budget; on failure
  // marks the pool FAILED and leaves the page IDLE.
  bool UnmapIdleLocked(PageId p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Classifies a failed mapping, refreshes the budgets, marks the pool FAILED
  // when needed, and returns the typed error for the caller.
  absl::Status MappingErrorLocked(const MapOutcome& outcome, int64_t requested)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkFailedLocked(const std::string& why, bool device_lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- reservations and idempotency ---
  // Releases the reservations whose time has come; reads the clock only
  // when a reservation exists.
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseReservationLocked(Reservation& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FindReservationLocked(const std::string& id, Reservation** out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Looks `request_id` up: nullptr if unknown; REQUEST_ID_REUSED if known
  // with another fingerprint.
  absl::StatusOr<const Remembered*> RecallLocked(const std::string& request_id,
                                                 const std::string& fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The remembered outcome of `request_id` as a T (marked replayed), the
  // REQUEST_ID_REUSED refusal, or nullopt when there is nothing to replay.
  template <typename T>
  std::optional<absl::StatusOr<T>> ReplayLocked(const std::string& request_id,
                                                const std::string& fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing mu_) until the prealloc worker's mapping, if any, ends:
  // at most one page's driver calls.
  void AwaitNoMappingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberLocked(
      const std::string& request_id, std::string fingerprint,
      std::variant<AllocResult, FreeResult, ReservationInfo> result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::vector<PageBlocks> GroupByPage(std::vector<BlockId> blocks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  LimitInfo LimitInfoLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MappedPagesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BumpGenerationLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Invokes options_.on_change if the generation moved, and
  // options_.on_prealloc_needed if `prealloc`.
  void NotifyIfChanged(uint64_t before, uint64_t after, bool prealloc)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether PreallocStep would map a page now.
  bool NeedsPreallocLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckInvariantsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- constant after construction ----
  const Geometry geometry_;
  Backend* const backend_;
  DeviceBudgets* const budgets_;
  Clock* const clock_;
  const PoolOptions options_;
  std::vector<VirtualRange> ranges_;  // one per device of the pool

  // ---- guarded by mu_ ----
  // The scalars every Alloc, Free and Capacity reads come first, next to
  // the mutex: a call after an idle spell then misses on a few cache lines
  // of this object, not on one per field.
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool device_lost_ ABSL_GUARDED_BY(mu_) = false;
  // Memory limit (SPEC 7); target_pages_ == T when no limit was set.
  LimitState limit_state_ ABSL_GUARDED_BY(mu_) = LimitState::kNone;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t open_free_ ABSL_GUARDED_BY(mu_) = 0;    // Σ free over open_
  int64_t idle_usable_ ABSL_GUARDED_BY(mu_) = 0;  // Σ usable over idle_
  // At most one page is MAPPING at a time (the prealloc worker's).
  std::optional<PageId> mapping_ ABSL_GUARDED_BY(mu_);
  int64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;  // excludes the null block
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t null_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reclaimed_usable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t target_pages_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<int64_t, 7> state_pages_ ABSL_GUARDED_BY(mu_) = {};
  // Reservations by expiry time (every call checks for due ones).
  std::set<std::pair<absl::Time, std::string>> expiry_ ABSL_GUARDED_BY(mu_);

  std::vector<Page> pages_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockOwner> owner_ ABSL_GUARDED_BY(mu_);
  // Bit b set <=> block b is usable, on a mapped page, and owned by nobody.
  std::vector<uint64_t> free_bits_ ABSL_GUARDED_BY(mu_);
  // OPEN pages ordered by (free blocks, page id): best fit is a lower_bound.
  absl::btree_set<std::pair<int64_t, PageId>> open_ ABSL_GUARDED_BY(mu_);
  std::deque<PageId> idle_ ABSL_GUARDED_BY(mu_);
  internal::FreeList free_ ABSL_GUARDED_BY(mu_);
  // handles_[p * devices + i]: page p's allocation on the pool's i-th device.
  std::vector<PhysicalHandle> handles_ ABSL_GUARDED_BY(mu_);
  std::deque<PageId> reclaimed_ ABSL_GUARDED_BY(mu_);

  std::string failure_ ABSL_GUARDED_BY(mu_);
  Bytes limit_bytes_ ABSL_GUARDED_BY(mu_);
  int64_t limit_revision_ ABSL_GUARDED_BY(mu_) = -1;

  std::map<std::string, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> expired_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> expired_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_reservation_ ABSL_GUARDED_BY(mu_) = 1;

  absl::flat_hash_map<std::string, Remembered> remembered_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, std::string>> remembered_order_
      ABSL_GUARDED_BY(mu_);

  PoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PAGE_POOL_H_
