// ReferenceModel: a brute-force executable model of one KV pool, written from
// docs/design.md and the documented choices of page_pool.h, for
// property tests. It shares no code with page_pool.cc.
//
// The model keeps explicit per-page and per-block state in plain vectors and
// recomputes every derived quantity (capacity, page counts, free blocks of a
// page) by walking everything: O(T + N) per query. It is deliberately slow
// and obvious; a disagreement with PagePool is either a bug in the pool or a
// place where the documents are ambiguous.
//
// What it models:
//   - geometry ("Geometry"): range(p) = [ceil(p*P/B), min(floor((p+1)*P/B),
//   N));
//   - page states FREE / IDLE / OPEN / FULL / RECLAIMED / EMPTY;
//   - the consumption order ("Consumption order", page_pool.h): OPEN best fit
//   (the page
//     with the fewest free blocks that still covers the remaining need, else
//     the one with the most free blocks; ties: lowest page id), then IDLE
//     front first, then FREE front first while every device can afford one
//     more bundle; blocks of a page ascending;
//   - Free: a page whose blocks are all free becomes IDLE (back of the IDLE
//     list) while fewer than max_idle_pages pages are IDLE, else it is
//     unmapped to the back of the FREE list;
//   - reservations (Reserve, Alloc from a reservation, ReleaseReservation);
//   - SetMemoryLimit ("Memory limits", page_pool.h): admitted = mapped + |FREE|
//   <=
//     target; lowering moves FREE pages from the back to RECLAIMED, then
//     unmaps IDLE pages from the back to RECLAIMED; DEFERRED while still over
//     the target; a page emptied while over the target is unmapped to
//     RECLAIMED; at or below the target the limit is APPLIED and RECLAIMED
//     ids come back to the front of the FREE list, in their order, until the
//     pool admits `target` pages again;
//   - Trim (IDLE front first -> back of the FREE list);
//   - PreallocStep (one FREE page from the front -> back of IDLE, when fewer
//     than min_idle_pages are IDLE and a bundle is affordable);
//   - a device budget of a fixed number of bundles per device, shared by
//     nothing else: affordable = max(0, budget_bundles - mapped pages);
//   - revocation (docs/design.md, "Pages and engines"): while a listener
//     (an engine's session) is attached, a page that would be unmapped
//     becomes REVOKING instead: unmapped, off every list, still counted as
//     mapped by the budget but not admitted; the pages one operation sends
//     away form one revocation. When it is acknowledged (oldest first) or
//     the listener leaves (all of them, oldest first), its pages land where
//     they were headed, in order, and the limit is settled;
//   - mapping in flight (docs/design.md, "The mapping transaction"): an
//     Alloc or Reserve that must map takes every block of the mapped pages
//     and the FREE pages it needs at once (BeginAcquire); those pages are
//     MAPPING, neither available nor allocated, and count as mapped for the
//     budget and the limit. CommitAcquire finishes the call as Alloc would
//     have; AbortAcquire puts everything back where it was.
//
// Orders that the documents leave open are isolated in ModelPolicy so that
// a test can name the choice it makes.
//
// Thread safety: none. For tests only.

#ifndef KVBROKER_ALLOCATOR_TESTING_REFERENCE_MODEL_H_
#define KVBROKER_ALLOCATOR_TESTING_REFERENCE_MODEL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "allocator/failure.h"

namespace kvbroker {
namespace reference {

struct ModelConfig {
  int64_t page_size = 0;       // P, bytes
  int64_t block_bytes = 0;     // B, bytes
  int64_t max_blocks = 0;      // N
  int64_t num_layers = 1;      // L
  int64_t num_kv_buffers = 1;  // K
  int64_t devices = 1;         // number of devices of the pool
  bool reserve_null_block = false;
  int64_t min_idle_pages = 0;
  int64_t max_idle_pages = 0;
  // Bundles each device can afford while the pool maps nothing.
  int64_t budget_bundles = 0;
};

// Choices the documents leave open ("RECLAIMED ids come back ... in their
// order" does not say what the RECLAIMED list's order is). The defaults are
// the pool's choice: pages reclaimed by lowering the limit go to the front of
// the RECLAIMED list (so the FREE list's order is kept: lowering and raising
// again restores it), pages emptied while over the limit go to its back, and
// ids come back from its front.
struct ModelPolicy {
  // Where a FREE or IDLE page reclaimed by SetMemoryLimit goes.
  bool lowering_reclaims_to_front = true;
  // Where a page emptied while over the limit goes.
  bool emptied_reclaims_to_front = false;
  // Whether RECLAIMED ids come back from the front of the RECLAIMED list
  // (else from its back). Either way the ids that come back keep their
  // relative order at the front of the FREE list.
  bool readmit_from_front = true;
};

enum class MPage : uint8_t {
  kFree,
  kIdle,
  kOpen,
  kFull,
  kReclaimed,
  kEmpty,
  kMapping,   // in flight: being mapped for one call
  kRevoking,  // leaving, waiting for a listener (REVOKING or QUARANTINED)
};
const char* MPageName(MPage s);

enum class MBlock : uint8_t {
  kUnusable,  // straddles a page boundary or lies on an EMPTY page
  kUnmapped,  // usable, its page is not mapped
  kFree,      // usable, on a mapped page, owned by nobody
  kAllocated,
  kReserved,
  kNull,
};

enum class MLimitState { kNone, kApplied, kDeferred };
enum class MLimitOutcome { kApplied, kDeferred, kStale, kConflict };

struct MOutcome {
  // kUnspecified means success.
  FailureReason reason = FailureReason::kUnspecified;
  bool ok() const { return reason == FailureReason::kUnspecified; }
  std::vector<int64_t> ids;  // ascending
  int64_t pages_mapped = 0;
  int64_t pages_unmapped = 0;
};

// What an Alloc or Reserve holds while its pages are in flight.
struct MInFlight {
  MBlock owner = MBlock::kAllocated;
  std::vector<int64_t> taken;      // blocks of mapped pages, taken already
  std::vector<int64_t> from_idle;  // IDLE pages drawn from, in list order
  std::vector<int64_t> pages;      // in flight, FREE-list order
  int64_t fresh_need = 0;          // blocks still to take from `pages`
};

struct MLimitResult {
  bool ok = true;  // false: INVALID_ARGUMENT
  MLimitOutcome outcome = MLimitOutcome::kApplied;
  MLimitState state = MLimitState::kNone;
  int64_t target_pages = 0;
  int64_t revision = -1;
  int64_t pages_unmapped = 0;
};

class ReferenceModel {
 public:
  // REQUIRES: a valid geometry (0 < B <= P, N > 0) and, with
  // reserve_null_block, budget_bundles >= 1.
  explicit ReferenceModel(const ModelConfig& config, ModelPolicy policy = {});

  // ---- geometry ----
  int64_t page_count() const { return T_; }
  int64_t range_begin(int64_t p) const;
  int64_t range_end(int64_t p) const;
  int64_t usable(int64_t p) const;
  int64_t page_of(int64_t b) const;
  bool is_usable_block(int64_t b) const;
  int64_t bundle_bytes() const;  // P * L * K

  // ---- state, recomputed by walking ----
  MPage page_state(int64_t p) const { return page_[p]; }
  MBlock block_state(int64_t b) const { return block_[b]; }
  int64_t free_blocks(int64_t p) const;   // kFree blocks of page p
  int64_t allocated_on(int64_t p) const;  // kAllocated + kNull
  int64_t reserved_on(int64_t p) const;
  int64_t PagesIn(MPage s) const;
  int64_t MappedPages() const;
  // Pages leaving for RECLAIMED (REVOKING) are no longer admitted; pages
  // leaving for FREE still are.
  int64_t Admitted() const {
    return MappedPages() - RevokingToReclaimed() + PagesIn(MPage::kFree);
  }
  int64_t RevokingToReclaimed() const;
  int64_t Affordable() const;
  int64_t AvailableBlocks() const;
  int64_t AllocatedBlocks() const;  // excludes the null block
  int64_t ReservedBlocks() const;
  std::vector<int64_t> AllocatedIds() const;  // ascending, no null block
  const std::deque<int64_t>& free_list() const { return free_list_; }
  const std::deque<int64_t>& idle_list() const { return idle_list_; }
  const std::deque<int64_t>& reclaimed_list() const { return reclaimed_; }
  const std::map<std::string, std::vector<int64_t>>& reservations() const {
    return reservations_;
  }
  MLimitState limit_state() const { return limit_state_; }
  int64_t target_pages() const { return target_; }
  int64_t limit_revision() const { return revision_; }
  int64_t limit_bytes() const { return limit_bytes_; }

  // Best guess of the reason a request for `need` blocks beyond the
  // reservation would be refused with (for messages; tests accept any
  // capacity reason).
  FailureReason ExpectedRefusal(int64_t need) const;

  // ---- operations; a failed one changes nothing ----
  MOutcome Alloc(int64_t n);
  MOutcome AllocFromReservation(const std::string& id, int64_t n);
  // `id` is the id the system under test assigned.
  MOutcome Reserve(int64_t n, const std::string& id);
  // Blocks freed in ascending id order.
  MOutcome Free(const std::vector<int64_t>& ids);
  MOutcome Release(const std::string& id);
  // Forgets an emptied reservation (how the pool treats one is not
  // documented). REQUIRES: it holds no block.
  void DropReservation(const std::string& id);
  MLimitResult SetMemoryLimit(int64_t limit_bytes, int64_t revision);

  // ---- mapping in flight ----
  // Whether Alloc(n) (or Reserve(n)) would map: n is more than the mapped
  // pages offer and no more than is available.
  bool WouldMap(int64_t n) const;
  // The first half of an Alloc or Reserve of n blocks that maps.
  // REQUIRES: WouldMap(n).
  MInFlight BeginAcquire(int64_t n, MBlock owner);
  // The mapping succeeded: the blocks of the call, ascending, as Alloc or
  // Reserve(n, id) would have returned them (a reservation is recorded
  // under `id`).
  MOutcome CommitAcquire(const MInFlight& f, const std::string& id = "");
  // The mapping failed: back to the state before BeginAcquire.
  void AbortAcquire(const MInFlight& f);
  int64_t Trim(int64_t max_pages);
  bool PreallocStep();
  // For checkers of concurrent histories, whose unmaps land in the order
  // they finish: moves FREE page p to the back of the FREE list (no-op for
  // a page in another state).
  void RequeueFreeAtBack(int64_t p);

  // ---- revocation ----
  // A listener attaches (true) or leaves (false: every revocation lands).
  void SetListening(bool on);
  // The oldest revocation is acknowledged; false when none is pending.
  bool AckOldestRevocation();
  int64_t pending_revocations() const {
    return static_cast<int64_t>(revocations_.size());
  }

  // Checks the model's own bookkeeping; "" when consistent.
  std::string SelfCheck() const;
  std::string DebugString() const;

 private:
  // Takes `need` blocks in consumption order (REQUIRES need <= available).
  void TakeLocked(int64_t need, MBlock owner, std::vector<int64_t>* out,
                  int64_t* pages_mapped);
  int64_t TakeFromPage(int64_t p, int64_t k, MBlock owner,
                       std::vector<int64_t>* out);
  void MapPage(int64_t p);    // FREE (already off its list) -> all free
  void UnmapPage(int64_t p);  // REQUIRES all blocks free
  void SetMappedStateByCounts(int64_t p);
  // A page whose last block was returned.
  void OnPageEmptied(int64_t p, int64_t* unmapped);
  void ReturnBlocks(const std::vector<int64_t>& ascending, int64_t* unmapped);
  void Settle();
  void AdmitReclaimed();
  void Reclaim(int64_t p, bool to_front);
  // Where a page that leaves goes.
  enum class Landing { kFreeBack, kReclaimedFront, kReclaimedBack };
  // Unmaps page p toward `to`: at once (counted in *unmapped), or, while a
  // listener is attached, REVOKING in the current operation's revocation.
  void Leave(int64_t p, Landing to, int64_t* unmapped);
  void Land(int64_t p, Landing to);
  // Ends the current operation's revocation (if it sent pages away).
  void CloseRevocation();
  void LandRevocation(const std::vector<std::pair<int64_t, Landing>>& r);

  const ModelConfig config_;
  const ModelPolicy policy_;
  int64_t T_ = 0;

  std::vector<MPage> page_;
  std::vector<MBlock> block_;
  std::deque<int64_t> free_list_;
  std::deque<int64_t> idle_list_;
  std::deque<int64_t> reclaimed_;
  std::map<std::string, std::vector<int64_t>> reservations_;

  MLimitState limit_state_ = MLimitState::kNone;
  int64_t revision_ = -1;
  int64_t limit_bytes_ = 0;
  int64_t target_ = 0;
  // Blocks a Reserve in flight holds (no reservation yet).
  int64_t reserving_ = 0;
  bool listening_ = false;
  std::vector<std::pair<int64_t, Landing>> revoking_now_;
  std::deque<std::vector<std::pair<int64_t, Landing>>> revocations_;
};

}  // namespace reference
}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_TESTING_REFERENCE_MODEL_H_
