// PagePool: one KV pool. Exact capacity, all-or-nothing allocation, and the
// page lifecycle; docs/design.md explains the
// design as a whole.
//
// The pool orchestrates four parts under its one lock (docs/design.md, "The
// pool in parts"):
//   PageLedger        (page_ledger.h)        pages, blocks, lists, counters
//   BundleMapper      (bundle_mapper.h)      the per-page backend transaction
//   ReservationTable  (reservation_table.h)  reservations and their expiry
//   IdempotencyWindow (idempotency_window.h) outcomes of recent request ids
// and owns what joins them: planning and the typed refusals, the memory
// limit, the budget charges, health, the generation and the statistics.
//
// Consumption order (Alloc and Reserve take capacity in this order, Capacity
// counts it in the same order):
//   1. the caller's reservation (Alloc only);
//   2. OPEN pages, best fit: the page with the fewest free blocks that still
//      covers the remaining need, else the one with the most free blocks
//      (ties: lowest page id);
//   3. IDLE pages, front of the list first;
//   4. FREE pages, front of the list first, while every device of the pool
//      can afford one more bundle. Under a limit of `target` pages the pool
//      admits (mapped + FREE) at most `target` pages.
// Within a page, blocks go out in ascending id order.
//
// Capacity (docs/design.md, "Capacity"):
//   available = open_free + idle_usable
//             + FreeList.PrefixSum(min(affordable bundles, |FREE|))
// from counters and one prefix-sum lookup: O(devices), no driver call.
// Pages in flight (MAPPING) are neither available nor allocated. Capacity
// reads the counters the last holder of the lock published, without taking
// the lock, unless it needs more than they hold (docs/design.md, "Capacity
// without the lock").
//
// Invariants, beyond the ledger's (CheckInvariants verifies them all):
//   reserved   == Σ |blocks| over reservations + blocks a Reserve in flight
//                 holds
//   admitted   <= target_pages unless the limit is DEFERRED, in which case
//                 |FREE| == 0
//   no page is in flight while no call is.
//   while mu_ is free: published_ holds CountersLocked() (every release of
//     mu_ publishes first: CloseLocked, WithoutLock, before each Await).
//
// Locking: one lock, mu_ (a SpinThenLock: spins, bounded, then parks in an
// absl::Mutex), guards all mutable state. No backend call,
// driver query or log line runs under it. A call that must map or unmap
// takes its pages under the lock (they become MAPPING: in flight), drops
// the lock in one helper, WithoutLock, for the driver calls, and retakes it
// to commit, or to roll back to exactly the state before the call. Long
// locked walks go in steps of at most step_pages_ pages, with the lock
// released in between (StepLocked; docs/design.md, "Bounded lock hold"). The
// caller's own unmaps finish before it returns. Lock order: mu_ ->
// DeviceBudgets (a leaf); on_change and on_prealloc_needed run with no pool
// lock held (docs/design.md, "Locking"). The PageAnnouncer's lock is taken
// only without mu_ (mu_ is released around every mapping step).

#ifndef KVBROKER_ALLOCATOR_PAGE_POOL_H_
#define KVBROKER_ALLOCATOR_PAGE_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/backend.h"
#include "allocator/bundle_mapper.h"
#include "allocator/clock.h"
#include "allocator/device_budget.h"
#include "allocator/failure.h"
#include "allocator/geometry.h"
#include "allocator/holder_tags.h"
#include "allocator/idempotency_window.h"
#include "allocator/page_announcer.h"
#include "allocator/page_ledger.h"
#include "allocator/page_listener.h"
#include "allocator/pool_types.h"
#include "allocator/published_counters.h"
#include "allocator/reservation_table.h"
#include "allocator/spin_then_lock.h"
#include "allocator/stats.h"
#include "allocator/units.h"

namespace kvbroker {

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
    return mapper_.range_base(device_index);
  }

  // docs/design.md, "Capacity". Read-only; never calls the driver; takes
  // the pool lock only for a page list, an expired reservation, a FAILED
  // pool, or devices that cannot afford every FREE page.
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

  // docs/design.md, "Memory limits". STALE and CONFLICT are outcomes, not
  // errors.
  // Errors: INVALID_ARGUMENT for a negative limit or revision; POOL_FAILED
  //   when an unmap fails.
  absl::StatusOr<LimitResult> SetMemoryLimit(Bytes limit_bytes,
                                             int64_t revision)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Unmaps up to `max_pages` IDLE pages (all of them when max_pages <= 0),
  // front first; they go to the back of the FREE list. Errors: POOL_FAILED
  // when an unmap fails.
  absl::StatusOr<TrimResult> Trim(int64_t max_pages = 0)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Allocated and reserved blocks of each page in `page_ids`.
  // Errors: INVALID_ARGUMENT for an id outside [0, T).
  absl::StatusOr<std::vector<PageOccupancy>> GetPageOccupancy(
      const std::vector<PageId>& page_ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Prealloc worker step: maps at most one page (in flight, without the
  // pool lock) if fewer than min_idle_pages pages are IDLE and no other
  // prealloc step is running. Returns true if it mapped a page and more work
  // may remain.
  // Called by the broker's background thread (and by tests, directly).
  bool PreallocStep() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the blocks of every reservation whose TTL has passed. Every other
  // entry point does this too, so expiry is exact from the caller's view.
  void ExpireReservations() ABSL_LOCKS_EXCLUDED(mu_);

  // Releases everything. Without `force`, refuses (POOL_NOT_EMPTY) while
  // blocks are allocated or reserved. Otherwise the pool is shut down: every
  // call returns POOL_NOT_FOUND from then on. Pages that page listeners
  // (engines) know are revoked first, with the usual deadline, and every
  // listener then hears OnPoolClosed; such a page keeps its handles and
  // stays charged until every listener told acknowledged or left (past the
  // deadline it is quarantined, as elsewhere), and the ranges are freed
  // after the last of them. Errors: POOL_NOT_EMPTY; INTERNAL when some pages
  // could not be unmapped and released: the pool is shut down all the same,
  // still owns their handles (backend_handles() > 0, still charged to the
  // device budgets) and ReleaseLeftovers retries them.
  absl::Status Shutdown(bool force) ABSL_LOCKS_EXCLUDED(mu_);
  // After a Shutdown that returned INTERNAL: retries the unmaps and releases
  // still owed, uncharges the pages that come back, and frees the address
  // ranges once nothing is held. Returns the pages still holding a handle
  // (0 also before Shutdown, or while another retry runs).
  int64_t ReleaseLeftovers() ABSL_LOCKS_EXCLUDED(mu_);
  // Backend handles the pool holds now: every device of its mapped pages,
  // plus those of failed rollbacks and unmaps still to be released. Never
  // blocks.
  int64_t backend_handles() const;

  PoolStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // From the published counters; never waits for the pool lock.
  uint64_t generation() const;
  bool healthy() const;
  // True once a backend call of this pool reported a fatal device error
  // (INTERNAL): the device, not just this pool, is unusable.
  bool device_lost() const ABSL_LOCKS_EXCLUDED(mu_);

  // Walks every page and block and checks the invariants in this header and
  // in page_ledger.h. O(T + N): for tests and debugging. Returns INTERNAL
  // naming the first violation.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

  // Engines (docs/design.md, "Pages and engines"). Registers `listener` for
  // the pool's mapped pages and calls `snapshot` with the pages mapped now,
  // atomically with the registration (page_announcer.h). Errors: the
  // backend's when a page cannot be exported (nothing registered).
  absl::Status AddPageListener(
      PageListener* listener,
      absl::FunctionRef<void(absl::Span<const MappedPage>)> snapshot)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After it returns `listener` is never called again; its pending
  // revocations count as acknowledged (their pages may be unmapped now, on
  // this thread).
  void RemovePageListener(PageListener* listener) ABSL_LOCKS_EXCLUDED(mu_);
  // `listener` has had its engine unmap the pages of revocation `id`; once
  // every listener told has, they are unmapped (on this thread) and land
  // where their unmap was headed. Errors: NOT_FOUND when `id` is not
  // pending for `listener`.
  absl::Status AckRevocation(PageListener* listener, uint64_t id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Revocations `listener` has yet to acknowledge, and their pages past the
  // deadline (QUARANTINED), for operators.
  int64_t pending_revocations(const PageListener* listener) const {
    return announcer_.pending_revocations(listener);
  }
  int64_t quarantined_pages(const PageListener* listener) const {
    return announcer_.overdue_pages(listener, clock_->Now());
  }
  // Revocations `listener` has yet to acknowledge within their deadline.
  int64_t revocations_in_time(const PageListener* listener) const {
    return announcer_.revocations_in_time(listener, clock_->Now());
  }
  // Revocations waiting for some listener (per pool; the pages are counted
  // by Capacity: pages_revoking, pages_quarantined).
  int64_t pending_revocations() const { return announcer_.revocations(); }
  // Pages mapped and announced to listeners (for tests and operators).
  int64_t announced_pages() const { return announcer_.announced_pages(); }

 private:
  // Where the blocks of one acquisition come from; computed and checked
  // before anything is taken.
  struct Plan {
    int64_t from_reservation = 0;
    int64_t from_pool = 0;  // OPEN + IDLE (+ fresh) pages
    int64_t new_pages = 0;  // FREE pages to map, front first (charged)
  };

  // What an Alloc or Reserve holds while its pages are in flight; enough to
  // commit it or to undo it exactly.
  struct Acquisition {
    BlockOwner owner = BlockOwner::kAllocated;
    std::string reservation_id;             // Alloc from a reservation
    std::vector<BlockId> from_reservation;  // ascending
    // Taken so far: from_reservation's ids first, then the pages' blocks
    // in the order taken.
    Stretches blocks;
    // The blocks taken from the pages (not the reservation's), ascending:
    // what goes back to the pool when the call fails.
    std::vector<BlockId> FromPagesAscending() const;
    PageIds from_idle;                      // IDLE pages drawn from, in order
    std::vector<PageId> fresh;              // in flight, FREE-list order
    int64_t fresh_need = 0;                 // blocks to take from `fresh`
  };

  // An unmap the calling thread owes: the page is in flight.
  struct Unmap {
    PageId page = 0;
    absl::Status status;
    absl::Duration took;
  };

  // What an entry point does once it has dropped the lock for good.
  struct Epilogue {
    uint64_t before = 0;
    uint64_t after = 0;
    bool prealloc = false;
    std::string log;  // a line for stderr (a pool that just failed)
  };

  PagePool(Geometry geometry, Backend* backend, DeviceBudgets* budgets,
           Clock* clock, PoolOptions options);

  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `work` with mu_ released, then retakes it: the only place the pool
  // drops its lock in the middle of a call. `work` must touch no guarded
  // member (clang checks it: the lambda is analysed without the lock).
  void WithoutLock(absl::FunctionRef<void()> work)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Between two steps of a long locked walk (docs/design.md, "Bounded lock
  // hold"): when a call waits for the lock, publishes, lets it take the
  // lock, and retakes it; otherwise does nothing.
  // The caller holds calls_in_flight_ while it steps, so that a limit or a
  // shutdown waits for it, and leaves every invariant true.
  void StepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether StepLocked would release the lock now (a thread waits for it,
  // or the between_steps hook is set): a walk skips a step's bookkeeping
  // where it would not.
  bool StepDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- refusals ---
  // Whether a refusal is counted in PoolStats::outcomes: yes in Alloc, Free
  // and Reserve, no elsewhere. Each refusal is counted where it is decided,
  // with the reason it is built from (successes at the end of the call).
  enum class Counted : bool { kNo, kYes };
  absl::Status RefuseLocked(Counted counted, FailureReason reason,
                            absl::string_view message,
                            FailureMetadata metadata = {},
                            std::vector<FieldViolation> violations = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InvalidFieldLocked(Counted counted, absl::string_view field,
                                  absl::string_view description)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- capacity and planning ---
  int64_t AffordableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Capacity reads without the lock (and with it): the ledger's
  // counters less unshown_.
  PoolCounters CountersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ledger's counters that a commit step changes.
  struct CommitCounts {
    int64_t mapped_supply = 0;
    int64_t reserved = 0;
    int64_t allocated = 0;
    int64_t admitted_usable = 0;
    int64_t mapped_pages = 0;
    int64_t pages_by_state[kPageStates] = {};
    CommitCounts& operator+=(const CommitCounts& o);
    CommitCounts& operator-=(const CommitCounts& o);
    bool zero() const;
  };
  CommitCounts CommitCountsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks as Capacity shows them (the ledger's, less unshown_).
  int64_t ShownAllocatedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ledger_.allocated().value() - unshown_.allocated;
  }
  int64_t ShownReservedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ledger_.reserved().value() - unshown_.reserved;
  }
  // Whether page p was committed by a call whose commit is not shown yet
  // (unshown_): it is shown MAPPING, with nothing on it.
  bool UnshownLocked(PageId p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Block b's owner as Capacity shows it: none on a page whose commit is
  // not shown yet, else the ledger's.
  BlockOwner ShownOwnerLocked(BlockId b) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes CountersLocked(); runs before every release of mu_.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The snapshot's scalar fields from `counters` and the budget.
  void FillCapacity(const PoolCounters& counters, int64_t affordable,
                    int64_t free_prefix, CapacitySnapshot* c) const;
  // Capacity under the lock: with the page list, or when the published
  // counters are not enough.
  absl::StatusOr<CapacitySnapshot> CapacityLocked(const CapacityQuery& query,
                                                  std::string* log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // POOL_NOT_FOUND after Shutdown, POOL_FAILED once failed, else OK.
  absl::Status CheckUsableLocked(Counted counted = Counted::kNo)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that `requested` blocks (from_reservation of them from the
  // caller's reservation) can be supplied now and charges the pages to map;
  // or returns the typed refusal, having changed nothing.
  absl::StatusOr<Plan> PlanLocked(int64_t requested, int64_t from_reservation,
                                  const Reservation* reservation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- acquisition (Alloc and Reserve) ---
  // Takes what `plan` says; the fresh pages go in flight.
  Acquisition BeginAcquireLocked(const Plan& plan, BlockOwner owner,
                                 Reservation* reservation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps acq->fresh without the lock (unwinding this call's earlier pages if
  // one fails), then commits, or rolls everything back and returns the
  // typed error. On success acq->blocks holds every block.
  absl::Status FinishAcquireLocked(Acquisition* acq, int64_t requested,
                                   std::vector<Unmap>* unmaps, std::string* log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinishAcquireLocked when acq has fresh pages to map (else OK at once),
  // with `request_id`'s entry pending while the lock is dropped.
  absl::Status MapFreshLocked(Acquisition* acq, int64_t requested,
                              const std::string& request_id,
                              std::vector<Unmap>* unmaps, std::string* log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts acq->from_reservation back at the front of its reservation, or,
  // when the reservation is gone meanwhile, returns them to the pool.
  void GiveBackToReservationLocked(Acquisition* acq, std::vector<Unmap>* unmaps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- zeroing (holder_tags.h) ---
  // Tags `blocks` (this Alloc's, committed) as `holder`'s and zeroes those
  // that held another holder's data, without the lock: meanwhile they count
  // as reserved by this call in flight, so no Free can name them and their
  // pages stay mapped. On a failed zero nothing of the Alloc stays: the
  // blocks a redeemed reservation gave go back to it (at its front, as
  // before the call), the others to the pool (acq->blocks is cleared), and
  // the typed error is returned.
  absl::Status ZeroForHolderLocked(const std::string& holder, Acquisition* acq,
                                   const std::string& request_id,
                                   std::vector<Unmap>* unmaps, std::string* log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Zeroes `ascending` blocks on every device (backend calls; no lock).
  absl::Status ZeroBlocks(absl::Span<const BlockId> ascending) const;

  // --- Free in steps (docs/design.md, "Bounded lock hold") ---
  // A Free whose ids span more than step_pages_ pages (and are more than
  // free_one_step_blocks_) marks them as being
  // freed while it validates them, step by step, then returns them in one
  // step. Marked blocks still count as allocated; no other Free may name
  // them: one that does waits until they are no longer marked (the waiting
  // rule), so two Frees of the same ids never both succeed.
  bool FreeingLocked(BlockId b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (freeing_[b >> 6] >> (b & 63)) & 1;
  }
  // The first marked block of [first, end), or -1.
  BlockId FirstFreeingLocked(BlockId first, BlockId end) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: `ids` strictly ascending.
  void MarkFreeingLocked(absl::Span<const BlockId> ids, bool on)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks one step's ids (strictly ascending) for a Free: whether every one
  // is shown allocated, and the first one another Free has marked (-1 if
  // none). Runs that name the rest of a page are checked a page at a time.
  struct FreeCheck {
    bool valid = true;
    BlockId busy = -1;
  };
  FreeCheck CheckStepLocked(absl::Span<const BlockId> ascending) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for blocks named by (first, count) pairs, ascending and apart,
  // a page's part of a run at a time.
  FreeCheck CheckRunsLocked(absl::Span<const int64_t> runs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing mu_) until block b is not marked.
  void AwaitNotFreeingLocked(BlockId b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The refusal for ids that are not all allocated (walks every id in the
  // request's order), or OK.
  absl::Status CheckFreeLocked(absl::Span<const BlockId> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- returning blocks and unmapping ---
  // Returns blocks (ascending) and files each emptied page: IDLE, or in
  // flight to be unmapped (appended to `unmaps`). Settles the limit.
  void ReturnBlocksLocked(absl::Span<const BlockId> ascending,
                          std::vector<Unmap>* unmaps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for runs that CheckRunsLocked found valid.
  void ReturnRunsLocked(absl::Span<const int64_t> runs,
                        std::vector<Unmap>* unmaps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A page left with no allocated or reserved block: IDLE while fewer than
  // max_idle_pages are and the pool is within its limit, else in flight to
  // be unmapped (to RECLAIMED when over the limit, else to FREE).
  void FileEmptiedLocked(PageId p, std::vector<Unmap>* unmaps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps the pages in `unmaps` without the lock, then lands them (or, for
  // a failed unmap, fails the pool and keeps the page IDLE). Returns the
  // pages unmapped; clears `unmaps`.
  // Pages engines know stay in flight, REVOKING, until acknowledged
  // (UnmapRevoked lands them later).
  int64_t CompleteUnmapsLocked(std::vector<Unmap>* unmaps, std::string* log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lands finished unmaps (FREE or RECLAIMED; a failed one fails the pool
  // and stays IDLE). Returns the pages landed; clears `unmaps`.
  int64_t LandUnmapsLocked(std::vector<Unmap>* unmaps, std::string* log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps and lands revoked pages every engine has let go of (after
  // Shutdown: releases them).
  void UnmapRevoked(const std::vector<PageId>& pages) ABSL_LOCKS_EXCLUDED(mu_);
  // After blocks were returned: completes a deferred shrink when possible.
  void SettleLimitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves RECLAIMED ids to the front of the FREE list until the pool admits
  // target pages again.
  void AdmitReclaimedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- failures ---
  // The typed error of a failed, rolled-back (or not) mapping; marks the
  // pool FAILED when the rollback failed or the device is lost.
  absl::Status MappingErrorLocked(const BundleMapper::MapOutcome& outcome,
                                  int64_t requested, std::string* log,
                                  Counted counted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkFailedLocked(const std::string& why, bool device_lost,
                        std::string* log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After shut_down_: mapper_.ReleaseHeld without the lock (sparing the
  // pages engines_hold_), then the uncharge, and the ranges once nothing is
  // held; returns the pages whose release failed.
  int64_t ReleaseLeftoversLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- reservations and idempotency ---
  // Releases the reservations whose time has come and finishes the unmaps
  // that causes (dropping the lock for them); reads the clock only when a
  // reservation exists.
  void ExpireLocked(std::string* log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FindReservationLocked(const std::string& id, Reservation** out,
                                     Counted counted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing mu_) while a call under `request_id` is in flight.
  void AwaitNotPendingLocked(const std::string& request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The remembered outcome of `request_id` as a T (marked replayed), the
  // REQUEST_ID_REUSED refusal, or nullopt when there is nothing to replay.
  template <typename T>
  std::optional<absl::StatusOr<T>> ReplayLocked(const std::string& request_id,
                                                const std::string& fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberLocked(const std::string& request_id, std::string fingerprint,
                      IdempotencyWindow::Outcome outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Groups blocks of one acquisition by page, pages ascending. `blocks` is
  // made of two parts, either of which may be empty: [0, sorted), ids
  // ascending (a reservation's), then the ledger's, where each page appears
  // once with its ids ascending (PageLedger::TakeMapped and the fresh pages'
  // takes). Reads only the geometry: callable without the lock.
  std::vector<PageBlocks> GroupByPage(std::vector<BlockId> blocks,
                                      size_t sorted) const;
  // Fills `r` from an acquisition's blocks (`sorted`: how many ids its
  // reservation part holds) in the form the request asked for: pages, or
  // runs with AllocRequest::as_runs, made from the stretches without a
  // list of ids.
  void ShapeResult(AllocResult* r, const Stretches& blocks, size_t sorted,
                   bool as_runs) const;
  // A remembered result in the form this request asks for (a retry may ask
  // otherwise than the call it repeats).
  void ReshapeResult(AllocResult* r, bool as_runs) const;
  LimitInfo LimitInfoLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Bytes MappedBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BumpGenerationLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the epilogue's "after" fields.
  void CloseLocked(Epilogue* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs, then invokes options_.on_change if the generation moved and
  // options_.on_prealloc_needed if asked.
  void RunEpilogue(const Epilogue& e) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether PreallocStep would map a page now.
  bool NeedsPreallocLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckInvariantsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- constant after construction ----
  const Geometry geometry_;
  Backend* const backend_;
  DeviceBudgets* const budgets_;
  Clock* const clock_;
  const PoolOptions options_;
  // A locked walk (pages committed, landed or unmapped, blocks validated or
  // returned) covers at most this many pages between two StepLocked
  // (PoolOptions::step_pages, at least 1).
  const size_t step_pages_;
  // A Free of at most this many ids is one step (PoolOptions).
  const size_t free_one_step_blocks_;
  // Not guarded: each page's handles belong to whoever holds the page in
  // flight (or to mu_'s holder for a settled page); see bundle_mapper.h.
  BundleMapper mapper_;
  // Its own lock, never taken with mu_ held: the pool calls it from its
  // unlocked mapping steps (Announce after a page is mapped, Withdraw before
  // one is unmapped).
  PageAnnouncer announcer_;

  // ---- guarded by mu_ ----
  mutable SpinThenLock mu_;
  // Written under mu_ (PublishLocked), read by anyone without it; on cache
  // lines of its own (seqlock.h), apart from mu_ and the fields below.
  PublishedCounters published_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool device_lost_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  // Calls that dropped the lock with pages in flight; Shutdown and
  // SetMemoryLimit wait for none.
  int64_t calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool prealloc_running_ ABSL_GUARDED_BY(mu_) = false;
  // Pages the ledger lists FREE whose failed rollback left handles in the
  // mapper (the pool is FAILED, so they are never mapped again). They stay
  // charged to the device budgets until released at shutdown.
  int64_t stranded_pages_ ABSL_GUARDED_BY(mu_) = 0;
  // After shut_down_: the pages still charged, i.e. still holding a handle
  // in mapper_; ReleaseLeftovers brings it to 0.
  int64_t charged_after_shutdown_ ABSL_GUARDED_BY(mu_) = 0;
  // A ReleaseLeftovers is running without the lock; release_again_: a page
  // engines let go of meanwhile waits for another round.
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  bool release_again_ ABSL_GUARDED_BY(mu_) = false;
  // After shut_down_: pages revoked by the shutdown (or still revoking
  // then) that engines may still map. They keep their handles, stay
  // charged and keep the ranges reserved until every engine told
  // acknowledged or left (UnmapRevoked); indexed by page id.
  std::vector<bool> engines_hold_ ABSL_GUARDED_BY(mu_);
  // Bit b set <=> block b is allocated and a stepped Free in flight is
  // freeing it; freeing_blocks_ counts the set bits.
  std::vector<uint64_t> freeing_ ABSL_GUARDED_BY(mu_);
  int64_t freeing_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks held as reserved by a Reserve in flight (no reservation yet).
  int64_t reserving_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // What the commit steps done so far of every Alloc or Reserve still
  // committing its fresh pages changed in the ledger (docs/design.md,
  // "Bounded lock hold"). Capacity is shown the ledger less this: such a
  // call's committed pages as still MAPPING and their blocks as not yet
  // taken, until its last step, so that no publication shows a call half
  // committed; and the blocks an Alloc zeroes for its holder as allocated
  // (the ledger holds them as reserved meanwhile). Zero while no call is in
  // flight. committing_ lists those
  // calls' committed pages, for the page list.
  CommitCounts unshown_ ABSL_GUARDED_BY(mu_);
  struct Committing {
    const std::vector<PageId>* fresh;  // the call's Acquisition::fresh
    size_t committed;                  // its first `committed` pages
  };
  std::vector<Committing> committing_ ABSL_GUARDED_BY(mu_);
  // Memory limit (docs/design.md, "Memory limits"); target_pages_ == T when no
  // limit was set.
  LimitState limit_state_ ABSL_GUARDED_BY(mu_) = LimitState::kNone;
  int64_t target_pages_ ABSL_GUARDED_BY(mu_) = 0;
  Bytes limit_bytes_ ABSL_GUARDED_BY(mu_);
  int64_t limit_revision_ ABSL_GUARDED_BY(mu_) = -1;
  std::string failure_ ABSL_GUARDED_BY(mu_);

  PageLedger ledger_ ABSL_GUARDED_BY(mu_);
  HolderTags tags_ ABSL_GUARDED_BY(mu_);
  // Pages being unmapped that engines may know: registered (with the
  // deadline after which they count as QUARANTINED) by the call that
  // unmaps them, marked `revoked` once engines were asked to let go
  // (REVOKING); from then on no call owns them. Each is in the ledger's
  // in-flight set with its landing and charged to the budget; the unmapping
  // call (pages nobody knew), UnmapRevoked or Shutdown removes it.
  struct Leaving {
    absl::Time deadline;
    bool revoked = false;
  };
  absl::flat_hash_map<PageId, Leaving> revoking_ ABSL_GUARDED_BY(mu_);
  ReservationTable reservations_ ABSL_GUARDED_BY(mu_);
  IdempotencyWindow remembered_ ABSL_GUARDED_BY(mu_);
  // On lines of its own: written by every call, read by none of the
  // lock-free readers.
  alignas(kCacheLine) PoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_PAGE_POOL_H_
