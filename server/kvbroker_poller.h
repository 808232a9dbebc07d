// KvBrokerPollerService: kvbroker.v1.KvBroker as kvbrokerd serves it with
// --server_threading=poller.
//
// Registered with the gRPC server in place of KvBrokerService (which stays
// the owner of every handler): each unary method is served raw through a
// UnaryPoller (unary_poller.h), whose workers parse the request, run
// KvBrokerService::Handle inline and serialize the response; a request that
// does not parse is refused with UnparsableRequest(method) (the typed
// INVALID_ARGUMENT the callback mode's interceptor gives) without reaching
// the handler. WatchCapacity, the one server stream, is served by
// KvBrokerService::WatchCapacity through the callback API as in the
// callback mode: a stream lives for minutes, so the hand-offs of its start
// do not matter, and its writes are paced by the ChangeFeed's notifier.
//
// Thread safety: the methods' handlers are called from any worker; the
// service is set up once, before the server is built.

#ifndef KVBROKER_SERVER_KVBROKER_POLLER_H_
#define KVBROKER_SERVER_KVBROKER_POLLER_H_

#include <vector>

#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/kvbroker_service.h"
#include "server/unary_poller.h"

namespace kvbroker {

class KvBrokerPollerService final : public v1::KvBroker::Service {
 public:
  // `handlers` must outlive the service.
  explicit KvBrokerPollerService(KvBrokerService* handlers);

  // Every unary method of kvbroker.v1.KvBroker, for the UnaryPoller.
  std::vector<UnaryPoller::Method> UnaryMethods();

 private:
  KvBrokerService* const handlers_;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_KVBROKER_POLLER_H_
