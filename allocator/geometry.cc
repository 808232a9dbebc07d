// Geometry validation and the exact page/block arithmetic. All products are
// formed in 128 bits so that no validated geometry can overflow.

#include "allocator/geometry.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "common/error_keys.h"

namespace kvbroker {
namespace {

using i128 = __int128;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

std::string HumanBytes(int64_t bytes) {
  if (bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, " MiB");
  if (bytes % kKiB == 0) return absl::StrCat(bytes / kKiB, " KiB");
  return absl::StrCat(bytes, " bytes");
}

}  // namespace

Bytes Geometry::SmallestValidPageSize(Bytes block_bytes, Bytes granularity) {
  const i128 g = granularity.value();
  const i128 smallest = (block_bytes.value() + g - 1) / g * g;
  return Bytes(smallest > INT64_MAX ? 0 : static_cast<int64_t>(smallest));
}

absl::StatusOr<Geometry> Geometry::Create(const PoolConfig& config,
                                          Bytes granularity, int device_count) {
  std::vector<FieldViolation> bad;
  if (!ValidName(config.name)) {
    bad.push_back({"name", "must be 1-128 characters of [A-Za-z0-9._-]"});
  }
  if (config.page_size.value() <= 0) {
    bad.push_back({"page_size", "must be positive"});
  }
  if (config.block_bytes.value() <= 0) {
    bad.push_back({"block_bytes", "must be positive"});
  }
  if (config.tokens_per_block <= 0 ||
      config.tokens_per_block > kMaxTokensPerBlock) {
    bad.push_back({"tokens_per_block",
                   absl::StrCat("must be in [1, ", kMaxTokensPerBlock, "]")});
  }
  if (config.num_layers <= 0 || config.num_layers > (1 << 20)) {
    bad.push_back({"num_layers", "must be in [1, 1048576]"});
  }
  if (config.num_kv_buffers <= 0 || config.num_kv_buffers > 64) {
    bad.push_back({"num_kv_buffers", "must be in [1, 64]"});
  }
  if (config.max_blocks <= 0 || config.max_blocks > kMaxBlocks) {
    bad.push_back(
        {"max_blocks", absl::StrCat("must be in [1, ", kMaxBlocks, "]")});
  }
  if (config.devices.empty()) {
    bad.push_back({"devices", "must name at least one device"});
  } else {
    std::set<int> seen;
    for (int d : config.devices) {
      if (d < 0 || d >= device_count) {
        bad.push_back(
            {"devices", absl::StrCat("unknown device ", d, " (", device_count,
                                     " device(s) present)")});
      } else if (!seen.insert(d).second) {
        bad.push_back({"devices", absl::StrCat("device ", d, " listed twice")});
      }
    }
  }
  if (config.min_idle_pages > (int64_t{1} << 40) ||
      config.max_idle_pages > (int64_t{1} << 40)) {
    bad.push_back({"min_idle_pages", "too large"});
  }
  if (!bad.empty()) {
    std::string message = "invalid pool configuration:";
    for (const auto& v : bad) {
      absl::StrAppend(&message, " ", v.field, " ", v.description, ";");
    }
    message.pop_back();
    std::string first_field = bad.front().field;
    return MakeFailure(
        FailureReason::kInvalidArgument, message,
        {{std::string(error_key::kField), std::move(first_field)}},
        std::move(bad));
  }

  const int64_t P = config.page_size.value();
  const int64_t B = config.block_bytes.value();
  const int64_t g = granularity.value();
  if (B > P) {
    Bytes smallest = SmallestValidPageSize(config.block_bytes, granularity);
    if (smallest.value() == 0) {
      return MakeFailure(
          FailureReason::kInvalidGeometry,
          absl::StrCat("block_bytes (", HumanBytes(B), ") exceeds page_size (",
                       HumanBytes(P), ") and every valid page size"),
          {{std::string(error_key::kBlockBytes), Num(B)},
           {std::string(error_key::kPageSizeBytes), Num(P)},
           {std::string(error_key::kGranularityBytes), Num(g)}},
          {{"block_bytes", "no page size can hold one block"}});
    }
    return MakeFailure(
        FailureReason::kInvalidGeometry,
        absl::StrCat("block_bytes (", HumanBytes(B), ") exceeds page_size (",
                     HumanBytes(P), "); the smallest valid page size is ",
                     HumanBytes(smallest.value()), " (", smallest.value(),
                     " bytes)"),
        {{std::string(error_key::kBlockBytes), Num(B)},
         {std::string(error_key::kPageSizeBytes), Num(P)},
         {std::string(error_key::kGranularityBytes), Num(g)},
         {std::string(error_key::kMinPageSizeBytes), Num(smallest.value())}},
        {{"page_size",
          absl::StrCat("must be at least ", HumanBytes(smallest.value()))}});
  }
  if (P % g != 0) {
    const int64_t lower = P / g * g;
    const bool has_upper = lower <= INT64_MAX - g;
    return MakeFailure(
        FailureReason::kInvalidGeometry,
        absl::StrCat("page_size (", HumanBytes(P),
                     ") is not a multiple of the backend granularity (",
                     HumanBytes(g), "); nearest valid sizes are ",
                     lower > 0 && has_upper ? HumanBytes(lower) + " and " : "",
                     has_upper ? HumanBytes(lower + g) : HumanBytes(lower)),
        {{std::string(error_key::kPageSizeBytes), Num(P)},
         {std::string(error_key::kGranularityBytes), Num(g)},
         {std::string(error_key::kMinPageSizeBytes),
          Num(SmallestValidPageSize(config.block_bytes, granularity).value())}},
        {{"page_size", absl::StrCat("must be a multiple of ", HumanBytes(g))}});
  }

  const i128 bundle = i128{P} * config.num_layers * config.num_kv_buffers;
  const i128 pages = (i128{config.max_blocks} * B + P - 1) / P;
  const i128 virtual_bytes = pages * bundle;
  if (virtual_bytes > kMaxVirtualBytesPerDevice) {
    return MakeFailure(
        FailureReason::kInvalidArgument,
        absl::StrCat("the pool needs ",
                     HumanBytes(static_cast<int64_t>(
                         std::min<i128>(virtual_bytes, INT64_MAX))),
                     " of virtual address space per device; the limit is ",
                     HumanBytes(kMaxVirtualBytesPerDevice)),
        {{std::string(error_key::kField), "max_blocks"}},
        {{"max_blocks", "pool too large to address"}});
  }

  if (pages > kMaxPages) {
    return MakeFailure(
        FailureReason::kInvalidArgument,
        absl::StrCat("the pool would have ", static_cast<int64_t>(pages),
                     " pages; the limit is ", kMaxPages,
                     " (use larger pages or fewer blocks)"),
        {{std::string(error_key::kField), "max_blocks"}},
        {{"max_blocks", "too many pages for one pool"}});
  }

  Geometry geo;
  geo.config_ = config;
  geo.page_count_ = static_cast<int64_t>(pages);
  geo.bundle_bytes_ = Bytes(static_cast<int64_t>(bundle));
  geo.block_stride_ = Bytes(B * config.num_layers * config.num_kv_buffers);
  // Σ usable(p): a block is usable iff it does not straddle a page boundary;
  // counting pages is O(T), done once.
  int64_t total = 0;
  for (PageId p = 0; p < geo.page_count_; ++p) total += geo.usable(p).value();
  geo.total_usable_ = total;
  return geo;
}

// Validation bounds every byte offset by kMaxVirtualBytesPerDevice (2^47), so
// the products below fit in 64 bits.
bool Geometry::is_usable_block(BlockId b) const {
  if (b < 0 || b >= config_.max_blocks) return false;
  BlockRange r = range(page_of(b));
  return b >= r.begin && b < r.end;
}

}  // namespace kvbroker
