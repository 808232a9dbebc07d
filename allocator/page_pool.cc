// PagePool: the mapping transaction, returning blocks and unmapping, mapping
// failures, the entry points and health. Free is in page_pool_free.cc;
// construction, shutdown and the prealloc worker are in
// page_pool_lifecycle.cc; capacity, planning and
// limits in page_pool_capacity.cc; listeners, revocation and zeroing in
// page_pool_engines.cc. The contract and the invariants are in page_pool.h;
// the design in docs/design.md.

#include "allocator/page_pool.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/consecutive_ids.h"
#include "common/error_keys.h"

namespace kvbroker {

// ---------------------------------------------------------------------------
// The one place the lock is dropped mid-call.

void PagePool::WithoutLock(absl::FunctionRef<void()> work)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  mu_.AssertHeld();
  PublishLocked();
  mu_.Unlock();
  work();
  mu_.Lock();
}

bool PagePool::StepDueLocked() const {
  return options_.between_steps != nullptr || mu_.HasWaiters();
}

void PagePool::StepLocked() {
  // With nobody waiting, releasing the lock would let no call in; the
  // publication then waits for the call's own release, so that readers of
  // the published counters keep seeing the state before the call.
  if (!StepDueLocked()) return;
  if (options_.between_steps) {
    WithoutLock([this] { options_.between_steps(); });
    return;
  }
  PublishLocked();
  mu_.Yield();  // a call waiting for the lock goes first
}

// ---------------------------------------------------------------------------
// Acquisition: take under the lock, map without it, commit or roll back.

PagePool::Acquisition PagePool::BeginAcquireLocked(const Plan& plan,
                                                   BlockOwner owner,
                                                   Reservation* reservation) {
  Acquisition acq;
  acq.owner = owner;
  if (plan.from_reservation > 0) {
    acq.reservation_id = reservation->id;
    acq.from_reservation =
        ReservationTable::TakeFront(*reservation, plan.from_reservation);
    ledger_.Reassign(acq.from_reservation, BlockOwner::kAllocated);
    acq.blocks.AppendIds(acq.from_reservation);
  }
  if (plan.new_pages == 0) {
    ledger_.TakeMapped(BlockCount(plan.from_pool), owner, &acq.blocks,
                       &acq.from_idle);
    return acq;
  }
  // Mapping is needed only when the mapped pages cannot cover the rest, so
  // this call takes every block they offer, then the fresh pages' blocks.
  const BlockCount supply = ledger_.mapped_supply();
  ledger_.TakeMapped(supply, owner, &acq.blocks, &acq.from_idle);
  if (owner == BlockOwner::kReserved) reserving_in_flight_ += supply.value();
  acq.fresh_need = plan.from_pool - supply.value();
  acq.fresh = ledger_.BeginMapFront(PageCount(plan.new_pages));
  return acq;
}

absl::Status PagePool::MapFreshLocked(Acquisition* acq, int64_t requested,
                                      const std::string& request_id,
                                      std::vector<Unmap>* unmaps,
                                      std::string* log) {
  if (acq->fresh.empty()) return absl::OkStatus();
  // The lock is dropped while the pages map: a retry of this request waits
  // for the outcome (AwaitNotPendingLocked) instead of running twice.
  if (!request_id.empty()) remembered_.MarkPending(request_id);
  absl::Status s = FinishAcquireLocked(acq, requested, unmaps, log);
  if (!request_id.empty()) remembered_.ClearPending(request_id);
  return s;
}

absl::Status PagePool::FinishAcquireLocked(Acquisition* acq, int64_t requested,
                                           std::vector<Unmap>* unmaps,
                                           std::string* log) {
  const std::vector<PageId>& fresh = acq->fresh;
  std::vector<BundleMapper::MapOutcome> outcomes;
  size_t failed_at = fresh.size();
  bool unwound = true;
  int64_t stranded = 0;
  ++calls_in_flight_;
  WithoutLock([&] {
    outcomes.reserve(fresh.size());
    for (size_t i = 0; i < fresh.size(); ++i) {
      outcomes.push_back(mapper_.Map(fresh[i]));
      if (outcomes.back().status.ok()) continue;
      failed_at = i;
      // Roll back this call's earlier pages, newest first. Pages that still
      // hold a handle afterwards stay charged (stranded).
      for (size_t j = i; j-- > 0;) {
        absl::Duration took;
        if (!mapper_.Unmap(fresh[j], &took).ok()) unwound = false;
      }
      for (size_t j = 0; j <= i; ++j) stranded += mapper_.holds(fresh[j]);
      budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(),
                         static_cast<int64_t>(fresh.size()) - stranded);
      // Every mapping failure refreshes the driver's view (after the
      // uncharge, so that the refresh does not count this call's pages).
      (void)budgets_->RefreshAll();
      break;
    }
    // Every page mapped: engines hear of them before any block is handed
    // out (nothing can roll them back from here).
    if (failed_at == fresh.size()) announcer_.Announce(fresh);
  });
  for (const BundleMapper::MapOutcome& m : outcomes) {
    if (m.status.ok()) stats_.map_latency.Record(m.took);
  }
  const int64_t held_mapped =
      acq->blocks.blocks() - static_cast<int64_t>(acq->from_reservation.size());

  if (failed_at == fresh.size()) {
    // Committed step_pages_ pages at a time; the pages not yet committed stay
    // in flight, and a Reserve's committed blocks count as held by the
    // Reserve in flight until its reservation exists. Capacity is not shown
    // the steps done (unshown_) until the last one, in which the commit
    // takes effect: no step before it leaves a block on a committed page
    // free (each such page gives all its blocks), so no other call can see
    // or take what the earlier steps committed.
    int64_t need = acq->fresh_need;
    CommitCounts step_start, unshown;
    if (fresh.size() > step_pages_) {
      committing_.push_back({&fresh, 0});
      step_start = CommitCountsLocked();
    }
    for (size_t i = 0; i < fresh.size(); ++i) {
      // The bookkeeping of a step is done only where the lock is released
      // (the counts since the last release are hidden together).
      if (i > 0 && i % step_pages_ == 0 && StepDueLocked()) {
        CommitCounts step = CommitCountsLocked();
        step -= step_start;
        unshown += step;
        unshown_ += step;
        for (Committing& c : committing_) {
          if (c.fresh == &fresh) c.committed = i;
        }
        StepLocked();
        step_start = CommitCountsLocked();
      }
      const int64_t taken =
          ledger_
              .CommitMap(fresh[i], BlockCount(need), acq->owner, &acq->blocks)
              .value();
      need -= taken;
      if (acq->owner == BlockOwner::kReserved) reserving_in_flight_ += taken;
      ++stats_.pages_mapped_total;
    }
    if (fresh.size() > step_pages_) {
      unshown_ -= unshown;
      committing_.erase(std::find_if(
          committing_.begin(), committing_.end(),
          [&fresh](const Committing& c) { return c.fresh == &fresh; }));
    }
    --calls_in_flight_;
    if (acq->owner == BlockOwner::kReserved) {
      reserving_in_flight_ -= held_mapped + acq->fresh_need - need;
    }
    stats_.peak_mapped_pages =
        std::max(stats_.peak_mapped_pages, ledger_.mapped_pages().value());
    if (need != 0) {
      // PlanLocked guaranteed the supply; reaching here is a bug.
      MarkFailedLocked(absl::StrCat("internal error: acquisition short by ",
                                    need, " blocks"),
                       /*device_lost=*/false, log);
      return absl::InternalError("acquisition short of its plan");
    }
    return absl::OkStatus();
  }

  // Roll back to the state before the call (the budget was uncharged
  // already): the fresh pages to the front of the FREE list, the mapped
  // pages' blocks and the reservation's blocks back.
  --calls_in_flight_;
  if (acq->owner == BlockOwner::kReserved) reserving_in_flight_ -= held_mapped;
  BundleMapper::MapOutcome m = outcomes[failed_at];
  if (!unwound) m.unwound = false;
  stranded_pages_ += stranded;
  ledger_.AbortMap(fresh);
  for (PageId p :
       ledger_.UntakeMapped(acq->FromPagesAscending(), acq->from_idle)) {
    FileEmptiedLocked(p, unmaps);  // emptied by other calls meanwhile
  }
  GiveBackToReservationLocked(acq, unmaps);
  acq->blocks.clear();
  return MappingErrorLocked(m, requested, log, Counted::kYes);
}

std::vector<BlockId> PagePool::Acquisition::FromPagesAscending() const {
  std::vector<BlockId> ids = blocks.Ids();
  ids.erase(ids.begin(), ids.begin() + from_reservation.size());
  std::sort(ids.begin(), ids.end());
  return ids;
}

void PagePool::GiveBackToReservationLocked(Acquisition* acq,
                                           std::vector<Unmap>* unmaps) {
  if (acq->from_reservation.empty()) return;
  if (Reservation* r = reservations_.Find(acq->reservation_id)) {
    ledger_.Reassign(acq->from_reservation, BlockOwner::kReserved);
    ReservationTable::PutFront(*r, acq->from_reservation);
  } else {
    // The reservation expired or was released meanwhile, and its other
    // blocks went back to the pool; these follow them.
    ReturnBlocksLocked(acq->from_reservation, unmaps);
  }
  acq->from_reservation.clear();
}

// ---------------------------------------------------------------------------
// Returning blocks, unmapping, the limit

void PagePool::FileEmptiedLocked(PageId p, std::vector<Unmap>* unmaps) {
  const bool over_limit = ledger_.admitted_pages().value() > target_pages_;
  if (failed_ || (!over_limit && ledger_.idle_pages_listed().value() <
                                     options_.max_idle_pages)) {
    ledger_.KeepIdle(p);
    return;
  }
  ledger_.BeginUnmap(p,
                     over_limit ? Landing::kReclaimedBack : Landing::kFreeBack);
  unmaps->push_back({p});
}

void PagePool::ReturnBlocksLocked(absl::Span<const BlockId> ascending,
                                  std::vector<Unmap>* unmaps) {
  for (PageId p : ledger_.ReturnBlocks(ascending)) {
    FileEmptiedLocked(p, unmaps);
  }
  SettleLimitLocked();
}

void PagePool::ReturnRunsLocked(absl::Span<const int64_t> runs,
                                std::vector<Unmap>* unmaps) {
  for (PageId p : ledger_.ReturnRuns(runs)) FileEmptiedLocked(p, unmaps);
  SettleLimitLocked();
}

int64_t PagePool::CompleteUnmapsLocked(std::vector<Unmap>* unmaps,
                                       std::string* log) {
  if (unmaps->empty()) return 0;
  // Registered before the lock drops: an engine's acknowledgement may land
  // a revoked page (UnmapRevoked) before this call retakes it.
  const absl::Time deadline = clock_->Now() + options_.revoke_timeout;
  for (const Unmap& u : *unmaps) revoking_[u.page] = Leaving{deadline};
  std::vector<PageId> ids;
  ids.reserve(unmaps->size());
  for (const Unmap& u : *unmaps) ids.push_back(u.page);
  std::vector<PageId> now;
  ++calls_in_flight_;
  WithoutLock([&] {
    now = announcer_.Revoke(ids, deadline);
    size_t i = 0;
    for (Unmap& u : *unmaps) {
      if (i < now.size() && now[i] == u.page) {
        u.status = mapper_.Unmap(u.page, &u.took);
        ++i;
      }
    }
  });
  // Pages engines know stay REVOKING (unless already acknowledged); the
  // others land now.
  std::vector<Unmap> done;
  size_t i = 0;
  for (Unmap& u : *unmaps) {
    if (i < now.size() && now[i] == u.page) {
      revoking_.erase(u.page);
      done.push_back(std::move(u));
      ++i;
    } else if (auto it = revoking_.find(u.page); it != revoking_.end()) {
      it->second.revoked = true;
    }
  }
  unmaps->clear();
  const int64_t landed = LandUnmapsLocked(&done, log);
  --calls_in_flight_;
  return landed;
}

int64_t PagePool::LandUnmapsLocked(std::vector<Unmap>* unmaps,
                                   std::string* log) {
  // In one step: landed in several, the pages of one call would be seen
  // partly FREE, partly in flight (docs/design.md, "Bounded lock hold").
  int64_t landed = 0;
  bool any_failed = false;
  for (size_t k = 0; k < unmaps->size(); ++k) {
    const Unmap& u = (*unmaps)[k];
    if (u.status.ok()) {
      tags_.Forget(ledger_.page(u.page).begin, ledger_.page(u.page).end);
      ledger_.FinishUnmap(u.page);
      stats_.unmap_latency.Record(u.took);
      ++stats_.pages_unmapped_total;
      ++landed;
      continue;
    }
    any_failed = true;
    MarkFailedLocked(
        absl::StrCat("unmapping page ", u.page,
                     " failed: ", u.status.message()),
        /*device_lost=*/u.status.code() == absl::StatusCode::kInternal, log);
    ledger_.AbortUnmap(u.page);  // still mapped: kept IDLE, accounted
  }
  // A page that could not leave still counts against the limit.
  if (any_failed && ledger_.admitted_pages().value() > target_pages_) {
    limit_state_ = LimitState::kDeferred;
  }
  // Another call's unmap may have failed (deferring the limit) while this
  // call's pages were in flight to the FREE list: while over the target
  // they are reclaimed instead, as a lowered limit would have.
  if (limit_state_ == LimitState::kDeferred) {
    while (ledger_.admitted_pages().value() > target_pages_ &&
           ledger_.free_pages().value() > 0) {
      ledger_.ReclaimFreeBack();
    }
    SettleLimitLocked();
  }
  if (landed > 0) {
    BumpGenerationLocked();
    // Uncharged once the landed pages are published (docs/design.md,
    // "Capacity without the lock").
    PublishLocked();
    budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(), landed);
  }
  unmaps->clear();
  return landed;
}

void PagePool::SettleLimitLocked() {
  if (limit_state_ != LimitState::kDeferred) return;
  if (ledger_.admitted_pages().value() > target_pages_) return;
  limit_state_ = LimitState::kApplied;
  AdmitReclaimedLocked();
}

void PagePool::AdmitReclaimedLocked() {
  const int64_t room = target_pages_ - ledger_.admitted_pages().value();
  if (room > 0) ledger_.AdmitReclaimed(PageCount(room));
}

// ---------------------------------------------------------------------------
// Failures

absl::Status PagePool::MappingErrorLocked(
    const BundleMapper::MapOutcome& outcome, int64_t requested,
    std::string* log, Counted counted) {
  ++stats_.map_failures_total;
  FailureMetadata md = {
      {std::string(error_key::kPool), name()},
      {std::string(error_key::kRequestedBlocks), Num(requested)},
      {std::string(error_key::kDriverError),
       std::string(outcome.status.message())}};
  for (int d : geometry_.devices()) {
    DeviceBudgetSnapshot s = budgets_->Snapshot(d);
    md[absl::StrCat("device_", d, "_free_bytes")] = Num(s.driver_free.value());
  }
  const absl::StatusCode code = outcome.status.code();
  if (!outcome.unwound || code == absl::StatusCode::kInternal) {
    MarkFailedLocked(
        absl::StrCat(outcome.unwound
                         ? "fatal device error: "
                         : "a failed mapping could not be rolled back: ",
                     outcome.status.message()),
        /*device_lost=*/code == absl::StatusCode::kInternal, log);
    return RefuseLocked(counted, FailureReason::kPoolFailed,
                        absl::StrCat("pool ", name(), " failed: ", failure_),
                        std::move(md));
  }
  if (code == absl::StatusCode::kResourceExhausted) {
    return RefuseLocked(
        counted, FailureReason::kGpuMemoryExhausted,
        absl::StrCat("the device ran out of memory while mapping for pool ",
                     name(), " (rolled back): ", outcome.status.message()),
        std::move(md));
  }
  return RefuseLocked(
      counted, FailureReason::kMappingFailed,
      absl::StrCat("mapping failed for pool ", name(),
                   " (rolled back): ", outcome.status.message()),
      std::move(md));
}

void PagePool::MarkFailedLocked(const std::string& why, bool device_lost,
                                std::string* log) {
  device_lost_ = device_lost_ || device_lost;
  if (!failed_) {
    failed_ = true;
    failure_ = why;
    absl::StrAppend(log, "kvbroker: pool ", name(), " FAILED: ", why, "\n");
  }
  BumpGenerationLocked();
}

// ---------------------------------------------------------------------------
// Entry points

namespace {

std::string AllocFingerprint(const AllocRequest& r) {
  return absl::StrCat("alloc/", r.num_blocks, "/", r.reservation_id, "/",
                      r.expected_generation.has_value()
                          ? absl::StrCat(*r.expected_generation)
                          : "-");
}

std::string ReserveFingerprint(const ReserveRequest& r) {
  return absl::StrCat("reserve/", r.num_blocks, "/",
                      absl::ToInt64Nanoseconds(r.ttl));
}

}  // namespace

absl::StatusOr<AllocResult> PagePool::Alloc(const AllocRequest& request) {
  Epilogue epi;
  absl::StatusOr<AllocResult> result;
  // The blocks of a call that nothing remembers are shaped into the reply
  // after the lock is released.
  Stretches unshaped;
  size_t unshaped_sorted = 0;
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    std::vector<Unmap> unmaps;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<AllocResult> {
      if (request.num_blocks < 0) {
        return InvalidFieldLocked(Counted::kYes, "num_blocks",
                                  "must not be negative");
      }
      KVB_RETURN_IF_ERROR(CheckUsableLocked(Counted::kYes));
      const std::string& id = request.request_id;
      const std::string fingerprint =
          id.empty() ? "" : AllocFingerprint(request);
      ExpireLocked(&epi.log);
      AwaitNotPendingLocked(id);
      if (std::optional<absl::StatusOr<AllocResult>> replay =
              ReplayLocked<AllocResult>(id, fingerprint)) {
        if (replay->ok()) ReshapeResult(&**replay, request.as_runs);
        return *std::move(replay);
      }
      KVB_RETURN_IF_ERROR(CheckUsableLocked(Counted::kYes));
      if (request.expected_generation.has_value() &&
          *request.expected_generation != generation_) {
        return RefuseLocked(
            Counted::kYes, FailureReason::kGenerationMismatch,
            absl::StrCat("pool ", name(), " is at generation ", generation_,
                         ", not ", *request.expected_generation,
                         "; re-read capacity"),
            {{std::string(error_key::kPool), name()},
             {std::string(error_key::kExpectedGeneration),
              absl::StrCat(*request.expected_generation)},
             {std::string(error_key::kCurrentGeneration),
              absl::StrCat(generation_)}});
      }
      Reservation* reservation = nullptr;
      if (!request.reservation_id.empty()) {
        KVB_RETURN_IF_ERROR(FindReservationLocked(request.reservation_id,
                                                  &reservation, Counted::kYes));
      }
      const int64_t from_res =
          reservation == nullptr
              ? 0
              : std::min<int64_t>(request.num_blocks,
                                  reservation->blocks.size());
      absl::StatusOr<Plan> plan =
          PlanLocked(request.num_blocks, from_res, reservation);
      if (!plan.ok()) return plan.status();
      Acquisition acq =
          BeginAcquireLocked(*plan, BlockOwner::kAllocated, reservation);
      KVB_RETURN_IF_ERROR(
          MapFreshLocked(&acq, request.num_blocks, id, &unmaps, &epi.log));
      if (!request.holder.empty()) {
        KVB_RETURN_IF_ERROR(
            ZeroForHolderLocked(request.holder, &acq, id, &unmaps, &epi.log));
      }
      AllocResult out;
      out.pages_mapped = plan->new_pages;
      out.num_blocks = acq.blocks.blocks();
      if (out.num_blocks > 0 || out.pages_mapped > 0) BumpGenerationLocked();
      out.generation = generation_;
      stats_.blocks_allocated_total += out.num_blocks;
      if (!id.empty()) {
        ShapeResult(&out, acq.blocks, acq.from_reservation.size(),
                    request.as_runs);
        RememberLocked(id, fingerprint, out);
      } else {
        unshaped = std::move(acq.blocks);
        unshaped_sorted = acq.from_reservation.size();
      }
      return out;
    }();
    CompleteUnmapsLocked(&unmaps, &epi.log);
    ++stats_.alloc_calls;
    if (result.ok()) ++stats_.outcomes[0];
    CloseLocked(&epi);
  }
  if (result.ok() && !unshaped.empty()) {
    ShapeResult(&*result, unshaped, unshaped_sorted, request.as_runs);
  }
  RunEpilogue(epi);
  return result;
}

absl::StatusOr<ReservationInfo> PagePool::Reserve(
    const ReserveRequest& request) {
  Epilogue epi;
  absl::StatusOr<ReservationInfo> result;
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    std::vector<Unmap> unmaps;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<ReservationInfo> {
      if (request.num_blocks <= 0) {
        return InvalidFieldLocked(Counted::kYes, "num_blocks",
                                  "must be positive");
      }
      if (request.ttl <= absl::ZeroDuration()) {
        return InvalidFieldLocked(Counted::kYes, "ttl", "must be positive");
      }
      KVB_RETURN_IF_ERROR(CheckUsableLocked(Counted::kYes));
      const std::string& id = request.request_id;
      const std::string fingerprint =
          id.empty() ? "" : ReserveFingerprint(request);
      ExpireLocked(&epi.log);
      AwaitNotPendingLocked(id);
      if (std::optional<absl::StatusOr<ReservationInfo>> replay =
              ReplayLocked<ReservationInfo>(id, fingerprint)) {
        return *std::move(replay);
      }
      KVB_RETURN_IF_ERROR(CheckUsableLocked(Counted::kYes));
      absl::StatusOr<Plan> plan = PlanLocked(request.num_blocks, 0, nullptr);
      if (!plan.ok()) return plan.status();
      Acquisition acq =
          BeginAcquireLocked(*plan, BlockOwner::kReserved, nullptr);
      KVB_RETURN_IF_ERROR(
          MapFreshLocked(&acq, request.num_blocks, id, &unmaps, &epi.log));
      std::vector<BlockId> reserved = acq.blocks.Ids();
      std::sort(reserved.begin(), reserved.end());
      const Reservation& r =
          reservations_.Add(std::move(reserved), clock_->Now() + request.ttl);
      ReservationInfo info;
      info.reservation_id = r.id;
      info.num_blocks = static_cast<int64_t>(r.blocks.size());
      info.pages = GroupByPage(r.blocks, r.blocks.size());
      info.expires = r.expires;
      BumpGenerationLocked();
      info.generation = generation_;
      if (!id.empty()) RememberLocked(id, fingerprint, info);
      return info;
    }();
    CompleteUnmapsLocked(&unmaps, &epi.log);
    ++stats_.reserve_calls;
    if (result.ok()) ++stats_.outcomes[0];
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
  return result;
}

absl::StatusOr<ReleaseResult> PagePool::ReleaseReservation(
    const std::string& reservation_id) {
  Epilogue epi;
  absl::StatusOr<ReleaseResult> result;
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<ReleaseResult> {
      if (shut_down_) return CheckUsableLocked();
      ExpireLocked(&epi.log);
      Reservation* r = nullptr;
      KVB_RETURN_IF_ERROR(
          FindReservationLocked(reservation_id, &r, Counted::kNo));
      const Reservation gone = reservations_.Remove(reservation_id);
      ReleaseResult out;
      out.released_blocks = static_cast<int64_t>(gone.blocks.size());
      std::vector<Unmap> unmaps;
      ReturnBlocksLocked(gone.blocks, &unmaps);  // ascending
      BumpGenerationLocked();
      CompleteUnmapsLocked(&unmaps, &epi.log);
      out.generation = generation_;
      return out;
    }();
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
  return result;
}

absl::Status PagePool::FindReservationLocked(const std::string& id,
                                             Reservation** out,
                                             Counted counted) {
  if (Reservation* r = reservations_.Find(id)) {
    *out = r;
    return absl::OkStatus();
  }
  if (reservations_.WasExpired(id)) {
    return RefuseLocked(counted, FailureReason::kReservationExpired,
                        absl::StrCat("reservation ", id, " in pool ", name(),
                                     " has expired; its blocks went back to "
                                     "the pool"),
                        {{std::string(error_key::kPool), name()},
                         {std::string(error_key::kReservationId), id}});
  }
  return RefuseLocked(counted, FailureReason::kReservationNotFound,
                      absl::StrCat("no reservation ", id, " in pool ", name()),
                      {{std::string(error_key::kPool), name()},
                       {std::string(error_key::kReservationId), id}});
}

void PagePool::ExpireLocked(std::string* log) {
  const std::optional<absl::Time> next = reservations_.next_expiry();
  if (!next.has_value()) return;  // the common case reads no clock
  const absl::Time now = clock_->Now();
  if (*next > now) return;
  std::vector<Unmap> unmaps;
  for (const Reservation& r : reservations_.TakeExpired(now)) {
    ReturnBlocksLocked(r.blocks, &unmaps);
    ++stats_.reservations_expired_total;
    BumpGenerationLocked();
  }
  // Finished before the caller goes on, so that it sees the pages landed,
  // as if they had been unmapped under the lock.
  CompleteUnmapsLocked(&unmaps, log);
}

void PagePool::ExpireReservations() {
  Epilogue epi;
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    if (!shut_down_) ExpireLocked(&epi.log);
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
}

void PagePool::AwaitNotPendingLocked(const std::string& request_id) {
  if (request_id.empty() || !remembered_.IsPending(request_id)) return;
  struct Args {
    const IdempotencyWindow* window;
    const std::string* id;
  };
  // The window is read under mu_: Await evaluates the condition with the
  // lock held.
  Args args{&remembered_, &request_id};
  PublishLocked();
  mu_.Await(absl::Condition(
      +[](Args* a) { return !a->window->IsPending(*a->id); }, &args));
}

template <typename T>
std::optional<absl::StatusOr<T>> PagePool::ReplayLocked(
    const std::string& request_id, const std::string& fingerprint) {
  if (request_id.empty()) return std::nullopt;
  const IdempotencyWindow::Entry* seen =
      remembered_.Recall(request_id, clock_->Now());
  if (seen == nullptr) return std::nullopt;
  if (seen->fingerprint != fingerprint) {
    return absl::StatusOr<T>(RefuseLocked(
        Counted::kYes, FailureReason::kRequestIdReused,
        absl::StrCat("request_id ", request_id,
                     " was already used with other parameters in pool ",
                     name()),
        {{std::string(error_key::kPool), name()},
         {std::string(error_key::kRequestId), request_id},
         {std::string(error_key::kFirstRequest), seen->fingerprint},
         {std::string(error_key::kThisRequest), fingerprint}}));
  }
  ++stats_.idempotent_replays_total;
  T replay = std::get<T>(seen->outcome);
  replay.replayed = true;
  return absl::StatusOr<T>(std::move(replay));
}

// Free (page_pool_free.cc) replays through the same template.
template std::optional<absl::StatusOr<FreeResult>>
PagePool::ReplayLocked<FreeResult>(const std::string& request_id,
                                   const std::string& fingerprint);

void PagePool::RememberLocked(const std::string& request_id,
                              std::string fingerprint,
                              IdempotencyWindow::Outcome outcome) {
  remembered_.Remember(request_id, std::move(fingerprint), std::move(outcome),
                       clock_->Now());
}

// ---------------------------------------------------------------------------
// Helpers

namespace {

// The end of the ascending run of ids below `end` that starts at
// blocks[i], where blocks is an acquisition's (PagePool::GroupByPage says
// what its two parts hold). Within one part a page's ids are distinct,
// ascending and on no other stretch of that part, so when the id k - 1
// places on (k as many as the page and the part leave room for) is
// blocks[i] + k - 1, all k are consecutive: a whole page (what most
// acquisitions take) is cut without a test per id.
size_t PageRunEnd(absl::Span<const BlockId> blocks, size_t i, BlockId end,
                  size_t sorted) {
  const size_t part_end = i < sorted ? sorted : blocks.size();
  const int64_t k =
      std::min<int64_t>(static_cast<int64_t>(part_end - i), end - blocks[i]);
  if (k > 1 && blocks[i + k - 1] == blocks[i] + (k - 1)) return i + k;
  size_t j = i + 1;
  while (j < blocks.size() && blocks[j] < end && blocks[j] > blocks[j - 1]) {
    ++j;
  }
  return j;
}

}  // namespace

void PagePool::ShapeResult(AllocResult* r, const Stretches& blocks,
                           size_t sorted, bool as_runs) const {
  if (as_runs) {
    r->block_runs = blocks.AscendingRuns();
  } else {
    r->pages = GroupByPage(blocks.Ids(), sorted);
  }
}

void PagePool::ReshapeResult(AllocResult* r, bool as_runs) const {
  if (as_runs && !r->pages.empty()) {
    Stretches ids;
    ids.AppendIds(AllBlockIds(r->pages));
    r->block_runs = ids.AscendingRuns();
    r->pages.clear();
  } else if (!as_runs && !r->block_runs.empty()) {
    std::vector<BlockId> ids = AllBlockIds(*r);
    const size_t n = ids.size();
    r->pages = GroupByPage(std::move(ids), n);
    r->block_runs.clear();
  }
}

std::vector<PageBlocks> PagePool::GroupByPage(std::vector<BlockId> blocks,
                                              size_t sorted) const {
  std::vector<PageBlocks> out;
  if (blocks.empty()) return out;
  // Acquisition yields each page's blocks as one ascending run, pages in the
  // order they were taken (FREE-list order for fresh pages). Cut the runs,
  // then order them by page: O(blocks + pages log pages), not a sort of
  // every id. Should a page appear in two runs (a reservation's blocks and
  // the pool's on one page), the ids are sorted instead.
  const auto by_page = [](const PageBlocks& a, const PageBlocks& b) {
    return a.page_id < b.page_id;
  };
  auto run_end = [&](std::vector<BlockId>::iterator it, BlockId end) {
    return blocks.begin() +
           static_cast<ptrdiff_t>(PageRunEnd(
               blocks, static_cast<size_t>(it - blocks.begin()), end, sorted));
  };
  const PageId first = geometry_.page_of(blocks.front());
  if (run_end(blocks.begin(), geometry_.range(first).end) == blocks.end()) {
    out.push_back({first, std::move(blocks)});
    return out;
  }
  // A page holds at least P/B - 1 blocks (one fewer where a block
  // straddles its edge): room for every page, barring runs cut short.
  const int64_t per_page = std::max<int64_t>(
      1, geometry_.page_size().value() / geometry_.block_bytes().value() - 1);
  out.reserve(blocks.size() / static_cast<size_t>(per_page) + 2);
  for (auto it = blocks.begin(); it != blocks.end();) {
    const PageId p = geometry_.page_of(*it);
    const auto end = run_end(it, geometry_.range(p).end);
    out.push_back({p, std::vector<BlockId>(it, end)});
    it = end;
  }
  if (!std::is_sorted(out.begin(), out.end(), by_page)) {
    std::sort(out.begin(), out.end(), by_page);
  }
  if (std::adjacent_find(out.begin(), out.end(),
                         [](const PageBlocks& a, const PageBlocks& b) {
                           return a.page_id == b.page_id;
                         }) == out.end()) {
    return out;
  }
  out.clear();
  std::sort(blocks.begin(), blocks.end());
  for (auto it = blocks.begin(); it != blocks.end();) {
    const PageId p = geometry_.page_of(*it);
    const BlockId end = geometry_.range(p).end;
    auto group_end =
        std::find_if(it, blocks.end(), [end](BlockId b) { return b >= end; });
    out.push_back({p, std::vector<BlockId>(it, group_end)});
    it = group_end;
  }
  return out;
}

void PagePool::BumpGenerationLocked() { ++generation_; }

void PagePool::CloseLocked(Epilogue* e) {
  e->after = generation_;
  e->prealloc = NeedsPreallocLocked();
  PublishLocked();
}

void PagePool::RunEpilogue(const Epilogue& e) {
  if (!e.log.empty()) std::fputs(e.log.c_str(), stderr);
  if (e.after != e.before && options_.on_change) options_.on_change(name());
  if (e.prealloc && options_.on_prealloc_needed) options_.on_prealloc_needed();
}

bool PagePool::NeedsPreallocLocked() const {
  return !shut_down_ && !failed_ && !prealloc_running_ &&
         ledger_.idle_pages_listed().value() < options_.min_idle_pages &&
         limit_state_ != LimitState::kDeferred &&
         ledger_.free_pages().value() > 0;
}

uint64_t PagePool::generation() const {
  return static_cast<uint64_t>(published_.Read().generation);
}

bool PagePool::healthy() const { return published_.Read().failed == 0; }

bool PagePool::device_lost() const {
  SpinThenLockGuard lock(&mu_);
  return device_lost_;
}

PoolStats PagePool::Stats() const {
  SpinThenLockGuard lock(&mu_);
  return stats_;
}

absl::Status PagePool::CheckInvariants() const {
  SpinThenLockGuard lock(&mu_);
  return CheckInvariantsLocked();
}

absl::Status PagePool::CheckInvariantsLocked() const {
  auto fail = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("invariant: ", parts...));
  };
  if (std::string e = ledger_.Check(); !e.empty()) return fail(e);
  // Checked with mu_ just taken: every release of it published.
  if (published_.last() != CountersLocked() ||
      published_.Read() != published_.last()) {
    return fail("published counters differ from the pool's state");
  }
  for (const auto& [id, r] : reservations_.live()) {
    for (BlockId b : r.blocks) {
      if (ledger_.owner(b) != BlockOwner::kReserved) {
        return fail("reservation ", id, " block ", b, " not reserved");
      }
    }
  }
  if (reservations_.total_blocks() + reserving_in_flight_ !=
      ledger_.reserved().value()) {
    return fail("reservation totals");
  }
  int64_t freeing = 0;
  for (size_t w = 0; w < freeing_.size(); ++w) {
    for (uint64_t bits = freeing_[w]; bits != 0; bits &= bits - 1) {
      const BlockId b = static_cast<BlockId>(w * 64 + __builtin_ctzll(bits));
      if (b >= geometry_.max_blocks() ||
          ledger_.owner(b) != BlockOwner::kAllocated) {
        return fail("block ", b, " is being freed but not allocated");
      }
      ++freeing;
    }
  }
  if (freeing != freeing_blocks_) {
    return fail(freeing, " blocks being freed, counted ", freeing_blocks_);
  }
  if (calls_in_flight_ == 0 && freeing_blocks_ > 0) {
    return fail(freeing_blocks_, " blocks being freed with no call in flight");
  }
  if (calls_in_flight_ == 0 && (!committing_.empty() || !unshown_.zero())) {
    return fail(committing_.size(),
                " commit(s) not shown with no call in flight");
  }
  for (const Committing& c : committing_) {
    for (size_t i = 0; i < c.committed; ++i) {
      const PageLedger::Page& page = ledger_.page((*c.fresh)[i]);
      if (page.free != 0 || page.state == PageState::kMapping) {
        return fail("page ", (*c.fresh)[i], " of a commit not shown is ",
                    PageStateName(page.state), " with ", page.free,
                    " free blocks");
      }
    }
  }
  for (const auto& [p, leaving] : revoking_) {
    if (ledger_.page(p).state != PageState::kMapping) {
      return fail("revoking page ", p, " is ",
                  PageStateName(ledger_.page(p).state));
    }
  }
  if (calls_in_flight_ == 0 && ledger_.pages_in_flight().value() >
                                   static_cast<int64_t>(revoking_.size())) {
    return fail(ledger_.pages_in_flight().value(),
                " page(s) in flight with no call in flight and ",
                revoking_.size(), " revoking");
  }
  const int64_t admitted = ledger_.admitted_pages().value();
  if (limit_state_ != LimitState::kDeferred && admitted > target_pages_) {
    return fail("admitted ", admitted, " > target ", target_pages_);
  }
  if (limit_state_ == LimitState::kDeferred &&
      ledger_.free_pages().value() > 0) {
    return fail("FREE pages while DEFERRED");
  }
  return absl::OkStatus();
}

}  // namespace kvbroker
