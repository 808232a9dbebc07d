// Typed failures of the allocator core.
//
// Every expected failure is an `absl::Status` whose code is the canonical code
// of SPEC section 6 and whose payload (under `kFailurePayloadUrl`) carries a
// `FailureReason` and string metadata whose keys name their units
// (`requested_blocks`, `free_bytes`, ...). The core needs no protobuf for
// this; the service translates the payload into `google.rpc.ErrorInfo` and the
// other standard details in exactly one place (server/status_convert.cc).
//
// A status without the payload is a bug or a backend error that escaped
// translation; the service reports it as INTERNAL.

#ifndef KVBROKER_ALLOCATOR_FAILURE_H_
#define KVBROKER_ALLOCATOR_FAILURE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvbroker {

// The reasons of SPEC section 6. The numeric values are stable and equal the
// values of the `Reason` enum in proto/kvbroker/v1/kvbroker.proto.
enum class FailureReason : int {
  kUnspecified = 0,
  kPoolExhausted = 1,
  kGpuMemoryExhausted = 2,
  kShrinkPending = 3,
  kRequestTooLarge = 4,
  kInvalidGeometry = 5,
  kInvalidArgument = 6,
  kPoolNotFound = 7,
  kPoolAlreadyExists = 8,
  kPoolNotEmpty = 9,
  kBlockNotAllocated = 10,
  kBlockInReservation = 11,
  kReservationNotFound = 12,
  kReservationExpired = 13,
  kReservationTooSmall = 14,
  kGenerationMismatch = 15,
  kRequestIdReused = 16,
  kMappingFailed = 17,
  kPoolFailed = 18,
  kUnauthenticated = 19,
  kPermissionDenied = 20,
  // UNAVAILABLE: the daemon is shutting down (SIGTERM); the call was not
  // run. Retry elsewhere or after the restart.
  kDraining = 21,
};

constexpr int kMaxFailureReason = 21;

// "POOL_EXHAUSTED", ... as SPEC section 6 spells them.
absl::string_view ReasonName(FailureReason reason);
// Inverse of ReasonName; kUnspecified for an unknown name.
FailureReason ReasonFromName(absl::string_view name);
// The canonical code SPEC section 6 assigns to `reason`.
absl::StatusCode ReasonCode(FailureReason reason);
// The capacity reasons, with which an Alloc that does not fit is refused
// (SPEC section 4): POOL_EXHAUSTED, GPU_MEMORY_EXHAUSTED, SHRINK_PENDING,
// REQUEST_TOO_LARGE.
bool IsCapacityReason(FailureReason reason);

// Metadata keys are snake_case and carry their unit; values are strings.
using FailureMetadata = std::map<std::string, std::string>;

// One offending request field, for `google.rpc.BadRequest`.
struct FieldViolation {
  std::string field;
  std::string description;
};

struct Failure {
  FailureReason reason = FailureReason::kUnspecified;
  FailureMetadata metadata;
  // Set for INVALID_ARGUMENT / INVALID_GEOMETRY: which fields were wrong.
  std::vector<FieldViolation> violations;
};

inline constexpr absl::string_view kFailurePayloadUrl =
    "type.kvbroker.dev/kvbroker.Failure";

// Builds a status with the code of `reason`, `message`, and the payload.
absl::Status MakeFailure(FailureReason reason, absl::string_view message,
                         FailureMetadata metadata = {},
                         std::vector<FieldViolation> violations = {});

// Shorthand for INVALID_ARGUMENT naming one field.
absl::Status InvalidField(absl::string_view field,
                          absl::string_view description);

// The failure carried by `status`, if any.
std::optional<Failure> GetFailure(const absl::Status& status);

// The reason carried by `status`; kUnspecified for OK or untyped statuses.
FailureReason GetReason(const absl::Status& status);

// Formats an integer metadata value.
std::string Num(int64_t v);

#define KVB_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status kvb_status_ = (expr);       \
    if (!kvb_status_.ok()) return kvb_status_; \
  } while (0)

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_FAILURE_H_
