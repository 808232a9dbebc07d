// ReferenceModel: explicit state, recomputed by walking. See the header.

#include "allocator/testing/reference_model.h"

#include <algorithm>
#include <cassert>
#include <set>
#include <sstream>

namespace kvbroker {
namespace reference {
namespace {

using i128 = __int128;

bool Mapped(MPage s) {
  return s == MPage::kIdle || s == MPage::kOpen || s == MPage::kFull;
}

}  // namespace

const char* MPageName(MPage s) {
  switch (s) {
    case MPage::kFree: return "FREE";
    case MPage::kIdle: return "IDLE";
    case MPage::kOpen: return "OPEN";
    case MPage::kFull: return "FULL";
    case MPage::kReclaimed: return "RECLAIMED";
    case MPage::kEmpty: return "EMPTY";
    case MPage::kMapping: return "MAPPING";
    case MPage::kRevoking: return "REVOKING";
  }
  return "?";
}

ReferenceModel::ReferenceModel(const ModelConfig& config, ModelPolicy policy)
    : config_(config), policy_(policy) {
  const i128 P = config_.page_size, B = config_.block_bytes;
  T_ = static_cast<int64_t>((i128{config_.max_blocks} * B + P - 1) / P);
  target_ = T_;
  page_.assign(T_, MPage::kFree);
  block_.assign(config_.max_blocks, MBlock::kUnusable);
  for (int64_t p = 0; p < T_; ++p) {
    if (usable(p) == 0) {
      page_[p] = MPage::kEmpty;
      continue;
    }
    for (int64_t b = range_begin(p); b < range_end(p); ++b) {
      block_[b] = MBlock::kUnmapped;
    }
    free_list_.push_back(p);
  }
  if (config_.reserve_null_block) {
    // Block 0 is always usable and lives on page 0, the front of the list.
    assert(!free_list_.empty() && free_list_.front() == 0);
    free_list_.pop_front();
    MapPage(0);
    block_[0] = MBlock::kNull;
    SetMappedStateByCounts(0);
  }
}

// ---- geometry ----

int64_t ReferenceModel::range_begin(int64_t p) const {
  const i128 P = config_.page_size, B = config_.block_bytes;
  return static_cast<int64_t>((i128{p} * P + B - 1) / B);
}

int64_t ReferenceModel::range_end(int64_t p) const {
  const i128 P = config_.page_size, B = config_.block_bytes;
  return std::min<int64_t>(static_cast<int64_t>((i128{p + 1} * P) / B),
                           config_.max_blocks);
}

int64_t ReferenceModel::usable(int64_t p) const {
  return std::max<int64_t>(0, range_end(p) - range_begin(p));
}

int64_t ReferenceModel::page_of(int64_t b) const {
  return static_cast<int64_t>(i128{b} * config_.block_bytes /
                              config_.page_size);
}

bool ReferenceModel::is_usable_block(int64_t b) const {
  if (b < 0 || b >= config_.max_blocks) return false;
  int64_t p = page_of(b);
  return b >= range_begin(p) && b < range_end(p);
}

int64_t ReferenceModel::bundle_bytes() const {
  return config_.page_size * config_.num_layers * config_.num_kv_buffers;
}

// ---- walks ----

int64_t ReferenceModel::free_blocks(int64_t p) const {
  int64_t n = 0;
  for (int64_t b = range_begin(p); b < range_end(p); ++b) {
    n += block_[b] == MBlock::kFree;
  }
  return n;
}

int64_t ReferenceModel::allocated_on(int64_t p) const {
  int64_t n = 0;
  for (int64_t b = range_begin(p); b < range_end(p); ++b) {
    n += block_[b] == MBlock::kAllocated || block_[b] == MBlock::kNull;
  }
  return n;
}

int64_t ReferenceModel::reserved_on(int64_t p) const {
  int64_t n = 0;
  for (int64_t b = range_begin(p); b < range_end(p); ++b) {
    n += block_[b] == MBlock::kReserved;
  }
  return n;
}

int64_t ReferenceModel::PagesIn(MPage s) const {
  return std::count(page_.begin(), page_.end(), s);
}

int64_t ReferenceModel::MappedPages() const {
  return std::count_if(page_.begin(), page_.end(), Mapped) +
         PagesIn(MPage::kMapping) + PagesIn(MPage::kRevoking);
}

int64_t ReferenceModel::Affordable() const {
  return std::max<int64_t>(0, config_.budget_bundles - MappedPages());
}

int64_t ReferenceModel::AvailableBlocks() const {
  int64_t total = 0;
  for (int64_t p = 0; p < T_; ++p) {
    if (page_[p] == MPage::kOpen) total += free_blocks(p);
    if (page_[p] == MPage::kIdle) total += usable(p);
  }
  const int64_t a =
      std::min<int64_t>(Affordable(), static_cast<int64_t>(free_list_.size()));
  for (int64_t i = 0; i < a; ++i) total += usable(free_list_[i]);
  return total;
}

int64_t ReferenceModel::AllocatedBlocks() const {
  return std::count(block_.begin(), block_.end(), MBlock::kAllocated);
}

int64_t ReferenceModel::ReservedBlocks() const {
  return std::count(block_.begin(), block_.end(), MBlock::kReserved);
}

std::vector<int64_t> ReferenceModel::AllocatedIds() const {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < config_.max_blocks; ++b) {
    if (block_[b] == MBlock::kAllocated) ids.push_back(b);
  }
  return ids;
}

FailureReason ReferenceModel::ExpectedRefusal(int64_t need) const {
  int64_t admitted_usable = 0, mapped_supply = 0, free_total = 0;
  for (int64_t p = 0; p < T_; ++p) {
    if (Mapped(page_[p]) || page_[p] == MPage::kFree ||
        page_[p] == MPage::kMapping) {
      admitted_usable += usable(p);
    }
    if (page_[p] == MPage::kOpen) mapped_supply += free_blocks(p);
    if (page_[p] == MPage::kIdle) mapped_supply += usable(p);
    if (page_[p] == MPage::kFree) free_total += usable(p);
  }
  if (config_.reserve_null_block) admitted_usable -= 1;
  if (need > admitted_usable) return FailureReason::kRequestTooLarge;
  if (limit_state_ == MLimitState::kDeferred) {
    return FailureReason::kShrinkPending;
  }
  if (need <= mapped_supply + free_total) {
    return FailureReason::kGpuMemoryExhausted;
  }
  return FailureReason::kPoolExhausted;
}

// ---- page transitions ----

void ReferenceModel::MapPage(int64_t p) {
  assert(page_[p] == MPage::kFree);
  for (int64_t b = range_begin(p); b < range_end(p); ++b) {
    assert(block_[b] == MBlock::kUnmapped);
    block_[b] = MBlock::kFree;
  }
  page_[p] = MPage::kIdle;  // the caller sets the final state
}

void ReferenceModel::UnmapPage(int64_t p) {
  for (int64_t b = range_begin(p); b < range_end(p); ++b) {
    assert(block_[b] == MBlock::kFree);
    block_[b] = MBlock::kUnmapped;
  }
}

void ReferenceModel::SetMappedStateByCounts(int64_t p) {
  const int64_t f = free_blocks(p);
  if (f == usable(p)) {
    page_[p] = MPage::kIdle;
  } else if (f == 0) {
    page_[p] = MPage::kFull;
  } else {
    page_[p] = MPage::kOpen;
  }
}

int64_t ReferenceModel::TakeFromPage(int64_t p, int64_t k, MBlock owner,
                                     std::vector<int64_t>* out) {
  int64_t taken = 0;
  for (int64_t b = range_begin(p); b < range_end(p) && taken < k; ++b) {
    if (block_[b] != MBlock::kFree) continue;
    block_[b] = owner;
    out->push_back(b);
    ++taken;
  }
  SetMappedStateByCounts(p);
  return taken;
}

void ReferenceModel::TakeLocked(int64_t need, MBlock owner,
                                std::vector<int64_t>* out,
                                int64_t* pages_mapped) {
  // 1. OPEN pages, best fit. Pages that become OPEN during this call (from
  // IDLE or FREE) are never revisited: only the last page taken can stay
  // OPEN.
  std::vector<std::pair<int64_t, int64_t>> open;  // (page, free)
  for (int64_t p = 0; p < T_; ++p) {
    if (page_[p] == MPage::kOpen) open.push_back({p, free_blocks(p)});
  }
  while (need > 0) {
    int64_t best = -1, most = -1;
    for (size_t i = 0; i < open.size(); ++i) {
      const int64_t f = open[i].second;
      if (f == 0) continue;
      if (f >= need && (best < 0 || f < open[best].second)) best = i;
      if (most < 0 || f > open[most].second) most = i;
    }
    const int64_t pick = best >= 0 ? best : most;
    if (pick < 0) break;
    const int64_t k = std::min(need, open[pick].second);
    TakeFromPage(open[pick].first, k, owner, out);
    open[pick].second -= k;
    need -= k;
  }
  // 2. IDLE pages, front first.
  while (need > 0 && !idle_list_.empty()) {
    const int64_t p = idle_list_.front();
    idle_list_.pop_front();
    need -= TakeFromPage(p, need, owner, out);
  }
  // 3. FREE pages, front first (the caller checked affordability).
  while (need > 0) {
    assert(!free_list_.empty());
    const int64_t p = free_list_.front();
    free_list_.pop_front();
    MapPage(p);
    ++*pages_mapped;
    need -= TakeFromPage(p, need, owner, out);
  }
  std::sort(out->begin(), out->end());
}

void ReferenceModel::RequeueFreeAtBack(int64_t p) {
  if (page_[p] != MPage::kFree) return;
  free_list_.erase(std::find(free_list_.begin(), free_list_.end(), p));
  free_list_.push_back(p);
}

void ReferenceModel::Reclaim(int64_t p, bool to_front) {
  page_[p] = MPage::kReclaimed;
  if (to_front) {
    reclaimed_.push_front(p);
  } else {
    reclaimed_.push_back(p);
  }
}

void ReferenceModel::OnPageEmptied(int64_t p, int64_t* unmapped) {
  if (Admitted() > target_) {
    Leave(p,
          policy_.emptied_reclaims_to_front ? Landing::kReclaimedFront
                                            : Landing::kReclaimedBack,
          unmapped);
  } else if (static_cast<int64_t>(idle_list_.size()) < config_.max_idle_pages) {
    page_[p] = MPage::kIdle;
    idle_list_.push_back(p);
  } else {
    Leave(p, Landing::kFreeBack, unmapped);
  }
}

void ReferenceModel::Land(int64_t p, Landing to) {
  if (to == Landing::kFreeBack) {
    page_[p] = MPage::kFree;
    free_list_.push_back(p);
  } else {
    Reclaim(p, to == Landing::kReclaimedFront);
  }
}

void ReferenceModel::Leave(int64_t p, Landing to, int64_t* unmapped) {
  UnmapPage(p);
  if (listening_) {
    page_[p] = MPage::kRevoking;
    revoking_now_.push_back({p, to});
    return;
  }
  Land(p, to);
  ++*unmapped;
}

int64_t ReferenceModel::RevokingToReclaimed() const {
  int64_t n = 0;
  auto count = [&](const std::vector<std::pair<int64_t, Landing>>& r) {
    for (const auto& [p, to] : r) n += to != Landing::kFreeBack;
  };
  count(revoking_now_);
  for (const auto& r : revocations_) count(r);
  return n;
}

void ReferenceModel::CloseRevocation() {
  if (revoking_now_.empty()) return;
  revocations_.push_back(std::move(revoking_now_));
  revoking_now_.clear();
}

void ReferenceModel::LandRevocation(
    const std::vector<std::pair<int64_t, Landing>>& r) {
  for (const auto& [p, to] : r) Land(p, to);
  Settle();
  if (limit_state_ == MLimitState::kApplied) AdmitReclaimed();
}

void ReferenceModel::SetListening(bool on) {
  listening_ = on;
  if (on) return;
  std::vector<std::pair<int64_t, Landing>> all;
  for (const auto& r : revocations_) all.insert(all.end(), r.begin(), r.end());
  revocations_.clear();
  if (!all.empty()) LandRevocation(all);
}

bool ReferenceModel::AckOldestRevocation() {
  if (revocations_.empty()) return false;
  std::vector<std::pair<int64_t, Landing>> r = std::move(revocations_.front());
  revocations_.pop_front();
  LandRevocation(r);
  return true;
}

void ReferenceModel::ReturnBlocks(const std::vector<int64_t>& ascending,
                                  int64_t* unmapped) {
  for (size_t i = 0; i < ascending.size(); ++i) {
    const int64_t b = ascending[i];
    block_[b] = MBlock::kFree;
    const int64_t p = page_of(b);
    const bool last_of_page =
        i + 1 == ascending.size() || page_of(ascending[i + 1]) != p;
    if (!last_of_page) continue;
    if (free_blocks(p) == usable(p)) {
      OnPageEmptied(p, unmapped);
    } else {
      SetMappedStateByCounts(p);
    }
  }
  Settle();
}

void ReferenceModel::Settle() {
  if (limit_state_ == MLimitState::kDeferred && Admitted() <= target_) {
    limit_state_ = MLimitState::kApplied;
    AdmitReclaimed();
  }
}

void ReferenceModel::AdmitReclaimed() {
  int64_t room = target_ - Admitted();
  std::vector<int64_t> back;  // in RECLAIMED order
  while (room > 0 && !reclaimed_.empty()) {
    if (policy_.readmit_from_front) {
      back.push_back(reclaimed_.front());
      reclaimed_.pop_front();
    } else {
      back.insert(back.begin(), reclaimed_.back());
      reclaimed_.pop_back();
    }
    --room;
  }
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    page_[*it] = MPage::kFree;
    free_list_.push_front(*it);
  }
}

// ---- operations ----

MOutcome ReferenceModel::Alloc(int64_t n) {
  MOutcome out;
  if (n < 0) {
    out.reason = FailureReason::kInvalidArgument;
    return out;
  }
  if (n > AvailableBlocks()) {
    out.reason = ExpectedRefusal(n);
    return out;
  }
  TakeLocked(n, MBlock::kAllocated, &out.ids, &out.pages_mapped);
  return out;
}

MOutcome ReferenceModel::AllocFromReservation(const std::string& id,
                                              int64_t n) {
  MOutcome out;
  if (n < 0) {
    out.reason = FailureReason::kInvalidArgument;
    return out;
  }
  auto it = reservations_.find(id);
  if (it == reservations_.end()) {
    out.reason = FailureReason::kReservationNotFound;
    return out;
  }
  std::vector<int64_t>& held = it->second;
  const int64_t r = static_cast<int64_t>(held.size());
  const int64_t from_pool = std::max<int64_t>(0, n - r);
  if (from_pool > AvailableBlocks()) {
    out.reason = FailureReason::kReservationTooSmall;
    return out;
  }
  const int64_t from_res = std::min(n, r);
  for (int64_t i = 0; i < from_res; ++i) {
    block_[held[i]] = MBlock::kAllocated;
    out.ids.push_back(held[i]);
  }
  held.erase(held.begin(), held.begin() + from_res);
  if (from_pool > 0) {
    TakeLocked(from_pool, MBlock::kAllocated, &out.ids, &out.pages_mapped);
  }
  std::sort(out.ids.begin(), out.ids.end());
  return out;
}

MOutcome ReferenceModel::Reserve(int64_t n, const std::string& id) {
  MOutcome out;
  if (n <= 0) {
    out.reason = FailureReason::kInvalidArgument;
    return out;
  }
  if (n > AvailableBlocks()) {
    out.reason = ExpectedRefusal(n);
    return out;
  }
  assert(reservations_.count(id) == 0);
  TakeLocked(n, MBlock::kReserved, &out.ids, &out.pages_mapped);
  reservations_[id] = out.ids;
  return out;
}

MOutcome ReferenceModel::Free(const std::vector<int64_t>& ids) {
  MOutcome out;
  std::set<int64_t> seen;
  for (int64_t b : ids) {
    if (!seen.insert(b).second) {
      out.reason = FailureReason::kInvalidArgument;
      return out;
    }
  }
  for (int64_t b : ids) {
    if (b < 0 || b >= config_.max_blocks) {
      out.reason = FailureReason::kBlockNotAllocated;
      return out;
    }
    if (block_[b] == MBlock::kReserved) {
      out.reason = FailureReason::kBlockInReservation;
      return out;
    }
    if (block_[b] != MBlock::kAllocated) {
      out.reason = FailureReason::kBlockNotAllocated;
      return out;
    }
  }
  std::vector<int64_t> sorted(seen.begin(), seen.end());
  ReturnBlocks(sorted, &out.pages_unmapped);
  CloseRevocation();
  out.ids = sorted;
  return out;
}

MOutcome ReferenceModel::Release(const std::string& id) {
  MOutcome out;
  auto it = reservations_.find(id);
  if (it == reservations_.end()) {
    out.reason = FailureReason::kReservationNotFound;
    return out;
  }
  std::vector<int64_t> blocks = it->second;
  reservations_.erase(it);
  std::sort(blocks.begin(), blocks.end());
  ReturnBlocks(blocks, &out.pages_unmapped);
  CloseRevocation();
  out.ids = blocks;
  return out;
}

void ReferenceModel::DropReservation(const std::string& id) {
  auto it = reservations_.find(id);
  assert(it != reservations_.end() && it->second.empty());
  reservations_.erase(it);
}

MLimitResult ReferenceModel::SetMemoryLimit(int64_t limit_bytes,
                                            int64_t revision) {
  MLimitResult out;
  if (limit_bytes < 0 || revision < 0) {
    out.ok = false;
    return out;
  }
  auto current = [&](MLimitOutcome o) {
    out.outcome = o;
    out.state = limit_state_;
    out.target_pages = target_;
    out.revision = revision_;
    return out;
  };
  if (revision < revision_) return current(MLimitOutcome::kStale);
  if (revision == revision_) {
    if (limit_bytes != limit_bytes_) return current(MLimitOutcome::kConflict);
    return current(limit_state_ == MLimitState::kDeferred
                       ? MLimitOutcome::kDeferred
                       : MLimitOutcome::kApplied);
  }
  revision_ = revision;
  limit_bytes_ = limit_bytes;
  const i128 per_page = i128{bundle_bytes()} * config_.devices;
  target_ = static_cast<int64_t>(
      std::min<i128>(i128{limit_bytes} / per_page, i128{T_}));
  while (Admitted() > target_ && !free_list_.empty()) {
    const int64_t p = free_list_.back();
    free_list_.pop_back();
    Reclaim(p, policy_.lowering_reclaims_to_front);
  }
  while (Admitted() > target_ && !idle_list_.empty()) {
    const int64_t p = idle_list_.back();
    idle_list_.pop_back();
    Leave(p,
          policy_.lowering_reclaims_to_front ? Landing::kReclaimedFront
                                             : Landing::kReclaimedBack,
          &out.pages_unmapped);
  }
  CloseRevocation();
  // Then REVOKING pages bound for FREE go to RECLAIMED, lowest id first.
  for (int64_t p = 0; p < T_ && Admitted() > target_; ++p) {
    if (page_[p] != MPage::kRevoking) continue;
    for (auto& r : revocations_) {
      for (auto& [q, to] : r) {
        if (q == p && to == Landing::kFreeBack) to = Landing::kReclaimedFront;
      }
    }
  }
  if (Admitted() > target_) {
    limit_state_ = MLimitState::kDeferred;
  } else {
    limit_state_ = MLimitState::kApplied;
    AdmitReclaimed();
  }
  return current(limit_state_ == MLimitState::kDeferred
                     ? MLimitOutcome::kDeferred
                     : MLimitOutcome::kApplied);
}

int64_t ReferenceModel::Trim(int64_t max_pages) {
  int64_t n = 0, unmapped = 0;
  while (!idle_list_.empty() && (max_pages <= 0 || n < max_pages)) {
    const int64_t p = idle_list_.front();
    idle_list_.pop_front();
    Leave(p, Landing::kFreeBack, &unmapped);
    ++n;
  }
  CloseRevocation();
  return unmapped;
}

bool ReferenceModel::PreallocStep() {
  if (static_cast<int64_t>(idle_list_.size()) >= config_.min_idle_pages ||
      free_list_.empty() || Affordable() < 1) {
    return false;
  }
  const int64_t p = free_list_.front();
  free_list_.pop_front();
  MapPage(p);
  page_[p] = MPage::kIdle;
  idle_list_.push_back(p);
  return true;
}

// ---- mapping in flight ----

bool ReferenceModel::WouldMap(int64_t n) const {
  int64_t mapped_supply = 0;
  for (int64_t p = 0; p < T_; ++p) {
    if (page_[p] == MPage::kOpen) mapped_supply += free_blocks(p);
    if (page_[p] == MPage::kIdle) mapped_supply += usable(p);
  }
  return n > mapped_supply && n <= AvailableBlocks();
}

MInFlight ReferenceModel::BeginAcquire(int64_t n, MBlock owner) {
  assert(WouldMap(n));
  MInFlight f;
  f.owner = owner;
  // Every free block of OPEN pages and every IDLE page: take them all, the
  // order does not matter when all are taken.
  for (int64_t p = 0; p < T_; ++p) {
    if (page_[p] == MPage::kOpen) {
      n -= TakeFromPage(p, usable(p), owner, &f.taken);
    }
  }
  for (int64_t p : idle_list_) {
    f.from_idle.push_back(p);
    n -= TakeFromPage(p, usable(p), owner, &f.taken);
  }
  idle_list_.clear();
  if (owner == MBlock::kReserved) reserving_ += f.taken.size();
  f.fresh_need = n;
  while (n > 0) {
    const int64_t p = free_list_.front();
    free_list_.pop_front();
    page_[p] = MPage::kMapping;
    f.pages.push_back(p);
    n -= usable(p);
  }
  return f;
}

MOutcome ReferenceModel::CommitAcquire(const MInFlight& f,
                                       const std::string& id) {
  MOutcome out;
  out.ids = f.taken;
  if (f.owner == MBlock::kReserved) reserving_ -= f.taken.size();
  int64_t need = f.fresh_need;
  for (int64_t p : f.pages) {
    page_[p] = MPage::kFree;
    MapPage(p);
    ++out.pages_mapped;
    need -= TakeFromPage(p, need, f.owner, &out.ids);
  }
  std::sort(out.ids.begin(), out.ids.end());
  if (f.owner == MBlock::kReserved) reservations_[id] = out.ids;
  return out;
}

void ReferenceModel::AbortAcquire(const MInFlight& f) {
  if (f.owner == MBlock::kReserved) reserving_ -= f.taken.size();
  for (auto it = f.pages.rbegin(); it != f.pages.rend(); ++it) {
    page_[*it] = MPage::kFree;
    free_list_.push_front(*it);
  }
  for (int64_t b : f.taken) block_[b] = MBlock::kFree;
  for (int64_t p = 0; p < T_; ++p) {
    if (Mapped(page_[p])) SetMappedStateByCounts(p);
  }
  idle_list_.insert(idle_list_.begin(), f.from_idle.begin(), f.from_idle.end());
}

// ---- checks ----

std::string ReferenceModel::SelfCheck() const {
  std::ostringstream err;
  std::vector<int> listed(T_, 0);
  for (int64_t p : free_list_) {
    if (page_[p] != MPage::kFree) err << "free list holds page " << p << "; ";
    ++listed[p];
  }
  for (int64_t p : idle_list_) {
    if (page_[p] != MPage::kIdle) err << "idle list holds page " << p << "; ";
    ++listed[p];
  }
  for (int64_t p : reclaimed_) {
    if (page_[p] != MPage::kReclaimed) {
      err << "reclaimed list holds page " << p << "; ";
    }
    ++listed[p];
  }
  for (int64_t p = 0; p < T_; ++p) {
    const MPage s = page_[p];
    const bool should_list =
        s == MPage::kFree || s == MPage::kIdle || s == MPage::kReclaimed;
    if (s == MPage::kMapping || s == MPage::kRevoking) {
      // In flight: off every list, its blocks not mapped yet.
      if (listed[p] != 0) err << "page " << p << " in flight is listed; ";
      for (int64_t b = range_begin(p); b < range_end(p); ++b) {
        if (block_[b] != MBlock::kUnmapped) err << "block " << b << "; ";
      }
      continue;
    }
    if (listed[p] != (should_list ? 1 : 0)) {
      err << "page " << p << " listed " << listed[p] << " times; ";
    }
    if ((usable(p) == 0) != (s == MPage::kEmpty)) {
      err << "page " << p << " EMPTY mismatch; ";
    }
    const int64_t f = free_blocks(p);
    for (int64_t b = range_begin(p); b < range_end(p); ++b) {
      const bool unmapped = block_[b] == MBlock::kUnmapped;
      if (unmapped == Mapped(s)) err << "block " << b << " mapping; ";
    }
    if (s == MPage::kIdle && f != usable(p)) err << "idle page " << p << "; ";
    if (s == MPage::kOpen && (f == 0 || f == usable(p))) {
      err << "open page " << p << "; ";
    }
    if (s == MPage::kFull && f != 0) err << "full page " << p << "; ";
  }
  int64_t in_res = 0;
  for (const auto& [id, blocks] : reservations_) {
    for (int64_t b : blocks) {
      if (block_[b] != MBlock::kReserved) err << "reserved " << b << "; ";
    }
    in_res += static_cast<int64_t>(blocks.size());
  }
  if (in_res + reserving_ != ReservedBlocks()) err << "reserved count; ";
  if (limit_state_ != MLimitState::kDeferred && Admitted() > target_) {
    err << "admitted " << Admitted() << " > target " << target_ << "; ";
  }
  if (limit_state_ == MLimitState::kDeferred && !free_list_.empty()) {
    err << "FREE pages while DEFERRED; ";
  }
  if (MappedPages() > config_.budget_bundles) err << "over budget; ";
  return err.str();
}

std::string ReferenceModel::DebugString() const {
  std::ostringstream os;
  os << "T=" << T_ << " mapped=" << MappedPages()
     << " avail=" << AvailableBlocks() << " afford=" << Affordable()
     << " target=" << target_
     << " limit_state=" << static_cast<int>(limit_state_) << " FREE=[";
  for (int64_t p : free_list_) os << p << " ";
  os << "] IDLE=[";
  for (int64_t p : idle_list_) os << p << " ";
  os << "] RECLAIMED=[";
  for (int64_t p : reclaimed_) os << p << " ";
  os << "] OPEN/FULL={";
  for (int64_t p = 0; p < T_; ++p) {
    if (page_[p] == MPage::kOpen || page_[p] == MPage::kFull) {
      os << p << ":" << free_blocks(p) << "/" << usable(p) << " ";
    }
  }
  os << "}";
  return os.str();
}

}  // namespace reference
}  // namespace kvbroker
