// Conversions between the allocator's value types and kvbroker.v1 messages.
// The service (kvbroker_service.cc, capacity_watch.cc) and the daemon's
// --pools loader use them; nothing else translates these types. One
// FromProto per request message and one ToProto per result, so that a
// handler is "find the pool, convert, call, convert".
//
// Field defaults of the wire (proto3 has no presence for scalars): a zero
// tokens_per_block, num_layers or num_kv_buffers means 1, and an empty device
// list means {0}. Every other field passes through unchanged, so that the
// core validates it (Geometry::Create) and reports typed errors.
//
// Thread safety: the functions are pure.

#ifndef KVBROKER_SERVER_PROTO_CONVERT_H_
#define KVBROKER_SERVER_PROTO_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/geometry.h"
#include "allocator/page_pool.h"
#include "common/block_runs.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {

PoolConfig FromProto(const v1::PoolSpec& spec);
v1::PoolSpec ToProto(const PoolConfig& config);

v1::PageState ToProto(PageState state);
v1::LimitState ToProto(LimitState state);
v1::LimitOutcome ToProto(LimitOutcome outcome);

void ToProto(const LimitInfo& limit, v1::MemoryLimit* out);
void ToProto(const CapacitySnapshot& snapshot, v1::CapacitySnapshot* out);
void ToProto(const std::vector<PageBlocks>& pages,
             google::protobuf::RepeatedPtrField<v1::PageBlocks>* out);

void ToProto(const PageOccupancy& occupancy, v1::PageOccupancy* out);

// The pool's spec, derived geometry and `capacity`.
void ToProto(const Geometry& geometry, const CapacitySnapshot& capacity,
             v1::PoolInfo* out);

absl::Duration FromProto(const google::protobuf::Duration& d);
// Rounds down to the second, then adds the nanoseconds.
void ToProto(absl::Time t, google::protobuf::Timestamp* out);

// Requests. FreeRequest views the message's block ids: `request` must
// outlive the returned value.
AllocRequest FromProto(const v1::AllocRequest& request);
// A Free of block_ids and block_runs together, at most `max_ids` blocks:
// what CheckBlockRuns (common/block_runs.h) rejects is INVALID_ARGUMENT
// naming block_runs. Without runs the result views the message's
// block_ids; with runs only, the message's runs, unexpanded (the pool reads
// them as they are); with both, the ids followed by the runs' expansion in
// `*storage`, which must outlive it.
absl::StatusOr<FreeRequest> FromProto(const v1::FreeRequest& request,
                                      int64_t max_ids,
                                      std::vector<int64_t>* storage);
ReserveRequest FromProto(const v1::ReserveRequest& request);

// Results. An Alloc's blocks in the form the pool gave them: runs
// (AllocResponse.block_runs, asked for with AllocRequest.block_runs, which
// sets AllocRequest::as_runs) or pages. An empty result reads the same
// either way.
void ToProto(const AllocResult& result, v1::AllocResponse* out);
void ToProto(const FreeResult& result, v1::FreeResponse* out);
void ToProto(const ReservationInfo& result, v1::ReserveResponse* out);
void ToProto(const ReleaseResult& result, v1::ReleaseReservationResponse* out);
void ToProto(const LimitResult& result, v1::SetMemoryLimitResponse* out);
void ToProto(const TrimResult& result, v1::TrimResponse* out);

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_PROTO_CONVERT_H_
