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

namespace {

// Four tags to a compare: 32-bit lanes compare in one SSE2 instruction
// (unlike 64-bit ones, which baseline x86-64 emulates).
using Tags4 = uint32_t __attribute__((vector_size(16)));

}  // namespace

// A stretch's tags are consecutive in memory: one pass tells, eight at a
// time, whether each is 0 or this holder's (fresh blocks, or the holder's
// own coming back: by far the usual case) and whether any is 0; then the
// stretch is tagged with vector stores, or left alone when every tag is the
// holder's already. A stretch with another holder's (or a tainted) block is
// walked one block at a time, so to_zero keeps the blocks' order.
void HolderTags::Hand(const Stretches& blocks, uint32_t holder,
                      std::vector<BlockId>* to_zero) {
  if (holder == 0) return;
  const Tags4 mine = {holder, holder, holder, holder};
  for (const Stretch& s : blocks) {
    uint32_t* tags = last_.data() + s.first;
    const size_t n = static_cast<size_t>(s.count);
    // Lanes all ones while every tag seen is 0 or mine; any lane ones once
    // a tag was 0. Eight tags an iteration.
    Tags4 ok = ~Tags4{0, 0, 0, 0}, zero = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      Tags4 v, w;
      std::memcpy(&v, tags + i, sizeof v);
      std::memcpy(&w, tags + i + 4, sizeof w);
      const Tags4 zv = v == 0, zw = w == 0;
      ok &= (zv | (v == mine)) & (zw | (w == mine));
      zero |= zv | zw;
    }
    for (; i + 4 <= n; i += 4) {
      Tags4 v;
      std::memcpy(&v, tags + i, sizeof v);
      const Tags4 z = v == 0;
      ok &= z | (v == mine);
      zero |= z;
    }
    bool foreign = (~ok[0] | ~ok[1] | ~ok[2] | ~ok[3]) != 0;
    bool fresh = (zero[0] | zero[1] | zero[2] | zero[3]) != 0;
    for (; i < n; ++i) {
      foreign |= tags[i] != 0 && tags[i] != holder;
      fresh |= tags[i] == 0;
    }
    if (foreign) {
      for (size_t j = 0; j < n; ++j) {
        if (tags[j] != 0 && tags[j] != holder) {
          to_zero->push_back(s.first + static_cast<BlockId>(j));
        }
        tags[j] = holder;
      }
      continue;
    }
    if (!fresh) continue;
    for (i = 0; i + 4 <= n; i += 4) std::memcpy(tags + i, &mine, sizeof mine);
    for (; i < n; ++i) tags[i] = holder;
  }
}

void HolderTags::Taint(absl::Span<const BlockId> blocks) {
  for (BlockId b : blocks) last_[b] = kTainted;
}

void HolderTags::Forget(BlockId begin, BlockId end) {
  std::fill(last_.begin() + begin, last_.begin() + end, 0);
}

}  // namespace kvbroker
