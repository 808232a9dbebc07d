// PageLedger: page and block bookkeeping. The contract is in page_ledger.h.

#include "allocator/page_ledger.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>

#include "absl/base/macros.h"
#include "absl/strings/str_cat.h"
#include "common/consecutive_ids.h"

namespace kvbroker {
namespace {

bool IsMapped(PageState s) {
  return s == PageState::kIdle || s == PageState::kOpen ||
         s == PageState::kFull || s == PageState::kMapping;
}

}  // namespace

// Owners are one byte per block: eight are compared per step. In w, the
// XOR of eight owners with eight copies of `o`, a byte is zero exactly when
// its owner is `o`; adding 0x7f to a byte's low seven bits carries into its
// high bit unless they are zero, and no byte carries into the next. The
// eight high bits, moved to each byte's low bit and multiplied by kOnes, sum
// into the top byte (at most 8, so no lane overflows): a multiply, where a
// popcount would be a library call on a build without -mpopcnt.
int64_t PageLedger::CountOwnedBy(BlockId first, BlockId end,
                                 BlockOwner o) const {
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  const uint64_t copies = kOnes * static_cast<uint8_t>(o);
  const BlockOwner* at = owner_.data() + first;
  int64_t n = end - first, count = 0;
  for (; n >= 8; n -= 8, at += 8) {
    uint64_t w;
    std::memcpy(&w, at, sizeof w);
    w ^= copies;
    const uint64_t nonzero = (((w & kLow7) + kLow7) | w) & ~kLow7;
    count += 8 - static_cast<int64_t>(((nonzero >> 7) * kOnes) >> 56);
  }
  for (; n > 0; --n, ++at) count += *at == o;
  return count;
}

void PageLedger::SetOwner(BlockId first, BlockId end, BlockOwner o) {
  static_assert(sizeof(BlockOwner) == 1);
  std::memset(owner_.data() + first, static_cast<uint8_t>(o),
              static_cast<size_t>(end - first));
}

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

PageLedger::PageLedger(const Geometry* geometry) : geometry_(geometry) {
  const Geometry& g = *geometry_;
  const int64_t T = g.page_count().value();
  pages_.resize(T);
  owner_.assign(g.max_blocks(), BlockOwner::kNone);
  free_bits_.assign((g.max_blocks() + 63) / 64, 0);
  for (PageId p = 0; p < T; ++p) {
    Page& page = pages_[p];
    const BlockRange r = g.range(p);
    page.begin = r.begin;
    page.end = r.end;
    page.usable = r.size();
    page.state = page.usable == 0 ? PageState::kEmpty : PageState::kFree;
    if (page.usable > 0) free_.PushBack(p, page.usable);
    ++state_pages_[static_cast<int>(page.state)];
  }
}

// ---------------------------------------------------------------------------
// Reading

BlockCount PageLedger::admitted_usable() const {
  return BlockCount(geometry_->total_usable().value() - reclaimed_usable_ -
                    null_blocks_);
}

PageId PageLedger::PageOf(BlockId b, PageId hint) const {
  if (hint >= 0 && b >= pages_[hint].begin && b < pages_[hint].end) {
    return hint;
  }
  return geometry_->page_of(b);
}

// ---------------------------------------------------------------------------
// State bookkeeping

void PageLedger::AddInFlight(PageId p) {
  ABSL_ASSERT(pages_[p].in_flight_at < 0);
  pages_[p].in_flight_at = static_cast<int32_t>(in_flight_.size());
  in_flight_.push_back(p);
}

void PageLedger::RemoveInFlight(PageId p) {
  const int32_t at = pages_[p].in_flight_at;
  ABSL_ASSERT(at >= 0 && in_flight_[at] == p);
  const PageId last = in_flight_.back();
  in_flight_[at] = last;
  pages_[last].in_flight_at = at;
  in_flight_.pop_back();
  pages_[p].in_flight_at = -1;
}

std::vector<PageId> PageLedger::in_flight_ascending() const {
  std::vector<PageId> out = in_flight_;
  std::sort(out.begin(), out.end());
  return out;
}

void PageLedger::ChangeState(PageId p, PageState to) {
  --state_pages_[static_cast<int>(pages_[p].state)];
  pages_[p].state = to;
  ++state_pages_[static_cast<int>(to)];
}

void PageLedger::Detach(PageId p) {
  Page& page = pages_[p];
  if (page.state == PageState::kOpen) {
    open_.erase(page.free, p);
    open_free_ -= page.free;
  } else if (page.state == PageState::kIdle) {
    // Callers detach IDLE pages only after taking them off idle_.
    idle_usable_ -= page.usable;
  }
}

void PageLedger::Attach(PageId p) {
  Page& page = pages_[p];
  PageState to;
  if (page.allocated + page.reserved == 0) {
    to = PageState::kIdle;
  } else if (page.free == 0) {
    to = PageState::kFull;
  } else {
    to = PageState::kOpen;
  }
  ChangeState(p, to);
  if (to == PageState::kOpen) {
    open_.insert(page.free, p);
    open_free_ += page.free;
  } else if (to == PageState::kIdle) {
    idle_usable_ += page.usable;
    idle_.push_back(p);
  }
}

void PageLedger::SetFreeBits(PageId p, bool on) {
  Page& page = pages_[p];
  // A word at a time, masked to the page's range.
  for (int64_t word = page.begin >> 6; (word << 6) < page.end; ++word) {
    const uint64_t mask = WordMask(word, page.begin, page.end);
    if (on) {
      free_bits_[word] |= mask;
    } else {
      free_bits_[word] &= ~mask;
    }
  }
  page.free = on ? page.usable : 0;
}

void PageLedger::CountTaken(Page* page, BlockOwner owner, int64_t n) {
  if (owner == BlockOwner::kNull && n > 0) page->holds_null = true;
  if (owner == BlockOwner::kReserved) {
    page->reserved += n;
  } else {
    page->allocated += n;
  }
  switch (owner) {
    case BlockOwner::kAllocated: allocated_ += n; break;
    case BlockOwner::kReserved: reserved_ += n; break;
    case BlockOwner::kNull: null_blocks_ += n; break;
    case BlockOwner::kNone: ABSL_ASSERT(false); break;
  }
}

int64_t PageLedger::TakeFromPage(PageId p, int64_t n, BlockOwner owner,
                                 Stretches* out) {
  Page& page = pages_[p];
  int64_t taken = 0;
  // A word at a time: mask the word to the page's range, take its set bits
  // lowest first, store the word back once.
  for (int64_t word = page.begin >> 6; taken < n && (word << 6) < page.end;
       ++word) {
    uint64_t bits = free_bits_[word] & WordMask(word, page.begin, page.end);
    if (bits == ~uint64_t{0} && n - taken >= 64) {  // a whole word
      const BlockId first = word << 6;
      SetOwner(first, first + 64, owner);
      out->Append(first, 64);
      free_bits_[word] = 0;
      taken += 64;
      continue;
    }
    if (bits == 0) continue;
    // The word's free blocks are one run (a page's part of a word, filled
    // or emptied by whole calls, usually is): as many of them as are
    // needed, lowest first, are taken at once, not bit by bit. A run's
    // length is read off its highest bit, where a popcount would be a
    // library call on a build without -mpopcnt.
    const int shift = __builtin_ctzll(bits);
    const uint64_t run = bits >> shift;
    if ((run & (run + 1)) == 0) {
      const int64_t count =
          std::min<int64_t>(64 - __builtin_clzll(run), n - taken);
      const BlockId first = (word << 6) + shift;
      SetOwner(first, first + count, owner);
      out->Append(first, count);
      free_bits_[word] &= ~(count == 64 ? ~uint64_t{0}
                                        : ((uint64_t{1} << count) - 1) << shift);
      taken += count;
      continue;
    }
    uint64_t took = 0;
    while (bits != 0 && taken < n) {
      const uint64_t lowest = bits & (~bits + 1);
      const BlockId found = (word << 6) + __builtin_ctzll(bits);
      bits ^= lowest;
      took |= lowest;
      owner_[found] = owner;
      out->Append(found, 1);
      ++taken;
    }
    free_bits_[word] &= ~took;
  }
  page.free -= taken;
  CountTaken(&page, owner, taken);
  return taken;
}

int64_t PageLedger::TakeIdlePage(PageId p, BlockOwner owner, Stretches* out) {
  Page& page = pages_[p];
  ABSL_ASSERT(page.state == PageState::kIdle && page.free == page.usable);
  idle_usable_ -= page.usable;
  SetOwner(page.begin, page.end, owner);
  SetFreeBits(p, false);
  out->Append(page.begin, page.usable);
  CountTaken(&page, owner, page.usable);
  ChangeState(p, PageState::kFull);
  return page.usable;
}

// ---------------------------------------------------------------------------
// Taking blocks

void PageLedger::TakeMapped(BlockCount n, BlockOwner owner, Stretches* out,
                            PageIds* from_idle) {
  int64_t need = n.value();
  while (need > 0 && !open_.empty()) {
    const PageId p = open_.BestFit(need);
    Detach(p);
    need -= TakeFromPage(p, need, owner, out);
    Attach(p);
  }
  while (need > 0 && !idle_.empty()) {
    const PageId p = idle_.front();
    idle_.pop_front();
    from_idle->push_back(p);
    if (need >= pages_[p].usable) {
      need -= TakeIdlePage(p, owner, out);
      continue;
    }
    Detach(p);
    need -= TakeFromPage(p, need, owner, out);
    Attach(p);
    if (pages_[p].state == PageState::kIdle) {
      // Attach filed it at the back; nothing was taken from it.
      idle_.pop_back();
      idle_.push_front(p);
      from_idle->pop_back();
    }
  }
  ABSL_ASSERT(need == 0);
}

PageIds PageLedger::UntakeMapped(absl::Span<const BlockId> ascending,
                                 absl::Span<const PageId> from_idle) {
  PageIds emptied = ReturnBlocks(ascending);
  // Pages drawn from IDLE held only this call's blocks: they are emptied
  // again and go back to the front, the first one drawn first.
  for (auto it = from_idle.rbegin(); it != from_idle.rend(); ++it) {
    const PageId p = *it;
    auto at = std::find(emptied.begin(), emptied.end(), p);
    ABSL_ASSERT(at != emptied.end());
    emptied.erase(at);
    Attach(p);  // -> IDLE, at the back
    idle_.pop_back();
    idle_.push_front(p);
  }
  return emptied;
}

void PageLedger::Reassign(absl::Span<const BlockId> ids, BlockOwner to) {
  const BlockOwner from = to == BlockOwner::kAllocated ? BlockOwner::kReserved
                                                       : BlockOwner::kAllocated;
  PageId hint = -1;
  for (BlockId b : ids) {
    ABSL_ASSERT(owner_[b] == from);
    hint = PageOf(b, hint);
    Page& page = pages_[hint];
    owner_[b] = to;
    if (to == BlockOwner::kAllocated) {
      --page.reserved;
      ++page.allocated;
      --reserved_;
      ++allocated_;
    } else {
      ++page.reserved;
      --page.allocated;
      ++reserved_;
      --allocated_;
    }
  }
}

// ---------------------------------------------------------------------------
// Mapping in flight

std::vector<PageId> PageLedger::BeginMapFront(PageCount k) {
  std::vector<PageId> out;
  out.reserve(k.value());
  for (int64_t i = 0; i < k.value(); ++i) {
    const PageId p = free_.PopFront().page;
    ChangeState(p, PageState::kMapping);
    pages_[p].landing = Landing::kNone;
    AddInFlight(p);
    ++maps_in_flight_;
    out.push_back(p);
  }
  return out;
}

void PageLedger::AbortMap(absl::Span<const PageId> pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    const PageId p = *it;
    ABSL_ASSERT(pages_[p].state == PageState::kMapping);
    RemoveInFlight(p);
    --maps_in_flight_;
    ChangeState(p, PageState::kFree);
    free_.PushFront(p, pages_[p].usable);
  }
}

BlockCount PageLedger::CommitMap(PageId p, BlockCount n, BlockOwner owner,
                                 Stretches* out) {
  ABSL_ASSERT(pages_[p].state == PageState::kMapping);
  RemoveInFlight(p);
  --maps_in_flight_;
  SetFreeBits(p, true);
  const int64_t taken =
      n.value() > 0 ? TakeFromPage(p, n.value(), owner, out) : 0;
  Attach(p);
  return BlockCount(taken);
}

// ---------------------------------------------------------------------------
// Returning blocks and unmapping in flight

void PageLedger::ReturnRange(PageId p, BlockId first, BlockId end) {
  Page& page = pages_[p];
  // No reserved block on the page: none in the range, no count needed.
  const int64_t reserved =
      page.reserved == 0 ? 0 : CountOwnedBy(first, end, BlockOwner::kReserved);
  const int64_t allocated = (end - first) - reserved;
  SetOwner(first, end, BlockOwner::kNone);
  for (int64_t word = first >> 6; (word << 6) < end; ++word) {
    free_bits_[word] |= WordMask(word, first, end);
  }
  page.reserved -= reserved;
  page.allocated -= allocated;
  page.free += end - first;
  reserved_ -= reserved;
  allocated_ -= allocated;
}

PageIds PageLedger::FileReturned(const PageIds& touched) {
  PageIds emptied;
  for (PageId p : touched) {
    if (pages_[p].allocated + pages_[p].reserved == 0) {
      emptied.push_back(p);  // detached; KeepIdle or BeginUnmap files it
    } else {
      Attach(p);
    }
  }
  return emptied;
}

PageIds PageLedger::ReturnBlocks(absl::Span<const BlockId> ascending) {
  ABSL_ASSERT(std::adjacent_find(ascending.begin(), ascending.end(),
                                 std::greater_equal<BlockId>()) ==
              ascending.end());
  PageIds touched;
  for (size_t i = 0; i < ascending.size();) {
    const PageId p = geometry_->page_of(ascending[i]);
    Page& page = pages_[p];
    Detach(p);  // OPEN or FULL: it holds block ascending[i]
    touched.push_back(p);
    // A consecutive run of ids (a call giving back what one Alloc took)
    // goes back as a range. The ids are strictly ascending, so when the one
    // that many places on is the page's last block, every id up to it is
    // named: no walk is needed to find the run.
    size_t run = i + 1;
    const size_t to_end = static_cast<size_t>(page.end - ascending[i]);
    if (i + to_end <= ascending.size() &&
        ascending[i + to_end - 1] == page.end - 1) {
      run = i + to_end;
    } else {
      while (run < ascending.size() && ascending[run] < page.end &&
             ascending[run] == ascending[run - 1] + 1) {
        ++run;
      }
    }
    if (run - i >= 8 &&
        (run == ascending.size() || ascending[run] >= page.end)) {
      ReturnRange(p, ascending[i], ascending[run - 1] + 1);
      i = run;
      continue;
    }
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
  return FileReturned(touched);
}

PageIds PageLedger::ReturnRuns(absl::Span<const int64_t> runs) {
  PageIds touched;
  for (size_t i = 0; i + 1 < runs.size(); i += 2) {
    const BlockId end = runs[i] + runs[i + 1];
    for (BlockId b = runs[i]; b < end;) {
      const PageId p = geometry_->page_of(b);
      // Runs ascending: a page already touched is the last one touched.
      if (touched.empty() || touched.back() != p) {
        Detach(p);  // OPEN or FULL: it holds block b
        touched.push_back(p);
      }
      const BlockId e = std::min(end, pages_[p].end);
      ReturnRange(p, b, e);
      b = e;
    }
  }
  return FileReturned(touched);
}

void PageLedger::KeepIdle(PageId p) { Attach(p); }

void PageLedger::BeginUnmap(PageId p, Landing to) {
  ABSL_ASSERT(to != Landing::kNone);
  Page& page = pages_[p];
  ABSL_ASSERT(page.allocated + page.reserved == 0);
  if (page.state == PageState::kIdle) {
    if (!idle_.empty() && idle_.front() == p) {
      idle_.pop_front();
      idle_usable_ -= page.usable;
    } else {
      ABSL_ASSERT(!idle_.empty() && idle_.back() == p);
      idle_.pop_back();
      idle_usable_ -= page.usable;
    }
  }
  SetFreeBits(p, false);
  ChangeState(p, PageState::kMapping);
  page.landing = to;
  AddInFlight(p);
  if (to != Landing::kFreeBack) {
    ++leaving_;
    reclaimed_usable_ += page.usable;
  }
}

void PageLedger::FinishUnmap(PageId p) {
  Page& page = pages_[p];
  ABSL_ASSERT(page.state == PageState::kMapping &&
              page.landing != Landing::kNone);
  RemoveInFlight(p);
  const Landing to = page.landing;
  page.landing = Landing::kNone;
  if (to == Landing::kFreeBack) {
    ChangeState(p, PageState::kFree);
    free_.PushBack(p, page.usable);
    return;
  }
  --leaving_;
  ChangeState(p, PageState::kReclaimed);
  if (to == Landing::kReclaimedFront) {
    reclaimed_.push_front(p);
  } else {
    reclaimed_.push_back(p);
  }
}

void PageLedger::Redirect(PageId p, Landing to) {
  Page& page = pages_[p];
  ABSL_ASSERT(page.state == PageState::kMapping &&
              page.landing != Landing::kNone && to != Landing::kNone);
  const bool was_leaving = page.landing != Landing::kFreeBack;
  const bool leaving = to != Landing::kFreeBack;
  if (leaving && !was_leaving) {
    ++leaving_;
    reclaimed_usable_ += page.usable;
  } else if (!leaving && was_leaving) {
    --leaving_;
    reclaimed_usable_ -= page.usable;
  }
  page.landing = to;
}

void PageLedger::AbortUnmap(PageId p) {
  Page& page = pages_[p];
  ABSL_ASSERT(page.state == PageState::kMapping &&
              page.landing != Landing::kNone);
  RemoveInFlight(p);
  if (page.landing != Landing::kFreeBack) {
    --leaving_;
    reclaimed_usable_ -= page.usable;
  }
  page.landing = Landing::kNone;
  SetFreeBits(p, true);
  Attach(p);  // -> IDLE
}

// ---------------------------------------------------------------------------
// The memory limit's moves

void PageLedger::ReclaimFreeBack() {
  const internal::FreeList::Entry e = free_.PopBack();
  ChangeState(e.page, PageState::kReclaimed);
  reclaimed_.push_front(e.page);
  reclaimed_usable_ += e.usable;
}

PageCount PageLedger::AdmitReclaimed(PageCount room) {
  std::vector<PageId> back;
  while (!reclaimed_.empty() &&
         static_cast<int64_t>(back.size()) < room.value()) {
    back.push_back(reclaimed_.front());
    reclaimed_.pop_front();
  }
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    reclaimed_usable_ -= pages_[*it].usable;
    ChangeState(*it, PageState::kFree);
    free_.PushFront(*it, pages_[*it].usable);
  }
  return PageCount(back.size());
}

// ---------------------------------------------------------------------------
// Checking

std::string PageLedger::Check() const {
  const Geometry& g = *geometry_;
  const int64_t T = static_cast<int64_t>(pages_.size());
  std::array<int64_t, kPageStates> by_state = {};
  int64_t open_free = 0, idle_usable = 0, allocated = 0, reserved = 0;
  int64_t reclaimed_usable = 0, leaving = 0, maps = 0;
  for (PageId p = 0; p < T; ++p) {
    const Page& page = pages_[p];
    ++by_state[static_cast<int>(page.state)];
    const BlockRange range = g.range(p);
    if (page.usable != range.size() || page.begin != range.begin ||
        page.end != range.end) {
      return absl::StrCat("page ", p, " usable ", page.usable);
    }
    int64_t free_bits = 0, alloc_owned = 0, res_owned = 0, null_owned = 0;
    for (BlockId b = range.begin; b < range.end; ++b) {
      const bool bit = (free_bits_[b >> 6] >> (b & 63)) & 1;
      free_bits += bit;
      null_owned += owner_[b] == BlockOwner::kNull;
      alloc_owned +=
          owner_[b] == BlockOwner::kAllocated || owner_[b] == BlockOwner::kNull;
      res_owned += owner_[b] == BlockOwner::kReserved;
      if (bit && owner_[b] != BlockOwner::kNone) {
        return absl::StrCat("block ", b, " is free and owned");
      }
    }
    if (page.holds_null != (null_owned > 0)) {
      return absl::StrCat("page ", p, " holds_null ", page.holds_null,
                          " with ", null_owned, " null blocks");
    }
    const bool settled_mapped =
        IsMapped(page.state) && page.state != PageState::kMapping;
    if (settled_mapped) {
      if (page.free + page.allocated + page.reserved != page.usable) {
        return absl::StrCat("page ", p, " free+allocated+reserved != usable");
      }
      if (free_bits != page.free || alloc_owned != page.allocated ||
          res_owned != page.reserved) {
        return absl::StrCat("page ", p, " counts disagree with block owners");
      }
      const PageState expect =
          page.allocated + page.reserved == 0
              ? PageState::kIdle
              : (page.free == 0 ? PageState::kFull : PageState::kOpen);
      if (page.state != expect) {
        return absl::StrCat("page ", p, " state ", PageStateName(page.state),
                            " expected ", PageStateName(expect));
      }
    } else if (page.free != 0 || page.allocated != 0 || page.reserved != 0 ||
               free_bits != 0 || alloc_owned != 0 || res_owned != 0) {
      return absl::StrCat("page ", p, " (", PageStateName(page.state),
                          ") holds blocks");
    }
    if (page.state == PageState::kMapping) {
      if (page.in_flight_at < 0 ||
          page.in_flight_at >= static_cast<int64_t>(in_flight_.size()) ||
          in_flight_[page.in_flight_at] != p) {
        return absl::StrCat("page ", p, " in flight but not in the set");
      }
      if (page.landing == Landing::kNone) {
        ++maps;
      } else if (page.landing != Landing::kFreeBack) {
        ++leaving;
        reclaimed_usable += page.usable;
      }
    } else if (page.landing != Landing::kNone) {
      return absl::StrCat("page ", p, " has a landing but is not in flight");
    } else if (page.in_flight_at != -1) {
      return absl::StrCat("page ", p, " is not in flight but indexes the set");
    }
    if (page.state == PageState::kOpen) open_free += page.free;
    if (page.state == PageState::kIdle) idle_usable += page.usable;
    if (page.state == PageState::kReclaimed) reclaimed_usable += page.usable;
    allocated += page.allocated;
    reserved += page.reserved;
  }
  for (BlockId b = 0; b < g.max_blocks(); ++b) {
    if (!g.is_usable_block(b) && (owner_[b] != BlockOwner::kNone ||
                                  ((free_bits_[b >> 6] >> (b & 63)) & 1))) {
      return absl::StrCat("unusable block ", b, " is in use");
    }
  }
  if (by_state != state_pages_) return "page state counts";
  if (open_free != open_free_) {
    return absl::StrCat("open_free ", open_free, " vs ", open_free_);
  }
  if (idle_usable != idle_usable_) return "idle_usable";
  if (reclaimed_usable != reclaimed_usable_) return "reclaimed_usable";
  if (allocated - null_blocks_ != allocated_) return "allocated";
  if (reserved != reserved_) return "reserved";
  if (leaving != leaving_) return "pages in flight to RECLAIMED";
  if (maps != maps_in_flight_) return "maps in flight";
  if (static_cast<int64_t>(in_flight_.size()) !=
      by_state[static_cast<int>(PageState::kMapping)]) {
    return "in-flight set size";
  }
  if (static_cast<int64_t>(open_.size()) !=
      by_state[static_cast<int>(PageState::kOpen)]) {
    return "open index size";
  }
  for (const auto& [free, p] : open_) {
    if (pages_[p].state != PageState::kOpen || pages_[p].free != free) {
      return absl::StrCat("open index entry for page ", p);
    }
  }
  if (static_cast<int64_t>(idle_.size()) !=
      by_state[static_cast<int>(PageState::kIdle)]) {
    return "idle list size";
  }
  for (PageId p : idle_) {
    if (pages_[p].state != PageState::kIdle) {
      return absl::StrCat("idle list page ", p);
    }
  }
  if (static_cast<int64_t>(free_.size()) !=
      by_state[static_cast<int>(PageState::kFree)]) {
    return absl::StrCat("free list size ", free_.size(), " vs ",
                        by_state[static_cast<int>(PageState::kFree)]);
  }
  int64_t before = free_.empty() ? 0 : free_[0].before;
  for (size_t i = 0; i < free_.size(); ++i) {
    const auto& e = free_[i];
    if (pages_[e.page].state != PageState::kFree ||
        e.usable != pages_[e.page].usable || e.before != before) {
      return absl::StrCat("free list entry ", i);
    }
    before += e.usable;
  }
  if (static_cast<int64_t>(reclaimed_.size()) !=
      by_state[static_cast<int>(PageState::kReclaimed)]) {
    return "reclaimed list size";
  }
  for (PageId p : reclaimed_) {
    if (pages_[p].state != PageState::kReclaimed) {
      return absl::StrCat("reclaimed list page ", p);
    }
  }
  return "";
}

}  // namespace kvbroker
