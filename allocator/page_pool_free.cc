// PagePool: Free, validated in steps of at most PoolOptions::step_pages
// pages when its ids span more and returned in one (docs/design.md,
// "Bounded lock hold"); a Free of runs alone checked and returned run by
// run ("Acquisitions as stretches"); and the waiting rule that keeps two
// Frees of the same ids from both succeeding. Part of the page_pool
// target; the contract is in page_pool.h.

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/page_pool.h"
#include "common/error_keys.h"

namespace kvbroker {

namespace {

// Whether `runs` are (first, count) pairs each starting past the end of
// the one before: their expansion is strictly ascending. Sets `*total` to
// the ids they name. One step per pair.
bool RunsAscending(absl::Span<const int64_t> runs, uint64_t* total) {
  *total = 0;
  if (runs.empty() || runs.size() % 2 != 0) return false;
  int64_t next = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < runs.size(); i += 2) {
    const int64_t first = runs[i], count = runs[i + 1];
    if (count < 1 || first < next ||
        first > std::numeric_limits<int64_t>::max() - (count - 1)) {
      return false;
    }
    *total += static_cast<uint64_t>(count);
    if (first + (count - 1) == std::numeric_limits<int64_t>::max()) {
      return i + 2 == runs.size();
    }
    next = first + count;
  }
  return true;
}

// The ids themselves would make the fingerprint (and every remembered
// Free) as long as the request; a 64-bit hash of them, with the count,
// tells a retry from another request just as well within one process.
std::string FreeFingerprint(absl::Span<const BlockId> ids) {
  return absl::StrCat("free/", ids.size(), "/",
                      absl::Hex(absl::Hash<absl::Span<const BlockId>>{}(ids)));
}

}  // namespace

absl::StatusOr<FreeResult> PagePool::Free(const FreeRequest& request) {
  Epilogue epi;
  absl::StatusOr<FreeResult> result;
  // A Free named by runs alone that are ascending and apart, of at most
  // free_one_step_blocks_ ids and with no request id (the attach session's
  // usual Free) is checked and returned a page's part of a run at a time,
  // and no list of its ids is made. Any other is read as ids.
  std::vector<BlockId> expanded;
  absl::Span<const BlockId> named = request.block_ids;
  absl::Span<const int64_t> runs;
  uint64_t runs_total = 0;
  const bool runs_ascending = RunsAscending(request.block_runs, &runs_total);
  if (request.block_ids.empty() && !request.block_runs.empty()) {
    if (runs_ascending && request.request_id.empty() &&
        runs_total <= std::max(step_pages_, free_one_step_blocks_)) {
      runs = request.block_runs;
    } else {
      expanded = IdsOfRuns(request.block_runs);
      named = expanded;
    }
  }
  // Ordering the ids, finding a repeat and cutting them into steps need no
  // pool state. Ids as Alloc handed them out are already ascending: no copy
  // then. One pass when they are strictly ascending (sorted, no repeat);
  // none when the caller's runs already say so.
  std::vector<BlockId> sorted_copy;
  absl::Span<const BlockId> ascending = named;
  auto dup = runs_ascending && runs_total == ascending.size()
                 ? ascending.end()
                 : std::adjacent_find(ascending.begin(), ascending.end(),
                                      std::greater_equal<BlockId>());
  if (dup != ascending.end()) {
    sorted_copy.assign(ascending.begin(), ascending.end());
    std::sort(sorted_copy.begin(), sorted_copy.end());
    ascending = sorted_copy;
    dup = std::adjacent_find(ascending.begin(), ascending.end());
  }
  const bool repeated = dup != ascending.end();
  const BlockId repeated_id = repeated ? *dup : 0;
  const int64_t max_blocks = geometry_.max_blocks();
  // Step k covers ascending[cuts[k], cuts[k + 1]): ids on at most
  // step_pages_ pages (docs/design.md, "Bounded lock hold"). page_of is
  // monotone, so valid ascending ids whose first and last pages are fewer
  // than step_pages_ apart make one step without a walk; so do few ids,
  // whose check is no longer than their return.
  absl::InlinedVector<size_t, 2> cuts = {0};
  const bool one_step =
      ascending.size() <= std::max(step_pages_, free_one_step_blocks_) ||
      (ascending.front() >= 0 && ascending.back() < max_blocks &&
       geometry_.page_of(ascending.back()) -
               geometry_.page_of(ascending.front()) <
           static_cast<PageId>(step_pages_));
  if (!repeated && !one_step) {
    // A step starts at the first id of a page. Ids that are no blocks
    // (refused below) sort before 0 or from max_blocks on, so the others
    // are one stretch; a page's ids from b on, being distinct, lie within
    // the next (next_page - b) places: a bounded search per page, not a
    // test per id.
    using It = absl::Span<const BlockId>::const_iterator;
    It it = std::lower_bound(ascending.begin(), ascending.end(), BlockId{0});
    const It valid_end = std::lower_bound(it, ascending.end(), max_blocks);
    size_t pages = 0;
    while (it != valid_end) {
      if (++pages > step_pages_) {
        cuts.push_back(static_cast<size_t>(it - ascending.begin()));
        pages = 1;
      }
      const BlockId next_page =
          geometry_.range(geometry_.page_of(*it) + 1).begin;
      const It bound =
          it + std::min<ptrdiff_t>(next_page - *it, valid_end - it);
      it = std::lower_bound(it + 1, bound, next_page);
    }
  }
  cuts.push_back(ascending.size());
  const size_t steps = cuts.size() - 1;
  auto step_ids = [&](size_t k) {
    return ascending.subspan(cuts[k], cuts[k + 1] - cuts[k]);
  };
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    result =
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<FreeResult> {
      if (shut_down_) return CheckUsableLocked(Counted::kYes);
      const std::string& id = request.request_id;
      const std::string fingerprint = id.empty() ? "" : FreeFingerprint(named);
      ExpireLocked(&epi.log);
      AwaitNotPendingLocked(id);
      if (std::optional<absl::StatusOr<FreeResult>> replay =
              ReplayLocked<FreeResult>(id, fingerprint)) {
        return *std::move(replay);
      }
      if (repeated) {
        return RefuseLocked(
            Counted::kYes, FailureReason::kInvalidArgument,
            absl::StrCat("block ", repeated_id, " is named more than once"),
            {{std::string(error_key::kField), "block_ids"},
             {std::string(error_key::kBlockId), Num(repeated_id)}},
            {{"block_ids", absl::StrCat("block ", repeated_id,
                                        " is named more than once")}});
      }
      // Validate everything before changing anything. A Free of one step
      // checks its ids in one pass; a longer one marks them step by step.
      // Either way an id another Free is freeing is waited for (the
      // waiting rule), after dropping this call's marks, and the walk starts
      // again.
      const bool stepped = steps > 1;
      if (stepped) {
        ++calls_in_flight_;
        if (!id.empty()) remembered_.MarkPending(id);
      }
      auto done_stepping = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (!stepped) return;
        if (!id.empty()) remembered_.ClearPending(id);
        --calls_in_flight_;
      };
      for (;;) {
        size_t marked = 0;
        BlockId busy = -1;
        bool valid = true;
        for (size_t k = 0; k < steps && valid && busy < 0; ++k) {
          if (k > 0) StepLocked();
          const FreeCheck check = runs.empty() ? CheckStepLocked(step_ids(k))
                                               : CheckRunsLocked(runs);
          valid = check.valid;
          busy = check.busy;
          // A step's ids are marked together once all of them passed
          // (the ids are distinct, so none can meet its own mark).
          if (stepped && valid && busy < 0) {
            MarkFreeingLocked(step_ids(k), true);
            marked = cuts[k + 1];
          }
        }
        if (busy >= 0 || !valid) {
          MarkFreeingLocked(ascending.subspan(0, marked), false);
        }
        if (busy >= 0) {
          AwaitNotFreeingLocked(busy);
          continue;
        }
        if (!valid) {
          // The refusal names ids.
          if (!runs.empty() && expanded.empty()) expanded = IdsOfRuns(runs);
          absl::Status refusal =
              CheckFreeLocked(runs.empty() ? named : expanded);
          if (refusal.ok()) continue;  // changed meanwhile: walk again
          done_stepping();
          return refusal;
        }
        break;  // a stepped Free has marked every id
      }
      FreeResult out;
      std::vector<Unmap> unmaps;
      // The blocks go back in one step of their own: returned in several,
      // a Capacity between two would see the Free half done
      // (docs/design.md, "Bounded lock hold").
      if (stepped) {
        StepLocked();
        MarkFreeingLocked(ascending, false);
      }
      if (runs.empty()) {
        ReturnBlocksLocked(ascending, &unmaps);
        out.freed_blocks = static_cast<int64_t>(ascending.size());
      } else {
        ReturnRunsLocked(runs, &unmaps);
        out.freed_blocks = static_cast<int64_t>(runs_total);
      }
      if (out.freed_blocks > 0) BumpGenerationLocked();
      stats_.blocks_freed_total += out.freed_blocks;
      if (!unmaps.empty()) {
        if (!id.empty() && !stepped) remembered_.MarkPending(id);
        out.pages_unmapped = CompleteUnmapsLocked(&unmaps, &epi.log);
        if (!id.empty() && !stepped) remembered_.ClearPending(id);
      }
      done_stepping();
      out.generation = generation_;
      if (!id.empty()) RememberLocked(id, fingerprint, out);
      return out;
    }();
    ++stats_.free_calls;
    if (result.ok()) ++stats_.outcomes[0];
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
  return result;
}

PagePool::FreeCheck PagePool::CheckStepLocked(
    absl::Span<const BlockId> ascending) const {
  FreeCheck check;
  const int64_t max_blocks = geometry_.max_blocks();
  // Ids below next_page are on page p: one division per page.
  PageId p = -1;
  BlockId next_page = 0;
  for (size_t i = 0; i < ascending.size();) {
    const BlockId b = ascending[i];
    if (b < 0 || b >= max_blocks) {
      check.valid = false;
      return check;
    }
    if (p < 0 || b >= next_page) {
      p = geometry_.page_of(b);
      next_page = geometry_.range(p + 1).begin;
      // The ids name the rest of p's usable blocks (what an Alloc handed
      // out): the page is checked at once.
      const PageLedger::Page& page = ledger_.page(p);
      const size_t run = b >= page.begin && b < page.end
                             ? static_cast<size_t>(page.end - b)
                             : 0;
      if (run > 1 && i + run <= ascending.size() &&
          ascending[i + run - 1] == page.end - 1) {
        if ((!committing_.empty() && UnshownLocked(p)) ||
            !ledger_.AllAllocated(p, b, page.end)) {
          check.valid = false;
          return check;
        }
        if (freeing_blocks_ > 0) {
          check.busy = FirstFreeingLocked(b, page.end);
          if (check.busy >= 0) return check;
        }
        i += run;
        continue;
      }
    }
    if (ShownOwnerLocked(b) != BlockOwner::kAllocated) {
      check.valid = false;
      return check;
    }
    if (freeing_blocks_ > 0 && FreeingLocked(b)) {
      check.busy = b;
      return check;
    }
    ++i;
  }
  return check;
}

PagePool::FreeCheck PagePool::CheckRunsLocked(
    absl::Span<const int64_t> runs) const {
  FreeCheck check;
  const int64_t max_blocks = geometry_.max_blocks();
  for (size_t i = 0; i + 1 < runs.size(); i += 2) {
    const BlockId first = runs[i], end = runs[i] + runs[i + 1];
    if (first < 0 || end > max_blocks) {
      check.valid = false;
      return check;
    }
    for (BlockId b = first; b < end;) {
      const PageId p = geometry_.page_of(b);
      const PageLedger::Page& page = ledger_.page(p);
      // A block off its page's usable range (one that straddles two pages)
      // is no block anyone holds.
      if (b < page.begin || b >= page.end) {
        check.valid = false;
        return check;
      }
      const BlockId e = std::min(end, page.end);
      if ((!committing_.empty() && UnshownLocked(p)) ||
          !ledger_.AllAllocated(p, b, e)) {
        check.valid = false;
        return check;
      }
      if (freeing_blocks_ > 0) {
        check.busy = FirstFreeingLocked(b, e);
        if (check.busy >= 0) return check;
      }
      b = e;
    }
  }
  return check;
}

BlockId PagePool::FirstFreeingLocked(BlockId first, BlockId end) const {
  for (int64_t word = first >> 6; (word << 6) < end; ++word) {
    const uint64_t bits = freeing_[word] & WordMask(word, first, end);
    if (bits != 0) return (word << 6) + __builtin_ctzll(bits);
  }
  return -1;
}

BlockOwner PagePool::ShownOwnerLocked(BlockId b) const {
  if (!committing_.empty() && UnshownLocked(geometry_.page_of(b))) {
    return BlockOwner::kNone;  // shown as MAPPING still
  }
  return ledger_.owner(b);
}

void PagePool::MarkFreeingLocked(absl::Span<const BlockId> ids, bool on) {
  for (size_t i = 0; i < ids.size();) {
    const BlockId b = ids[i];
    // The ids are strictly ascending: when the one n places on is b + n,
    // every id between is named, so the n ids up to the end of b's word
    // (or of the span) take one mask.
    const size_t n =
        std::min(static_cast<size_t>(64 - (b & 63)), ids.size() - i);
    uint64_t mask = uint64_t{1} << (b & 63);
    size_t next = i + 1;
    if (n > 1 && ids[i + n - 1] == b + static_cast<BlockId>(n) - 1) {
      mask = (n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1) << (b & 63);
      next = i + n;
    }
    if (on) {
      freeing_[b >> 6] |= mask;
    } else {
      freeing_[b >> 6] &= ~mask;
    }
    i = next;
  }
  freeing_blocks_ += (on ? 1 : -1) * static_cast<int64_t>(ids.size());
}

void PagePool::AwaitNotFreeingLocked(BlockId b) {
  struct Args {
    const std::vector<uint64_t>* bits;
    BlockId b;
  };
  // Evaluated with mu_ held (Await's conditions are).
  Args args{&freeing_, b};
  PublishLocked();
  mu_.Await(absl::Condition(
      +[](Args* a) {
        return (((*a->bits)[a->b >> 6] >> (a->b & 63)) & 1) == 0;
      },
      &args));
}

absl::Status PagePool::CheckFreeLocked(absl::Span<const BlockId> ids) {
  std::vector<BlockId> not_allocated, in_reservation;
  for (BlockId b : ids) {
    const BlockOwner o = b < 0 || b >= geometry_.max_blocks()
                             ? BlockOwner::kNone
                             : ShownOwnerLocked(b);
    if (o != BlockOwner::kAllocated && o != BlockOwner::kReserved) {
      not_allocated.push_back(b);
    } else if (o == BlockOwner::kReserved) {
      in_reservation.push_back(b);
    }
  }
  auto first_ids = [](const std::vector<BlockId>& v) {
    std::vector<BlockId> head(v.begin(),
                              v.begin() + std::min<size_t>(v.size(), 16));
    return absl::StrJoin(head, ",");
  };
  if (!not_allocated.empty()) {
    return RefuseLocked(
        Counted::kYes, FailureReason::kBlockNotAllocated,
        absl::StrCat(not_allocated.size(), " of ", ids.size(),
                     " blocks are not allocated (first: ",
                     not_allocated.front(), "); nothing was freed"),
        {{std::string(error_key::kPool), name()},
         {std::string(error_key::kBlockId), Num(not_allocated.front())},
         {std::string(error_key::kBlockIds), first_ids(not_allocated)},
         {std::string(error_key::kNotAllocatedBlocks),
          Num(not_allocated.size())},
         {std::string(error_key::kRequestedBlocks), Num(ids.size())}});
  }
  if (!in_reservation.empty()) {
    return RefuseLocked(
        Counted::kYes, FailureReason::kBlockInReservation,
        absl::StrCat(in_reservation.size(),
                     " blocks are held by a reservation (first: ",
                     in_reservation.front(),
                     "); release the reservation instead; nothing was "
                     "freed"),
        {{std::string(error_key::kPool), name()},
         {std::string(error_key::kBlockId), Num(in_reservation.front())},
         {std::string(error_key::kBlockIds), first_ids(in_reservation)},
         {std::string(error_key::kReservedBlocksNamed),
          Num(in_reservation.size())}});
  }
  return absl::OkStatus();
}

}  // namespace kvbroker
