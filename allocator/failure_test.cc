// Tests of the typed-failure payload: reason names and codes (SPEC section 6)
// and the round trip of metadata and field violations through a Status.

#include "allocator/failure.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

struct ReasonRow {
  FailureReason reason;
  const char* name;
  absl::StatusCode code;
};

// SPEC section 6, transcribed row by row.
const std::vector<ReasonRow>& SpecTable() {
  static const auto* rows = new std::vector<ReasonRow>{
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
  };
  return *rows;
}

TEST(FailureReasonTest, SpecTableCoversEveryReason) {
  // Every reason but kUnspecified appears exactly once, in enum order.
  ASSERT_EQ(SpecTable().size(), static_cast<size_t>(kMaxFailureReason));
  for (int i = 0; i < kMaxFailureReason; ++i) {
    EXPECT_EQ(static_cast<int>(SpecTable()[i].reason), i + 1);
  }
}

TEST(FailureReasonTest, NamesAndCodesMatchSpec) {
  for (const ReasonRow& row : SpecTable()) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(ReasonName(row.reason), row.name);
    EXPECT_EQ(ReasonFromName(row.name), row.reason);
    EXPECT_EQ(ReasonCode(row.reason), row.code);
  }
}

TEST(FailureReasonTest, NumericValuesAreStable) {
  // The proto enum mirrors these numbers; a renumbering breaks the wire.
  EXPECT_EQ(static_cast<int>(FailureReason::kUnspecified), 0);
  EXPECT_EQ(static_cast<int>(FailureReason::kPoolExhausted), 1);
  EXPECT_EQ(static_cast<int>(FailureReason::kRequestTooLarge), 4);
  EXPECT_EQ(static_cast<int>(FailureReason::kBlockNotAllocated), 10);
  EXPECT_EQ(static_cast<int>(FailureReason::kMappingFailed), 17);
  EXPECT_EQ(static_cast<int>(FailureReason::kPoolFailed), 18);
  EXPECT_EQ(static_cast<int>(FailureReason::kPermissionDenied), 20);
}

TEST(FailureReasonTest, CapacityReasonsAreTheFourOfSection4) {
  std::set<std::string> capacity;
  for (int r = 0; r <= kMaxFailureReason; ++r) {
    const auto reason = static_cast<FailureReason>(r);
    if (IsCapacityReason(reason))
      capacity.insert(std::string(ReasonName(reason)));
  }
  EXPECT_EQ(capacity,
            (std::set<std::string>{"GPU_MEMORY_EXHAUSTED", "POOL_EXHAUSTED",
                                   "REQUEST_TOO_LARGE", "SHRINK_PENDING"}));
}

TEST(FailureReasonTest, UnknownNameIsUnspecified) {
  EXPECT_EQ(ReasonFromName("NO_SUCH_REASON"), FailureReason::kUnspecified);
  EXPECT_EQ(ReasonFromName(""), FailureReason::kUnspecified);
  // Names are exact: no case folding.
  EXPECT_EQ(ReasonFromName("pool_exhausted"), FailureReason::kUnspecified);
  EXPECT_EQ(ReasonFromName(ReasonName(FailureReason::kUnspecified)),
            FailureReason::kUnspecified);
}

TEST(MakeFailureTest, EveryReasonRoundTrips) {
  for (const ReasonRow& row : SpecTable()) {
    SCOPED_TRACE(row.name);
    absl::Status s = MakeFailure(row.reason, "msg", {{"k", "v"}});
    EXPECT_EQ(s.code(), row.code);
    EXPECT_EQ(s.message(), "msg");
    EXPECT_EQ(GetReason(s), row.reason);
    std::optional<Failure> f = GetFailure(s);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->reason, row.reason);
    EXPECT_EQ(f->metadata, (FailureMetadata{{"k", "v"}}));
    EXPECT_TRUE(f->violations.empty());
  }
}

TEST(MakeFailureTest, MetadataWithAwkwardCharactersRoundTrips) {
  FailureMetadata metadata = {
      {"requested_blocks", "4"},
      {"tabbed", "a\tb\t\tc"},
      {"newlines", "line1\nline2\r\n\n"},
      {"backslashes", "C:\\path\\n is not a newline"},
      {"quotes", "\"double\" and 'single'"},
      {"empty", ""},
      {"key\twith\ttabs", "v"},
      {"key\nwith newline", "w"},
      {"utf8", "\xc3\xa9t\xc3\xa9 \xe2\x82\xac"},
      {"control", std::string("nul\0byte\x01\x7f", 10)},
      {"record_like", "R\tPOOL_FAILED\nM\tinjected\tvalue"},
  };
  absl::Status s =
      MakeFailure(FailureReason::kPoolExhausted, "pool exhausted", metadata);
  std::optional<Failure> f = GetFailure(s);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, FailureReason::kPoolExhausted);
  EXPECT_EQ(f->metadata, metadata);
}

TEST(MakeFailureTest, ViolationsRoundTripInOrder) {
  std::vector<FieldViolation> violations = {
      {"num_blocks", "must be >= 0"},
      {"devices", "device 3 listed\ttwice\nand unknown"},
      {"name", ""},
      {"num_blocks", "a second violation of the same field"},
  };
  absl::Status s = MakeFailure(FailureReason::kInvalidArgument, "bad",
                               {{"field", "num_blocks"}}, violations);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::optional<Failure> f = GetFailure(s);
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->violations.size(), violations.size());
  for (size_t i = 0; i < violations.size(); ++i) {
    EXPECT_EQ(f->violations[i].field, violations[i].field) << i;
    EXPECT_EQ(f->violations[i].description, violations[i].description) << i;
  }
  EXPECT_EQ(f->metadata, (FailureMetadata{{"field", "num_blocks"}}));
}

TEST(MakeFailureTest, PayloadSurvivesCopyAndMove) {
  absl::Status s = MakeFailure(FailureReason::kRequestTooLarge, "too large",
                               {{"requested_blocks", "4"}});
  absl::Status copy = s;
  absl::Status moved = std::move(s);
  EXPECT_EQ(GetReason(copy), FailureReason::kRequestTooLarge);
  EXPECT_EQ(GetReason(moved), FailureReason::kRequestTooLarge);
  EXPECT_EQ(GetFailure(moved)->metadata.at("requested_blocks"), "4");
  EXPECT_EQ(copy, moved);
}

TEST(MakeFailureTest, PayloadIsUnderTheDocumentedUrl) {
  absl::Status s = MakeFailure(FailureReason::kPoolFailed, "failed");
  EXPECT_TRUE(s.GetPayload(kFailurePayloadUrl).has_value());
  // Removing the payload leaves an untyped status.
  s.ErasePayload(kFailurePayloadUrl);
  EXPECT_FALSE(GetFailure(s).has_value());
  EXPECT_EQ(GetReason(s), FailureReason::kUnspecified);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GetFailureTest, OkAndUntypedStatusesCarryNoFailure) {
  EXPECT_FALSE(GetFailure(absl::OkStatus()).has_value());
  EXPECT_EQ(GetReason(absl::OkStatus()), FailureReason::kUnspecified);
  absl::Status untyped = absl::ResourceExhaustedError("from a backend");
  EXPECT_FALSE(GetFailure(untyped).has_value());
  EXPECT_EQ(GetReason(untyped), FailureReason::kUnspecified);
  // A payload under another URL is not ours.
  untyped.SetPayload("type.example.com/other", absl::Cord("R\tPOOL_FAILED\n"));
  EXPECT_EQ(GetReason(untyped), FailureReason::kUnspecified);
}

TEST(InvalidFieldTest, NamesTheField) {
  absl::Status s = InvalidField("num_blocks", "must be >= 0");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_blocks"), absl::string_view::npos);
  std::optional<Failure> f = GetFailure(s);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, FailureReason::kInvalidArgument);
  ASSERT_EQ(f->violations.size(), 1u);
  EXPECT_EQ(f->violations[0].field, "num_blocks");
  EXPECT_EQ(f->violations[0].description, "must be >= 0");
  EXPECT_EQ(f->metadata.at("field"), "num_blocks");
}

TEST(NumTest, FormatsIntegers) {
  EXPECT_EQ(Num(0), "0");
  EXPECT_EQ(Num(-5), "-5");
  EXPECT_EQ(Num(65536), "65536");
  EXPECT_EQ(Num(INT64_MAX), "9223372036854775807");
  EXPECT_EQ(Num(INT64_MIN), "-9223372036854775808");
}

absl::Status ReturnsEarly(absl::Status first, int* reached) {
  KVB_RETURN_IF_ERROR(first);
  ++*reached;
  return absl::OkStatus();
}

TEST(ReturnIfErrorTest, ReturnsTheErrorUnchanged) {
  int reached = 0;
  absl::Status err =
      MakeFailure(FailureReason::kPoolNotFound, "gone", {{"pool", "a"}});
  absl::Status got = ReturnsEarly(err, &reached);
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(got, err);
  EXPECT_EQ(GetReason(got), FailureReason::kPoolNotFound);
  EXPECT_TRUE(ReturnsEarly(absl::OkStatus(), &reached).ok());
  EXPECT_EQ(reached, 1);
}

}  // namespace
}  // namespace kvbroker
