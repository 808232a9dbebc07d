// OpenIndex: the OPEN pages ordered by (free blocks, page id), the index
// that best fit searches (docs/design.md, "Consumption order").
//
// A page goes OPEN when a call takes part of it and leaves it when the page
// fills or empties, so on a quiet pool the index often goes from empty to
// one page and back on every Alloc/Free pair. An absl::btree_set frees its
// root node when its last entry goes and allocates one for the next, so the
// index keeps one sentinel entry after every page: the tree is never empty
// and, once the first page has grown the root to hold two entries, those
// transitions allocate nothing. The sentinel is invisible through this
// interface.
//
// Thread safety: none; the owning pool's lock guards it.

#ifndef KVBROKER_ALLOCATOR_OPEN_INDEX_H_
#define KVBROKER_ALLOCATOR_OPEN_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/base/macros.h"
#include "absl/container/btree_set.h"
#include "allocator/units.h"

namespace kvbroker {
namespace internal {

class OpenIndex {
 public:
  using Entry = std::pair<int64_t, PageId>;  // (free blocks, page)
  using Set = absl::btree_set<Entry>;

  OpenIndex() { set_.insert(kSentinel); }

  // REQUIRES: `free` >= 0 and `page` >= 0 (every real entry sorts before
  // the sentinel); insert: (free, page) absent; erase: present.
  void insert(int64_t free, PageId page) { set_.insert({free, page}); }
  void erase(int64_t free, PageId page) {
    const size_t n = set_.erase({free, page});
    ABSL_ASSERT(n == 1);
    (void)n;
  }

  size_t size() const { return set_.size() - 1; }
  bool empty() const { return size() == 0; }

  // Best fit for `need` blocks: the page with the fewest free blocks that
  // still cover `need`; if none does, the one with the most free blocks.
  // Ties go to the lowest page id. REQUIRES: !empty().
  PageId BestFit(int64_t need) const {
    ABSL_ASSERT(!empty());
    auto it = set_.lower_bound({need, PageId{-1}});
    if (it->second == kSentinel.second) {
      it = set_.lower_bound({std::prev(it)->first, PageId{-1}});
    }
    return it->second;
  }

  // The entries, ascending (fewest free blocks first).
  Set::const_iterator begin() const { return set_.begin(); }
  Set::const_iterator end() const { return std::prev(set_.end()); }

 private:
  static constexpr Entry kSentinel = {std::numeric_limits<int64_t>::max(),
                                      std::numeric_limits<PageId>::max()};
  Set set_;
};

}  // namespace internal
}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_OPEN_INDEX_H_
