// grpc.reflection.v1 over the generated descriptor pool; see reflection_v1.h.

#include "server/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>

#include <deque>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvbroker {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void SetError(grpc::StatusCode code, std::string message,
              ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(code);
  response->mutable_error_response()->set_error_message(std::move(message));
}

// `file` first, then its transitive imports, each once.
void AddFileAndImports(const FileDescriptor* file,
                       ServerReflectionResponse* response) {
  auto* out = response->mutable_file_descriptor_response();
  std::set<const FileDescriptor*> seen = {file};
  std::deque<const FileDescriptor*> queue = {file};
  while (!queue.empty()) {
    const FileDescriptor* f = queue.front();
    queue.pop_front();
    google::protobuf::FileDescriptorProto proto;
    f->CopyTo(&proto);
    proto.SerializeToString(out->add_file_descriptor_proto());
    for (int i = 0; i < f->dependency_count(); ++i) {
      if (seen.insert(f->dependency(i)).second) {
        queue.push_back(f->dependency(i));
      }
    }
  }
}

// One reflection stream: read a request, write its answer, repeat.
class ReflectionStream final
    : public grpc::ServerBidiReactor<ServerReflectionRequest,
                                     ServerReflectionResponse> {
 public:
  explicit ReflectionStream(const ReflectionV1Service* service)
      : service_(service) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done (or gone)
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    service_->Answer(request_, &response_);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const ReflectionV1Service* const service_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
};

class ReflectionV1Plugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "kvbroker_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* si) override {
    si->RegisterService(service_);
  }
  void Finish(grpc::ServerInitializer* si) override {
    service_->SetServiceNames(*si->GetServiceList());
  }
  void ChangeArguments(const std::string& /*name*/, void* /*value*/) override {}

 private:
  std::shared_ptr<ReflectionV1Service> service_ =
      std::make_shared<ReflectionV1Service>();
};

class ReflectionV1Option final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->push_back(std::make_unique<ReflectionV1Plugin>());
  }
};

}  // namespace

void ReflectionV1Service::SetServiceNames(std::vector<std::string> names) {
  absl::MutexLock lock(&mu_);
  services_ = std::move(names);
}

void ReflectionV1Service::Answer(const ServerReflectionRequest& request,
                                 ServerReflectionResponse* response) const {
  response->set_valid_host(request.host());
  *response->mutable_original_request() = request;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices: {
      absl::MutexLock lock(&mu_);
      for (const std::string& name : services_) {
        response->mutable_list_services_response()->add_service()->set_name(
            name);
      }
      return;
    }
    case ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* file =
          pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("file not found: ", request.file_by_filename()),
                 response);
        return;
      }
      AddFileAndImports(file, response);
      return;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* file =
          pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("symbol not found: ",
                              request.file_containing_symbol()),
                 response);
        return;
      }
      AddFileAndImports(file, response);
      return;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const Descriptor* type =
          pool->FindMessageTypeByName(ext.containing_type());
      const FieldDescriptor* field =
          type == nullptr
              ? nullptr
              : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("extension not found: ", ext.containing_type(),
                              " ", ext.extension_number()),
                 response);
        return;
      }
      AddFileAndImports(field->file(), response);
      return;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("type not found: ",
                              request.all_extension_numbers_of_type()),
                 response);
        return;
      }
      std::vector<const FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* out = response->mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (const FieldDescriptor* e : extensions) {
        out->add_extension_number(e->number());
      }
      return;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET: break;
  }
  SetError(grpc::StatusCode::INVALID_ARGUMENT, "no request set", response);
}

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(
    grpc::CallbackServerContext* /*context*/) {
  return new ReflectionStream(this);
}

std::unique_ptr<grpc::ServerBuilderOption> MakeReflectionV1Option() {
  return std::make_unique<ReflectionV1Option>();
}

}  // namespace kvbroker
