// Text helpers shared by kvbrokerctl's commands and its `top` view: the
// exit code of a failure class, and short human forms of capacity fields.
//
// Thread safety: pure functions.

#ifndef KVBROKER_CLIENT_CLI_TEXT_H_
#define KVBROKER_CLIENT_CLI_TEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {
namespace cli {

// kvbrokerctl's exit codes, one per failure class (client/README.md has the
// table).
enum ExitCode : int {
  kExitOk = 0,
  kExitOther = 1,
  kExitUsage = 2,
  kExitNotFound = 3,
  kExitCapacity = 4,
  kExitPrecondition = 5,
  kExitUnavailable = 6,
  kExitInvalid = 7,
  kExitAuth = 8,
};

// The exit code of a finished call: by its kvbroker reason, else (the gRPC
// library's own errors) by its code.
ExitCode ExitCodeFor(const absl::Status& status);

// `text` safe to print on a terminal: printable ASCII as it is, every other
// byte (control bytes such as ESC and line breaks, DEL, non-ASCII) escaped
// as \n, \r, \t or \xNN, so a string from the daemon (a name, a message)
// can neither send escape sequences nor forge lines of output.
std::string Printable(absl::string_view text);

// "FREE", "OPEN", ... (the PageState name without its prefix).
std::string StateName(v1::PageState state);
// "none", "applied 28MiB (2 pages, rev 1)", "DEFERRED to ... over by ...".
std::string LimitText(const v1::MemoryLimit& limit);
// "full 0  open 1  idle 0  mapping 0  free 1  reclaimed 0  empty 1".
std::string PageCountsText(const v1::PageCounts& pages);
// Pages by state as a bar of `width` characters between brackets, each
// state's share rounded by largest remainder, in ANSI colours; a state with
// any page shows at least one character. EMPTY pages (never mapped) are left
// out; pages that attached engines still map on their way out (REVOKING,
// QUARANTINED) are in.
std::string PageBar(const v1::PageCounts& pages, int width);
// The glyph of each state in PageBar, in its colour.
std::string PageBarLegend();
// "healthy" or "FAILED: <why>" (<why> Printable).
std::string HealthText(const v1::CapacitySnapshot& capacity);
// "0,1" (an empty device list means device 0).
std::string DevicesText(const v1::PoolSpec& spec);

}  // namespace cli
}  // namespace kvbroker

#endif  // KVBROKER_CLIENT_CLI_TEXT_H_
