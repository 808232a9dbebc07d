// google.rpc.Status details -> KvbError; see error_codec.h.

#include "client/error_codec.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvbroker {
namespace {

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

// Fills `e` from the details already in e->details.
void DecodeDetails(KvbError* e) {
  bool have_info = false;
  for (const google::protobuf::Any& any : e->details.details()) {
    google::rpc::ErrorInfo info;
    google::rpc::BadRequest bad;
    google::rpc::RetryInfo retry;
    if (!have_info && any.Is<google::rpc::ErrorInfo>() && any.UnpackTo(&info) &&
        info.domain() == kErrorDomain) {
      have_info = true;
      e->reason_name = info.reason();
      v1::Reason reason;
      e->reason = v1::Reason_Parse(info.reason(), &reason)
                      ? reason
                      : v1::REASON_UNSPECIFIED;
      e->metadata.insert(info.metadata().begin(), info.metadata().end());
    } else if (any.Is<google::rpc::BadRequest>() && any.UnpackTo(&bad)) {
      e->field_violations.assign(bad.field_violations().begin(),
                                 bad.field_violations().end());
    } else if (any.Is<google::rpc::RetryInfo>() && any.UnpackTo(&retry)) {
      e->retry_delay = FromProto(retry.retry_delay());
    }
  }
}

KvbError Untyped(grpc::StatusCode code, absl::string_view message) {
  KvbError e;
  e.code = code;
  e.message = std::string(message);
  e.reason_name = v1::Reason_Name(v1::REASON_UNSPECIFIED);
  return e;
}

}  // namespace

std::optional<KvbError> DecodeError(const grpc::Status& status) {
  if (status.ok()) return std::nullopt;
  KvbError e = Untyped(status.error_code(), status.error_message());
  if (!status.error_details().empty() &&
      e.details.ParseFromString(status.error_details())) {
    DecodeDetails(&e);
  } else {
    e.details.Clear();
  }
  return e;
}

absl::Status KvbStatusFromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  google::rpc::Status rpc;
  if (!status.error_details().empty() &&
      rpc.ParseFromString(status.error_details())) {
    out.SetPayload(kKvbErrorPayloadUrl, absl::Cord(status.error_details()));
  }
  return out;
}

std::optional<KvbError> GetKvbError(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  KvbError e =
      Untyped(static_cast<grpc::StatusCode>(status.code()), status.message());
  auto payload = status.GetPayload(kKvbErrorPayloadUrl);
  if (payload.has_value() && e.details.ParseFromString(std::string(*payload))) {
    DecodeDetails(&e);
  } else {
    e.details.Clear();
  }
  return e;
}

v1::Reason GetKvbReason(const absl::Status& status) {
  std::optional<KvbError> e = GetKvbError(status);
  return e.has_value() ? e->reason : v1::REASON_UNSPECIFIED;
}

std::optional<google::rpc::Status> GetRpcStatus(const grpc::Status& status) {
  if (status.ok() || status.error_details().empty()) return std::nullopt;
  google::rpc::Status rpc;
  if (!rpc.ParseFromString(status.error_details())) return std::nullopt;
  return rpc;
}

std::optional<google::rpc::ErrorInfo> GetErrorInfo(const grpc::Status& status) {
  std::optional<google::rpc::Status> rpc = GetRpcStatus(status);
  if (!rpc.has_value()) return std::nullopt;
  for (const google::protobuf::Any& any : rpc->details()) {
    google::rpc::ErrorInfo info;
    if (any.Is<google::rpc::ErrorInfo>() && any.UnpackTo(&info) &&
        info.domain() == kErrorDomain) {
      return info;
    }
  }
  return std::nullopt;
}

std::string KvbError::ToString() const {
  const std::string code_name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  std::string out =
      reason_name == v1::Reason_Name(v1::REASON_UNSPECIFIED)
          ? absl::StrCat(code_name, ": ", message)
          : absl::StrCat(reason_name, " (", code_name, "): ", message);
  if (!metadata.empty()) {
    absl::StrAppend(&out, " {",
                    absl::StrJoin(metadata, ", ", absl::PairFormatter("=")),
                    "}");
  }
  for (const auto& v : field_violations) {
    absl::StrAppend(&out, "; field ", v.field(), ": ", v.description());
  }
  return out;
}

}  // namespace kvbroker
