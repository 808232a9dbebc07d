// FreeList: the FIFO of unmapped, allocatable page ids, with O(1) prefix sums
// of their usable block counts.
//
// Capacity needs Σ usable(p) over the first A pages of the list for an A that
// changes with the device budget; a walk would cost O(A). Each entry instead
// stores the running total of usable blocks of the entries before it, so the
// sum over the first A entries is one subtraction. Pages are taken from and
// returned to the front (a rolled-back mapping, reclaimed ids coming back) and
// appended or trimmed at the back (unmapped pages, limit changes); entries are
// never removed from the middle.
//
// Invariant: for consecutive entries e[i], e[i+1]:
//   e[i+1].before == e[i].before + e[i].usable, and end_ == back.before +
//   back.usable.
// Thread safety: none; the owning pool's lock guards it.

#ifndef KVBROKER_ALLOCATOR_FREE_LIST_H_
#define KVBROKER_ALLOCATOR_FREE_LIST_H_

#include <cstdint>
#include <deque>

#include "absl/base/macros.h"
#include "allocator/units.h"

namespace kvbroker {
namespace internal {

class FreeList {
 public:
  struct Entry {
    PageId page;
    int64_t usable;  // > 0: zero-usable pages are never listed
    int64_t before;  // Σ usable of the entries in front of this one
  };

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const Entry& operator[](size_t i) const { return entries_[i]; }
  PageId front() const { return entries_.front().page; }
  PageId back() const { return entries_.back().page; }

  // Σ usable over every listed page.
  int64_t total() const { return empty() ? 0 : end_ - entries_.front().before; }

  // Σ usable over the first min(a, size()) pages.
  int64_t PrefixSum(int64_t a) const {
    if (a <= 0 || empty()) return 0;
    if (static_cast<size_t>(a) >= entries_.size()) return total();
    return entries_[a].before - entries_.front().before;
  }

  // The smallest k such that PrefixSum(k) >= blocks, or size() + 1 when the
  // whole list is not enough. O(log size).
  int64_t PagesToCover(int64_t blocks) const {
    if (blocks <= 0) return 0;
    if (total() < blocks) return static_cast<int64_t>(size()) + 1;
    const int64_t base = entries_.front().before;
    // First index i with (before[i] + usable[i] - base) >= blocks.
    size_t lo = 0, hi = entries_.size() - 1;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (entries_[mid].before + entries_[mid].usable - base >= blocks) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return static_cast<int64_t>(lo) + 1;
  }

  void PushBack(PageId page, int64_t usable) {
    ABSL_ASSERT(usable > 0);
    entries_.push_back({page, usable, end_});
    end_ += usable;
  }

  void PushFront(PageId page, int64_t usable) {
    ABSL_ASSERT(usable > 0);
    int64_t before = empty() ? end_ - usable : entries_.front().before - usable;
    entries_.push_front({page, usable, before});
  }

  Entry PopFront() {
    Entry e = entries_.front();
    entries_.pop_front();
    if (entries_.empty()) end_ = 0;  // keeps the running totals small
    return e;
  }

  Entry PopBack() {
    Entry e = entries_.back();
    entries_.pop_back();
    end_ = entries_.empty() ? 0 : e.before;
    return e;
  }

 private:
  std::deque<Entry> entries_;
  int64_t end_ = 0;  // running total after the last entry
};

}  // namespace internal
}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_FREE_LIST_H_
