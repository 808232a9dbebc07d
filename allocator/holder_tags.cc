// HolderTags: the last holder of each block. Contract in holder_tags.h.

#include "allocator/holder_tags.h"

#include <algorithm>

namespace kvbroker {

HolderTags::HolderTags(int64_t max_blocks) : last_(max_blocks, 0) {}

uint32_t HolderTags::Intern(const std::string& holder) {
  if (holder.empty()) return 0;
  auto [it, added] =
      ids_.try_emplace(holder, static_cast<uint32_t>(ids_.size() + 1));
  return it->second;
}

void HolderTags::Hand(absl::Span<const BlockId> blocks, uint32_t holder,
                      std::vector<BlockId>* to_zero) {
  if (holder == 0) return;
  for (BlockId b : blocks) {
    if (last_[b] != 0 && last_[b] != holder) to_zero->push_back(b);
    last_[b] = holder;
  }
}

void HolderTags::Taint(absl::Span<const BlockId> blocks) {
  for (BlockId b : blocks) last_[b] = kTainted;
}

void HolderTags::Forget(BlockId begin, BlockId end) {
  std::fill(last_.begin() + begin, last_.begin() + end, 0);
}

}  // namespace kvbroker
