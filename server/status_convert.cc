// absl::Status (kvbroker Failure payload) <-> grpc::Status (google.rpc.Status
// details). See status_convert.h for the mapping.

#include "server/status_convert.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"

namespace kvbroker {
namespace {

using google::rpc::BadRequest;
using google::rpc::ErrorInfo;
using google::rpc::PreconditionFailure;
using google::rpc::QuotaFailure;
using google::rpc::ResourceInfo;
using google::rpc::RetryInfo;

constexpr absl::string_view kPoolType = "kvbroker.v1.Pool";
constexpr absl::string_view kReservationType = "kvbroker.v1.Reservation";

// `text` cut to at most `limit` bytes (plus the marker) at a UTF-8
// character boundary.
std::string Bounded(absl::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string(text);
  size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return absl::StrCat(text.substr(0, cut), "...(", text.size() - cut,
                      " more bytes)");
}

// `f` with every caller-influenced part within the wire limits.
Failure BoundedFailure(const Failure& f) {
  Failure out;
  out.reason = f.reason;
  for (const auto& [key, value] : f.metadata) {
    if (out.metadata.size() == kMaxErrorMetadataEntries) break;
    out.metadata[Bounded(key, kMaxErrorMetadataKeyBytes)] =
        Bounded(value, kMaxErrorMetadataValueBytes);
  }
  for (const FieldViolation& v : f.violations) {
    if (out.violations.size() == kMaxFieldViolations) break;
    out.violations.push_back(
        {Bounded(v.field, kMaxErrorMetadataKeyBytes),
         Bounded(v.description, kMaxErrorMetadataValueBytes)});
  }
  return out;
}

std::string Meta(const Failure& f, absl::string_view key) {
  auto it = f.metadata.find(std::string(key));
  return it == f.metadata.end() ? std::string() : it->second;
}

// "kind:<metadata[key]>", or just "kind" when the key is absent.
std::string Subject(const Failure& f, absl::string_view kind,
                    absl::string_view key) {
  std::string value = Meta(f, key);
  return value.empty() ? std::string(kind) : absl::StrCat(kind, ":", value);
}

// Which standard details a reason gets beyond ErrorInfo.
struct DetailPlan {
  bool quota = false;
  // PreconditionFailure subject: "" for none.
  std::string precondition_subject;
  // ResourceInfo: empty type for none.
  absl::string_view resource_type;
  std::string resource_name;
  absl::Duration retry_delay = absl::ZeroDuration();
  bool retry = false;
};

DetailPlan PlanFor(const Failure& f) {
  DetailPlan p;
  const std::string pool = Subject(f, "pool", error_key::kPool);
  auto pool_resource = [&] {
    p.resource_type = kPoolType;
    p.resource_name = Meta(f, error_key::kPool);
  };
  auto reservation_resource = [&] {
    p.resource_type = kReservationType;
    p.resource_name = Meta(f, error_key::kReservationId);
  };
  switch (f.reason) {
    case FailureReason::kPoolExhausted:
    case FailureReason::kShrinkPending: p.quota = true; break;
    case FailureReason::kGpuMemoryExhausted:
      p.quota = true;
      p.retry = true;
      p.retry_delay = kBudgetRetryDelay;
      break;
    case FailureReason::kRequestTooLarge: p.quota = true; break;
    case FailureReason::kPoolNotFound:
    case FailureReason::kPoolAlreadyExists: pool_resource(); break;
    case FailureReason::kPoolNotEmpty:
    case FailureReason::kPoolFailed:
      p.precondition_subject = pool;
      pool_resource();
      break;
    case FailureReason::kGenerationMismatch:
      p.precondition_subject = pool;
      break;
    case FailureReason::kBlockNotAllocated:
    case FailureReason::kBlockInReservation:
      p.precondition_subject = Subject(f, "block", error_key::kBlockId);
      break;
    case FailureReason::kReservationNotFound: reservation_resource(); break;
    case FailureReason::kReservationExpired:
      p.precondition_subject =
          Subject(f, "reservation", error_key::kReservationId);
      reservation_resource();
      break;
    case FailureReason::kReservationTooSmall:
      p.precondition_subject =
          Subject(f, "reservation", error_key::kReservationId);
      break;
    case FailureReason::kRequestIdReused:
      p.precondition_subject = Subject(f, "request_id", error_key::kRequestId);
      break;
    case FailureReason::kMappingFailed:
      p.retry = true;
      p.retry_delay = kMappingRetryDelay;
      break;
    case FailureReason::kDraining:
      p.retry = true;
      p.retry_delay = kDrainingRetryDelay;
      break;
    case FailureReason::kUnspecified:
    case FailureReason::kInvalidGeometry:
    case FailureReason::kInvalidArgument:
    case FailureReason::kUnauthenticated:
    case FailureReason::kPermissionDenied: break;
  }
  return p;
}

google::rpc::Status RichStatus(absl::StatusCode code, absl::string_view message,
                               const Failure& f) {
  google::rpc::Status rpc;
  rpc.set_code(static_cast<int>(code));
  rpc.set_message(std::string(message));

  ErrorInfo info;
  info.set_domain(std::string(kErrorDomain));
  info.set_reason(std::string(ReasonName(f.reason)));
  for (const auto& [key, value] : f.metadata) {
    (*info.mutable_metadata())[key] = value;
  }
  rpc.add_details()->PackFrom(info);

  const DetailPlan plan = PlanFor(f);
  if (!f.violations.empty()) {
    BadRequest bad;
    for (const FieldViolation& v : f.violations) {
      BadRequest::FieldViolation* fv = bad.add_field_violations();
      fv->set_field(v.field);
      fv->set_description(v.description);
    }
    rpc.add_details()->PackFrom(bad);
  }
  if (plan.quota) {
    QuotaFailure quota;
    QuotaFailure::Violation* v = quota.add_violations();
    v->set_subject(Subject(f, "pool", error_key::kPool));
    v->set_description(std::string(message));
    rpc.add_details()->PackFrom(quota);
  }
  if (!plan.precondition_subject.empty()) {
    PreconditionFailure pre;
    PreconditionFailure::Violation* v = pre.add_violations();
    v->set_type(std::string(ReasonName(f.reason)));
    v->set_subject(plan.precondition_subject);
    v->set_description(std::string(message));
    rpc.add_details()->PackFrom(pre);
  }
  if (!plan.resource_type.empty()) {
    ResourceInfo res;
    res.set_resource_type(std::string(plan.resource_type));
    res.set_resource_name(plan.resource_name);
    res.set_description(std::string(message));
    rpc.add_details()->PackFrom(res);
  }
  if (plan.retry) {
    RetryInfo retry;
    const int64_t nanos = absl::ToInt64Nanoseconds(plan.retry_delay);
    retry.mutable_retry_delay()->set_seconds(nanos / 1000000000);
    retry.mutable_retry_delay()->set_nanos(
        static_cast<int32_t>(nanos % 1000000000));
    rpc.add_details()->PackFrom(retry);
  }
  return rpc;
}

grpc::Status Serialize(const google::rpc::Status& rpc) {
  return grpc::Status(static_cast<grpc::StatusCode>(rpc.code()), rpc.message(),
                      rpc.SerializeAsString());
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::optional<Failure> failure = GetFailure(status);
  if (!failure.has_value() || failure->reason == FailureReason::kUnspecified) {
    const std::string original(absl::StatusCodeToString(status.code()));
    Failure untyped;
    untyped.metadata[std::string(error_key::kOriginalCode)] = original;
    return Serialize(
        RichStatus(absl::StatusCode::kInternal,
                   Bounded(absl::StrCat(original, ": ", status.message()),
                           kMaxErrorMessageBytes),
                   untyped));
  }
  return Serialize(RichStatus(status.code(),
                              Bounded(status.message(), kMaxErrorMessageBytes),
                              BoundedFailure(*failure)));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  std::optional<KvbError> e = DecodeError(status);
  if (!e.has_value()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(e->code);
  absl::Status plain(code, e->message);
  const FailureReason reason = ReasonFromName(e->reason_name);
  if (reason == FailureReason::kUnspecified) return plain;
  FailureMetadata metadata(e->metadata.begin(), e->metadata.end());
  std::vector<FieldViolation> violations;
  for (const BadRequest::FieldViolation& v : e->field_violations) {
    violations.push_back({v.field(), v.description()});
  }
  // MakeFailure encodes the payload; the code stays the wire's, number for
  // number, even if it disagrees with the reason's usual code.
  absl::Status typed = MakeFailure(reason, e->message, std::move(metadata),
                                   std::move(violations));
  if (typed.code() == code) return typed;
  plain.SetPayload(kFailurePayloadUrl, *typed.GetPayload(kFailurePayloadUrl));
  return plain;
}

}  // namespace kvbroker
