// Server reflection, protocol version v1 (grpc.reflection.v1).
//
// Debian's gRPC 1.51 serves only grpc.reflection.v1alpha
// (grpc::reflection::InitProtoReflectionServerBuilderPlugin); newer grpcurl
// and other clients ask for v1 first. The two protocols have the same
// messages and semantics, so this service answers v1 from the same source
// v1alpha uses: the process's generated descriptor pool
// (google::protobuf::DescriptorPool::generated_pool()), which holds every
// .proto linked into the binary, including google/rpc/error_details.proto.
//
// Answers:
//   list_services                  every service registered on the server
//   file_by_filename               the file and its transitive imports
//   file_containing_symbol         the declaring file and its imports
//   file_containing_extension      idem, for an extension
//   all_extension_numbers_of_type  the extension numbers of a message
// An unknown name gets an ErrorResponse with NOT_FOUND, as v1alpha does; the
// stream stays open.
//
// Usage: builder.SetOption(MakeReflectionV1Option()) before BuildAndStart;
// the option registers the service and hands it the server's service list
// once the server is built.
//
// Thread safety: thread-safe.

#ifndef KVBROKER_SERVER_REFLECTION_V1_H_
#define KVBROKER_SERVER_REFLECTION_V1_H_

#include <grpcpp/impl/server_builder_option.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"

namespace kvbroker {

class ReflectionV1Service final
    : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // The names list_services answers with.
  void SetServiceNames(std::vector<std::string> names) ABSL_LOCKS_EXCLUDED(mu_);

  // Fills `response` for one request (the protocol's whole logic).
  void Answer(const grpc::reflection::v1::ServerReflectionRequest& request,
              grpc::reflection::v1::ServerReflectionResponse* response) const
      ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> services_ ABSL_GUARDED_BY(mu_);
};

// A ServerBuilder option that adds a ReflectionV1Service to the server.
std::unique_ptr<grpc::ServerBuilderOption> MakeReflectionV1Option();

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_REFLECTION_V1_H_
