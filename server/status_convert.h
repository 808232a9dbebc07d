// The one translation between the allocator's typed failures and gRPC's
// rich error model (SPEC section 6: google.rpc.Status with ErrorInfo and the
// other standard details).
//
// Server side, ToGrpcStatus turns an absl::Status carrying a kvbroker Failure
// payload (allocator/failure.h) into
//   grpc::Status(code, message, details)
// where `details` is a serialized google.rpc.Status{code, message, details}
// whose `details` hold, in this order:
//   - google.rpc.ErrorInfo{domain: "kvbroker", reason: "POOL_EXHAUSTED", ...,
//     metadata: the failure's metadata (string values, keys with units)},
//     always;
//   - google.rpc.BadRequest, one field violation per offending field, when
//     the failure names fields (INVALID_ARGUMENT, INVALID_GEOMETRY);
//   - google.rpc.QuotaFailure for the capacity refusals (POOL_EXHAUSTED,
//     GPU_MEMORY_EXHAUSTED, SHRINK_PENDING, REQUEST_TOO_LARGE), subject
//     "pool:<name>";
//   - google.rpc.PreconditionFailure for the FAILED_PRECONDITION and ABORTED
//     reasons, type = the reason, subject naming what is wrong
//     ("pool:<name>", "block:<id>", "reservation:<id>", "request_id:<id>");
//   - google.rpc.ResourceInfo when the failure is about one named resource
//     (a pool, "kvbroker.v1.Pool"; a reservation, "kvbroker.v1.Reservation");
//   - google.rpc.RetryInfo where waiting and retrying can help:
//     MAPPING_FAILED (kMappingRetryDelay) and GPU_MEMORY_EXHAUSTED
//     (kBudgetRetryDelay, the broker's budget refresh interval), and
//     DRAINING (kDrainingRetryDelay).
// Size: the message, every metadata key and value and every field
// violation are cut to the limits below (at a UTF-8 boundary, marked
// "...(N more bytes)"), at most kMaxErrorMetadataEntries metadata entries
// and kMaxFieldViolations violations are kept, so that the serialized
// details stay under kMaxErrorDetailsBytes and the whole status fits gRPC's
// default 8 KiB metadata limit whatever a caller sent; otherwise the client
// would get the library's untyped RESOURCE_EXHAUSTED instead of the reason.
// Codes convert number for number (absl::StatusCode and grpc::StatusCode
// both follow google.rpc.Code). A non-OK status without the payload is a bug
// or an untranslated backend error: it becomes INTERNAL, its message prefixed
// with its original code name, with ErrorInfo reason REASON_UNSPECIFIED and
// metadata {"original_code": <code name>}.
//
// The reverse direction is decoded in one place, client/error_codec.h, which
// the client library and the tests share. FromGrpcStatus turns its result
// back into the core's form: a status whose details hold a kvbroker
// ErrorInfo becomes an absl::Status with the same code and message and the
// Failure payload (reason, metadata, BadRequest violations). Any other
// status (the gRPC library's own UNAVAILABLE, DEADLINE_EXCEEDED, ..., and
// REASON_UNSPECIFIED) keeps its code and message and carries no payload.
//
// The domain and every metadata key the encoder writes itself are the
// constants of common/error_keys.h.
//
// Thread safety: the functions are pure.

#ifndef KVBROKER_SERVER_STATUS_CONVERT_H_
#define KVBROKER_SERVER_STATUS_CONVERT_H_

#include <grpcpp/support/status.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/error_codec.h"
#include "common/error_keys.h"

namespace kvbroker {

// RetryInfo.retry_delay of MAPPING_FAILED and GPU_MEMORY_EXHAUSTED.
inline constexpr absl::Duration kMappingRetryDelay = absl::Milliseconds(100);
inline constexpr absl::Duration kBudgetRetryDelay = absl::Seconds(1);
// RetryInfo.retry_delay of DRAINING: about a restart's time.
inline constexpr absl::Duration kDrainingRetryDelay = absl::Seconds(1);

// Size limits of a status on the wire (see above).
inline constexpr size_t kMaxErrorMessageBytes = 256;
inline constexpr size_t kMaxErrorMetadataKeyBytes = 48;
inline constexpr size_t kMaxErrorMetadataValueBytes = 128;
inline constexpr size_t kMaxErrorMetadataEntries = 10;
inline constexpr size_t kMaxFieldViolations = 4;
inline constexpr size_t kMaxErrorDetailsBytes = 4096;

// Core -> wire. OK stays OK.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Wire -> core. OK stays OK.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_STATUS_CONVERT_H_
