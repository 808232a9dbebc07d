// HolderTags: the last holder of each block. Contract in holder_tags.h.

#include "allocator/holder_tags.h"

#include <algorithm>
#include <cstring>

namespace kvbroker {

HolderTags::HolderTags(int64_t max_blocks) : last_(max_blocks, 0) {}

uint32_t HolderTags::Intern(const std::string& holder) {
  if (holder.empty()) return 0;
  auto [it, added] =
      ids_.try_emplace(holder, static_cast<uint32_t>(ids_.size() + 1));
  return it->second;
}

// Four blocks at a time where their ids are consecutive (most of an Alloc
// is whole pages) and their tags all one value, 0 or this holder (fresh
// blocks, or the holder's own coming back): two 8-byte loads, compares and
// stores for the four, where the plain loop pays a load, two compares and
// a store for each. Any other four go one at a time, so to_zero keeps the
// order of `blocks`.
void HolderTags::Hand(absl::Span<const BlockId> blocks, uint32_t holder,
                      std::vector<BlockId>* to_zero) {
  if (holder == 0) return;
  const uint64_t two_mine = uint64_t{holder} << 32 | holder;
  auto one = [&](BlockId b) {
    if (last_[b] != 0 && last_[b] != holder) to_zero->push_back(b);
    last_[b] = holder;
  };
  const size_t n = blocks.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const BlockId b = blocks[i];
    // Unsigned: a difference that would overflow int64 wraps and is
    // simply not 0 (ids are blocks of the pool, far from either end).
    const uint64_t u = static_cast<uint64_t>(b);
    const uint64_t apart = (static_cast<uint64_t>(blocks[i + 1]) - u - 1) |
                           (static_cast<uint64_t>(blocks[i + 2]) - u - 2) |
                           (static_cast<uint64_t>(blocks[i + 3]) - u - 3);
    if (apart == 0) {
      uint32_t* tags = last_.data() + b;
      uint64_t w[2];
      std::memcpy(w, tags, sizeof w);
      if ((w[0] | w[1]) == 0 || (w[0] == two_mine && w[1] == two_mine)) {
        w[0] = w[1] = two_mine;
        std::memcpy(tags, w, sizeof w);
        continue;
      }
    }
    for (size_t j = i; j < i + 4; ++j) one(blocks[j]);
  }
  for (; i < n; ++i) one(blocks[i]);
}

void HolderTags::Taint(absl::Span<const BlockId> blocks) {
  for (BlockId b : blocks) last_[b] = kTainted;
}

void HolderTags::Forget(BlockId begin, BlockId end) {
  std::fill(last_.begin() + begin, last_.begin() + end, 0);
}

}  // namespace kvbroker
