// CapacityWatch: one kvbroker.v1.KvBroker.WatchCapacity stream.
//
// A ServerWriteReactor subscribed to the ChangeFeed, which builds snapshots
// on its notifier thread and offers each watcher the same message (see
// change_feed.h). The stream writes the first snapshot as soon as the
// notifier has built it, then every newer one, with at most one write in
// flight: snapshots offered during a write are coalesced, only the latest is
// written next. It ends with the pool's failure when the pool is deleted
// (POOL_NOT_FOUND), with CANCELLED when the client goes away or its deadline
// passes, with OK when the feed closes (the server is draining), and, when
// the feed refuses the subscription, with that refusal (INVALID_ARGUMENT past
// the per-caller bound, UNAVAILABLE while draining).
//
// Thread safety: the reactor is driven by gRPC and the notifier concurrently;
// it owns itself from StartCapacityWatch until gRPC calls OnDone.

#ifndef KVBROKER_SERVER_CAPACITY_WATCH_H_
#define KVBROKER_SERVER_CAPACITY_WATCH_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/status.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/change_feed.h"

namespace kvbroker {

// Starts a stream of `watch`'s pool. Returns the reactor gRPC drives.
grpc::ServerWriteReactor<v1::WatchCapacityResponse>* StartCapacityWatch(
    std::shared_ptr<ChangeFeed> feed, ChangeFeed::Watch watch);

// A stream that only finishes with `refusal` (not OK).
grpc::ServerWriteReactor<v1::WatchCapacityResponse>* RefuseCapacityWatch(
    const absl::Status& refusal);

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_CAPACITY_WATCH_H_
