// BlockSet: the block ids one holder owns on the attach socket, as a bitmap
// grown to the highest id it has held. Membership, insertion and removal
// cost a shift and a mask: no hashing and no allocation on the session's hot
// path (Alloc and Free), where a hash set cost more than the pool's own
// work. Runs of consecutive ids, as one Alloc hands them out per page, are
// set and cleared a word at a time. A pool's ids lie in [0, max_blocks), so the
// bitmap never exceeds max_blocks / 8 bytes.
//
// Thread safety: none; the attach server guards each holder's set with its
// lock.

#ifndef KVBROKER_ATTACH_BLOCK_SET_H_
#define KVBROKER_ATTACH_BLOCK_SET_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/types/span.h"

namespace kvbroker::attach {

class BlockSet {
 public:
  // REQUIRES: id >= 0 for every id given.
  bool contains(int64_t id) const {
    const size_t w = static_cast<size_t>(id) / 64;
    return w < words_.size() && (words_[w] >> (id % 64) & 1) != 0;
  }
  // False when `id` was already in the set.
  bool insert(int64_t id) {
    const size_t w = static_cast<size_t>(id) / 64;
    if (w >= words_.size()) words_.resize(w + 1, 0);
    const uint64_t bit = uint64_t{1} << (id % 64);
    if (words_[w] & bit) return false;
    words_[w] |= bit;
    ++size_;
    return true;
  }
  // REQUIRES: every id in [0, INT64_MAX).
  template <typename It>
  void insert(It first, It last) {
    while (first != last) {
      const int64_t begin = *first;
      int64_t end = begin + 1;
      for (++first; first != last && *first == end; ++first) ++end;
      InsertRange(begin, end);
    }
  }
  // The same for ids ascending and distinct (one page of an Alloc): a
  // stretch without gaps is told from its ends and set as one range.
  void InsertAscending(absl::Span<const int64_t> ids) {
    if (ids.empty()) return;
    if (ids.back() - ids.front() == static_cast<int64_t>(ids.size()) - 1 &&
        ids.back() < std::numeric_limits<int64_t>::max()) {
      InsertRange(ids.front(), ids.back() + 1);
    } else {
      insert(ids.begin(), ids.end());
    }
  }
  // Inserts [begin, end). REQUIRES: 0 <= begin <= end.
  void InsertRange(int64_t begin, int64_t end) {
    if (begin == end) return;
    const size_t last = static_cast<size_t>(end - 1) / 64;
    if (last >= words_.size()) words_.resize(last + 1, 0);
    for (size_t w = static_cast<size_t>(begin) / 64; w <= last; ++w) {
      const uint64_t mask = Mask(w, begin, end);
      size_ += __builtin_popcountll(mask & ~words_[w]);
      words_[w] |= mask;
    }
  }
  // Erases [begin, end) when every id of it is in the set; otherwise (or
  // for begin < 0) changes nothing and returns false.
  bool EraseRange(int64_t begin, int64_t end) {
    if (begin < 0 || end <= begin) return begin >= 0 && end == begin;
    const size_t first = static_cast<size_t>(begin) / 64;
    const size_t last = static_cast<size_t>(end - 1) / 64;
    if (last >= words_.size()) return false;
    for (size_t w = first; w <= last; ++w) {
      const uint64_t mask = Mask(w, begin, end);
      if ((words_[w] & mask) != mask) return false;
    }
    for (size_t w = first; w <= last; ++w) words_[w] &= ~Mask(w, begin, end);
    size_ -= end - begin;
    return true;
  }
  // False when `id` was not in the set.
  bool erase(int64_t id) {
    const size_t w = static_cast<size_t>(id) / 64;
    if (w >= words_.size()) return false;  // negative ids land here too
    const uint64_t bit = uint64_t{1} << (id % 64);
    if (!(words_[w] & bit)) return false;
    words_[w] &= ~bit;
    --size_;
    return true;
  }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() {
    words_.clear();
    size_ = 0;
  }
  // Every id, ascending.
  std::vector<int64_t> Sorted() const {
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(size_));
    for (size_t w = 0; w < words_.size(); ++w) {
      for (uint64_t bits = words_[w]; bits != 0; bits &= bits - 1) {
        out.push_back(static_cast<int64_t>(w * 64) + __builtin_ctzll(bits));
      }
    }
    return out;
  }

 private:
  // The bits of word `w` that lie in [begin, end).
  static uint64_t Mask(size_t w, int64_t begin, int64_t end) {
    const int64_t lo = std::max<int64_t>(begin, static_cast<int64_t>(w * 64));
    const int64_t hi =
        std::min<int64_t>(end, static_cast<int64_t>(w * 64 + 64));
    const int64_t n = hi - lo;
    const uint64_t ones = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    return ones << (lo - static_cast<int64_t>(w * 64));
  }

  std::vector<uint64_t> words_;
  int64_t size_ = 0;  // bits set
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_BLOCK_SET_H_
