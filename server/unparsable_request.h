// Requests whose bytes do not parse as the method's request message.
//
// gRPC's callback API answers such a call with a bare UNIMPLEMENTED (the
// handler is never run), which a client cannot tell from a method the
// daemon lacks. This server interceptor notices the failed parse (gRPC hands
// interceptors no request message at POST_RECV_MESSAGE then) and replaces
// the status the call ends with by a typed refusal: INVALID_ARGUMENT, reason
// INVALID_ARGUMENT, ErrorInfo metadata "method" (the full method name) and
// "field" "request", BadRequest naming the request, built through
// status_convert.h like every other refusal. Calls whose request parsed are
// passed through untouched; it covers every method with one request
// message (unary and server-streaming), including those of services added
// later. Client and bidi streams (server reflection) are left alone: there
// no message also means the client closed its side. Methods that parse
// their requests themselves (the raw methods of kvbrokerd's poller mode,
// kvbroker_poller.h) are named to the factory and left alone too.
//
// Thread safety: the factory is thread-safe; each interceptor serves one
// call.

#ifndef KVBROKER_SERVER_UNPARSABLE_REQUEST_H_
#define KVBROKER_SERVER_UNPARSABLE_REQUEST_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvbroker {

// The typed refusal of a request to `method` that did not parse.
absl::Status UnparsableRequest(absl::string_view method);

class UnparsableRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `parsed_elsewhere`: full method names ("/pkg.Service/Method") whose
  // calls get no interceptor.
  explicit UnparsableRequestInterceptorFactory(
      absl::flat_hash_set<std::string> parsed_elsewhere = {})
      : parsed_elsewhere_(std::move(parsed_elsewhere)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const absl::flat_hash_set<std::string> parsed_elsewhere_;
};

// For ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewUnparsableRequestInterceptorFactory(
    absl::flat_hash_set<std::string> parsed_elsewhere = {});

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_UNPARSABLE_REQUEST_H_
