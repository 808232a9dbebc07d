// Consecutive block ids: where a stretch of them ends in a list, and
// writing one out. Standard library and absl::Span only, so that the
// allocator core (which must not see protobuf) and the wire's block runs
// (block_runs.h) share one version of each.
#ifndef KVBROKER_COMMON_CONSECUTIVE_IDS_H_
#define KVBROKER_COMMON_CONSECUTIVE_IDS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/types/span.h"

namespace kvbroker {

// The end of the stretch of consecutive ids that starts at ids[i]: the
// least end > i with end == ids.size() or ids[end] != ids[end - 1] + 1. A
// stretch never wraps past the largest int64. Along a stretch ids[j] - j is
// constant (in unsigned arithmetic, which wraps where int64 would
// overflow; a stretch that wrapped is cut below). Eight ids are checked
// with one branch: each pair of them XORed with the pair a stretch would
// hold there and the results ORed, in the compiler's generic vectors (XOR,
// OR and 64-bit adds are SSE2 on x86-64, where only 64-bit compares are
// not); then four with one branch, then the last few one by one.
inline size_t ConsecutiveEnd(absl::Span<const int64_t> ids, size_t i) {
  using Pair = uint64_t __attribute__((vector_size(16)));
  const uint64_t base = static_cast<uint64_t>(ids[i]) - i;
  const uint64_t* at = reinterpret_cast<const uint64_t*>(ids.data());
  size_t end = i + 1;
  if (end + 8 <= ids.size()) {
    const uint64_t w = base + end;
    Pair w0 = {w, w + 1}, w2 = {w + 2, w + 3}, w4 = {w + 4, w + 5},
         w6 = {w + 6, w + 7};
    const Pair eight = {8, 8};
    for (; end + 8 <= ids.size(); end += 8) {
      Pair a, b, c, d;
      std::memcpy(&a, at + end, sizeof a);
      std::memcpy(&b, at + end + 2, sizeof b);
      std::memcpy(&c, at + end + 4, sizeof c);
      std::memcpy(&d, at + end + 6, sizeof d);
      const Pair off = (a ^ w0) | (b ^ w2) | (c ^ w4) | (d ^ w6);
      if ((off[0] | off[1]) != 0) break;
      w0 += eight;
      w2 += eight;
      w4 += eight;
      w6 += eight;
    }
  }
  while (end + 4 <= ids.size() &&
         ((at[end] - end - base) | (at[end + 1] - (end + 1) - base) |
          (at[end + 2] - (end + 2) - base) |
          (at[end + 3] - (end + 3) - base)) == 0) {
    end += 4;
  }
  while (end < ids.size() && at[end] - end == base) ++end;
  const int64_t first = ids[i];
  constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
  if (first > 0 && end - i - 1 > static_cast<uint64_t>(kLargest - first)) {
    end = i + static_cast<size_t>(kLargest - first) + 1;
  }
  return end;
}

// Writes first, first + 1, ..., first + count - 1 to dst[0 .. count).
// REQUIRES: count >= 0 and first + count - 1 <= the largest int64.
//
// Two ids per vector add and store (the compiler's generic vectors: SSE2
// on x86-64, NEON on arm64), four per iteration: at -O2 the compiler does
// not vectorise the plain loop, which costs three or four instructions an
// id, and ids written this way are most of what an Alloc or Free of whole
// pages does per block (bench/RESULTS.md, "Runs through the pool").
// Unsigned lanes: the last add may step past the largest int64, and its
// result is never stored.
inline void WriteConsecutive(int64_t* dst, int64_t first, int64_t count) {
  using Pair = uint64_t __attribute__((vector_size(16)));
  int64_t k = 0;
  if (count >= 4) {
    const uint64_t f = static_cast<uint64_t>(first);
    Pair lo = {f, f + 1}, hi = {f + 2, f + 3};
    const Pair four = {4, 4};
    for (; k + 4 <= count; k += 4) {
      std::memcpy(dst + k, &lo, sizeof lo);
      std::memcpy(dst + k + 2, &hi, sizeof hi);
      lo += four;
      hi += four;
    }
  }
  for (; k < count; ++k) dst[k] = first + k;
}

}  // namespace kvbroker

#endif  // KVBROKER_COMMON_CONSECUTIVE_IDS_H_
