#include "client/cli_text.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/kvbroker_client.h"
#include "gtest/gtest.h"
#include "proto/google/rpc/error_details.pb.h"
#include "proto/google/rpc/status.pb.h"

namespace kvbroker {
namespace cli {
namespace {

// A status as the client library returns it for a kvbroker refusal.
absl::Status Refusal(v1::Reason reason, grpc::StatusCode code) {
  google::rpc::Status rpc;
  rpc.set_code(code);
  google::rpc::ErrorInfo info;
  info.set_domain("kvbroker");
  info.set_reason(v1::Reason_Name(reason));
  rpc.add_details()->PackFrom(info);
  return KvbStatusFromGrpc(grpc::Status(code, "x", rpc.SerializeAsString()));
}

TEST(ExitCodeTest, EveryReasonHasItsClass) {
  struct Row {
    v1::Reason reason;
    grpc::StatusCode code;
    ExitCode exit;
  };
  using C = grpc::StatusCode;
  const Row rows[] = {
      {v1::POOL_EXHAUSTED, C::RESOURCE_EXHAUSTED, kExitCapacity},
      {v1::GPU_MEMORY_EXHAUSTED, C::RESOURCE_EXHAUSTED, kExitCapacity},
      {v1::SHRINK_PENDING, C::RESOURCE_EXHAUSTED, kExitCapacity},
      {v1::REQUEST_TOO_LARGE, C::OUT_OF_RANGE, kExitCapacity},
      {v1::INVALID_GEOMETRY, C::INVALID_ARGUMENT, kExitInvalid},
      {v1::INVALID_ARGUMENT, C::INVALID_ARGUMENT, kExitInvalid},
      {v1::POOL_NOT_FOUND, C::NOT_FOUND, kExitNotFound},
      {v1::POOL_ALREADY_EXISTS, C::ALREADY_EXISTS, kExitPrecondition},
      {v1::POOL_NOT_EMPTY, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::BLOCK_NOT_ALLOCATED, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::BLOCK_IN_RESERVATION, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::RESERVATION_NOT_FOUND, C::NOT_FOUND, kExitNotFound},
      {v1::RESERVATION_EXPIRED, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::RESERVATION_TOO_SMALL, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::GENERATION_MISMATCH, C::ABORTED, kExitPrecondition},
      {v1::REQUEST_ID_REUSED, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::MAPPING_FAILED, C::UNAVAILABLE, kExitUnavailable},
      {v1::POOL_FAILED, C::FAILED_PRECONDITION, kExitPrecondition},
      {v1::UNAUTHENTICATED, C::UNAUTHENTICATED, kExitAuth},
      {v1::PERMISSION_DENIED, C::PERMISSION_DENIED, kExitAuth},
      {v1::DRAINING, C::UNAVAILABLE, kExitUnavailable},
  };
  // Every reason of the proto is in the table.
  EXPECT_EQ(std::size(rows), static_cast<size_t>(v1::Reason_MAX));
  for (const Row& row : rows) {
    EXPECT_EQ(ExitCodeFor(Refusal(row.reason, row.code)), row.exit)
        << v1::Reason_Name(row.reason);
  }
}

TEST(ExitCodeTest, ReasonBeatsCode) {
  // The reason decides even when the gRPC library's code would say else.
  EXPECT_EQ(ExitCodeFor(Refusal(v1::POOL_EXHAUSTED, grpc::StatusCode::UNKNOWN)),
            kExitCapacity);
}

TEST(ExitCodeTest, ErrorsWithoutAReasonGoByCode) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("down")), kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("slow")), kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("?")), kExitNotFound);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("?")), kExitInvalid);
  EXPECT_EQ(ExitCodeFor(absl::UnauthenticatedError("?")), kExitAuth);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("bug")), kExitOther);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("msg too big")),
            kExitOther);
}

// One state's run of `n` glyphs in the bar, colour codes spelled out.
std::string Glyphs(const char* color, char glyph, int n) {
  return absl::StrCat(color, std::string(n, glyph), "\x1b[0m");
}

TEST(PageBarTest, EveryStateHasItsShareRevokingAndQuarantinedIncluded) {
  v1::PageCounts pages;
  pages.set_full_pages(2);
  pages.set_open_pages(1);
  pages.set_idle_pages(1);
  pages.set_revoking_pages(2);
  pages.set_quarantined_pages(2);
  pages.set_free_pages(12);
  pages.set_empty_pages(5);  // never shown
  EXPECT_EQ(PageBar(pages, 20),
            absl::StrCat("[", Glyphs("\x1b[31m", '#', 2),
                         Glyphs("\x1b[33m", '+', 1), Glyphs("\x1b[32m", '=', 1),
                         Glyphs("\x1b[34m", '<', 2), Glyphs("\x1b[41m", '!', 2),
                         Glyphs("\x1b[2m", '.', 12), "]"));
}

TEST(PageBarTest, AQuarantinedPageAmongManyStillShows) {
  v1::PageCounts pages;
  pages.set_free_pages(1000);
  pages.set_quarantined_pages(1);
  EXPECT_EQ(PageBar(pages, 10), absl::StrCat("[", Glyphs("\x1b[41m", '!', 1),
                                             Glyphs("\x1b[2m", '.', 9), "]"));
  pages.set_quarantined_pages(0);
  pages.set_revoking_pages(1);
  EXPECT_EQ(PageBar(pages, 10), absl::StrCat("[", Glyphs("\x1b[34m", '<', 1),
                                             Glyphs("\x1b[2m", '.', 9), "]"));
  EXPECT_EQ(PageBar(v1::PageCounts(), 4), "[    ]");
}

// The characters of `bar` a terminal shows (escape sequences left out).
int VisibleWidth(const std::string& bar) {
  int visible = 0;
  for (size_t i = 0; i < bar.size(); ++i) {
    if (bar[i] == '\x1b') {
      i = bar.find('m', i);
      if (i == std::string::npos) break;
      continue;
    }
    ++visible;
  }
  return visible;
}

// Counts are the daemon's word: a negative one, or ones whose sum passes
// int64 (signed overflow), once gave shares wider than the bar: 40 columns
// for a bar of 20, pushing the rest of top's line off the screen.
TEST(PageBarTest, NegativeOrHugeCountsFromADaemonStillDrawABar) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  v1::PageCounts negative;
  negative.set_full_pages(2);
  negative.set_free_pages(-1);
  v1::PageCounts huge;
  huge.set_full_pages(kMax);
  huge.set_open_pages(kMax);
  huge.set_free_pages(1);
  v1::PageCounts all_negative;
  all_negative.set_idle_pages(-5);
  for (const v1::PageCounts& pages : {negative, huge, all_negative}) {
    const std::string bar = PageBar(pages, 20);
    EXPECT_EQ(VisibleWidth(bar), 22) << pages.ShortDebugString() << " " << bar;
  }
  EXPECT_EQ(PageBar(negative, 20),
            absl::StrCat("[", Glyphs("\x1b[31m", '#', 20), "]"));
  EXPECT_EQ(PageBar(all_negative, 4), "[    ]");
}

TEST(PageBarTest, LegendNamesEveryGlyphOfTheBar) {
  EXPECT_EQ(PageBarLegend(),
            absl::StrCat("pages: ", Glyphs("\x1b[31m", '#', 1), " full  ",
                         Glyphs("\x1b[33m", '+', 1), " open  ",
                         Glyphs("\x1b[32m", '=', 1), " idle  ",
                         Glyphs("\x1b[36m", '~', 1), " mapping  ",
                         Glyphs("\x1b[34m", '<', 1), " revoking  ",
                         Glyphs("\x1b[41m", '!', 1), " quarantined  ",
                         Glyphs("\x1b[2m", '.', 1), " free  ",
                         Glyphs("\x1b[35m", 'x', 1), " reclaimed"));
}

// What kvbrokerctl and top print of the daemon's strings: printable ASCII
// kept, everything else escaped.
TEST(TextTest, PrintableEscapesControlBytesAndNonAscii) {
  EXPECT_EQ(Printable("pool-1.a_B"), "pool-1.a_B");
  EXPECT_EQ(Printable("no pool named \"x\" {a=b}"),
            "no pool named \"x\" {a=b}");
  EXPECT_EQ(Printable("a\x1b]0;t\x07\nb\r\tc"), "a\\x1b]0;t\\x07\\nb\\r\\tc");
  EXPECT_EQ(Printable(std::string("\0\x7f\x9b\xc3\xa9", 5)),
            "\\x00\\x7f\\x9b\\xc3\\xa9");
  v1::CapacitySnapshot c;
  c.set_failure("unmap\x1b[2J failed");
  EXPECT_EQ(HealthText(c), "FAILED: unmap\\x1b[2J failed");
}

TEST(TextTest, Forms) {
  EXPECT_EQ(StateName(v1::PAGE_STATE_RECLAIMED), "RECLAIMED");
  v1::MemoryLimit limit;
  EXPECT_EQ(LimitText(limit), "none");
  limit.set_state(v1::LIMIT_STATE_DEFERRED);
  limit.set_effective_bytes(28 << 20);
  limit.set_target_pages(2);
  limit.set_revision(4);
  limit.set_overage_bytes(14 << 20);
  EXPECT_EQ(LimitText(limit),
            "DEFERRED to 28MiB (2 pages, rev 4), over by 14MiB");
  v1::PageCounts pages;
  pages.set_free_pages(2);
  pages.set_empty_pages(1);
  EXPECT_EQ(PageCountsText(pages),
            "full 0  open 0  idle 0  mapping 0  free 2  reclaimed 0  empty 1");
  pages.set_revoking_pages(3);
  pages.set_quarantined_pages(1);
  EXPECT_EQ(PageCountsText(pages),
            "full 0  open 0  idle 0  mapping 0  free 2  reclaimed 0  empty 1"
            "  revoking 3  quarantined 1");
  v1::PoolSpec spec;
  EXPECT_EQ(DevicesText(spec), "0");
  spec.add_devices(0);
  spec.add_devices(3);
  EXPECT_EQ(DevicesText(spec), "0,3");
  v1::CapacitySnapshot c;
  c.set_healthy(false);
  c.set_failure("unmap failed");
  EXPECT_EQ(HealthText(c), "FAILED: unmap failed");
}

}  // namespace
}  // namespace cli
}  // namespace kvbroker
