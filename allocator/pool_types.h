// The value types of the pool's API: requests, results, snapshots and
// options. They carry no behaviour; PagePool (page_pool.h) states what each
// call does with them, and docs/design.md explains the states they report.

#ifndef KVBROKER_ALLOCATOR_POOL_TYPES_H_
#define KVBROKER_ALLOCATOR_POOL_TYPES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/device_budget.h"
#include "allocator/page_ledger.h"
#include "allocator/page_listener.h"
#include "allocator/units.h"
#include "common/consecutive_ids.h"

namespace kvbroker {

// State of the memory limit (docs/design.md, "Memory limits").
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
  // Whether available_blocks counts the page: for FREE pages, whether the
  // device budget affords it; false for pages in flight (MAPPING).
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
  // pages_mapping: pages in flight (being mapped or unmapped without the
  // pool lock); counted in mapped_bytes, not in available or allocated.
  PageCount pages_free, pages_mapping, pages_idle, pages_open, pages_full,
      pages_reclaimed, pages_empty;
  // Pages on their way out that engines still map (docs/design.md, "Pages
  // and engines"): waiting for acknowledgements (REVOKING), or past the
  // deadline (QUARANTINED). Neither is available nor counted in
  // pages_mapping; both stay charged to the device budget.
  PageCount pages_revoking, pages_quarantined;
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
  // Who gets the blocks (an engine's holder); empty for callers that cannot
  // read the memory (gRPC). A block that last held another holder's data is
  // zeroed before it is returned (holder_tags.h).
  std::string holder;
  // The blocks as AllocResult::block_runs instead of pages, for a caller
  // that answers with runs (AllocRequest.block_runs on the wire): no list
  // of ids per page is built.
  bool as_runs = false;
};

struct AllocResult {
  std::vector<PageBlocks> pages;  // ascending page id; none with as_runs
  // With as_runs: (first, count) pairs, ascending, adjacent pairs merged.
  BlockRuns block_runs;
  int64_t num_blocks = 0;
  uint64_t generation = 0;
  bool replayed = false;     // a retry answered from the idempotency window
  int64_t pages_mapped = 0;  // pages this call mapped
};

// Every block id of `pages`, in page order.
inline std::vector<BlockId> AllBlockIds(const std::vector<PageBlocks>& pages) {
  size_t n = 0;
  for (const PageBlocks& pb : pages) n += pb.block_ids.size();
  std::vector<BlockId> out;
  out.reserve(n);
  for (const PageBlocks& pb : pages) {
    out.insert(out.end(), pb.block_ids.begin(), pb.block_ids.end());
  }
  return out;
}
// The ids that (first, count) pairs name, in order. REQUIRES: every count
// >= 1 and no run past the largest int64 (FreeRequest::block_runs).
inline std::vector<BlockId> IdsOfRuns(absl::Span<const int64_t> runs) {
  size_t n = 0;
  for (size_t i = 1; i < runs.size(); i += 2) n += static_cast<size_t>(runs[i]);
  std::vector<BlockId> out(n);
  BlockId* at = out.data();
  for (size_t i = 0; i + 1 < runs.size(); i += 2) {
    WriteConsecutive(at, runs[i], runs[i + 1]);
    at += runs[i + 1];
  }
  return out;
}
// Every block id of an Alloc's result, ascending, in either form.
inline std::vector<BlockId> AllBlockIds(const AllocResult& r) {
  if (!r.pages.empty() || r.block_runs.empty()) return AllBlockIds(r.pages);
  return IdsOfRuns(r.block_runs);
}

struct FreeRequest {
  // Viewed, not copied (the RPC layer points it at the request message):
  // must stay valid until Free returns.
  absl::Span<const BlockId> block_ids;
  std::string request_id;
  // Optional, viewed likewise: (first, count) pairs, each with count >= 1
  // and naming no id past the largest int64 (the RPC layer checks that,
  // and bounds the ids they name). With block_ids empty they are the ids
  // the Free names; otherwise their expansion is exactly block_ids. Pairs
  // ascending and apart tell Free that the ids are strictly ascending
  // without a pass over them; a Free of such pairs alone is checked and
  // returned run by run (docs/design.md, "Acquisitions as stretches").
  absl::Span<const int64_t> block_runs;
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
  // Names this incarnation of the pool (pool_uid); reported in every
  // capacity snapshot. Empty: none.
  std::string uid;
  // Called (without any pool lock held) after a call left the pool below
  // min_idle_pages with pages it could map: wake the prealloc worker.
  std::function<void()> on_prealloc_needed;
  // How long engines have to acknowledge a revocation (PageListener) before
  // its pages count as QUARANTINED.
  absl::Duration revoke_timeout = absl::Seconds(10);
  // Pages one revocation names at most (page_listener.h); an unmap of more
  // is revoked in several. Tests set fewer.
  int64_t max_revocation_pages = kMaxRevocationPages;
  // Pages a long locked walk covers between two releases of the pool lock
  // (docs/design.md, "Bounded lock hold"); values below 1 read as 1.
  int64_t step_pages = 1;
  // A Free of at most this many ids is validated in one step whatever
  // pages they span: its walk is no longer than the return of its blocks,
  // which is one step anyway (docs/design.md, "Bounded lock hold"). Tests
  // of the stepping set 0.
  int64_t free_one_step_blocks = 256;
  // For tests: called without the pool lock between two steps of a long
  // locked walk (docs/design.md, "Bounded lock hold"), on the stepping
  // call's thread. It may call into the pool, except to name the blocks of
  // a Free that is stepping (that would wait for itself).
  std::function<void()> between_steps;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_POOL_TYPES_H_
