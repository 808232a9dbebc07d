// Encoding of typed failures as an absl::Status payload.
//
// Payload format: one record per line, fields separated by a tab, every field
// C-escaped so tabs and newlines inside values survive:
//   R <reason name>
//   M <key> <value>
//   V <field> <description>

#include "allocator/failure.h"

#include <array>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/error_keys.h"

namespace kvbroker {
namespace {

struct ReasonInfo {
  FailureReason reason;
  absl::string_view name;
  absl::StatusCode code;
};

constexpr std::array<ReasonInfo, kMaxFailureReason + 1> kReasons = {{
    {FailureReason::kUnspecified, "REASON_UNSPECIFIED",
     absl::StatusCode::kUnknown},
    {FailureReason::kPoolExhausted, "POOL_EXHAUSTED",
     absl::StatusCode::kResourceExhausted},
    {FailureReason::kGpuMemoryExhausted, "GPU_MEMORY_EXHAUSTED",
     absl::StatusCode::kResourceExhausted},
    {FailureReason::kShrinkPending, "SHRINK_PENDING",
     absl::StatusCode::kResourceExhausted},
    {FailureReason::kRequestTooLarge, "REQUEST_TOO_LARGE",
     absl::StatusCode::kOutOfRange},
    {FailureReason::kInvalidGeometry, "INVALID_GEOMETRY",
     absl::StatusCode::kInvalidArgument},
    {FailureReason::kInvalidArgument, "INVALID_ARGUMENT",
     absl::StatusCode::kInvalidArgument},
    {FailureReason::kPoolNotFound, "POOL_NOT_FOUND",
     absl::StatusCode::kNotFound},
    {FailureReason::kPoolAlreadyExists, "POOL_ALREADY_EXISTS",
     absl::StatusCode::kAlreadyExists},
    {FailureReason::kPoolNotEmpty, "POOL_NOT_EMPTY",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kBlockNotAllocated, "BLOCK_NOT_ALLOCATED",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kBlockInReservation, "BLOCK_IN_RESERVATION",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kReservationNotFound, "RESERVATION_NOT_FOUND",
     absl::StatusCode::kNotFound},
    {FailureReason::kReservationExpired, "RESERVATION_EXPIRED",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kReservationTooSmall, "RESERVATION_TOO_SMALL",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kGenerationMismatch, "GENERATION_MISMATCH",
     absl::StatusCode::kAborted},
    {FailureReason::kRequestIdReused, "REQUEST_ID_REUSED",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kMappingFailed, "MAPPING_FAILED",
     absl::StatusCode::kUnavailable},
    {FailureReason::kPoolFailed, "POOL_FAILED",
     absl::StatusCode::kFailedPrecondition},
    {FailureReason::kUnauthenticated, "UNAUTHENTICATED",
     absl::StatusCode::kUnauthenticated},
    {FailureReason::kPermissionDenied, "PERMISSION_DENIED",
     absl::StatusCode::kPermissionDenied},
    {FailureReason::kDraining, "DRAINING", absl::StatusCode::kUnavailable},
}};

const ReasonInfo& Info(FailureReason reason) {
  int i = static_cast<int>(reason);
  if (i < 0 || i > kMaxFailureReason) i = 0;
  return kReasons[i];
}

}  // namespace

absl::string_view ReasonName(FailureReason reason) { return Info(reason).name; }

FailureReason ReasonFromName(absl::string_view name) {
  for (const ReasonInfo& info : kReasons) {
    if (info.name == name) return info.reason;
  }
  return FailureReason::kUnspecified;
}

absl::StatusCode ReasonCode(FailureReason reason) { return Info(reason).code; }

bool IsCapacityReason(FailureReason reason) {
  switch (reason) {
    case FailureReason::kPoolExhausted:
    case FailureReason::kGpuMemoryExhausted:
    case FailureReason::kShrinkPending:
    case FailureReason::kRequestTooLarge: return true;
    default: return false;
  }
}

absl::Status MakeFailure(FailureReason reason, absl::string_view message,
                         FailureMetadata metadata,
                         std::vector<FieldViolation> violations) {
  absl::Status status(ReasonCode(reason), message);
  std::string payload = absl::StrCat("R\t", ReasonName(reason), "\n");
  for (const auto& [key, value] : metadata) {
    absl::StrAppend(&payload, "M\t", absl::CEscape(key), "\t",
                    absl::CEscape(value), "\n");
  }
  for (const FieldViolation& v : violations) {
    absl::StrAppend(&payload, "V\t", absl::CEscape(v.field), "\t",
                    absl::CEscape(v.description), "\n");
  }
  status.SetPayload(kFailurePayloadUrl, absl::Cord(payload));
  return status;
}

absl::Status InvalidField(absl::string_view field,
                          absl::string_view description) {
  return MakeFailure(FailureReason::kInvalidArgument,
                     absl::StrCat(field, ": ", description),
                     {{std::string(error_key::kField), std::string(field)}},
                     {{std::string(field), std::string(description)}});
}

std::optional<Failure> GetFailure(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  auto payload = status.GetPayload(kFailurePayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  Failure failure;
  for (absl::string_view line :
       absl::StrSplit(std::string(*payload), '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, '\t');
    std::vector<std::string> fields;
    for (size_t i = 1; i < parts.size(); ++i) {
      std::string unescaped;
      if (!absl::CUnescape(parts[i], &unescaped)) unescaped = parts[i];
      fields.push_back(std::move(unescaped));
    }
    if (parts[0] == "R" && fields.size() == 1) {
      failure.reason = ReasonFromName(fields[0]);
    } else if (parts[0] == "M" && fields.size() == 2) {
      failure.metadata[fields[0]] = fields[1];
    } else if (parts[0] == "V" && fields.size() == 2) {
      failure.violations.push_back({fields[0], fields[1]});
    }
  }
  return failure;
}

FailureReason GetReason(const absl::Status& status) {
  std::optional<Failure> f = GetFailure(status);
  return f.has_value() ? f->reason : FailureReason::kUnspecified;
}

std::string Num(int64_t v) { return absl::StrCat(v); }

}  // namespace kvbroker
