// The one decoder of kvbroker's typed failures as they travel over gRPC
// (SPEC section 6): a grpc::Status whose binary details are a
// google.rpc.Status holding an ErrorInfo of domain kErrorDomain (the reason
// and its metadata) and, by reason, BadRequest, RetryInfo and other standard
// details. The server's encoder is server/status_convert.h; the client
// library (client/kvbroker_client.h) and the tests decode with this file.
//
// Thread safety: the functions are pure.

#ifndef KVBROKER_CLIENT_ERROR_CODEC_H_
#define KVBROKER_CLIENT_ERROR_CODEC_H_

#include <grpcpp/support/status.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/error_keys.h"
#include "proto/google/rpc/error_details.pb.h"
#include "proto/google/rpc/status.pb.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {

// The absl::Status payload under which a failed call keeps the serialized
// google.rpc.Status of its trailer (KvbStatusFromGrpc).
inline constexpr absl::string_view kKvbErrorPayloadUrl =
    "type.googleapis.com/google.rpc.Status";

// A decoded failure.
struct KvbError {
  // The SPEC 6 reason; REASON_UNSPECIFIED when the status carries no
  // kvbroker ErrorInfo (the gRPC library's own errors) or a reason this
  // build does not know (then `reason_name` still has it).
  v1::Reason reason = v1::REASON_UNSPECIFIED;
  std::string reason_name;
  // The gRPC status code.
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
  // ErrorInfo.metadata, keyed by the names of error_keys.h.
  std::map<std::string, std::string> metadata;
  // BadRequest.field_violations, for INVALID_ARGUMENT / INVALID_GEOMETRY.
  std::vector<google::rpc::BadRequest::FieldViolation> field_violations;
  // RetryInfo.retry_delay, when the server suggested one.
  std::optional<absl::Duration> retry_delay;
  // Everything the server sent (all details), for the rarer detail types.
  google::rpc::Status details;

  // "POOL_EXHAUSTED (RESOURCE_EXHAUSTED): <message> {available_blocks=1,
  // requested_blocks=2}"; without a reason "UNAVAILABLE: <message>".
  std::string ToString() const;
};

// Decodes a finished call's status; nullopt for OK.
std::optional<KvbError> DecodeError(const grpc::Status& status);

// Wire -> absl: the status with the same code and message, carrying the
// rich details as the kKvbErrorPayloadUrl payload. OK stays OK.
absl::Status KvbStatusFromGrpc(const grpc::Status& status);

// The error carried by a status from KvbStatusFromGrpc; nullopt for OK. A
// non-OK status without the payload gives reason REASON_UNSPECIFIED with its
// code and message.
std::optional<KvbError> GetKvbError(const absl::Status& status);

// Shorthand: the reason of `status`; REASON_UNSPECIFIED for OK or untyped.
v1::Reason GetKvbReason(const absl::Status& status);

// The google.rpc.Status in `status`'s binary details; nullopt when there is
// none or it does not parse.
std::optional<google::rpc::Status> GetRpcStatus(const grpc::Status& status);

// The first ErrorInfo of domain kErrorDomain in `status`'s details, if any.
std::optional<google::rpc::ErrorInfo> GetErrorInfo(const grpc::Status& status);

// The first detail of type T (BadRequest, QuotaFailure, ...) in `status`.
template <typename T>
std::optional<T> GetDetail(const grpc::Status& status) {
  std::optional<google::rpc::Status> rpc = GetRpcStatus(status);
  if (!rpc.has_value()) return std::nullopt;
  for (const google::protobuf::Any& any : rpc->details()) {
    T detail;
    if (any.Is<T>() && any.UnpackTo(&detail)) return detail;
  }
  return std::nullopt;
}

}  // namespace kvbroker

#endif  // KVBROKER_CLIENT_ERROR_CODEC_H_
