#include "server/status_convert.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {
namespace {

using google::rpc::BadRequest;
using google::rpc::ErrorInfo;
using google::rpc::PreconditionFailure;
using google::rpc::QuotaFailure;
using google::rpc::ResourceInfo;
using google::rpc::RetryInfo;

TEST(StatusConvertTest, ProtoReasonEnumMatchesFailureReason) {
  for (int i = 0; i <= kMaxFailureReason; ++i) {
    const auto reason = static_cast<FailureReason>(i);
    ASSERT_TRUE(v1::Reason_IsValid(i)) << i;
    EXPECT_EQ(v1::Reason_Name(static_cast<v1::Reason>(i)), ReasonName(reason));
  }
  EXPECT_FALSE(v1::Reason_IsValid(kMaxFailureReason + 1));
}

TEST(StatusConvertTest, OkStaysOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusConvertTest, EveryReasonRoundTripsNumberForNumber) {
  for (int i = 1; i <= kMaxFailureReason; ++i) {
    const auto reason = static_cast<FailureReason>(i);
    absl::Status core = MakeFailure(reason, "why", {{"pool", "p"}, {"k", "v"}});
    grpc::Status wire = ToGrpcStatus(core);
    EXPECT_EQ(static_cast<int>(wire.error_code()),
              static_cast<int>(core.code()))
        << ReasonName(reason);
    EXPECT_EQ(wire.error_message(), "why");

    std::optional<google::rpc::Status> rpc = GetRpcStatus(wire);
    ASSERT_TRUE(rpc.has_value());
    EXPECT_EQ(rpc->code(), static_cast<int>(core.code()));
    EXPECT_EQ(rpc->message(), "why");
    ASSERT_TRUE(rpc->details(0).Is<ErrorInfo>()) << "ErrorInfo comes first";

    std::optional<ErrorInfo> info = GetErrorInfo(wire);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->domain(), "kvbroker");
    EXPECT_EQ(info->reason(), ReasonName(reason));
    EXPECT_EQ(info->metadata().at("pool"), "p");
    EXPECT_EQ(info->metadata().at("k"), "v");

    absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(back.code(), core.code());
    EXPECT_EQ(back.message(), "why");
    std::optional<Failure> f = GetFailure(back);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->reason, reason);
    EXPECT_EQ(f->metadata, (FailureMetadata{{"pool", "p"}, {"k", "v"}}));
  }
}

TEST(StatusConvertTest, FieldViolationsBecomeBadRequestAndComeBack) {
  absl::Status core = MakeFailure(
      FailureReason::kInvalidGeometry, "block_bytes exceeds page_size",
      {{"min_page_size_bytes", "4194304"}},
      {{"page_size", "must be at least 4 MiB"}, {"block_bytes", "too big"}});
  grpc::Status wire = ToGrpcStatus(core);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  std::optional<BadRequest> bad = GetDetail<BadRequest>(wire);
  ASSERT_TRUE(bad.has_value());
  ASSERT_EQ(bad->field_violations_size(), 2);
  EXPECT_EQ(bad->field_violations(0).field(), "page_size");
  EXPECT_EQ(bad->field_violations(0).description(), "must be at least 4 MiB");
  EXPECT_EQ(bad->field_violations(1).field(), "block_bytes");

  std::optional<Failure> f = GetFailure(FromGrpcStatus(wire));
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->violations.size(), 2u);
  EXPECT_EQ(f->violations[0].field, "page_size");
  EXPECT_EQ(f->violations[1].description, "too big");
}

TEST(StatusConvertTest, CapacityRefusalsCarryQuotaFailure) {
  for (FailureReason r :
       {FailureReason::kPoolExhausted, FailureReason::kGpuMemoryExhausted,
        FailureReason::kShrinkPending, FailureReason::kRequestTooLarge}) {
    grpc::Status wire = ToGrpcStatus(MakeFailure(
        r, "no room", {{"pool", "demo"}, {"requested_blocks", "4"}}));
    std::optional<QuotaFailure> quota = GetDetail<QuotaFailure>(wire);
    ASSERT_TRUE(quota.has_value()) << ReasonName(r);
    ASSERT_EQ(quota->violations_size(), 1);
    EXPECT_EQ(quota->violations(0).subject(), "pool:demo");
    EXPECT_EQ(quota->violations(0).description(), "no room");
    EXPECT_FALSE(GetDetail<BadRequest>(wire).has_value());
  }
}

TEST(StatusConvertTest, RetryInfoWhereWaitingHelps) {
  std::optional<RetryInfo> retry = GetDetail<RetryInfo>(
      ToGrpcStatus(MakeFailure(FailureReason::kMappingFailed, "driver")));
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->retry_delay().seconds(), 0);
  EXPECT_EQ(retry->retry_delay().nanos(), 100000000);
  retry = GetDetail<RetryInfo>(
      ToGrpcStatus(MakeFailure(FailureReason::kGpuMemoryExhausted, "oom")));
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->retry_delay().seconds(), 1);
  EXPECT_FALSE(GetDetail<RetryInfo>(
                   ToGrpcStatus(MakeFailure(FailureReason::kPoolExhausted, "")))
                   .has_value());
}

TEST(StatusConvertTest, PreconditionFailureNamesTheSubject) {
  struct Case {
    FailureReason reason;
    FailureMetadata metadata;
    std::string subject;
  };
  const Case cases[] = {
      {FailureReason::kBlockNotAllocated, {{"block_id", "9"}}, "block:9"},
      {FailureReason::kBlockInReservation, {{"block_id", "3"}}, "block:3"},
      {FailureReason::kRequestIdReused,
       {{"request_id", "r1"}},
       "request_id:r1"},
      {FailureReason::kReservationExpired,
       {{"reservation_id", "res-1"}},
       "reservation:res-1"},
      {FailureReason::kPoolNotEmpty, {{"pool", "demo"}}, "pool:demo"},
      {FailureReason::kPoolFailed, {{"pool", "demo"}}, "pool:demo"},
      {FailureReason::kGenerationMismatch, {{"pool", "demo"}}, "pool:demo"},
  };
  for (const Case& c : cases) {
    std::optional<PreconditionFailure> pre = GetDetail<PreconditionFailure>(
        ToGrpcStatus(MakeFailure(c.reason, "msg", c.metadata)));
    ASSERT_TRUE(pre.has_value()) << ReasonName(c.reason);
    ASSERT_EQ(pre->violations_size(), 1);
    EXPECT_EQ(pre->violations(0).type(), ReasonName(c.reason));
    EXPECT_EQ(pre->violations(0).subject(), c.subject);
  }
}

TEST(StatusConvertTest, ResourceInfoNamesPoolsAndReservations) {
  std::optional<ResourceInfo> res = GetDetail<ResourceInfo>(ToGrpcStatus(
      MakeFailure(FailureReason::kPoolNotFound, "no pool", {{"pool", "x"}})));
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->resource_type(), "kvbroker.v1.Pool");
  EXPECT_EQ(res->resource_name(), "x");
  res = GetDetail<ResourceInfo>(
      ToGrpcStatus(MakeFailure(FailureReason::kReservationNotFound, "gone",
                               {{"reservation_id", "r7"}})));
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->resource_type(), "kvbroker.v1.Reservation");
  EXPECT_EQ(res->resource_name(), "r7");
}

TEST(StatusConvertTest, HugeCallerStringsStayWithinTheWireLimits) {
  const std::string huge(1 << 16, 'x');
  for (int r = 1; r <= kMaxFailureReason; ++r) {
    const auto reason = static_cast<FailureReason>(r);
    FailureMetadata metadata;
    for (const char* key :
         {"pool", "block_id", "reservation_id", "request_id"}) {
      metadata[key] = huge;
    }
    for (int i = 0; i < 40; ++i) metadata[absl::StrCat("key_", i)] = huge;
    std::vector<FieldViolation> violations(100, {huge, huge});
    grpc::Status wire = ToGrpcStatus(
        MakeFailure(reason, huge, std::move(metadata), std::move(violations)));
    EXPECT_LE(wire.error_details().size(), kMaxErrorDetailsBytes)
        << ReasonName(reason);
    EXPECT_LE(wire.error_message().size(), kMaxErrorMessageBytes + 32);
    EXPECT_TRUE(
        absl::EndsWith(wire.error_message(),
                       absl::StrCat("...(", huge.size() - kMaxErrorMessageBytes,
                                    " more bytes)")));
    EXPECT_EQ(GetReason(FromGrpcStatus(wire)), reason) << ReasonName(reason);
  }
}

TEST(StatusConvertTest, CutsLongTextAtACharacterBoundary) {
  // 255 ASCII bytes, then a 2-byte character straddling the 256-byte limit.
  const std::string text = std::string(255, 'a') + "\xc3\xa9" + "tail";
  grpc::Status wire =
      ToGrpcStatus(MakeFailure(FailureReason::kInvalidArgument, text));
  EXPECT_EQ(wire.error_message(), std::string(255, 'a') + "...(6 more bytes)");
}

TEST(StatusConvertTest, UntypedStatusBecomesInternal) {
  grpc::Status wire = ToGrpcStatus(absl::UnavailableError("mmap failed"));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(wire.error_message(), "UNAVAILABLE: mmap failed");
  std::optional<ErrorInfo> info = GetErrorInfo(wire);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->reason(), "REASON_UNSPECIFIED");
  EXPECT_EQ(info->metadata().at("original_code"), "UNAVAILABLE");

  absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(GetFailure(back).has_value());
}

TEST(StatusConvertTest, LibraryErrorsKeepTheirCodeAndCarryNoFailure) {
  absl::Status back = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"));
  EXPECT_EQ(back.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(back.message(), "Deadline Exceeded");
  EXPECT_FALSE(GetFailure(back).has_value());

  // Undecodable details are ignored, not fatal.
  back = FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                     "too big", "\xff\xff not a proto"));
  EXPECT_EQ(back.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(GetFailure(back).has_value());
}

TEST(StatusConvertTest, WireCodeWinsOverTheReasonsUsualCode) {
  // A peer that pairs a reason with another code: the code converts number
  // for number and the reason still comes through.
  google::rpc::Status rpc;
  rpc.set_code(grpc::StatusCode::UNAVAILABLE);
  rpc.set_message("odd");
  ErrorInfo info;
  info.set_domain("kvbroker");
  info.set_reason("POOL_EXHAUSTED");
  rpc.add_details()->PackFrom(info);
  absl::Status back = FromGrpcStatus(grpc::Status(
      grpc::StatusCode::UNAVAILABLE, "odd", rpc.SerializeAsString()));
  EXPECT_EQ(back.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetReason(back), FailureReason::kPoolExhausted);
}

TEST(StatusConvertTest, ForeignDomainIsNotAKvbrokerFailure) {
  google::rpc::Status rpc;
  rpc.set_code(grpc::StatusCode::NOT_FOUND);
  ErrorInfo info;
  info.set_domain("example.com");
  info.set_reason("POOL_NOT_FOUND");
  rpc.add_details()->PackFrom(info);
  grpc::Status wire(grpc::StatusCode::NOT_FOUND, "x", rpc.SerializeAsString());
  EXPECT_FALSE(GetErrorInfo(wire).has_value());
  EXPECT_FALSE(GetFailure(FromGrpcStatus(wire)).has_value());
}

}  // namespace
}  // namespace kvbroker
