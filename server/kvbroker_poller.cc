// The poller mode's KvBroker service: raw unary methods bound to
// KvBrokerService::Handle, WatchCapacity through the callback API.

#include "server/kvbroker_poller.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/server_callback.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/status_convert.h"
#include "server/unparsable_request.h"

namespace kvbroker {
namespace {

const google::protobuf::ServiceDescriptor& KvBrokerDescriptor() {
  return *v1::CapacityRequest::descriptor()->file()->FindServiceByName(
      "KvBroker");
}

[[noreturn]] void Unsupported(const std::string& what) {
  std::fprintf(stderr, "kvbrokerd: poller mode: %s\n", what.c_str());
  std::abort();
}

// The handler of one unary method: parse, Handle, serialize.
template <typename Request, typename Response>
UnaryPoller::Method Bind(KvBrokerService* handlers, std::string name) {
  UnaryPoller::Method method;
  method.name = name;
  method.handle = [handlers, name = std::move(name)](
                      grpc::ServerContext* ctx, grpc::ByteBuffer* in,
                      grpc::ByteBuffer* out) -> grpc::Status {
    Request request;
    if (!grpc::SerializationTraits<Request>::Deserialize(in, &request).ok()) {
      return ToGrpcStatus(UnparsableRequest(name));
    }
    Response response;
    grpc::Status status = handlers->Handle(ctx, request, &response);
    if (!status.ok()) return status;
    bool own_buffer;
    return grpc::SerializationTraits<Response>::Serialize(response, out,
                                                          &own_buffer);
  };
  return method;
}

}  // namespace

KvBrokerPollerService::KvBrokerPollerService(KvBrokerService* handlers)
    : handlers_(handlers) {
  // v1::KvBroker::Service added the methods in the descriptor's order.
  const google::protobuf::ServiceDescriptor& service = KvBrokerDescriptor();
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& m = *service.method(i);
    if (m.client_streaming()) Unsupported(m.full_name());
    if (!m.server_streaming()) {
      MarkMethodRaw(i);
      continue;
    }
    if (m.input_type() != v1::WatchCapacityRequest::descriptor() ||
        m.output_type() != v1::WatchCapacityResponse::descriptor()) {
      Unsupported(m.full_name());
    }
    MarkMethodCallback(i,
                       new grpc::internal::CallbackServerStreamingHandler<
                           v1::WatchCapacityRequest, v1::WatchCapacityResponse>(
                           [handlers](grpc::CallbackServerContext* ctx,
                                      const v1::WatchCapacityRequest* request) {
                             return handlers->WatchCapacity(ctx, request);
                           }));
  }
}

std::vector<UnaryPoller::Method> KvBrokerPollerService::UnaryMethods() {
  const google::protobuf::ServiceDescriptor& service = KvBrokerDescriptor();
  std::vector<UnaryPoller::Method> methods;
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& m = *service.method(i);
    if (m.server_streaming()) continue;
    const std::string name =
        absl::StrCat("/", service.full_name(), "/", m.name());
    const google::protobuf::Descriptor* in = m.input_type();
    KvBrokerService* h = handlers_;
    UnaryPoller::Method method;
#define KVB_BIND(Rpc)                                            \
  if (in == v1::Rpc##Request::descriptor()) {                    \
    if (m.output_type() != v1::Rpc##Response::descriptor()) {    \
      Unsupported(name);                                         \
    }                                                            \
    method = Bind<v1::Rpc##Request, v1::Rpc##Response>(h, name); \
  } else
    KVB_BIND(CreatePool)
    KVB_BIND(GetPool)
    KVB_BIND(ListPools)
    KVB_BIND(DeletePool)
    KVB_BIND(Capacity)
    KVB_BIND(Alloc)
    KVB_BIND(Free)
    KVB_BIND(Reserve)
    KVB_BIND(ReleaseReservation)
    KVB_BIND(SetMemoryLimit)
    KVB_BIND(Trim)
    KVB_BIND(GetPageOccupancy)
    KVB_BIND(ListSessions)
    Unsupported(absl::StrCat(name, ": no handler"));
#undef KVB_BIND
    method.request = [this, i](grpc::ServerContext* ctx,
                               grpc::ByteBuffer* request,
                               UnaryPoller::Writer* writer,
                               grpc::ServerCompletionQueue* cq, void* tag) {
      RequestAsyncUnary(i, ctx, request, writer, cq, cq, tag);
    };
    methods.push_back(std::move(method));
  }
  return methods;
}

}  // namespace kvbroker
