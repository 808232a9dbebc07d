// Request bounds and reply-size bounds; see request_bounds.h.

#include "server/request_bounds.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"

namespace kvbroker {
namespace {

// Every reply field but the blocks: counts, generation, flags, a
// reservation id, an expiry and a pool uid, with their tags (Alloc needs
// about 100 bytes, Reserve about 250).
constexpr int64_t kReplyFixedBytes = 512;

int64_t VarintBytes(uint64_t v) {
  int64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

absl::Status TooLong(absl::string_view field, size_t length, size_t limit,
                     absl::string_view unit) {
  return MakeFailure(
      FailureReason::kInvalidArgument,
      absl::StrCat(field, " has ", length, " ", unit, "; at most ", limit,
                   " are accepted"),
      {{"field", std::string(field)},
       {absl::StrCat("length_", unit), Num(static_cast<int64_t>(length))},
       {absl::StrCat("max_", unit), Num(static_cast<int64_t>(limit))}},
      {{std::string(field), absl::StrCat("at most ", limit, " ", unit)}});
}

absl::Status CheckString(absl::string_view field, const std::string& value,
                         size_t limit) {
  return value.size() <= limit ? absl::OkStatus()
                               : TooLong(field, value.size(), limit, "bytes");
}

absl::Status CheckList(absl::string_view field, int size, int limit) {
  return size <= limit ? absl::OkStatus()
                       : TooLong(field, static_cast<size_t>(size),
                                 static_cast<size_t>(limit), "entries");
}

absl::Status CheckRequestId(const std::string& request_id) {
  KVB_RETURN_IF_ERROR(
      CheckString("request_id", request_id, kMaxRequestIdBytes));
  if (request_id.find(kSessionRequestIdMark) == std::string::npos) {
    return absl::OkStatus();
  }
  return MakeFailure(FailureReason::kInvalidArgument,
                     "request_id contains byte 0x01, which is reserved",
                     {{"field", "request_id"}},
                     {{"request_id", "no byte 0x01"}});
}

}  // namespace

absl::Status CheckPoolName(absl::string_view field, const std::string& name) {
  return CheckString(field, name, kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::CreatePoolRequest& request) {
  KVB_RETURN_IF_ERROR(
      CheckString("pool.name", request.pool().name(), kMaxPoolNameBytes));
  return CheckList("pool.devices", request.pool().devices_size(),
                   kMaxDevicesPerPool);
}

absl::Status CheckBounds(const v1::GetPoolRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::ListSessionsRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::DeletePoolRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::CapacityRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::AllocRequest& request) {
  KVB_RETURN_IF_ERROR(CheckString("pool", request.pool(), kMaxPoolNameBytes));
  KVB_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  KVB_RETURN_IF_ERROR(
      CheckString("pool_uid", request.pool_uid(), kMaxPoolUidBytes));
  return CheckString("reservation_id", request.reservation_id(),
                     kMaxReservationIdBytes);
}

absl::Status CheckBounds(const v1::FreeRequest& request) {
  KVB_RETURN_IF_ERROR(CheckString("pool", request.pool(), kMaxPoolNameBytes));
  KVB_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  KVB_RETURN_IF_ERROR(
      CheckString("pool_uid", request.pool_uid(), kMaxPoolUidBytes));
  KVB_RETURN_IF_ERROR(
      CheckList("block_ids", request.block_ids_size(), kMaxBlockIdsPerCall));
  // Two values per run; the blocks they name are bounded where they are
  // expanded (proto_convert.h, FromProto of a FreeRequest).
  return CheckList("block_runs", request.block_runs_size(),
                   2 * kMaxBlockIdsPerCall);
}

absl::Status CheckBounds(const v1::ReserveRequest& request) {
  KVB_RETURN_IF_ERROR(CheckString("pool", request.pool(), kMaxPoolNameBytes));
  KVB_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  if (!request.has_ttl()) return absl::OkStatus();
  const google::protobuf::Duration& ttl = request.ttl();
  // google.protobuf.Duration's own rule: |nanos| < 1e9, same sign as
  // seconds. Positivity is the pool's check (INVALID_ARGUMENT there too).
  const bool valid = ttl.nanos() > -1000000000 && ttl.nanos() < 1000000000 &&
                     !(ttl.seconds() > 0 && ttl.nanos() < 0) &&
                     !(ttl.seconds() < 0 && ttl.nanos() > 0);
  if (!valid || ttl.seconds() > absl::ToInt64Seconds(kMaxReservationTtl) ||
      (ttl.seconds() == absl::ToInt64Seconds(kMaxReservationTtl) &&
       ttl.nanos() > 0)) {
    return MakeFailure(
        FailureReason::kInvalidArgument,
        absl::StrCat("ttl must be a valid duration of at most ",
                     absl::FormatDuration(kMaxReservationTtl)),
        {{"field", "ttl"},
         {"ttl_seconds", Num(ttl.seconds())},
         {"max_ttl_seconds", Num(absl::ToInt64Seconds(kMaxReservationTtl))}},
        {{"ttl",
          absl::StrCat("at most ", absl::FormatDuration(kMaxReservationTtl))}});
  }
  return absl::OkStatus();
}

absl::Status CheckBounds(const v1::ReleaseReservationRequest& request) {
  KVB_RETURN_IF_ERROR(CheckString("pool", request.pool(), kMaxPoolNameBytes));
  KVB_RETURN_IF_ERROR(
      CheckString("pool_uid", request.pool_uid(), kMaxPoolUidBytes));
  return CheckString("reservation_id", request.reservation_id(),
                     kMaxReservationIdBytes);
}

absl::Status CheckBounds(const v1::SetMemoryLimitRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::TrimRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::WatchCapacityRequest& request) {
  return CheckString("pool", request.pool(), kMaxPoolNameBytes);
}

absl::Status CheckBounds(const v1::GetPageOccupancyRequest& request) {
  KVB_RETURN_IF_ERROR(CheckString("pool", request.pool(), kMaxPoolNameBytes));
  KVB_RETURN_IF_ERROR(
      CheckString("pool_uid", request.pool_uid(), kMaxPoolUidBytes));
  return CheckList("page_ids", request.page_ids_size(), kMaxPageIdsPerCall);
}

int64_t ReplyBytesBound(int64_t num_blocks, const Geometry& geometry) {
  const int64_t n = std::max<int64_t>(num_blocks, 0);
  const int64_t pages = std::min(n, geometry.page_count().value());
  const int64_t id_bytes =
      VarintBytes(static_cast<uint64_t>(geometry.max_blocks() - 1));
  // PageBlocks: tag + length (<= 5) + page_id (tag + varint) + block_ids
  // (tag + length <= 5).
  const int64_t page_bytes =
      1 + 5 + 1 +
      VarintBytes(static_cast<uint64_t>(geometry.page_count().value())) + 1 + 5;
  // Saturates instead of overflowing for absurd counts.
  if (n > (INT64_MAX - kReplyFixedBytes) / (id_bytes + page_bytes)) {
    return INT64_MAX;
  }
  return kReplyFixedBytes + n * id_bytes + pages * page_bytes;
}

int64_t MaxBlocksPerReply(const Geometry& geometry) {
  int64_t lo = 0, hi = geometry.max_blocks();  // bound(lo) always fits
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (ReplyBytesBound(mid, geometry) <= kMaxReplyBytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

absl::Status CheckReplyFits(int64_t num_blocks, const Geometry& geometry) {
  if (ReplyBytesBound(num_blocks, geometry) <= kMaxReplyBytes) {
    return absl::OkStatus();
  }
  const int64_t max_blocks = MaxBlocksPerReply(geometry);
  return MakeFailure(
      FailureReason::kInvalidArgument,
      absl::StrCat("the reply listing ", num_blocks,
                   " block ids could exceed the 4 MiB message limit; pool ",
                   geometry.config().name, " hands out at most ", max_blocks,
                   " blocks per call"),
      {{"field", "num_blocks"},
       {"pool", geometry.config().name},
       {"requested_blocks", Num(num_blocks)},
       {"max_blocks_per_call", Num(max_blocks)},
       {"max_reply_bytes", Num(kMaxReplyBytes)}},
      {{"num_blocks", absl::StrCat("at most ", max_blocks, " per call")}});
}

}  // namespace kvbroker
