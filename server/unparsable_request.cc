// The interceptor that types the refusal of unparsable requests; see
// unparsable_request.h.

#include "server/unparsable_request.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "common/error_keys.h"
#include "server/status_convert.h"

namespace kvbroker {
namespace {

using grpc::experimental::InterceptionHookPoints;

class UnparsableRequestInterceptor final
    : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequestInterceptor(const char* method)
      : method_(method != nullptr ? method : "") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* batch) override {
    // No message at POST_RECV_MESSAGE: the bytes did not parse.
    if (batch->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        batch->GetRecvMessage() == nullptr) {
      unparsable_ = true;
    }
    // gRPC's own answer to it is UNIMPLEMENTED; any other status is the
    // handler's.
    if (unparsable_ &&
        batch->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS) &&
        batch->GetSendStatus().error_code() ==
            grpc::StatusCode::UNIMPLEMENTED) {
      batch->ModifySendStatus(ToGrpcStatus(UnparsableRequest(method_)));
    }
    batch->Proceed();
  }

 private:
  const absl::string_view method_;  // gRPC's; lives as long as the call
  bool unparsable_ = false;
};

}  // namespace

absl::Status UnparsableRequest(absl::string_view method) {
  return MakeFailure(
      FailureReason::kInvalidArgument,
      absl::StrCat("the request to ", method,
                   " is not a valid message of the method's request type"),
      {{std::string(error_key::kMethod), std::string(method)},
       {std::string(error_key::kField), "request"}},
      {{"request", "does not parse as the method's request message"}});
}

grpc::experimental::Interceptor*
UnparsableRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  // Only methods with exactly one request message: in a client or bidi
  // stream no message also means the client closed its side.
  using Type = grpc::experimental::ServerRpcInfo::Type;
  if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) {
    return nullptr;
  }
  if (!parsed_elsewhere_.empty() && info->method() != nullptr &&
      parsed_elsewhere_.contains(info->method())) {
    return nullptr;
  }
  return new UnparsableRequestInterceptor(info->method());
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewUnparsableRequestInterceptorFactory(
    absl::flat_hash_set<std::string> parsed_elsewhere) {
  return std::make_unique<UnparsableRequestInterceptorFactory>(
      std::move(parsed_elsewhere));
}

}  // namespace kvbroker
