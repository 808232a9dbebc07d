// Conversions between the allocator's value types and kvbroker.v1 messages.
// The service (kvbroker_service.cc) and the daemon's --pools loader use them;
// nothing else translates these types.
//
// Field defaults of the wire (proto3 has no presence for scalars): a zero
// tokens_per_block, num_layers or num_kv_buffers means 1, and an empty device
// list means {0}. Every other field passes through unchanged, so that the
// core validates it (Geometry::Create) and reports typed errors.
//
// Thread safety: the functions are pure.

#ifndef KVBROKER_SERVER_PROTO_CONVERT_H_
#define KVBROKER_SERVER_PROTO_CONVERT_H_

#include <vector>

#include "allocator/geometry.h"
#include "allocator/page_pool.h"
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

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_PROTO_CONVERT_H_
