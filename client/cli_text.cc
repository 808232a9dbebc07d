#include "client/cli_text.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/kvbroker_client.h"
#include "common/byte_size.h"

namespace kvbroker {
namespace cli {

ExitCode ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  const v1::Reason reason = GetKvbReason(status);
  if (IsCapacityRefusal(reason)) return kExitCapacity;
  switch (reason) {
    case v1::POOL_NOT_FOUND:
    case v1::RESERVATION_NOT_FOUND: return kExitNotFound;
    case v1::POOL_ALREADY_EXISTS:
    case v1::POOL_NOT_EMPTY:
    case v1::BLOCK_NOT_ALLOCATED:
    case v1::BLOCK_IN_RESERVATION:
    case v1::RESERVATION_EXPIRED:
    case v1::RESERVATION_TOO_SMALL:
    case v1::GENERATION_MISMATCH:
    case v1::REQUEST_ID_REUSED:
    case v1::POOL_FAILED: return kExitPrecondition;
    case v1::MAPPING_FAILED:
    case v1::DRAINING: return kExitUnavailable;
    case v1::INVALID_ARGUMENT:
    case v1::INVALID_GEOMETRY: return kExitInvalid;
    case v1::UNAUTHENTICATED:
    case v1::PERMISSION_DENIED: return kExitAuth;
    default: break;
  }
  // No kvbroker reason: the gRPC library's own errors, by code.
  switch (status.code()) {
    case absl::StatusCode::kNotFound: return kExitNotFound;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted: return kExitPrecondition;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: return kExitUnavailable;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return kExitInvalid;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied: return kExitAuth;
    default: return kExitOther;
  }
}

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f) {
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", b);
    }
  }
  return out;
}

std::string StateName(v1::PageState state) {
  return std::string(
      absl::StripPrefix(v1::PageState_Name(state), "PAGE_STATE_"));
}

std::string LimitText(const v1::MemoryLimit& limit) {
  switch (limit.state()) {
    case v1::LIMIT_STATE_APPLIED:
      return absl::StrCat("applied ", FormatBytes(limit.effective_bytes()),
                          " (", limit.target_pages(), " pages, rev ",
                          limit.revision(), ")");
    case v1::LIMIT_STATE_DEFERRED:
      return absl::StrCat("DEFERRED to ", FormatBytes(limit.effective_bytes()),
                          " (", limit.target_pages(), " pages, rev ",
                          limit.revision(), "), over by ",
                          FormatBytes(limit.overage_bytes()));
    default: return "none";
  }
}

std::string PageCountsText(const v1::PageCounts& p) {
  std::string text =
      absl::StrCat("full ", p.full_pages(), "  open ", p.open_pages(),
                   "  idle ", p.idle_pages(), "  mapping ", p.mapping_pages(),
                   "  free ", p.free_pages(), "  reclaimed ",
                   p.reclaimed_pages(), "  empty ", p.empty_pages());
  // Pages waiting for attached engines appear only while there are some.
  if (p.revoking_pages() > 0 || p.quarantined_pages() > 0) {
    absl::StrAppend(&text, "  revoking ", p.revoking_pages(), "  quarantined ",
                    p.quarantined_pages());
  }
  return text;
}

namespace {

struct BarPart {
  const char* name;
  const char* color;
  char glyph;
};

// PageBar's states, in bar order.
constexpr BarPart kBarParts[] = {
    {"full", "\x1b[31m", '#'},     {"open", "\x1b[33m", '+'},
    {"idle", "\x1b[32m", '='},     {"mapping", "\x1b[36m", '~'},
    {"revoking", "\x1b[34m", '<'}, {"quarantined", "\x1b[41m", '!'},
    {"free", "\x1b[2m", '.'},      {"reclaimed", "\x1b[35m", 'x'},
};
constexpr size_t kBarPartCount = sizeof(kBarParts) / sizeof(kBarParts[0]);

}  // namespace

std::string PageBar(const v1::PageCounts& p, int width) {
  // The counts are the daemon's word: a negative one counts as none, and
  // the sums are taken in 128 bits, so that no answer makes a share
  // negative or wider than the bar.
  using Wide = __int128;
  Wide pages[kBarPartCount] = {
      p.full_pages(),    p.open_pages(),      p.idle_pages(),
      p.mapping_pages(), p.revoking_pages(),  p.quarantined_pages(),
      p.free_pages(),    p.reclaimed_pages(),
  };
  Wide total = 0;
  for (Wide& n : pages) {
    n = std::max<Wide>(n, 0);
    total += n;
  }
  if (total == 0 || width <= 0) {
    return absl::StrCat("[", std::string(std::max(width, 0), ' '), "]");
  }
  int cells[kBarPartCount];
  int used = 0;
  size_t order[kBarPartCount];
  for (size_t i = 0; i < kBarPartCount; ++i) {
    cells[i] = static_cast<int>(pages[i] * width / total);
    used += cells[i];
    order[i] = i;
  }
  std::stable_sort(order, order + kBarPartCount, [&](size_t a, size_t b) {
    return (pages[a] * width) % total > (pages[b] * width) % total;
  });
  for (size_t k = 0; used < width && k < kBarPartCount; ++k) {
    if (pages[order[k]] == 0) continue;
    ++cells[order[k]];
    ++used;
  }
  for (size_t i = 0; i < kBarPartCount; ++i) {
    if (pages[i] == 0 || cells[i] > 0) continue;
    int* widest = std::max_element(cells, cells + kBarPartCount);
    if (*widest > 1) {
      --*widest;
      cells[i] = 1;
    }
  }
  std::string bar = "[";
  for (size_t i = 0; i < kBarPartCount; ++i) {
    if (cells[i] == 0) continue;
    absl::StrAppend(&bar, kBarParts[i].color,
                    std::string(cells[i], kBarParts[i].glyph), "\x1b[0m");
  }
  return bar + "]";
}

std::string PageBarLegend() {
  std::string legend = "pages:";
  for (const BarPart& part : kBarParts) {
    absl::StrAppend(&legend, " ", part.color, std::string(1, part.glyph),
                    "\x1b[0m ", part.name, " ");
  }
  legend.pop_back();
  return legend;
}

std::string HealthText(const v1::CapacitySnapshot& c) {
  return c.healthy() ? "healthy"
                     : absl::StrCat("FAILED: ", Printable(c.failure()));
}

std::string DevicesText(const v1::PoolSpec& spec) {
  return spec.devices().empty() ? "0" : absl::StrJoin(spec.devices(), ",");
}

}  // namespace cli
}  // namespace kvbroker
