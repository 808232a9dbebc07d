// The names of kvbroker's typed failures on the wire: the ErrorInfo domain
// and every ErrorInfo metadata key. The encoder (server/status_convert.cc and
// the code that builds failures) and the decoder (client/error_codec.h) use
// these constants, so that a key is spelled once.
//
// Keys are snake_case and carry their unit (_blocks, _pages, _bytes); values
// are strings (integers in decimal).
//
// Header-only, no dependencies: the allocator core may include it.

#ifndef KVBROKER_COMMON_ERROR_KEYS_H_
#define KVBROKER_COMMON_ERROR_KEYS_H_

#include "absl/strings/string_view.h"

namespace kvbroker {

// google.rpc.ErrorInfo.domain of every kvbroker failure.
inline constexpr absl::string_view kErrorDomain = "kvbroker";

namespace error_key {

// What the failure is about.
inline constexpr absl::string_view kPool = "pool";
inline constexpr absl::string_view kBlockId = "block_id";
inline constexpr absl::string_view kBlockIds = "block_ids";
inline constexpr absl::string_view kPageIds = "page_ids";
inline constexpr absl::string_view kReservationId = "reservation_id";
inline constexpr absl::string_view kRequestId = "request_id";
inline constexpr absl::string_view kFirstRequest = "first_request";
inline constexpr absl::string_view kThisRequest = "this_request";
// INVALID_ARGUMENT: the offending request field (also in BadRequest).
inline constexpr absl::string_view kField = "field";

// Capacity refusals.
inline constexpr absl::string_view kRequestedBlocks = "requested_blocks";
inline constexpr absl::string_view kAvailableBlocks = "available_blocks";
inline constexpr absl::string_view kAllocatedBlocks = "allocated_blocks";
inline constexpr absl::string_view kReservedBlocks = "reserved_blocks";
inline constexpr absl::string_view kReservedBlocksNamed =
    "reserved_blocks_named";
inline constexpr absl::string_view kReservationBlocks = "reservation_blocks";
inline constexpr absl::string_view kNotAllocatedBlocks = "not_allocated_blocks";
inline constexpr absl::string_view kNumBlocks = "num_blocks";
inline constexpr absl::string_view kPoolTotalBlocks = "pool_total_blocks";
inline constexpr absl::string_view kMaxBlocks = "max_blocks";
inline constexpr absl::string_view kRequestedPages = "requested_pages";
inline constexpr absl::string_view kRequiredPages = "required_pages";
inline constexpr absl::string_view kAffordablePages = "affordable_pages";
inline constexpr absl::string_view kMappedPages = "mapped_pages";
inline constexpr absl::string_view kTargetPages = "target_pages";
inline constexpr absl::string_view kMinIdlePages = "min_idle_pages";
inline constexpr absl::string_view kMappedBytes = "mapped_bytes";
inline constexpr absl::string_view kVirtualBytes = "virtual_bytes";
inline constexpr absl::string_view kLimitBytes = "limit_bytes";
inline constexpr absl::string_view kBundleBytes = "bundle_bytes";

// Geometry.
inline constexpr absl::string_view kPageSizeBytes = "page_size_bytes";
inline constexpr absl::string_view kBlockBytes = "block_bytes";
inline constexpr absl::string_view kGranularityBytes = "granularity_bytes";
inline constexpr absl::string_view kMinPageSizeBytes = "min_page_size_bytes";

// Generations and failures.
inline constexpr absl::string_view kExpectedGeneration = "expected_generation";
inline constexpr absl::string_view kCurrentGeneration = "current_generation";
inline constexpr absl::string_view kDriverError = "driver_error";
inline constexpr absl::string_view kFailure = "failure";
// A capacity refusal that a reservation could not cover: the reason the
// pool itself would have given.
inline constexpr absl::string_view kPoolReason = "pool_reason";
// REASON_UNSPECIFIED (an untranslated status): its original code's name.
inline constexpr absl::string_view kOriginalCode = "original_code";

// Access control.
inline constexpr absl::string_view kTokenName = "token_name";
inline constexpr absl::string_view kMethod = "method";

// Request bounds.
inline constexpr absl::string_view kCaller = "caller";
inline constexpr absl::string_view kMaxWatchesPerCaller =
    "max_watches_per_caller";

}  // namespace error_key
}  // namespace kvbroker

#endif  // KVBROKER_COMMON_ERROR_KEYS_H_
