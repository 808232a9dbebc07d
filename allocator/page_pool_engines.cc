// PagePool: what the pool does for engines (docs/design.md, "Pages and
// engines"): page listeners and revocations, and zeroing blocks that pass
// from one holder to another. The contract is in page_pool.h.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "allocator/page_pool.h"
#include "common/error_keys.h"

namespace kvbroker {

// ---------------------------------------------------------------------------
// Zeroing blocks that pass from one holder to another

absl::Status PagePool::ZeroForHolderLocked(const std::string& holder,
                                           Acquisition* acq,
                                           const std::string& request_id,
                                           std::vector<Unmap>* unmaps,
                                           std::string* log) {
  std::vector<BlockId> to_zero;
  tags_.Hand(acq->blocks, tags_.Intern(holder), &to_zero);
  if (to_zero.empty()) return absl::OkStatus();
  std::sort(to_zero.begin(), to_zero.end());
  const int64_t n = static_cast<int64_t>(to_zero.size());
  // Held as reserved while they are zeroed, so that no Free takes them,
  // but shown allocated: Capacity sees the Alloc done, as it is unless the
  // zeroing fails (and then the pool has a device fault to report).
  ledger_.Reassign(to_zero, BlockOwner::kReserved);
  reserving_in_flight_ += n;
  unshown_.reserved += n;
  unshown_.allocated -= n;
  if (!request_id.empty()) remembered_.MarkPending(request_id);
  ++calls_in_flight_;
  absl::Status zeroed;
  WithoutLock([&] { zeroed = ZeroBlocks(to_zero); });
  --calls_in_flight_;
  if (!request_id.empty()) remembered_.ClearPending(request_id);
  unshown_.reserved -= n;
  unshown_.allocated += n;
  reserving_in_flight_ -= n;
  ledger_.Reassign(to_zero, BlockOwner::kAllocated);
  if (zeroed.ok()) {
    stats_.blocks_zeroed_total += n;
    return absl::OkStatus();
  }
  // Nothing of this call reaches the holder: a redeemed reservation gets
  // its blocks back, the others go back to the pool, and those that kept
  // old data are zeroed for whoever gets them next.
  tags_.Taint(to_zero);
  ReturnBlocksLocked(acq->FromPagesAscending(), unmaps);
  GiveBackToReservationLocked(acq, unmaps);
  acq->blocks.clear();
  if (zeroed.code() == absl::StatusCode::kInternal) {
    MarkFailedLocked(absl::StrCat("zeroing failed: ", zeroed.message()),
                     /*device_lost=*/true, log);
  }
  return MakeFailure(FailureReason::kMappingFailed,
                     absl::StrCat("blocks of pool ", name(),
                                  " could not be zeroed for holder ", holder,
                                  ": ", zeroed.message()),
                     {{std::string(error_key::kPool), name()}});
}

absl::Status PagePool::ZeroBlocks(absl::Span<const BlockId> ascending) const {
  const int64_t stride = geometry_.block_stride().value();
  for (size_t first = 0; first < ascending.size();) {
    size_t end = first + 1;
    while (end < ascending.size() && ascending[end] == ascending[end - 1] + 1) {
      ++end;
    }
    const Bytes bytes(static_cast<int64_t>(end - first) * stride);
    for (int i = 0; i < geometry_.device_count(); ++i) {
      const uint64_t address =
          mapper_.range_base(i) + ascending[first] * stride;
      KVB_RETURN_IF_ERROR(
          backend_->Zero(geometry_.devices()[i], address, bytes));
    }
    first = end;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Revoked pages, once every engine let go

void PagePool::UnmapRevoked(const std::vector<PageId>& pages) {
  if (pages.empty()) return;
  Epilogue epi;
  {
    SpinThenLockGuard lock(&mu_);
    if (shut_down_) {
      bool let_go = false;
      for (PageId p : pages) {
        if (p < static_cast<PageId>(engines_hold_.size()) && engines_hold_[p]) {
          engines_hold_[p] = false;
          let_go = true;
        }
      }
      if (let_go) ReleaseLeftoversLocked();
      return;
    }
    epi.before = generation_;
    std::vector<Unmap> unmaps;
    for (PageId p : pages) {
      // Shutdown may have unmapped it already.
      if (revoking_.erase(p) > 0) unmaps.push_back({p});
    }
    if (!unmaps.empty()) {
      ++calls_in_flight_;
      WithoutLock([&] {
        for (Unmap& u : unmaps) u.status = mapper_.Unmap(u.page, &u.took);
      });
      LandUnmapsLocked(&unmaps, &epi.log);
      --calls_in_flight_;
      SettleLimitLocked();
      // A limit raised while they were leaving may have room for them.
      if (limit_state_ == LimitState::kApplied) AdmitReclaimedLocked();
    }
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
}

// ---------------------------------------------------------------------------
// Engines

absl::Status PagePool::AddPageListener(
    PageListener* listener,
    absl::FunctionRef<void(absl::Span<const MappedPage>)> snapshot) {
  return announcer_.AddListener(listener, snapshot);
}

void PagePool::RemovePageListener(PageListener* listener) {
  UnmapRevoked(announcer_.RemoveListener(listener));
}

absl::Status PagePool::AckRevocation(PageListener* listener, uint64_t id) {
  absl::StatusOr<std::vector<PageId>> done = announcer_.Ack(listener, id);
  if (!done.ok()) return done.status();
  UnmapRevoked(*done);
  return absl::OkStatus();
}

}  // namespace kvbroker
