// PagePool: exact capacity, all-or-nothing acquisition, page lifecycle.
// The contract and the invariants are in page_pool.h.

#include "allocator/page_pool.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvbroker {
namespace {

constexpr int kStates = 7;

int StateIndex(PageState s) { return static_cast<int>(s); }

bool IsMapped(PageState s) {
  return s == PageState::kIdle || s == PageState::kOpen ||
         s == PageState::kFull || s == PageState::kMapping;
}

}  // namespace

const char* PageStateName(PageState s) {
  switch (s) {
    case PageState::kFree: return "FREE";
    case PageState::kMapping: return "MAPPING";
    case PageState::kIdle: return "IDLE";
    case PageState::kOpen: return "OPEN";
    case PageState::kFull: return "FULL";
    case PageState::kReclaimed: return "RECLAIMED";
    case PageState::kEmpty: return "EMPTY";
  }
  return "?";
}

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
// Construction and shutdown

PagePool::PagePool(Geometry geometry, Backend* backend, DeviceBudgets* budgets,
                   Clock* clock, PoolOptions options)
    : geometry_(std::move(geometry)),
      backend_(backend),
      budgets_(budgets),
      clock_(clock),
      options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  generation_ = options_.initial_generation;
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
  for (int i = 0; i < g.device_count(); ++i) {
    absl::StatusOr<VirtualRange> r =
        backend_->ReserveRange(g.devices()[i], g.virtual_bytes_per_device());
    if (!r.ok()) {
      for (int j = i - 1; j >= 0; --j) {
        (void)backend_->FreeRange(g.devices()[j], ranges_[j]);
      }
      ranges_.clear();
      return MakeFailure(
          FailureReason::kMappingFailed,
          absl::StrCat("cannot reserve ", g.virtual_bytes_per_device().value(),
                       " bytes of address space on device ", g.devices()[i],
                       ": ", r.status().message()),
          {{"virtual_bytes", Num(g.virtual_bytes_per_device().value())}});
    }
    ranges_.push_back(*r);
  }

  absl::MutexLock lock(&mu_);
  const int64_t T = g.page_count().value();
  pages_.resize(T);
  handles_.resize(T * g.device_count());
  owner_.assign(g.max_blocks(), BlockOwner::kNone);
  free_bits_.assign((g.max_blocks() + 63) / 64, 0);
  target_pages_ = T;
  for (PageId p = 0; p < T; ++p) {
    Page& page = pages_[p];
    const BlockRange r = g.range(p);
    page.begin = r.begin;
    page.end = r.end;
    page.usable = r.size();
    if (page.usable == 0) {
      page.state = PageState::kEmpty;
    } else {
      page.state = PageState::kFree;
      free_.PushBack(p, page.usable);
    }
    SetStateCountLocked(page.state, +1);
  }

  if (g.config().reserve_null_block) {
    // Block 0 lives on page 0 (B <= P), which is mapped now and never again
    // unmapped while the pool lives.
    if (!budgets_->TryCharge(g.devices(), g.bundle_bytes(), 1)) {
      return MakeFailure(FailureReason::kGpuMemoryExhausted,
                         "cannot afford the page of the null block",
                         {{"requested_pages", "1"}});
    }
    free_.PopFront();
    MapOutcome m = MapPageUnlocked(0);
    if (!m.status.ok()) {
      budgets_->Uncharge(g.devices(), g.bundle_bytes(), 1);
      return MappingErrorLocked(m, 1);
    }
    stats_.map_latency.Record(m.took);
    ChangeStateLocked(0, PageState::kMapping);
    MarkMappedLocked(0);
    std::vector<BlockId> got;
    TakeFromPageLocked(0, 1, BlockOwner::kNull, &got);
    AttachMappedLocked(0);  // -> OPEN or FULL
    null_blocks_ = 1;
  }
  return absl::OkStatus();
}

PagePool::~PagePool() { (void)Shutdown(/*force=*/true); }

absl::Status PagePool::Shutdown(bool force) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::OkStatus();
  if (!force && (allocated_ > 0 || reserved_ > 0)) {
    return MakeFailure(
        FailureReason::kPoolNotEmpty,
        absl::StrCat("pool ", name(), " holds ", allocated_, " allocated and ",
                     reserved_,
                     " reserved blocks; free them or delete with force"),
        {{"pool", name()},
         {"allocated_blocks", Num(allocated_)},
         {"reserved_blocks", Num(reserved_)}});
  }
  AwaitNoMappingLocked();
  shut_down_ = true;
  int64_t leaked = 0;
  for (PageId p = 0; p < static_cast<PageId>(pages_.size()); ++p) {
    if (!IsMapped(pages_[p].state)) continue;
    if (UnmapPageLocked(p).ok()) {
      budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(), 1);
    } else {
      ++leaked;
    }
  }
  for (size_t i = 0; i < ranges_.size(); ++i) {
    if (leaked == 0)
      (void)backend_->FreeRange(geometry_.devices()[i], ranges_[i]);
  }
  if (leaked > 0) {
    return absl::InternalError(absl::StrCat("pool ", name(), ": ", leaked,
                                            " page(s) could not be unmapped"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// State bookkeeping

void PagePool::SetStateCountLocked(PageState s, int64_t delta) {
  state_pages_[StateIndex(s)] += delta;
}

void PagePool::ChangeStateLocked(PageId p, PageState to) {
  SetStateCountLocked(pages_[p].state, -1);
  pages_[p].state = to;
  SetStateCountLocked(to, +1);
}

int64_t PagePool::MappedPagesLocked() const {
  return state_pages_[StateIndex(PageState::kIdle)] +
         state_pages_[StateIndex(PageState::kOpen)] +
         state_pages_[StateIndex(PageState::kFull)] +
         state_pages_[StateIndex(PageState::kMapping)];
}

void PagePool::DetachMappedLocked(PageId p) {
  Page& page = pages_[p];
  switch (page.state) {
    case PageState::kOpen:
      open_.erase({page.free, p});
      open_free_ -= page.free;
      break;
    case PageState::kIdle:
      // Callers detach IDLE pages only at the front of idle_ or after
      // removing them from it themselves.
      idle_usable_ -= page.usable;
      break;
    default: break;
  }
}

void PagePool::AttachMappedLocked(PageId p) {
  Page& page = pages_[p];
  PageState to;
  if (page.allocated + page.reserved == 0) {
    to = PageState::kIdle;
  } else if (page.free == 0) {
    to = PageState::kFull;
  } else {
    to = PageState::kOpen;
  }
  ChangeStateLocked(p, to);
  if (to == PageState::kOpen) {
    open_.insert({page.free, p});
    open_free_ += page.free;
  } else if (to == PageState::kIdle) {
    idle_usable_ += page.usable;
  }
}

void PagePool::MarkMappedLocked(PageId p) {
  Page& page = pages_[p];
  for (BlockId b = page.begin; b < page.end; ++b) {
    free_bits_[b >> 6] |= uint64_t{1} << (b & 63);
  }
  page.free = page.usable;
  ++stats_.pages_mapped_total;
  stats_.peak_mapped_pages =
      std::max(stats_.peak_mapped_pages, MappedPagesLocked());
}

void PagePool::MarkUnmappedLocked(PageId p) {
  Page& page = pages_[p];
  for (BlockId b = page.begin; b < page.end; ++b) {
    free_bits_[b >> 6] &= ~(uint64_t{1} << (b & 63));
  }
  page.free = 0;
  ++stats_.pages_unmapped_total;
}

int64_t PagePool::TakeFromPageLocked(PageId p, int64_t n, BlockOwner owner,
                                     std::vector<BlockId>* out) {
  Page& page = pages_[p];
  int64_t taken = 0;
  // A word at a time: mask the word to the page's range, take its set bits
  // lowest first, store the word back once.
  for (int64_t word = page.begin >> 6; taken < n && (word << 6) < page.end;
       ++word) {
    uint64_t bits = free_bits_[word];
    if ((word << 6) < page.begin) bits &= ~uint64_t{0} << (page.begin & 63);
    if (((word + 1) << 6) > page.end) {
      bits &= ~uint64_t{0} >> (64 - (page.end & 63));
    }
    if (bits == ~uint64_t{0} && n - taken >= 64) {  // a whole word
      const BlockId first = word << 6;
      std::fill_n(owner_.begin() + first, 64, owner);
      const size_t at = out->size();
      out->resize(at + 64);
      std::iota(out->begin() + at, out->end(), first);
      free_bits_[word] = 0;
      taken += 64;
      continue;
    }
    uint64_t took = 0;
    while (bits != 0 && taken < n) {
      const uint64_t lowest = bits & (~bits + 1);
      const BlockId found = (word << 6) + __builtin_ctzll(bits);
      bits ^= lowest;
      took |= lowest;
      owner_[found] = owner;
      out->push_back(found);
      ++taken;
    }
    free_bits_[word] &= ~took;
  }
  page.free -= taken;
  if (owner == BlockOwner::kReserved) {
    page.reserved += taken;
  } else {
    page.allocated += taken;
  }
  return taken;
}

PageId PagePool::PageOfLocked(BlockId b, PageId hint) const {
  if (hint >= 0 && b >= pages_[hint].begin && b < pages_[hint].end) {
    return hint;
  }
  return geometry_.page_of(b);
}

// ---------------------------------------------------------------------------
// Capacity

int64_t PagePool::AffordableLocked() const {
  return budgets_->AffordableBundles(geometry_.devices(),
                                     geometry_.bundle_bytes());
}

int64_t PagePool::MappedSupplyLocked() const {
  int64_t mapping = mapping_.has_value() ? pages_[*mapping_].usable : 0;
  return open_free_ + idle_usable_ + mapping;
}

int64_t PagePool::AvailableLocked(int64_t affordable) const {
  return MappedSupplyLocked() + free_.PrefixSum(affordable);
}

int64_t PagePool::TotalUnderLimitLocked() const {
  return geometry_.total_usable().value() - reclaimed_usable_ - null_blocks_;
}

absl::Status PagePool::CheckUsableLocked() const {
  if (shut_down_) {
    return MakeFailure(FailureReason::kPoolNotFound,
                       absl::StrCat("pool ", name(), " was deleted"),
                       {{"pool", name()}});
  }
  if (failed_) {
    return MakeFailure(FailureReason::kPoolFailed,
                       absl::StrCat("pool ", name(), " has failed: ", failure_,
                                    "; delete and recreate it"),
                       {{"pool", name()}, {"failure", failure_}});
  }
  return absl::OkStatus();
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
  const int64_t mapped = MappedPagesLocked() * per_page;
  info.overage_bytes =
      Bytes(std::max<int64_t>(0, mapped - info.effective_bytes.value()));
  return info;
}

absl::StatusOr<CapacitySnapshot> PagePool::Capacity(
    const CapacityQuery& query) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return CheckUsableLocked();
  ExpireLocked();
  CapacitySnapshot c;
  c.pool = name();
  c.pool_uid = options_.uid;
  c.generation = generation_;
  c.healthy = !failed_;
  c.failure = failure_;
  const int64_t affordable = AffordableLocked();
  c.affordable_bundles = affordable;
  // A FAILED pool refuses allocation, so it has nothing available.
  c.available_blocks = BlockCount(failed_ ? 0 : AvailableLocked(affordable));
  c.available_tokens =
      c.available_blocks.value() * geometry_.config().tokens_per_block;
  c.reserved_blocks = BlockCount(reserved_);
  c.allocated_blocks = BlockCount(allocated_);
  c.total_blocks = BlockCount(TotalUnderLimitLocked());
  c.pages_free = PageCount(state_pages_[StateIndex(PageState::kFree)]);
  c.pages_mapping = PageCount(state_pages_[StateIndex(PageState::kMapping)]);
  c.pages_idle = PageCount(state_pages_[StateIndex(PageState::kIdle)]);
  c.pages_open = PageCount(state_pages_[StateIndex(PageState::kOpen)]);
  c.pages_full = PageCount(state_pages_[StateIndex(PageState::kFull)]);
  c.pages_reclaimed =
      PageCount(state_pages_[StateIndex(PageState::kReclaimed)]);
  c.pages_empty = PageCount(state_pages_[StateIndex(PageState::kEmpty)]);
  const int64_t devices = geometry_.device_count();
  c.mapped_bytes =
      Bytes(MappedPagesLocked() * geometry_.bundle_bytes().value() * devices);
  c.virtual_bytes = geometry_.virtual_bytes_per_device() * devices;
  for (int d : geometry_.devices()) c.devices.push_back(budgets_->Snapshot(d));
  c.limit = LimitInfoLocked();

  if (query.max_pages > 0) {
    const size_t cap = static_cast<size_t>(query.max_pages);
    auto add = [&](PageId p, bool counted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (c.pages.size() >= cap) return false;
      const Page& page = pages_[p];
      PageInfo info;
      info.page_id = p;
      info.usable_blocks = BlockCount(page.usable);
      info.free_blocks =
          BlockCount(IsMapped(page.state) ? page.free : page.usable);
      info.allocated_blocks = BlockCount(page.allocated);
      info.reserved_blocks = BlockCount(page.reserved);
      info.state = page.state;
      info.counted = counted;
      c.pages.push_back(info);
      return true;
    };
    for (const auto& [free, p] : open_) {
      if (!add(p, true)) break;
    }
    for (PageId p : idle_) {
      if (!add(p, true)) break;
    }
    if (mapping_.has_value()) add(*mapping_, true);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (!add(free_[i].page, static_cast<int64_t>(i) < affordable)) break;
    }
  }
  return c;
}

// ---------------------------------------------------------------------------
// Planning: every refusal is decided here, before any mapping.

absl::StatusOr<PagePool::Plan> PagePool::PlanLocked(
    int64_t requested, int64_t from_reservation,
    const Reservation* reservation) {
  Plan plan;
  plan.from_reservation = from_reservation;
  const int64_t need = requested - from_reservation;
  const int64_t total = TotalUnderLimitLocked();
  const int64_t mapped_supply = MappedSupplyLocked();
  plan.from_pool = need;
  // Fast path: mapped pages cover the request; no budget lookup needed.
  if (requested <= total && need <= mapped_supply) return plan;
  const int64_t affordable = AffordableLocked();
  const int64_t available = mapped_supply + free_.PrefixSum(affordable);

  auto refuse =
      [&](FailureReason reason, std::string message, FailureMetadata md)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    md["pool"] = name();
    md["requested_blocks"] = Num(requested);
    md["available_blocks"] = Num(available);
    md["pool_total_blocks"] = Num(total);
    md["reserved_blocks"] = Num(reserved_);
    md["allocated_blocks"] = Num(allocated_);
    if (reservation != nullptr) {
      md["reservation_id"] = reservation->id;
      md["reservation_blocks"] = Num(from_reservation);
      md["pool_reason"] = std::string(ReasonName(reason));
      return MakeFailure(
          FailureReason::kReservationTooSmall,
          absl::StrCat("reservation ", reservation->id, " holds ",
                       from_reservation, " of ", requested,
                       " requested blocks and the pool cannot supply the "
                       "rest: ",
                       message),
          std::move(md));
    }
    return MakeFailure(reason, std::move(message), std::move(md));
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
        {{"target_pages", Num(target_pages_)},
         {"mapped_pages", Num(MappedPagesLocked())}});
  }
  const int64_t pages = free_.PagesToCover(beyond);
  if (pages > static_cast<int64_t>(free_.size())) {
    return refuse(FailureReason::kPoolExhausted,
                  absl::StrCat("requested ", requested, " blocks; pool ",
                               name(), " has ", available, " available now"),
                  {});
  }
  if (pages > affordable ||
      !budgets_->TryCharge(geometry_.devices(), geometry_.bundle_bytes(),
                           pages)) {
    FailureMetadata md = {
        {"required_pages", Num(pages)},
        {"affordable_pages", Num(affordable)},
        {"bundle_bytes", Num(geometry_.bundle_bytes().value())}};
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
// Mapping transactions

PagePool::MapOutcome PagePool::MapPageUnlocked(PageId p) {
  const Geometry& g = geometry_;
  const Bytes size = g.bundle_bytes();
  const uint64_t offset = g.page_offset(p).value();
  const int n = g.device_count();
  const absl::Time start = absl::Now();
  // Steps done so far on the device being mapped: 0 none, 1 created,
  // 2 mapped. Devices before it are fully done.
  int done_devices = 0;
  int step = 0;
  absl::Status error;
  for (; done_devices < n; ++done_devices) {
    const int dev = g.devices()[done_devices];
    const uint64_t va = ranges_[done_devices].base + offset;
    step = 0;
    absl::StatusOr<PhysicalHandle> h = backend_->Create(dev, size);
    if (!h.ok()) {
      error = h.status();
      break;
    }
    handles_[p * n + done_devices] = *h;
    step = 1;
    error = backend_->Map(dev, va, size, *h);
    if (!error.ok()) break;
    step = 2;
    error = backend_->SetAccess(dev, va, size);
    if (!error.ok()) break;
  }
  MapOutcome out;
  if (error.ok()) {
    out.took = absl::Now() - start;
    return out;
  }
  out.status = error;
  // Unwind in reverse: the failing device's finished steps, then every
  // earlier device.
  for (int i = done_devices; i >= 0; --i) {
    const int dev = g.devices()[i];
    const uint64_t va = ranges_[i].base + offset;
    const int steps = (i == done_devices) ? step : 2;
    if (steps >= 2 && !backend_->Unmap(dev, va, size).ok()) {
      out.unwound = false;
      continue;  // a handle still mapped must not be released
    }
    if (steps >= 1 && !backend_->Release(dev, handles_[p * n + i]).ok()) {
      out.unwound = false;
    }
  }
  return out;
}

absl::Status PagePool::UnmapPageLocked(PageId p) {
  const Geometry& g = geometry_;
  const Bytes size = g.bundle_bytes();
  const uint64_t offset = g.page_offset(p).value();
  const int n = g.device_count();
  const absl::Time start = absl::Now();
  absl::Status first;
  for (int i = n - 1; i >= 0; --i) {
    const int dev = g.devices()[i];
    absl::Status s = backend_->Unmap(dev, ranges_[i].base + offset, size);
    if (s.ok()) s = backend_->Release(dev, handles_[p * n + i]);
    if (!s.ok() && first.ok()) first = s;
  }
  if (first.ok()) stats_.unmap_latency.Record(absl::Now() - start);
  return first;
}

bool PagePool::UnmapIdleLocked(PageId p) {
  absl::Status s = UnmapPageLocked(p);
  if (!s.ok()) {
    MarkFailedLocked(
        absl::StrCat("unmapping page ", p, " failed: ", s.message()),
        /*device_lost=*/s.code() == absl::StatusCode::kInternal);
    return false;
  }
  budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(), 1);
  MarkUnmappedLocked(p);
  return true;
}

absl::Status PagePool::MappingErrorLocked(const MapOutcome& outcome,
                                          int64_t requested) {
  ++stats_.map_failures_total;
  (void)budgets_->RefreshAll();
  FailureMetadata md = {
      {"pool", name()},
      {"requested_blocks", Num(requested)},
      {"driver_error", std::string(outcome.status.message())}};
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
        /*device_lost=*/code == absl::StatusCode::kInternal);
    return MakeFailure(FailureReason::kPoolFailed,
                       absl::StrCat("pool ", name(), " failed: ", failure_),
                       std::move(md));
  }
  if (code == absl::StatusCode::kResourceExhausted) {
    return MakeFailure(
        FailureReason::kGpuMemoryExhausted,
        absl::StrCat("the device ran out of memory while mapping for pool ",
                     name(), " (rolled back): ", outcome.status.message()),
        std::move(md));
  }
  return MakeFailure(FailureReason::kMappingFailed,
                     absl::StrCat("mapping failed for pool ", name(),
                                  " (rolled back): ", outcome.status.message()),
                     std::move(md));
}

void PagePool::MarkFailedLocked(const std::string& why, bool device_lost) {
  device_lost_ = device_lost_ || device_lost;
  if (!failed_) {
    failed_ = true;
    failure_ = why;
    std::fprintf(stderr, "kvbroker: pool %s FAILED: %s\n", name().c_str(),
                 why.c_str());
  }
  BumpGenerationLocked();
}

// ---------------------------------------------------------------------------
// Acquisition

absl::StatusOr<std::vector<BlockId>> PagePool::AcquireLocked(
    const Plan& plan, BlockOwner owner, Reservation* reservation,
    int64_t* pages_mapped) {
  // Map the new pages first; nothing else has changed yet, so a failure
  // only has to undo the mappings.
  std::vector<PageId> fresh;
  fresh.reserve(plan.new_pages);
  for (int64_t i = 0; i < plan.new_pages; ++i) {
    fresh.push_back(free_[i].page);
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    MapOutcome m = MapPageUnlocked(fresh[i]);
    if (m.status.ok()) {
      stats_.map_latency.Record(m.took);
      continue;
    }
    // Roll back this call's earlier pages, newest first.
    for (size_t j = i; j-- > 0;) {
      if (!UnmapPageLocked(fresh[j]).ok()) m.unwound = false;
    }
    // Budget for pages whose unmap failed stays charged: that memory is
    // still held.
    budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(),
                       m.unwound ? plan.new_pages : plan.new_pages - i);
    return MappingErrorLocked(m, plan.from_reservation + plan.from_pool);
  }
  *pages_mapped = plan.new_pages;

  std::vector<BlockId> out;
  out.reserve(plan.from_reservation + plan.from_pool);
  // 1. The caller's reservation.
  if (plan.from_reservation > 0) {
    PageId hint = -1;
    for (int64_t i = 0; i < plan.from_reservation; ++i) {
      BlockId b = reservation->blocks[i];
      hint = PageOfLocked(b, hint);
      Page& page = pages_[hint];
      --page.reserved;
      ++page.allocated;
      --reserved_;
      ++allocated_;
      owner_[b] = BlockOwner::kAllocated;
      out.push_back(b);
    }
    reservation->blocks.erase(
        reservation->blocks.begin(),
        reservation->blocks.begin() + plan.from_reservation);
  }
  // The fresh pages join the IDLE list's back, where step 3 reaches them
  // after the older IDLE pages.
  for (PageId p : fresh) {
    free_.PopFront();
    ChangeStateLocked(p, PageState::kIdle);
    MarkMappedLocked(p);
    idle_.push_back(p);
    idle_usable_ += pages_[p].usable;
  }
  int64_t need = plan.from_pool;
  // 2. OPEN pages, best fit.
  while (need > 0 && !open_.empty()) {
    auto it = open_.lower_bound({need, PageId{-1}});
    if (it == open_.end()) {
      // None covers the need: the most free blocks, lowest id among ties.
      it = open_.lower_bound({std::prev(open_.end())->first, PageId{-1}});
    }
    const PageId p = it->second;
    DetachMappedLocked(p);
    need -= TakeFromPageLocked(p, need, owner, &out);
    AttachMappedLocked(p);
  }
  // 3. IDLE pages, front first (the fresh ones are at the back).
  while (need > 0 && !idle_.empty()) {
    const PageId p = idle_.front();
    idle_.pop_front();
    DetachMappedLocked(p);
    need -= TakeFromPageLocked(p, need, owner, &out);
    AttachMappedLocked(p);
    if (pages_[p].state == PageState::kIdle) idle_.push_front(p);
  }
  if (need != 0) {
    // PlanLocked guaranteed the supply; reaching here is a bug.
    MarkFailedLocked(
        absl::StrCat("internal error: acquisition short by ", need, " blocks"),
        /*device_lost=*/false);
    return absl::InternalError("acquisition short of its plan");
  }
  if (owner == BlockOwner::kReserved) {
    reserved_ += plan.from_pool;
  } else {
    allocated_ += plan.from_pool;
  }
  return out;
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

// The ids themselves would make the fingerprint (and every remembered
// Free) as long as the request; a 64-bit hash of them, with the count,
// tells a retry from another request just as well within one process.
std::string FreeFingerprint(const FreeRequest& r) {
  return absl::StrCat(
      "free/", r.block_ids.size(), "/",
      absl::Hex(absl::Hash<absl::Span<const BlockId>>{}(r.block_ids)));
}

std::string ReserveFingerprint(const ReserveRequest& r) {
  return absl::StrCat("reserve/", r.num_blocks, "/",
                      absl::ToInt64Nanoseconds(r.ttl));
}

}  // namespace

absl::StatusOr<AllocResult> PagePool::Alloc(const AllocRequest& request) {
  uint64_t before, after;
  bool prealloc = false;
  absl::StatusOr<AllocResult> result;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<AllocResult> {
      if (request.num_blocks < 0) {
        return InvalidField("num_blocks", "must not be negative");
      }
      KVB_RETURN_IF_ERROR(CheckUsableLocked());
      const std::string fingerprint =
          request.request_id.empty() ? "" : AllocFingerprint(request);
      for (;;) {
        ExpireLocked();
        if (std::optional<absl::StatusOr<AllocResult>> replay =
                ReplayLocked<AllocResult>(request.request_id, fingerprint)) {
          return *std::move(replay);
        }
        KVB_RETURN_IF_ERROR(CheckUsableLocked());
        if (request.expected_generation.has_value() &&
            *request.expected_generation != generation_) {
          return MakeFailure(
              FailureReason::kGenerationMismatch,
              absl::StrCat("pool ", name(), " is at generation ", generation_,
                           ", not ", *request.expected_generation,
                           "; re-read capacity"),
              {{"pool", name()},
               {"expected_generation",
                absl::StrCat(*request.expected_generation)},
               {"current_generation", absl::StrCat(generation_)}});
        }
        Reservation* reservation = nullptr;
        if (!request.reservation_id.empty()) {
          KVB_RETURN_IF_ERROR(
              FindReservationLocked(request.reservation_id, &reservation));
        }
        const int64_t from_res =
            reservation == nullptr
                ? 0
                : std::min<int64_t>(request.num_blocks,
                                    reservation->blocks.size());
        // A page being mapped by the prealloc worker is counted as IDLE; a
        // request that needs it waits for its mapping (one page, bounded).
        if (mapping_.has_value() &&
            request.num_blocks - from_res > open_free_ + idle_usable_) {
          AwaitNoMappingLocked();
          continue;
        }
        absl::StatusOr<Plan> plan =
            PlanLocked(request.num_blocks, from_res, reservation);
        if (!plan.ok()) return plan.status();
        AllocResult out;
        absl::StatusOr<std::vector<BlockId>> blocks = AcquireLocked(
            *plan, BlockOwner::kAllocated, reservation, &out.pages_mapped);
        if (!blocks.ok()) return blocks.status();
        out.num_blocks = static_cast<int64_t>(blocks->size());
        out.pages = GroupByPage(*std::move(blocks));
        if (out.num_blocks > 0 || out.pages_mapped > 0) BumpGenerationLocked();
        out.generation = generation_;
        stats_.blocks_allocated_total += out.num_blocks;
        if (!request.request_id.empty()) {
          RememberLocked(request.request_id, fingerprint, out);
        }
        return out;
      }
    }();
    ++stats_.alloc_calls;
    ++stats_.outcomes[static_cast<int>(GetReason(result.status()))];
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return result;
}

absl::StatusOr<ReservationInfo> PagePool::Reserve(
    const ReserveRequest& request) {
  uint64_t before, after;
  bool prealloc = false;
  absl::StatusOr<ReservationInfo> result;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<ReservationInfo> {
      if (request.num_blocks <= 0) {
        return InvalidField("num_blocks", "must be positive");
      }
      if (request.ttl <= absl::ZeroDuration()) {
        return InvalidField("ttl", "must be positive");
      }
      KVB_RETURN_IF_ERROR(CheckUsableLocked());
      const std::string fingerprint =
          request.request_id.empty() ? "" : ReserveFingerprint(request);
      for (;;) {
        ExpireLocked();
        if (std::optional<absl::StatusOr<ReservationInfo>> replay =
                ReplayLocked<ReservationInfo>(request.request_id,
                                              fingerprint)) {
          return *std::move(replay);
        }
        KVB_RETURN_IF_ERROR(CheckUsableLocked());
        if (mapping_.has_value() &&
            request.num_blocks > open_free_ + idle_usable_) {
          AwaitNoMappingLocked();
          continue;
        }
        absl::StatusOr<Plan> plan = PlanLocked(request.num_blocks, 0, nullptr);
        if (!plan.ok()) return plan.status();
        int64_t mapped = 0;
        absl::StatusOr<std::vector<BlockId>> blocks =
            AcquireLocked(*plan, BlockOwner::kReserved, nullptr, &mapped);
        if (!blocks.ok()) return blocks.status();
        std::sort(blocks->begin(), blocks->end());
        Reservation r;
        r.id = absl::StrCat("res-", next_reservation_++);
        r.blocks = *blocks;
        r.expires = clock_->Now() + request.ttl;
        expiry_.insert({r.expires, r.id});
        ReservationInfo info;
        info.reservation_id = r.id;
        info.num_blocks = static_cast<int64_t>(r.blocks.size());
        info.pages = GroupByPage(r.blocks);
        info.expires = r.expires;
        reservations_.emplace(r.id, std::move(r));
        BumpGenerationLocked();
        info.generation = generation_;
        if (!request.request_id.empty()) {
          RememberLocked(request.request_id, fingerprint, info);
        }
        return info;
      }
    }();
    ++stats_.reserve_calls;
    ++stats_.outcomes[static_cast<int>(GetReason(result.status()))];
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return result;
}

absl::StatusOr<FreeResult> PagePool::Free(const FreeRequest& request) {
  uint64_t before, after;
  bool prealloc = false;
  absl::StatusOr<FreeResult> result;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    result =
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<FreeResult> {
      if (shut_down_) return CheckUsableLocked();
      ExpireLocked();
      const std::string fingerprint =
          request.request_id.empty() ? "" : FreeFingerprint(request);
      if (std::optional<absl::StatusOr<FreeResult>> replay =
              ReplayLocked<FreeResult>(request.request_id, fingerprint)) {
        return *std::move(replay);
      }
      // Validate everything before changing anything.
      // Ids as Alloc handed them out are already ascending: no copy then.
      std::vector<BlockId> sorted_copy;
      absl::Span<const BlockId> ascending = request.block_ids;
      if (!std::is_sorted(ascending.begin(), ascending.end())) {
        sorted_copy.assign(ascending.begin(), ascending.end());
        std::sort(sorted_copy.begin(), sorted_copy.end());
        ascending = sorted_copy;
      }
      if (auto dup = std::adjacent_find(ascending.begin(), ascending.end());
          dup != ascending.end()) {
        return MakeFailure(
            FailureReason::kInvalidArgument,
            absl::StrCat("block ", *dup, " is named more than once"),
            {{"field", "block_ids"}, {"block_id", Num(*dup)}},
            {{"block_ids",
              absl::StrCat("block ", *dup, " is named more than once")}});
      }
      std::vector<BlockId> not_allocated, in_reservation;
      for (BlockId b : request.block_ids) {
        if (b < 0 || b >= geometry_.max_blocks() ||
            (owner_[b] != BlockOwner::kAllocated &&
             owner_[b] != BlockOwner::kReserved)) {
          not_allocated.push_back(b);
        } else if (owner_[b] == BlockOwner::kReserved) {
          in_reservation.push_back(b);
        }
      }
      auto first_ids = [](const std::vector<BlockId>& ids) {
        std::vector<BlockId> head(
            ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 16));
        return absl::StrJoin(head, ",");
      };
      if (!not_allocated.empty()) {
        return MakeFailure(
            FailureReason::kBlockNotAllocated,
            absl::StrCat(not_allocated.size(), " of ", request.block_ids.size(),
                         " blocks are not allocated (first: ",
                         not_allocated.front(), "); nothing was freed"),
            {{"pool", name()},
             {"block_id", Num(not_allocated.front())},
             {"block_ids", first_ids(not_allocated)},
             {"not_allocated_blocks", Num(not_allocated.size())},
             {"requested_blocks", Num(request.block_ids.size())}});
      }
      if (!in_reservation.empty()) {
        return MakeFailure(
            FailureReason::kBlockInReservation,
            absl::StrCat(in_reservation.size(),
                         " blocks are held by a reservation (first: ",
                         in_reservation.front(),
                         "); release the reservation instead; nothing was "
                         "freed"),
            {{"pool", name()},
             {"block_id", Num(in_reservation.front())},
             {"block_ids", first_ids(in_reservation)},
             {"reserved_blocks_named", Num(in_reservation.size())}});
      }
      FreeResult out;
      out.pages_unmapped = ReturnBlocksLocked(ascending);
      out.freed_blocks = static_cast<int64_t>(ascending.size());
      stats_.blocks_freed_total += out.freed_blocks;
      if (out.freed_blocks > 0) BumpGenerationLocked();
      out.generation = generation_;
      if (!request.request_id.empty()) {
        RememberLocked(request.request_id, fingerprint, out);
      }
      return out;
    }();
    ++stats_.free_calls;
    ++stats_.outcomes[static_cast<int>(GetReason(result.status()))];
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return result;
}

void PagePool::OnPageEmptiedLocked(PageId p, int64_t* unmapped) {
  Page& page = pages_[p];
  // The page is detached from every index and holds only free blocks.
  const bool over_limit =
      MappedPagesLocked() + static_cast<int64_t>(free_.size()) > target_pages_;
  if (failed_ || (!over_limit && static_cast<int64_t>(idle_.size()) <
                                     options_.max_idle_pages)) {
    AttachMappedLocked(p);  // -> IDLE
    idle_.push_back(p);
    return;
  }
  if (!UnmapIdleLocked(p)) {
    AttachMappedLocked(p);  // the pool is FAILED; keep the page accounted
    idle_.push_back(p);
    return;
  }
  ++*unmapped;
  if (over_limit) {
    ChangeStateLocked(p, PageState::kReclaimed);
    reclaimed_.push_back(p);
    reclaimed_usable_ += page.usable;
  } else {
    ChangeStateLocked(p, PageState::kFree);
    free_.PushBack(p, page.usable);
  }
}

void PagePool::SettleLimitLocked() {
  if (limit_state_ != LimitState::kDeferred) return;
  if (MappedPagesLocked() + static_cast<int64_t>(free_.size()) >
      target_pages_) {
    return;
  }
  limit_state_ = LimitState::kApplied;
  AdmitReclaimedLocked();
}

void PagePool::AdmitReclaimedLocked() {
  // Reclaimed ids come back before every other FREE page, in their order.
  std::vector<PageId> back;
  while (!reclaimed_.empty() && MappedPagesLocked() +
                                        static_cast<int64_t>(free_.size()) +
                                        static_cast<int64_t>(back.size()) <
                                    target_pages_) {
    back.push_back(reclaimed_.front());
    reclaimed_.pop_front();
  }
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    reclaimed_usable_ -= pages_[*it].usable;
    ChangeStateLocked(*it, PageState::kFree);
    free_.PushFront(*it, pages_[*it].usable);
  }
}

absl::StatusOr<ReleaseResult> PagePool::ReleaseReservation(
    const std::string& reservation_id) {
  uint64_t before, after;
  bool prealloc = false;
  absl::StatusOr<ReleaseResult> result;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<ReleaseResult> {
      if (shut_down_) return CheckUsableLocked();
      ExpireLocked();
      Reservation* r = nullptr;
      KVB_RETURN_IF_ERROR(FindReservationLocked(reservation_id, &r));
      ReleaseResult out;
      out.released_blocks = static_cast<int64_t>(r->blocks.size());
      ReleaseReservationLocked(*r);
      reservations_.erase(reservation_id);
      BumpGenerationLocked();
      out.generation = generation_;
      return out;
    }();
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return result;
}

void PagePool::ReleaseReservationLocked(Reservation& r) {
  expiry_.erase({r.expires, r.id});
  ReturnBlocksLocked(r.blocks);  // ascending
  r.blocks.clear();
}

int64_t PagePool::ReturnBlocksLocked(absl::Span<const BlockId> ascending) {
  absl::InlinedVector<PageId, 4> touched;
  for (size_t i = 0; i < ascending.size();) {
    const PageId p = geometry_.page_of(ascending[i]);
    Page& page = pages_[p];
    DetachMappedLocked(p);  // OPEN or FULL: it holds block ascending[i]
    touched.push_back(p);
    int64_t reserved = 0, allocated = 0;
    for (; i < ascending.size() && ascending[i] < page.end; ++i) {
      const BlockId b = ascending[i];
      if (owner_[b] == BlockOwner::kReserved) {
        ++reserved;
      } else {
        ++allocated;
      }
      owner_[b] = BlockOwner::kNone;
      free_bits_[b >> 6] |= uint64_t{1} << (b & 63);
    }
    page.reserved -= reserved;
    page.allocated -= allocated;
    page.free += reserved + allocated;
    reserved_ -= reserved;
    allocated_ -= allocated;
  }
  int64_t unmapped = 0;
  for (PageId p : touched) {
    if (pages_[p].allocated + pages_[p].reserved == 0) {
      OnPageEmptiedLocked(p, &unmapped);
    } else {
      AttachMappedLocked(p);
    }
  }
  SettleLimitLocked();
  return unmapped;
}

absl::Status PagePool::FindReservationLocked(const std::string& id,
                                             Reservation** out) {
  auto it = reservations_.find(id);
  if (it != reservations_.end()) {
    *out = &it->second;
    return absl::OkStatus();
  }
  if (expired_.count(id) > 0) {
    return MakeFailure(FailureReason::kReservationExpired,
                       absl::StrCat("reservation ", id, " in pool ", name(),
                                    " has expired; its blocks went back to "
                                    "the pool"),
                       {{"pool", name()}, {"reservation_id", id}});
  }
  return MakeFailure(FailureReason::kReservationNotFound,
                     absl::StrCat("no reservation ", id, " in pool ", name()),
                     {{"pool", name()}, {"reservation_id", id}});
}

void PagePool::ExpireLocked() {
  if (expiry_.empty()) return;  // the common case reads no clock
  const absl::Time now = clock_->Now();
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    const std::string id = expiry_.begin()->second;
    auto it = reservations_.find(id);
    if (it == reservations_.end()) {
      expiry_.erase(expiry_.begin());
      continue;
    }
    ReleaseReservationLocked(it->second);  // erases the expiry entry
    reservations_.erase(it);
    expired_.insert(id);
    expired_order_.push_back(id);
    while (static_cast<int64_t>(expired_order_.size()) >
           options_.expired_reservations_remembered) {
      expired_.erase(expired_order_.front());
      expired_order_.pop_front();
    }
    ++stats_.reservations_expired_total;
    BumpGenerationLocked();
  }
}

void PagePool::ExpireReservations() {
  uint64_t before, after;
  bool prealloc = false;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    if (!shut_down_) ExpireLocked();
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
}

void PagePool::AwaitNoMappingLocked() {
  mu_.Await(absl::Condition(
      +[](std::optional<PageId>* m) { return !m->has_value(); }, &mapping_));
}

template <typename T>
std::optional<absl::StatusOr<T>> PagePool::ReplayLocked(
    const std::string& request_id, const std::string& fingerprint) {
  if (request_id.empty()) return std::nullopt;
  absl::StatusOr<const Remembered*> seen =
      RecallLocked(request_id, fingerprint);
  if (!seen.ok()) return absl::StatusOr<T>(seen.status());
  if (*seen == nullptr) return std::nullopt;
  ++stats_.idempotent_replays_total;
  T replay = std::get<T>((*seen)->result);
  replay.replayed = true;
  return absl::StatusOr<T>(std::move(replay));
}

absl::StatusOr<const PagePool::Remembered*> PagePool::RecallLocked(
    const std::string& request_id, const std::string& fingerprint) {
  const absl::Time now = clock_->Now();
  while (!remembered_order_.empty() &&
         (remembered_order_.front().first + options_.idempotency_window < now ||
          static_cast<int64_t>(remembered_order_.size()) >
              options_.idempotency_capacity)) {
    remembered_.erase(remembered_order_.front().second);
    remembered_order_.pop_front();
  }
  auto it = remembered_.find(request_id);
  if (it == remembered_.end()) return nullptr;
  if (it->second.fingerprint != fingerprint) {
    return MakeFailure(
        FailureReason::kRequestIdReused,
        absl::StrCat("request_id ", request_id,
                     " was already used with other parameters in pool ",
                     name()),
        {{"pool", name()},
         {"request_id", request_id},
         {"first_request", it->second.fingerprint},
         {"this_request", fingerprint}});
  }
  return &it->second;
}

void PagePool::RememberLocked(
    const std::string& request_id, std::string fingerprint,
    std::variant<AllocResult, FreeResult, ReservationInfo> result) {
  const absl::Time now = clock_->Now();
  remembered_[request_id] =
      Remembered{std::move(fingerprint), std::move(result), now};
  remembered_order_.push_back({now, request_id});
}

// ---------------------------------------------------------------------------
// Limits, trim, occupancy

absl::StatusOr<LimitResult> PagePool::SetMemoryLimit(Bytes limit_bytes,
                                                     int64_t revision) {
  uint64_t before, after;
  bool prealloc = false;
  absl::StatusOr<LimitResult> result;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    result = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                 mu_) -> absl::StatusOr<LimitResult> {
      if (limit_bytes.value() < 0) {
        return InvalidField("limit_bytes", "must not be negative");
      }
      if (revision < 0) return InvalidField("revision", "must not be negative");
      if (shut_down_) return CheckUsableLocked();
      ExpireLocked();
      auto current =
          [&](LimitOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            LimitResult r;
            r.outcome = outcome;
            r.limit = LimitInfoLocked();
            r.mapped_bytes =
                Bytes(MappedPagesLocked() * geometry_.bundle_bytes().value() *
                      geometry_.device_count());
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
      AwaitNoMappingLocked();
      const int64_t per_page =
          geometry_.bundle_bytes().value() * geometry_.device_count();
      limit_bytes_ = limit_bytes;
      limit_revision_ = revision;
      target_pages_ = std::min(limit_bytes.value() / per_page,
                               geometry_.page_count().value());
      auto admitted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return MappedPagesLocked() + static_cast<int64_t>(free_.size());
      };
      // Lowering: unmapped FREE pages go first (from the back), then IDLE
      // pages are unmapped (from the back).
      while (admitted() > target_pages_ && !free_.empty()) {
        internal::FreeList::Entry e = free_.PopBack();
        ChangeStateLocked(e.page, PageState::kReclaimed);
        reclaimed_.push_front(e.page);
        reclaimed_usable_ += e.usable;
      }
      while (admitted() > target_pages_ && !idle_.empty() && !failed_) {
        const PageId p = idle_.back();
        idle_.pop_back();
        DetachMappedLocked(p);
        if (!UnmapIdleLocked(p)) {
          AttachMappedLocked(p);
          idle_.push_back(p);
          break;
        }
        ChangeStateLocked(p, PageState::kReclaimed);
        reclaimed_.push_front(p);
        reclaimed_usable_ += pages_[p].usable;
      }
      limit_state_ = admitted() > target_pages_ ? LimitState::kDeferred
                                                : LimitState::kApplied;
      if (limit_state_ == LimitState::kApplied) AdmitReclaimedLocked();
      BumpGenerationLocked();
      return current(state_outcome());
    }();
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return result;
}

absl::StatusOr<TrimResult> PagePool::Trim(int64_t max_pages) {
  uint64_t before, after;
  bool prealloc = false;
  absl::StatusOr<TrimResult> result;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    result =
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<TrimResult> {
      KVB_RETURN_IF_ERROR(CheckUsableLocked());
      AwaitNoMappingLocked();
      TrimResult out;
      while (!idle_.empty() &&
             (max_pages <= 0 || out.pages_unmapped < max_pages)) {
        const PageId p = idle_.front();
        if (pages_[p].allocated > 0) break;  // the null block's page stays
        idle_.pop_front();
        DetachMappedLocked(p);
        if (!UnmapIdleLocked(p)) {
          AttachMappedLocked(p);
          idle_.push_front(p);
          return CheckUsableLocked();
        }
        ChangeStateLocked(p, PageState::kFree);
        free_.PushBack(p, pages_[p].usable);
        ++out.pages_unmapped;
      }
      if (out.pages_unmapped > 0) BumpGenerationLocked();
      out.generation = generation_;
      return out;
    }();
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return result;
}

absl::StatusOr<std::vector<PageOccupancy>> PagePool::GetPageOccupancy(
    const std::vector<PageId>& page_ids) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return CheckUsableLocked();
  std::vector<PageOccupancy> out;
  out.reserve(page_ids.size());
  for (PageId p : page_ids) {
    if (p < 0 || p >= static_cast<PageId>(pages_.size())) {
      return InvalidField(
          "page_ids",
          absl::StrCat("page ", p, " is outside [0, ", pages_.size(), ")"));
    }
    const Page& page = pages_[p];
    PageOccupancy o;
    o.page_id = p;
    o.usable_blocks = BlockCount(page.usable);
    o.allocated_blocks = BlockCount(page.allocated);
    o.reserved_blocks = BlockCount(page.reserved);
    o.state = page.state;
    out.push_back(o);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Prealloc worker

bool PagePool::PreallocStep() {
  PageId p;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || failed_ || mapping_.has_value()) return false;
    if (static_cast<int64_t>(idle_.size()) >= options_.min_idle_pages) {
      return false;
    }
    if (limit_state_ == LimitState::kDeferred || free_.empty()) return false;
    if (!budgets_->TryCharge(geometry_.devices(), geometry_.bundle_bytes(),
                             1)) {
      return false;
    }
    p = free_.PopFront().page;
    ChangeStateLocked(p, PageState::kMapping);
    mapping_ = p;
  }
  // Only this thread touches page p's handles while it is MAPPING.
  MapOutcome m = MapPageUnlocked(p);
  uint64_t before, after;
  bool prealloc = false;
  bool more = false;
  {
    absl::MutexLock lock(&mu_);
    before = generation_;
    mapping_.reset();
    if (m.status.ok()) {
      stats_.map_latency.Record(m.took);
      MarkMappedLocked(p);
      AttachMappedLocked(p);  // MAPPING -> IDLE
      idle_.push_back(p);
      ++stats_.prealloc_pages_total;
      BumpGenerationLocked();
      more = static_cast<int64_t>(idle_.size()) < options_.min_idle_pages;
    } else {
      ChangeStateLocked(p, PageState::kFree);
      free_.PushFront(p, pages_[p].usable);
      if (m.unwound) {
        budgets_->Uncharge(geometry_.devices(), geometry_.bundle_bytes(), 1);
      }
      (void)MappingErrorLocked(m, 0);  // marks FAILED when it must
      BumpGenerationLocked();
    }
    after = generation_;
    prealloc = NeedsPreallocLocked();
  }
  NotifyIfChanged(before, after, prealloc);
  return more;
}

// ---------------------------------------------------------------------------
// Helpers

std::vector<PageBlocks> PagePool::GroupByPage(
    std::vector<BlockId> blocks) const {
  // Acquisition yields ascending ids within each page; one page's blocks
  // (the common case) need no sort.
  if (!std::is_sorted(blocks.begin(), blocks.end())) {
    std::sort(blocks.begin(), blocks.end());
  }
  std::vector<PageBlocks> out;
  if (blocks.empty()) return out;
  const PageId first = geometry_.page_of(blocks.front());
  if (blocks.back() < pages_[first].end) {
    out.push_back({first, std::move(blocks)});
    return out;
  }
  for (auto it = blocks.begin(); it != blocks.end();) {
    const PageId p =
        PageOfLocked(*it, out.empty() ? PageId{-1} : out.back().page_id);
    const BlockId end = pages_[p].end;
    auto group_end =
        std::find_if(it, blocks.end(), [end](BlockId b) { return b >= end; });
    out.push_back({p, std::vector<BlockId>(it, group_end)});
    it = group_end;
  }
  return out;
}

void PagePool::BumpGenerationLocked() { ++generation_; }

void PagePool::NotifyIfChanged(uint64_t before, uint64_t after, bool prealloc) {
  if (after != before && options_.on_change) options_.on_change(name());
  if (prealloc && options_.on_prealloc_needed) options_.on_prealloc_needed();
}

bool PagePool::NeedsPreallocLocked() const {
  return !shut_down_ && !failed_ && !mapping_.has_value() &&
         static_cast<int64_t>(idle_.size()) < options_.min_idle_pages &&
         limit_state_ != LimitState::kDeferred && !free_.empty();
}

uint64_t PagePool::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool PagePool::healthy() const {
  absl::MutexLock lock(&mu_);
  return !failed_;
}

bool PagePool::device_lost() const {
  absl::MutexLock lock(&mu_);
  return device_lost_;
}

PoolStats PagePool::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status PagePool::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  return CheckInvariantsLocked();
}

absl::Status PagePool::CheckInvariantsLocked() const {
  auto fail = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("invariant: ", parts...));
  };
  const int64_t T = static_cast<int64_t>(pages_.size());
  std::array<int64_t, kStates> by_state = {};
  int64_t open_free = 0, idle_usable = 0, allocated = 0, reserved = 0;
  int64_t reclaimed_usable = 0;
  for (PageId p = 0; p < T; ++p) {
    const Page& page = pages_[p];
    ++by_state[StateIndex(page.state)];
    const BlockRange range = geometry_.range(p);
    if (page.usable != range.size() || page.begin != range.begin ||
        page.end != range.end) {
      return fail("page ", p, " usable ", page.usable);
    }
    BlockRange r = geometry_.range(p);
    int64_t free_bits = 0, alloc_owned = 0, res_owned = 0;
    for (BlockId b = r.begin; b < r.end; ++b) {
      const bool bit = (free_bits_[b >> 6] >> (b & 63)) & 1;
      free_bits += bit;
      alloc_owned +=
          owner_[b] == BlockOwner::kAllocated || owner_[b] == BlockOwner::kNull;
      res_owned += owner_[b] == BlockOwner::kReserved;
      if (bit && owner_[b] != BlockOwner::kNone) {
        return fail("block ", b, " is free and owned");
      }
    }
    if (IsMapped(page.state) && page.state != PageState::kMapping) {
      if (page.free + page.allocated + page.reserved != page.usable) {
        return fail("page ", p, " free+allocated+reserved != usable");
      }
      if (free_bits != page.free || alloc_owned != page.allocated ||
          res_owned != page.reserved) {
        return fail("page ", p, " counts disagree with block owners");
      }
      const PageState expect =
          page.allocated + page.reserved == 0
              ? PageState::kIdle
              : (page.free == 0 ? PageState::kFull : PageState::kOpen);
      if (page.state != expect) {
        return fail("page ", p, " state ", PageStateName(page.state),
                    " expected ", PageStateName(expect));
      }
    } else if (page.free != 0 || page.allocated != 0 || page.reserved != 0 ||
               free_bits != 0 || alloc_owned != 0 || res_owned != 0) {
      return fail("unmapped page ", p, " holds blocks");
    }
    if (page.state == PageState::kOpen) open_free += page.free;
    if (page.state == PageState::kIdle) idle_usable += page.usable;
    if (page.state == PageState::kReclaimed) reclaimed_usable += page.usable;
    allocated += page.allocated;
    reserved += page.reserved;
  }
  // Straddling blocks are never owned or free.
  for (BlockId b = 0; b < geometry_.max_blocks(); ++b) {
    if (!geometry_.is_usable_block(b) &&
        (owner_[b] != BlockOwner::kNone ||
         ((free_bits_[b >> 6] >> (b & 63)) & 1))) {
      return fail("unusable block ", b, " is in use");
    }
  }
  if (by_state != state_pages_) return fail("page state counts");
  if (open_free != open_free_)
    return fail("open_free ", open_free, " vs ", open_free_);
  if (idle_usable != idle_usable_) return fail("idle_usable");
  if (reclaimed_usable != reclaimed_usable_) return fail("reclaimed_usable");
  if (allocated - null_blocks_ != allocated_) return fail("allocated");
  if (reserved != reserved_) return fail("reserved");
  if (static_cast<int64_t>(open_.size()) !=
      by_state[StateIndex(PageState::kOpen)]) {
    return fail("open index size");
  }
  for (const auto& [free, p] : open_) {
    if (pages_[p].state != PageState::kOpen || pages_[p].free != free) {
      return fail("open index entry for page ", p);
    }
  }
  if (static_cast<int64_t>(idle_.size()) !=
      by_state[StateIndex(PageState::kIdle)]) {
    return fail("idle list size");
  }
  for (PageId p : idle_) {
    if (pages_[p].state != PageState::kIdle) return fail("idle list page ", p);
  }
  if (static_cast<int64_t>(free_.size()) !=
      by_state[StateIndex(PageState::kFree)]) {
    return fail("free list size ", free_.size(), " vs ",
                by_state[StateIndex(PageState::kFree)]);
  }
  int64_t before = free_.empty() ? 0 : free_[0].before;
  for (size_t i = 0; i < free_.size(); ++i) {
    const auto& e = free_[i];
    if (pages_[e.page].state != PageState::kFree ||
        e.usable != pages_[e.page].usable || e.before != before) {
      return fail("free list entry ", i);
    }
    before += e.usable;
  }
  if (static_cast<int64_t>(reclaimed_.size()) !=
      by_state[StateIndex(PageState::kReclaimed)]) {
    return fail("reclaimed list size");
  }
  int64_t reserved_in_res = 0;
  for (const auto& [id, r] : reservations_) {
    reserved_in_res += static_cast<int64_t>(r.blocks.size());
    for (BlockId b : r.blocks) {
      if (owner_[b] != BlockOwner::kReserved) {
        return fail("reservation ", id, " block ", b, " not reserved");
      }
    }
  }
  if (reserved_in_res != reserved_) return fail("reservation totals");
  const int64_t admitted =
      MappedPagesLocked() + static_cast<int64_t>(free_.size());
  if (limit_state_ != LimitState::kDeferred && admitted > target_pages_) {
    return fail("admitted ", admitted, " > target ", target_pages_);
  }
  if (limit_state_ == LimitState::kDeferred && !free_.empty()) {
    return fail("FREE pages while DEFERRED");
  }
  return absl::OkStatus();
}

}  // namespace kvbroker
