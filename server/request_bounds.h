// Bounds on what a caller may send and on what a reply may weigh (SPEC 9).
//
// Every caller-given string and list of kvbroker.v1.KvBroker has a bound
// below; a request past one is refused with INVALID_ARGUMENT (BadRequest
// names the field, metadata gives the length and the limit) before it is
// authorized or touches a pool, so it changes nothing, and the refusal
// never echoes the oversized value. A request whose reply could exceed
// gRPC's default 4 MiB message size is refused the same way before any
// change (CheckReplyFits).
//
//   field                                          bound
//   pool names (every request, PoolSpec.name)      kMaxPoolNameBytes
//   request_id (Alloc, Free, Reserve)              kMaxRequestIdBytes,
//                                                  no kSessionRequestIdMark
//   reservation_id (Alloc, ReleaseReservation)     kMaxReservationIdBytes
//   pool_uid (Alloc, Free, ReleaseReservation,
//             GetPageOccupancy)                    kMaxPoolUidBytes
//   PoolSpec.devices                               kMaxDevicesPerPool
//   Free.block_ids                                 kMaxBlockIdsPerCall
//   Free.block_runs: values / blocks named         2 x / 1 x
//   kMaxBlockIdsPerCall GetPageOccupancy.page_ids kMaxPageIdsPerCall
//   Reserve.ttl                                    (0, kMaxReservationTtl]
//   Alloc / Reserve num_blocks                     MaxBlocksPerReply(pool)
//
// The page list of Capacity and WatchCapacity has its own bound,
// kvbrokerd --max_page_list (KvBrokerService's ServiceLimits).
//
// The numbers keep the largest reply of each kind under kMaxReplyBytes:
// a GetPageOccupancy entry encodes in at most 48 bytes, so 65536 entries
// stay below 3.2 MiB.
//
// Thread safety: the functions are pure.

#ifndef KVBROKER_SERVER_REQUEST_BOUNDS_H_
#define KVBROKER_SERVER_REQUEST_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "allocator/geometry.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {

// gRPC's default maximum message size, which default clients enforce on
// the replies they receive.
inline constexpr int64_t kMaxReplyBytes = 4 * 1024 * 1024;

inline constexpr size_t kMaxPoolNameBytes = 128;  // = Geometry's name rule
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxReservationIdBytes = 128;
inline constexpr size_t kMaxPoolUidBytes = 64;
inline constexpr int kMaxDevicesPerPool = 16;
inline constexpr int kMaxBlockIdsPerCall = 1 << 20;
inline constexpr int kMaxPageIdsPerCall = 65536;
inline constexpr absl::Duration kMaxReservationTtl = absl::Hours(24);
// The pool's request ids of attach sessions begin with this byte
// (attach/session.cc), and a caller's request_id may not contain it: no
// caller can name a session's id, to replay its outcome or to be answered
// with it. Not NUL: refusals quote request ids, and a C caller reads
// them as C strings.
inline constexpr char kSessionRequestIdMark = '\x01';

// One overload per request: OK, or the INVALID_ARGUMENT refusal of the
// first field past its bound.
absl::Status CheckBounds(const v1::CreatePoolRequest& request);
absl::Status CheckBounds(const v1::GetPoolRequest& request);
absl::Status CheckBounds(const v1::ListSessionsRequest& request);
absl::Status CheckBounds(const v1::DeletePoolRequest& request);
absl::Status CheckBounds(const v1::CapacityRequest& request);
absl::Status CheckBounds(const v1::AllocRequest& request);
absl::Status CheckBounds(const v1::FreeRequest& request);
absl::Status CheckBounds(const v1::ReserveRequest& request);
absl::Status CheckBounds(const v1::ReleaseReservationRequest& request);
absl::Status CheckBounds(const v1::SetMemoryLimitRequest& request);
absl::Status CheckBounds(const v1::TrimRequest& request);
absl::Status CheckBounds(const v1::WatchCapacityRequest& request);
absl::Status CheckBounds(const v1::GetPageOccupancyRequest& request);

// The bound of a pool name in `field` (for requests of other services).
absl::Status CheckPoolName(absl::string_view field, const std::string& name);

// An upper bound of the encoded size of an Alloc or Reserve reply carrying
// `num_blocks` blocks of a pool of `geometry`: every block id costs at most
// the varint size of max_blocks - 1, every page touched (at most
// min(num_blocks, page_count)) its PageBlocks framing, plus the reply's
// other fields. Monotone in num_blocks.
int64_t ReplyBytesBound(int64_t num_blocks, const Geometry& geometry);

// The largest num_blocks whose ReplyBytesBound fits kMaxReplyBytes.
int64_t MaxBlocksPerReply(const Geometry& geometry);

// INVALID_ARGUMENT (field num_blocks, metadata max_blocks_per_call) when
// the reply to `num_blocks` blocks could exceed kMaxReplyBytes.
absl::Status CheckReplyFits(int64_t num_blocks, const Geometry& geometry);

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_REQUEST_BOUNDS_H_
