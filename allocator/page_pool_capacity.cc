// PagePool: what the pool can supply and the refusals when it cannot:
// the refusal helpers that count outcomes, usability, the capacity snapshot,
// planning (every capacity refusal is decided there, before anything is taken),
// memory limits, trim and page occupancy. Part of the page_pool target; the
// contract is in page_pool.h, the mapping transaction and the entry points in
// page_pool.cc.

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/page_pool.h"
#include "common/error_keys.h"

namespace kvbroker {

const char* LimitOutcomeName(LimitOutcome o) {
  switch (o) {
    case LimitOutcome::kApplied: return "APPLIED";
    case LimitOutcome::kDeferred: return "DEFERRED";
    case LimitOutcome::kStale: return "STALE";
    case LimitOutcome::kConflict: return "CONFLICT";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Refusals

absl::Status PagePool::RefuseLocked(Counted counted, FailureReason reason,
                                    absl::string_view message,
                                    FailureMetadata metadata,
                                    std::vector<FieldViolation> violations) {
  if (counted == Counted::kYes) ++stats_.outcomes[static_cast<int>(reason)];
  return MakeFailure(reason, message, std::move(metadata),
                     std::move(violations));
}

absl::Status PagePool::InvalidFieldLocked(Counted counted,
                                          absl::string_view field,
                                          absl::string_view description) {
  if (counted == Counted::kYes) {
    ++stats_.outcomes[static_cast<int>(FailureReason::kInvalidArgument)];
  }
  return InvalidField(field, description);
}

// ---------------------------------------------------------------------------
// Capacity

int64_t PagePool::AffordableLocked() const {
  return budgets_->AffordableBundles(geometry_.devices(),
                                     geometry_.bundle_bytes());
}

absl::Status PagePool::CheckUsableLocked(Counted counted) {
  if (shut_down_) {
    return RefuseLocked(counted, FailureReason::kPoolNotFound,
                        absl::StrCat("pool ", name(), " was deleted"),
                        {{std::string(error_key::kPool), name()}});
  }
  if (failed_) {
    return RefuseLocked(counted, FailureReason::kPoolFailed,
                        absl::StrCat("pool ", name(), " has failed: ", failure_,
                                     "; delete and recreate it"),
                        {{std::string(error_key::kPool), name()},
                         {std::string(error_key::kFailure), failure_}});
  }
  return absl::OkStatus();
}

Bytes PagePool::MappedBytesLocked() const {
  return Bytes(ledger_.mapped_pages().value() *
               geometry_.bundle_bytes().value() * geometry_.device_count());
}

LimitInfo PagePool::LimitInfoLocked() const {
  LimitInfo info;
  info.state = limit_state_;
  info.limit_bytes = limit_bytes_;
  info.revision = limit_revision_;
  info.target_pages = PageCount(target_pages_);
  const int64_t per_page =
      geometry_.bundle_bytes().value() * geometry_.device_count();
  info.effective_bytes = Bytes(target_pages_ * per_page);
  info.overage_bytes = Bytes(std::max<int64_t>(
      0, MappedBytesLocked().value() - info.effective_bytes.value()));
  return info;
}

PagePool::CommitCounts& PagePool::CommitCounts::operator+=(
    const CommitCounts& o) {
  mapped_supply += o.mapped_supply;
  reserved += o.reserved;
  allocated += o.allocated;
  admitted_usable += o.admitted_usable;
  mapped_pages += o.mapped_pages;
  for (int s = 0; s < kPageStates; ++s)
    pages_by_state[s] += o.pages_by_state[s];
  return *this;
}

PagePool::CommitCounts& PagePool::CommitCounts::operator-=(
    const CommitCounts& o) {
  mapped_supply -= o.mapped_supply;
  reserved -= o.reserved;
  allocated -= o.allocated;
  admitted_usable -= o.admitted_usable;
  mapped_pages -= o.mapped_pages;
  for (int s = 0; s < kPageStates; ++s)
    pages_by_state[s] -= o.pages_by_state[s];
  return *this;
}

bool PagePool::UnshownLocked(PageId p) const {
  for (const Committing& c : committing_) {
    const auto end = c.fresh->begin() + c.committed;
    if (std::find(c.fresh->begin(), end, p) != end) return true;
  }
  return false;
}

bool PagePool::CommitCounts::zero() const {
  return mapped_supply == 0 && reserved == 0 && allocated == 0 &&
         admitted_usable == 0 && mapped_pages == 0 &&
         std::all_of(std::begin(pages_by_state), std::end(pages_by_state),
                     [](int64_t n) { return n == 0; });
}

PagePool::CommitCounts PagePool::CommitCountsLocked() const {
  CommitCounts k;
  k.mapped_supply = ledger_.mapped_supply().value();
  k.reserved = ledger_.reserved().value();
  k.allocated = ledger_.allocated().value();
  k.admitted_usable = ledger_.admitted_usable().value();
  k.mapped_pages = ledger_.mapped_pages().value();
  for (int s = 0; s < kPageStates; ++s) {
    k.pages_by_state[s] = ledger_.pages(static_cast<PageState>(s)).value();
  }
  return k;
}

PoolCounters PagePool::CountersLocked() const {
  PoolCounters c;
  c.generation = static_cast<int64_t>(generation_);
  c.shut_down = shut_down_ ? 1 : 0;
  c.failed = failed_ ? 1 : 0;
  // unshown_ is zero unless a call commits in steps or zeroes blocks.
  const CommitCounts shown = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CommitCounts k = CommitCountsLocked();
    if (calls_in_flight_ > 0) k -= unshown_;
    return k;
  }();
  c.mapped_supply = shown.mapped_supply;
  // A commit does not touch the FREE list.
  c.free_pages = ledger_.free_pages().value();
  c.free_total = ledger_.FreePrefix(ledger_.free_pages()).value();
  c.reserved = shown.reserved;
  c.allocated = shown.allocated;
  c.admitted_usable = shown.admitted_usable;
  c.mapped_pages = shown.mapped_pages;
  std::copy(std::begin(shown.pages_by_state), std::end(shown.pages_by_state),
            std::begin(c.pages_by_state));
  c.limit_state = static_cast<int64_t>(limit_state_);
  c.limit_bytes = limit_bytes_.value();
  c.limit_revision = limit_revision_;
  c.target_pages = target_pages_;
  // Only pages engines were asked to let go of: a page still owned by its
  // unmapping call counts as MAPPING either way.
  for (const auto& [p, leaving] : revoking_) c.revoking += leaving.revoked;
  if (std::optional<absl::Time> next = reservations_.next_expiry()) {
    c.next_expiry_ns = absl::ToUnixNanos(*next);
  }
  return c;
}

void PagePool::PublishLocked() { published_.Publish(CountersLocked()); }

void PagePool::FillCapacity(const PoolCounters& k, int64_t affordable,
                            int64_t free_prefix, CapacitySnapshot* c) const {
  c->pool = name();
  c->pool_uid = options_.uid;
  c->generation = static_cast<uint64_t>(k.generation);
  c->healthy = k.failed == 0;
  c->affordable_bundles = affordable;
  // A FAILED pool refuses allocation, so it has nothing available.
  c->available_blocks =
      BlockCount(k.failed != 0 ? 0 : k.mapped_supply + free_prefix);
  c->available_tokens =
      c->available_blocks.value() * geometry_.config().tokens_per_block;
  c->reserved_blocks = BlockCount(k.reserved);
  c->allocated_blocks = BlockCount(k.allocated);
  c->total_blocks = BlockCount(k.admitted_usable);
  auto pages = [&k](PageState s) {
    return PageCount(k.pages_by_state[static_cast<int>(s)]);
  };
  c->pages_free = pages(PageState::kFree);
  c->pages_mapping = pages(PageState::kMapping);
  c->pages_idle = pages(PageState::kIdle);
  c->pages_open = pages(PageState::kOpen);
  c->pages_full = pages(PageState::kFull);
  c->pages_reclaimed = pages(PageState::kReclaimed);
  c->pages_empty = pages(PageState::kEmpty);
  const int64_t per_page =
      geometry_.bundle_bytes().value() * geometry_.device_count();
  c->mapped_bytes = Bytes(k.mapped_pages * per_page);
  c->virtual_bytes =
      geometry_.virtual_bytes_per_device() * geometry_.device_count();
  c->devices.reserve(geometry_.devices().size());
  for (int d : geometry_.devices()) {
    c->devices.push_back(budgets_->Snapshot(d));
  }
  c->limit.state = static_cast<LimitState>(k.limit_state);
  c->limit.limit_bytes = Bytes(k.limit_bytes);
  c->limit.revision = k.limit_revision;
  c->limit.target_pages = PageCount(k.target_pages);
  c->limit.effective_bytes = Bytes(k.target_pages * per_page);
  c->limit.overage_bytes = Bytes(std::max<int64_t>(
      0, c->mapped_bytes.value() - c->limit.effective_bytes.value()));
}

absl::StatusOr<CapacitySnapshot> PagePool::Capacity(
    const CapacityQuery& query) {
  // Without the lock (docs/design.md, "Capacity without the lock"). The
  // FREE pages count in full only when the devices afford all of them; a
  // budget read after the counters can only be lower than the one that
  // goes with them, because a call charges before it publishes the pages
  // it takes and uncharges after it publishes the pages it returned.
  if (query.max_pages <= 0) {
    const PoolCounters k = published_.Read();
    const bool expiring = k.next_expiry_ns != PoolCounters::kNoExpiry &&
                          absl::ToUnixNanos(clock_->Now()) >= k.next_expiry_ns;
    // Revoking pages turn QUARANTINED by the clock alone: counted under the
    // lock.
    if (k.shut_down == 0 && k.failed == 0 && k.revoking == 0 && !expiring) {
      const int64_t affordable = budgets_->AffordableBundles(
          geometry_.devices(), geometry_.bundle_bytes());
      if (affordable >= k.free_pages) {
        CapacitySnapshot c;
        FillCapacity(k, affordable, k.free_total, &c);
        return c;
      }
    }
  }
  std::string log;
  absl::StatusOr<CapacitySnapshot> c;
  {
    SpinThenLockGuard lock(&mu_);
    c = CapacityLocked(query, &log);
    PublishLocked();  // reservations may have expired
  }
  if (!log.empty()) std::fputs(log.c_str(), stderr);
  return c;
}

absl::StatusOr<CapacitySnapshot> PagePool::CapacityLocked(
    const CapacityQuery& query, std::string* log) {
  if (shut_down_) return CheckUsableLocked();
  ExpireLocked(log);
  CapacitySnapshot c;
  const int64_t affordable = AffordableLocked();
  FillCapacity(CountersLocked(), affordable,
               ledger_.FreePrefix(PageCount(affordable)).value(), &c);
  c.failure = failure_;
  if (!revoking_.empty()) {  // the common case reads no clock
    const absl::Time now = clock_->Now();
    for (const auto& [p, leaving] : revoking_) {
      if (!leaving.revoked) continue;  // still its unmapping call's
      if (leaving.deadline < now) {
        c.pages_quarantined += PageCount(1);
      } else {
        c.pages_revoking += PageCount(1);
      }
    }
    c.pages_mapping -= c.pages_revoking + c.pages_quarantined;
  }
  if (query.max_pages > 0) {
    const size_t cap = static_cast<size_t>(query.max_pages);
    // Pages committed by a call whose commit is not shown yet are listed
    // as in flight (MAPPING, nothing on them); they are FULL in the ledger,
    // so no other list holds them.
    std::vector<PageId> unshown_pages;
    for (const Committing& k : committing_) {
      unshown_pages.insert(unshown_pages.end(), k.fresh->begin(),
                           k.fresh->begin() + k.committed);
    }
    std::sort(unshown_pages.begin(), unshown_pages.end());
    auto add = [&](PageId p, bool counted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (c.pages.size() >= cap) return false;
      const PageLedger::Page& page = ledger_.page(p);
      PageInfo info;
      info.page_id = p;
      info.usable_blocks = BlockCount(page.usable);
      info.counted = counted;
      if (std::binary_search(unshown_pages.begin(), unshown_pages.end(), p)) {
        info.state = PageState::kMapping;
        c.pages.push_back(info);
        return true;
      }
      info.free_blocks =
          BlockCount(page.state == PageState::kFree ? page.usable : page.free);
      info.allocated_blocks = BlockCount(page.allocated);
      info.reserved_blocks = BlockCount(page.reserved);
      info.state = page.state;
      c.pages.push_back(info);
      return true;
    };
    for (const auto& [free, p] : ledger_.open_index()) {
      if (!add(p, true)) break;
    }
    for (PageId p : ledger_.idle_list()) {
      if (!add(p, true)) break;
    }
    std::vector<PageId> flying = ledger_.in_flight_ascending();
    if (!unshown_pages.empty()) {
      const size_t n = flying.size();
      flying.insert(flying.end(), unshown_pages.begin(), unshown_pages.end());
      std::inplace_merge(flying.begin(), flying.begin() + n, flying.end());
    }
    for (PageId p : flying) {
      if (!add(p, false)) break;
    }
    const internal::FreeList& free_list = ledger_.free_list();
    for (size_t i = 0; i < free_list.size(); ++i) {
      if (!add(free_list[i].page, static_cast<int64_t>(i) < affordable)) {
        break;
      }
    }
  }
  return c;
}

// ---------------------------------------------------------------------------
// Planning: every refusal is decided here, before anything is taken.

absl::StatusOr<PagePool::Plan> PagePool::PlanLocked(
    int64_t requested, int64_t from_reservation,
    const Reservation* reservation) {
  Plan plan;
  plan.from_reservation = from_reservation;
  const int64_t need = requested - from_reservation;
  const int64_t total = ledger_.admitted_usable().value();
  const int64_t mapped_supply = ledger_.mapped_supply().value();
  plan.from_pool = need;
  // Fast path: mapped pages cover the request; no budget lookup needed.
  if (requested <= total && need <= mapped_supply) return plan;
  const int64_t affordable = AffordableLocked();
  const int64_t available =
      mapped_supply + ledger_.FreePrefix(PageCount(affordable)).value();

  auto refuse =
      [&](FailureReason reason, std::string message, FailureMetadata md)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    md[std::string(error_key::kPool)] = name();
    md[std::string(error_key::kRequestedBlocks)] = Num(requested);
    md[std::string(error_key::kAvailableBlocks)] = Num(available);
    md[std::string(error_key::kPoolTotalBlocks)] = Num(total);
    md[std::string(error_key::kReservedBlocks)] = Num(ShownReservedLocked());
    md[std::string(error_key::kAllocatedBlocks)] = Num(ShownAllocatedLocked());
    if (reservation != nullptr) {
      md[std::string(error_key::kReservationId)] = reservation->id;
      md[std::string(error_key::kReservationBlocks)] = Num(from_reservation);
      md[std::string(error_key::kPoolReason)] = std::string(ReasonName(reason));
      return RefuseLocked(
          Counted::kYes, FailureReason::kReservationTooSmall,
          absl::StrCat("reservation ", reservation->id, " holds ",
                       from_reservation, " of ", requested,
                       " requested blocks and the pool cannot supply the "
                       "rest: ",
                       message),
          std::move(md));
    }
    return RefuseLocked(Counted::kYes, reason, message, std::move(md));
  };

  if (requested > total) {
    return refuse(
        FailureReason::kRequestTooLarge,
        absl::StrCat("requested ", requested, " blocks; pool ", name(),
                     " can hold at most ", total, " blocks under its limit"),
        {});
  }
  const int64_t beyond = need - mapped_supply;
  if (limit_state_ == LimitState::kDeferred) {
    return refuse(
        FailureReason::kShrinkPending,
        absl::StrCat("pool ", name(),
                     " is shrinking to its memory limit and maps no new "
                     "page; ",
                     mapped_supply, " blocks are available on mapped pages"),
        {{std::string(error_key::kTargetPages), Num(target_pages_)},
         {std::string(error_key::kMappedPages),
          Num(ledger_.mapped_pages().value())}});
  }
  const int64_t pages = ledger_.FreePagesToCover(BlockCount(beyond)).value();
  if (pages > ledger_.free_pages().value()) {
    return refuse(FailureReason::kPoolExhausted,
                  absl::StrCat("requested ", requested, " blocks; pool ",
                               name(), " has ", available, " available now"),
                  {});
  }
  if (pages > affordable ||
      !budgets_->TryCharge(geometry_.devices(), geometry_.bundle_bytes(),
                           pages)) {
    FailureMetadata md = {
        {std::string(error_key::kRequiredPages), Num(pages)},
        {std::string(error_key::kAffordablePages), Num(affordable)},
        {std::string(error_key::kBundleBytes),
         Num(geometry_.bundle_bytes().value())}};
    for (int d : geometry_.devices()) {
      md[absl::StrCat("device_", d, "_budget_bytes")] =
          Num(budgets_->Snapshot(d).budget.value());
    }
    return refuse(
        FailureReason::kGpuMemoryExhausted,
        absl::StrCat("requested ", requested, " blocks; pool ", name(), " has ",
                     available, " available: the devices can afford ",
                     affordable, " more page(s), ", pages, " needed"),
        std::move(md));
  }
  plan.new_pages = pages;  // charged
  return plan;
}

// ---------------------------------------------------------------------------
// Limits, trim, occupancy

absl::StatusOr<LimitResult> PagePool::SetMemoryLimit(Bytes limit_bytes,
                                                     int64_t revision) {
  Epilogue epi;
  absl::StatusOr<LimitResult> result;
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<LimitResult> {
      if (limit_bytes.value() < 0) {
        return InvalidField("limit_bytes", "must not be negative");
      }
      if (revision < 0) return InvalidField("revision", "must not be negative");
      if (shut_down_) return CheckUsableLocked();
      ExpireLocked(&epi.log);
      // A limit moves pages between lists; it waits until no call has pages
      // in flight, so that no rollback lands on a list the limit changed.
      PublishLocked();
      mu_.Await(absl::Condition(
          +[](int64_t* calls) { return *calls == 0; }, &calls_in_flight_));
      if (shut_down_) return CheckUsableLocked();
      auto current = [&](LimitOutcome outcome)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           LimitResult r;
                           r.outcome = outcome;
                           r.limit = LimitInfoLocked();
                           r.mapped_bytes = MappedBytesLocked();
                           r.generation = generation_;
                           return r;
                         };
      auto state_outcome = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return limit_state_ == LimitState::kDeferred ? LimitOutcome::kDeferred
                                                     : LimitOutcome::kApplied;
      };
      if (limit_revision_ >= 0) {
        if (revision < limit_revision_) return current(LimitOutcome::kStale);
        if (revision == limit_revision_) {
          return current(limit_bytes == limit_bytes_ ? state_outcome()
                                                     : LimitOutcome::kConflict);
        }
      }
      const int64_t per_page =
          geometry_.bundle_bytes().value() * geometry_.device_count();
      limit_bytes_ = limit_bytes;
      limit_revision_ = revision;
      target_pages_ = std::min(limit_bytes.value() / per_page,
                               geometry_.page_count().value());
      auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return ledger_.admitted_pages().value() > target_pages_;
      };
      // Lowering: unmapped FREE pages go first (from the back), then IDLE
      // pages are unmapped (from the back).
      while (over() && ledger_.free_pages().value() > 0) {
        ledger_.ReclaimFreeBack();
      }
      std::vector<Unmap> unmaps;
      while (over() && ledger_.idle_pages_listed().value() > 0 && !failed_) {
        const PageId p = ledger_.idle_list().back();
        ledger_.BeginUnmap(p, Landing::kReclaimedFront);
        unmaps.push_back({p});
      }
      // Then pages leaving for FREE while engines let go of them (REVOKING)
      // are sent to RECLAIMED instead, lowest page id first.
      if (over() && !revoking_.empty()) {
        std::vector<PageId> leaving;
        for (const auto& [p, l] : revoking_) leaving.push_back(p);
        std::sort(leaving.begin(), leaving.end());
        for (PageId p : leaving) {
          if (!over()) break;
          if (ledger_.page(p).landing != Landing::kFreeBack) continue;
          ledger_.Redirect(p, Landing::kReclaimedFront);
        }
      }
      limit_state_ = over() ? LimitState::kDeferred : LimitState::kApplied;
      if (limit_state_ == LimitState::kApplied) AdmitReclaimedLocked();
      BumpGenerationLocked();
      // The outcome is this call's decision, taken here. Its unmaps run
      // without the lock, and a Free meanwhile may settle a deferred limit:
      // the reply then says DEFERRED, with the limit in force after the
      // call (APPLIED), as if that Free had come after this call.
      const LimitOutcome decided = state_outcome();
      CompleteUnmapsLocked(&unmaps, &epi.log);
      return current(decided);
    }();
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
  return result;
}

absl::StatusOr<TrimResult> PagePool::Trim(int64_t max_pages) {
  Epilogue epi;
  absl::StatusOr<TrimResult> result;
  {
    SpinThenLockGuard lock(&mu_);
    epi.before = generation_;
    result =
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<TrimResult> {
      KVB_RETURN_IF_ERROR(CheckUsableLocked());
      std::vector<Unmap> unmaps;
      // step_pages_ pages at a time; the pages taken so far are in flight.
      ++calls_in_flight_;
      auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return ledger_.idle_pages_listed().value() > 0 &&
               (max_pages <= 0 ||
                static_cast<int64_t>(unmaps.size()) < max_pages);
      };
      while (more()) {
        if (!unmaps.empty() && unmaps.size() % step_pages_ == 0) {
          StepLocked();
          if (failed_) break;
          // Other calls may have taken the IDLE pages meanwhile.
          if (!more()) break;
        }
        const PageId p = ledger_.idle_list().front();
        ledger_.BeginUnmap(p, Landing::kFreeBack);
        unmaps.push_back({p});
      }
      TrimResult out;
      out.pages_unmapped = CompleteUnmapsLocked(&unmaps, &epi.log);
      --calls_in_flight_;
      if (failed_) return CheckUsableLocked();
      out.generation = generation_;
      return out;
    }();
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
  return result;
}

absl::StatusOr<std::vector<PageOccupancy>> PagePool::GetPageOccupancy(
    const std::vector<PageId>& page_ids) {
  SpinThenLockGuard lock(&mu_);
  if (shut_down_) return CheckUsableLocked();
  const int64_t T = geometry_.page_count().value();
  std::vector<PageOccupancy> out;
  out.reserve(page_ids.size());
  for (PageId p : page_ids) {
    if (p < 0 || p >= T) {
      return InvalidField("page_ids",
                          absl::StrCat("page ", p, " is outside [0, ", T, ")"));
    }
    const PageLedger::Page& page = ledger_.page(p);
    PageOccupancy o;
    o.page_id = p;
    o.usable_blocks = BlockCount(page.usable);
    if (!committing_.empty() && UnshownLocked(p)) {
      o.state = PageState::kMapping;  // as Capacity shows it
      out.push_back(o);
      continue;
    }
    o.allocated_blocks = BlockCount(page.allocated);
    o.reserved_blocks = BlockCount(page.reserved);
    o.state = page.state;
    out.push_back(o);
  }
  return out;
}

}  // namespace kvbroker
