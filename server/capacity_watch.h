// CapacityWatch: one kvbroker.v1.KvBroker.WatchCapacity stream.
//
// A ServerWriteReactor subscribed to the ChangeFeed that the broker's
// on_change feeds. It writes a snapshot at once and again whenever the pool's
// generation moved, with at most one write in flight: changes that arrive
// during a write are coalesced into one snapshot of the latest state. It ends
// with the pool's failure when the pool is deleted (POOL_NOT_FOUND), with
// CANCELLED when the client goes away or its deadline passes, and with OK
// when the feed closes (the server is draining).
//
// Thread safety: the reactor is driven by gRPC and the feed concurrently; it
// owns itself from StartCapacityWatch until gRPC calls OnDone.

#ifndef KVBROKER_SERVER_CAPACITY_WATCH_H_
#define KVBROKER_SERVER_CAPACITY_WATCH_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "allocator/page_pool.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/change_feed.h"

namespace kvbroker {

// Starts a stream of `pool`'s capacity with page lists of at most
// `max_pages` entries (CapacityQuery::max_pages).
grpc::ServerWriteReactor<v1::WatchCapacityResponse>* StartCapacityWatch(
    std::shared_ptr<ChangeFeed> feed, std::shared_ptr<PagePool> pool,
    int64_t max_pages);

// A stream that only finishes with `refusal` (not OK).
grpc::ServerWriteReactor<v1::WatchCapacityResponse>* RefuseCapacityWatch(
    const absl::Status& refusal);

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_CAPACITY_WATCH_H_
