// BlockSet: the block ids one holder owns on the attach socket, as a bitmap
// grown to the highest id it has held. Membership, insertion and removal
// cost a shift and a mask: no hashing and no allocation on the session's hot
// path (Alloc and Free), where a hash set cost more than the pool's own
// work. A pool's ids lie in [0, max_blocks), so the bitmap never exceeds
// max_blocks / 8 bytes.
//
// Thread safety: none; the attach server guards each holder's set with its
// lock.

#ifndef KVBROKER_ATTACH_BLOCK_SET_H_
#define KVBROKER_ATTACH_BLOCK_SET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

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
  template <typename It>
  void insert(It first, It last) {
    for (; first != last; ++first) insert(*first);
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
  std::vector<uint64_t> words_;
  int64_t size_ = 0;  // bits set
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_BLOCK_SET_H_
