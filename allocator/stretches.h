// Stretches: the blocks one acquisition takes, kept as runs of consecutive
// ids in the order taken. The ledger takes blocks a word's free run at a
// time (a whole page at once, for most calls), so a run is what it finds;
// the holder tags, the reply's block runs and a reservation's list are
// made from the runs, and a list of ids is written only where a caller
// needs one (docs/design.md, "Acquisitions as stretches").
//
// Invariant: no two stretches overlap, each has count >= 1, and a stretch
// that continues the one before it (first == previous end) is merged into
// it, so expanding the stretches gives the ids in the order they were
// appended.
//
// Thread safety: none (a value type).

#ifndef KVBROKER_ALLOCATOR_STRETCHES_H_
#define KVBROKER_ALLOCATOR_STRETCHES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "allocator/units.h"
#include "common/consecutive_ids.h"

namespace kvbroker {

struct Stretch {
  BlockId first = 0;
  int64_t count = 0;
  BlockId end() const { return first + count; }
  friend bool operator==(const Stretch& a, const Stretch& b) {
    return a.first == b.first && a.count == b.count;
  }
};

// (first, count) pairs, ascending, adjacent ones merged (AllocResult::
// block_runs). An acquisition's blocks are usually one or two runs, so two
// are kept off the heap.
using BlockRuns = absl::InlinedVector<BlockId, 4>;

class Stretches {
 public:
  // Eight inline: an engine's Alloc of 256 blocks of 64 KiB on 2 MiB pages
  // takes eight pages, and a page's blocks are one stretch.
  using List = absl::InlinedVector<Stretch, 8>;

  // Appends first .. first + count - 1 (count >= 1, disjoint from what is
  // held), merged into the last stretch when it continues it.
  void Append(BlockId first, int64_t count) {
    blocks_ += count;
    if (!list_.empty() && list_.back().end() == first) {
      list_.back().count += count;
      return;
    }
    list_.push_back({first, count});
  }
  // Appends distinct ids, in the order given, one stretch per run of
  // consecutive ones.
  void AppendIds(absl::Span<const BlockId> ids) {
    for (size_t i = 0; i < ids.size();) {
      const size_t end = ConsecutiveEnd(ids, i);
      Append(ids[i], static_cast<int64_t>(end - i));
      i = end;
    }
  }

  int64_t blocks() const { return blocks_; }
  bool empty() const { return blocks_ == 0; }
  const List& list() const { return list_; }
  List::const_iterator begin() const { return list_.begin(); }
  List::const_iterator end() const { return list_.end(); }

  // The ids, in the order appended.
  std::vector<BlockId> Ids() const {
    std::vector<BlockId> ids(static_cast<size_t>(blocks_));
    BlockId* at = ids.data();
    for (const Stretch& s : list_) {
      WriteConsecutive(at, s.first, s.count);
      at += s.count;
    }
    return ids;
  }

  // The same blocks as ascending (first, count) pairs with adjacent ones
  // merged (AllocResult::block_runs): one sort of the stretches, none of
  // the ids.
  BlockRuns AscendingRuns() const {
    List sorted;
    const List* in = &list_;
    if (!std::is_sorted(list_.begin(), list_.end(), ByFirst)) {
      sorted = list_;
      std::sort(sorted.begin(), sorted.end(), ByFirst);
      in = &sorted;
    }
    BlockRuns runs;
    for (const Stretch& s : *in) {
      if (!runs.empty() && runs[runs.size() - 2] + runs.back() == s.first) {
        runs.back() += s.count;
      } else {
        runs.push_back(s.first);
        runs.push_back(s.count);
      }
    }
    return runs;
  }

  void clear() {
    list_.clear();
    blocks_ = 0;
  }

 private:
  static bool ByFirst(const Stretch& a, const Stretch& b) {
    return a.first < b.first;
  }

  List list_;
  int64_t blocks_ = 0;  // Σ count
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_STRETCHES_H_
