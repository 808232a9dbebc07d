// Strong integer types for the quantities the allocator mixes: bytes, blocks
// and pages. A `BlockCount` cannot be passed where a `PageCount` is expected,
// and conversions between units go through the pool geometry, never through a
// bare cast.
//
// Ids (`BlockId`, `PageId`) are plain signed 64-bit integers: they index
// arrays and travel over the wire unchanged, and the geometry documents their
// ranges.

#ifndef KVBROKER_ALLOCATOR_UNITS_H_
#define KVBROKER_ALLOCATOR_UNITS_H_

#include <cstdint>
#include <ostream>

#include "absl/base/macros.h"

namespace kvbroker {

using BlockId = int64_t;  // 0 .. max_blocks - 1
using PageId = int64_t;   // 0 .. page_count - 1

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// A signed count with a unit. Arithmetic stays within the unit; subtraction
// asserts against going negative in debug builds, because a negative count of
// pages or blocks is always a bug.
template <typename Tag>
class Quantity {
 public:
  constexpr Quantity() : v_(0) {}
  constexpr explicit Quantity(int64_t v) : v_(v) {}

  constexpr int64_t value() const { return v_; }

  constexpr Quantity operator+(Quantity o) const { return Quantity(v_ + o.v_); }
  Quantity operator-(Quantity o) const {
    ABSL_ASSERT(v_ >= o.v_);
    return Quantity(v_ - o.v_);
  }
  Quantity& operator+=(Quantity o) {
    v_ += o.v_;
    return *this;
  }
  Quantity& operator-=(Quantity o) {
    ABSL_ASSERT(v_ >= o.v_);
    v_ -= o.v_;
    return *this;
  }
  constexpr Quantity operator*(int64_t k) const { return Quantity(v_ * k); }

  constexpr bool operator==(Quantity o) const { return v_ == o.v_; }
  constexpr bool operator!=(Quantity o) const { return v_ != o.v_; }
  constexpr bool operator<(Quantity o) const { return v_ < o.v_; }
  constexpr bool operator<=(Quantity o) const { return v_ <= o.v_; }
  constexpr bool operator>(Quantity o) const { return v_ > o.v_; }
  constexpr bool operator>=(Quantity o) const { return v_ >= o.v_; }

  friend std::ostream& operator<<(std::ostream& os, Quantity q) {
    return os << q.v_;
  }

 private:
  int64_t v_;
};

struct BytesTag {};
struct BlocksTag {};
struct PagesTag {};

using Bytes = Quantity<BytesTag>;
using BlockCount = Quantity<BlocksTag>;
using PageCount = Quantity<PagesTag>;

inline Bytes MiB(int64_t n) { return Bytes(n * kMiB); }
inline Bytes KiB(int64_t n) { return Bytes(n * kKiB); }

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_UNITS_H_
