// Pool geometry (docs/design.md, "Geometry"): which blocks live on which page,
// exactly.
//
// Glossary:
//   P  page size in bytes (per layer and KV buffer); a multiple of the
//      backend's allocation granularity.
//   B  block size in bytes (per layer and KV buffer); 0 < B <= P.
//   L  layers, K  KV buffers (2 for separate K and V, 1 for MLA).
//   N  max_blocks; block ids are 0 .. N-1.
//   T  page count = ceil(N*B / P).
//   bundle = P*L*K bytes: the physical memory one page id costs on each device.
//
// Block b occupies bytes [b*B, (b+1)*B) of the block-major address space and
// lives on page floor(b*B / P). A block is *usable* only if it lies wholly
// inside one page; a block straddling a page boundary belongs to no page and
// is never handed out. The usable blocks of page p are
//   range(p) = [ceil(p*P / B), min(floor((p+1)*P / B), N))
// and usable(p) = max(0, end - start). A page with usable(p) == 0 is never
// mapped and never counted.

#ifndef KVBROKER_ALLOCATOR_GEOMETRY_H_
#define KVBROKER_ALLOCATOR_GEOMETRY_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/units.h"

namespace kvbroker {

// What a caller asks for when creating a pool.
struct PoolConfig {
  std::string name;
  Bytes page_size;                 // P
  Bytes block_bytes;               // B
  int64_t tokens_per_block = 1;    // for reporting capacity in tokens
  int64_t num_layers = 1;          // L
  int64_t num_kv_buffers = 1;      // K
  std::vector<int> devices = {0};  // one physical page per device per page id
  int64_t max_blocks = 0;          // N
  bool reserve_null_block = false;
  // Per-pool prealloc bounds; negative means "the broker's default".
  int64_t min_idle_pages = -1;
  int64_t max_idle_pages = -1;
  // Export each page's handles when it is mapped (BundleMapper::Map), not
  // lazily at an engine's first attach.
  bool export_at_map = false;
};

// A half-open range of block ids [begin, end); empty when begin >= end.
struct BlockRange {
  BlockId begin = 0;
  BlockId end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
  bool operator==(const BlockRange& o) const {
    return begin == o.begin && end == o.end;
  }
};

// Immutable, validated geometry of one pool.
class Geometry {
 public:
  // Validates `config` against a backend with allocation granularity
  // `granularity` and `device_count` devices (ordinals 0..device_count-1).
  // Errors:
  //   INVALID_ARGUMENT (reason INVALID_ARGUMENT) with one field violation per
  //     malformed field: empty or malformed name, non-positive sizes or
  //     counts, empty, duplicate or unknown devices, a pool too large to
  //     address;
  //   INVALID_ARGUMENT (reason INVALID_GEOMETRY) when B > P (the message and
  //     the metadata key `min_page_size_bytes` name the least multiple of the
  //     granularity >= B) or when P is not a multiple of the granularity.
  static absl::StatusOr<Geometry> Create(const PoolConfig& config,
                                         Bytes granularity, int device_count);

  const PoolConfig& config() const { return config_; }
  Bytes page_size() const { return config_.page_size; }
  Bytes block_bytes() const { return config_.block_bytes; }
  int64_t max_blocks() const { return config_.max_blocks; }
  int device_count() const { return static_cast<int>(config_.devices.size()); }
  const std::vector<int>& devices() const { return config_.devices; }

  // T: number of page ids, including pages that hold no usable block.
  PageCount page_count() const { return PageCount(page_count_); }
  // P*L*K: physical bytes one page id costs on one device.
  Bytes bundle_bytes() const { return bundle_bytes_; }
  // B*L*K: bytes of one block across its layers and buffers, i.e. the
  // distance between consecutive blocks in the block-major layout.
  Bytes block_stride() const { return block_stride_; }
  // T*bundle: bytes of the virtual range reserved on each device.
  Bytes virtual_bytes_per_device() const {
    return Bytes(page_count_ * bundle_bytes_.value());
  }
  // Byte offset of page p inside each device's range.
  Bytes page_offset(PageId p) const { return Bytes(p * bundle_bytes_.value()); }

  // Inline: the pool's walks call these once per page or per id.
  BlockRange range(PageId p) const {
    const int64_t P = config_.page_size.value();
    const int64_t B = config_.block_bytes.value();
    BlockRange r;
    r.begin = (p * P + B - 1) / B;
    r.end = std::min<int64_t>((p + 1) * P / B, config_.max_blocks);
    return r;
  }
  BlockCount usable(PageId p) const { return BlockCount(range(p).size()); }
  // The page holding block b's first byte. REQUIRES: 0 <= b < N.
  PageId page_of(BlockId b) const {
    return b * config_.block_bytes.value() / config_.page_size.value();
  }
  // True iff b is in range(page_of(b)), i.e. b can ever be handed out.
  bool is_usable_block(BlockId b) const;
  // Σ usable(p) over all pages.
  BlockCount total_usable() const { return BlockCount(total_usable_); }

  // The least multiple of `granularity` that is >= `block_bytes`; 0 when
  // that multiple exceeds INT64_MAX (no page size can hold the block).
  static Bytes SmallestValidPageSize(Bytes block_bytes, Bytes granularity);

 private:
  Geometry() = default;

  PoolConfig config_;
  int64_t page_count_ = 0;
  Bytes bundle_bytes_;
  Bytes block_stride_;
  int64_t total_usable_ = 0;
};

// Largest virtual range one pool may reserve on one device (128 TiB).
constexpr int64_t kMaxVirtualBytesPerDevice = int64_t{1} << 47;
// Bounds on the pool's own bookkeeping, which is O(N + T) bytes: 2^27 blocks
// (about 150 MiB of block state) and 2^22 pages (8 TiB of 2 MiB pages per
// device). No request can make the daemon allocate more.
constexpr int64_t kMaxBlocks = int64_t{1} << 27;
constexpr int64_t kMaxPages = int64_t{1} << 22;
// Keeps available_tokens = blocks * tokens_per_block far from overflow.
constexpr int64_t kMaxTokensPerBlock = int64_t{1} << 24;

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_GEOMETRY_H_
