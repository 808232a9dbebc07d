// PagePool: construction, shutdown and the release of what a shut-down pool
// still holds, and the prealloc worker's step: the parts of the pool that
// bring its pages up and take them down outside the callers' entry points.
// The contract is in page_pool.h; the design in docs/design.md.

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "allocator/page_pool.h"
#include "common/error_keys.h"

namespace kvbroker {

// ---------------------------------------------------------------------------
// Construction and shutdown

PagePool::PagePool(Geometry geometry, Backend* backend, DeviceBudgets* budgets,
                   Clock* clock, PoolOptions options)
    : geometry_(std::move(geometry)),
      backend_(backend),
      budgets_(budgets),
      clock_(clock),
      options_(std::move(options)),
      step_pages_(
          static_cast<size_t>(std::max<int64_t>(1, options_.step_pages))),
      free_one_step_blocks_(static_cast<size_t>(
          std::max<int64_t>(0, options_.free_one_step_blocks))),
      mapper_(&geometry_, backend, budgets),
      announcer_(&geometry_, &mapper_, options_.max_revocation_pages),
      ledger_(&geometry_),
      tags_(geometry_.max_blocks()),
      reservations_(options_.expired_reservations_remembered),
      remembered_(options_.idempotency_window, options_.idempotency_capacity) {
  SpinThenLockGuard lock(&mu_);
  generation_ = options_.initial_generation;
  freeing_.assign((geometry_.max_blocks() + 63) / 64, 0);
  target_pages_ = geometry_.page_count().value();
  PublishLocked();
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(
    const PoolConfig& config, Backend* backend, DeviceBudgets* budgets,
    Clock* clock, PoolOptions options) {
  Bytes granularity = backend->granularity(0);
  for (int d : config.devices) {
    if (d >= 0 && d < backend->device_count()) {
      granularity = std::max(granularity, backend->granularity(d));
    }
  }
  absl::StatusOr<Geometry> geometry =
      Geometry::Create(config, granularity, backend->device_count());
  if (!geometry.ok()) return geometry.status();
  if (config.min_idle_pages >= 0) {
    options.min_idle_pages = config.min_idle_pages;
  }
  if (config.max_idle_pages >= 0) {
    options.max_idle_pages = config.max_idle_pages;
  }
  if (options.min_idle_pages > options.max_idle_pages) {
    options.max_idle_pages = options.min_idle_pages;
  }
  std::unique_ptr<PagePool> pool(new PagePool(
      *std::move(geometry), backend, budgets, clock, std::move(options)));
  if (absl::Status s = pool->Init(); !s.ok()) return s;
  return pool;
}

absl::Status PagePool::Init() {
  const Geometry& g = geometry_;
  int failed_device = -1;
  if (absl::Status s = mapper_.ReserveRanges(&failed_device); !s.ok()) {
    return MakeFailure(
        FailureReason::kMappingFailed,
        absl::StrCat("cannot reserve ", g.virtual_bytes_per_device().value(),
                     " bytes of address space on device ", failed_device, ": ",
                     s.message()),
        {{std::string(error_key::kVirtualBytes),
          Num(g.virtual_bytes_per_device().value())}});
  }
  Epilogue epi;
  absl::Status result;
  {
    SpinThenLockGuard lock(&mu_);
    target_pages_ = g.page_count().value();
    if (g.config().reserve_null_block) {
      // Block 0 lives on page 0 (B <= P), the front of the FREE list; it is
      // mapped now and never again unmapped while the pool lives.
      if (!budgets_->TryCharge(g.devices(), g.bundle_bytes(), 1)) {
        return MakeFailure(FailureReason::kGpuMemoryExhausted,
                           "cannot afford the page of the null block",
                           {{std::string(error_key::kRequestedPages), "1"}});
      }
      const PageId p = ledger_.BeginMapFront(PageCount(1)).front();
      BundleMapper::MapOutcome m;
      ++calls_in_flight_;
      WithoutLock([&] {
        m = mapper_.Map(p);
        if (!m.status.ok()) {
          if (m.unwound) budgets_->Uncharge(g.devices(), g.bundle_bytes(), 1);
          (void)budgets_->RefreshAll();
        } else {
          announcer_.Announce({p});
        }
      });
      --calls_in_flight_;
      if (!m.status.ok()) {
        if (!m.unwound) ++stranded_pages_;
        ledger_.AbortMap({p});
        result = MappingErrorLocked(m, 1, &epi.log, Counted::kNo);
      } else {
        stats_.map_latency.Record(m.took);
        ++stats_.pages_mapped_total;
        stats_.peak_mapped_pages = 1;
        Stretches got;
        ledger_.CommitMap(p, BlockCount(1), BlockOwner::kNull, &got);
      }
    }
    PublishLocked();
  }
  if (!epi.log.empty()) std::fputs(epi.log.c_str(), stderr);
  return result;
}

PagePool::~PagePool() {
  (void)Shutdown(/*force=*/true);
  {
    // No listener is left (each holds the pool while registered); pages
    // still kept for engines go with the rest.
    SpinThenLockGuard lock(&mu_);
    engines_hold_.clear();
    ReleaseLeftoversLocked();
  }
  if (const int64_t left = mapper_.held_handles(); left > 0) {
    std::fprintf(stderr,
                 "kvbroker: pool %s destroyed holding %lld backend handle(s) "
                 "that could not be released\n",
                 name().c_str(), static_cast<long long>(left));
  }
}

absl::Status PagePool::Shutdown(bool force) {
  SpinThenLockGuard lock(&mu_);
  if (shut_down_) return absl::OkStatus();
  // The blocks are counted once no call is in flight: an Alloc still
  // mapping, or between two of its commit steps, holds blocks the ledger
  // shows only in part.
  PublishLocked();
  mu_.Await(absl::Condition(
      +[](int64_t* calls) { return *calls == 0; }, &calls_in_flight_));
  if (shut_down_) return absl::OkStatus();  // another Shutdown meanwhile
  const int64_t allocated = ledger_.allocated().value();
  const int64_t reserved = ledger_.reserved().value();
  if (!force && (allocated > 0 || reserved > 0)) {
    return MakeFailure(
        FailureReason::kPoolNotEmpty,
        absl::StrCat("pool ", name(), " holds ", allocated, " allocated and ",
                     reserved,
                     " reserved blocks; free them or delete with force"),
        {{std::string(error_key::kPool), name()},
         {std::string(error_key::kAllocatedBlocks), Num(allocated)},
         {std::string(error_key::kReservedBlocks), Num(reserved)}});
  }
  shut_down_ = true;
  // From here every call answers POOL_NOT_FOUND and leaves the pages alone.
  // Engines are asked to let go of every mapped page; until they have (or
  // left), the pages they know keep their handles. Pages still revoking
  // wait for their own revocations.
  const PageId pages = geometry_.page_count().value();
  engines_hold_.assign(pages, false);
  std::vector<PageId> mapped;
  for (PageId p = 0; p < pages; ++p) {
    const PageState s = ledger_.page(p).state;
    if (revoking_.contains(p)) {
      engines_hold_[p] = true;
    } else if (s == PageState::kIdle || s == PageState::kOpen ||
               s == PageState::kFull) {
      engines_hold_[p] = true;
      mapped.push_back(p);
    }
  }
  revoking_.clear();
  // The mapped pages and the stranded ones are exactly what is charged.
  charged_after_shutdown_ = ledger_.mapped_pages().value() + stranded_pages_;
  stranded_pages_ = 0;
  const absl::Time deadline = clock_->Now() + options_.revoke_timeout;
  std::vector<PageId> unknown;
  WithoutLock([&] {
    unknown = announcer_.Revoke(mapped, deadline);
    announcer_.Close();
  });
  for (PageId p : unknown) engines_hold_[p] = false;
  const int64_t held = ReleaseLeftoversLocked();
  if (held > 0) {
    return absl::InternalError(
        absl::StrCat("pool ", name(), ": ", held,
                     " page(s) could not be unmapped and released; their ",
                     mapper_.held_handles(), " handle(s) are kept for retry"));
  }
  return absl::OkStatus();
}

int64_t PagePool::ReleaseLeftovers() {
  SpinThenLockGuard lock(&mu_);
  if (!shut_down_) return 0;
  return ReleaseLeftoversLocked();
}

int64_t PagePool::ReleaseLeftoversLocked() {
  if (releasing_) {
    release_again_ = true;
    return charged_after_shutdown_;
  }
  int64_t held = 0;
  do {
    release_again_ = false;
    if (mapper_.held_handles() == 0 && !mapper_.has_ranges()) return 0;
    const std::vector<bool> keep = engines_hold_;
    const int64_t kept = std::count(keep.begin(), keep.end(), true);
    releasing_ = true;
    WithoutLock([&] {
      held = mapper_.ReleaseHeld(keep);
      if (held == 0 && kept == 0 && mapper_.has_ranges()) mapper_.FreeRanges();
    });
    releasing_ = false;
    budgets_->Uncharge(
        geometry_.devices(), geometry_.bundle_bytes(),
        std::max<int64_t>(0, charged_after_shutdown_ - held - kept));
    charged_after_shutdown_ = held + kept;
  } while (release_again_);
  return held;
}

int64_t PagePool::backend_handles() const { return mapper_.held_handles(); }

// ---------------------------------------------------------------------------
// Prealloc worker

bool PagePool::PreallocStep() {
  Epilogue epi;
  bool more = false;
  {
    SpinThenLockGuard lock(&mu_);
    if (!NeedsPreallocLocked()) return false;
    if (!budgets_->TryCharge(geometry_.devices(), geometry_.bundle_bytes(),
                             1)) {
      return false;
    }
    epi.before = generation_;
    prealloc_running_ = true;
    const PageId p = ledger_.BeginMapFront(PageCount(1)).front();
    BundleMapper::MapOutcome m;
    ++calls_in_flight_;
    WithoutLock([&] {
      m = mapper_.Map(p);
      if (m.status.ok()) announcer_.Announce({p});
      if (!m.status.ok()) {
        if (m.unwound) {
          budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(), 1);
        }
        (void)budgets_->RefreshAll();
      }
    });
    --calls_in_flight_;
    prealloc_running_ = false;
    if (m.status.ok()) {
      stats_.map_latency.Record(m.took);
      ledger_.CommitMap(p, BlockCount(0), BlockOwner::kAllocated, nullptr);
      ++stats_.pages_mapped_total;
      stats_.peak_mapped_pages =
          std::max(stats_.peak_mapped_pages, ledger_.mapped_pages().value());
      ++stats_.prealloc_pages_total;
      BumpGenerationLocked();
      more = ledger_.idle_pages_listed().value() < options_.min_idle_pages;
    } else {
      if (!m.unwound) ++stranded_pages_;
      ledger_.AbortMap({p});
      // FAILED when it must be.
      (void)MappingErrorLocked(m, 0, &epi.log, Counted::kNo);
    }
    CloseLocked(&epi);
  }
  RunEpilogue(epi);
  return more;
}

}  // namespace kvbroker
