// HolderTags: which holder's data each block last held, so that a block
// passing from one engine's holder to another's is zeroed before the new
// holder gets it (SPEC section 10; docs/design.md, "Pages and engines").
//
// Holders are named by the caller of Alloc (an attach session passes its
// holder; gRPC callers pass none and cannot read the memory). A block's tag
// is the last named holder it was allocated to; an Alloc without a holder
// leaves it, so data cannot reach a second holder by way of a holderless
// allocation in between. Unmapping a page forgets its blocks' tags: the
// next mapping is new memory.
//
// Memory: 4 bytes per block, and one entry per distinct holder name ever
// seen by the pool (holders are few and long-lived).
//
// Thread safety: none; the owning pool's lock guards it.

#ifndef KVBROKER_ALLOCATOR_HOLDER_TAGS_H_
#define KVBROKER_ALLOCATOR_HOLDER_TAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "allocator/stretches.h"
#include "allocator/units.h"

namespace kvbroker {

class HolderTags {
 public:
  explicit HolderTags(int64_t max_blocks);

  // The tag of `holder`; 0 (no holder) for "".
  uint32_t Intern(const std::string& holder);

  // `blocks` go to `holder` (a tag from Intern). With a holder, each block
  // whose last holder was another one is appended to `to_zero` (in the
  // order of `blocks`), and every block's tag becomes `holder`. Without
  // one, nothing changes.
  void Hand(const Stretches& blocks, uint32_t holder,
            std::vector<BlockId>* to_zero);

  // Blocks [begin, end) lost their memory (their page was unmapped).
  void Forget(BlockId begin, BlockId end);
  // Blocks whose zeroing failed: whoever gets them next, they are zeroed.
  void Taint(absl::Span<const BlockId> blocks);

  uint32_t last(BlockId b) const { return last_[b]; }

 private:
  // Per block: 0 no holder's data; kTainted unknown data.
  static constexpr uint32_t kTainted = ~0u;
  std::vector<uint32_t> last_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_HOLDER_TAGS_H_
