// One-line log records on stderr, the daemon's only log sink:
//   kvbrokerd 2026-01-02T03:04:05.678Z <text>
// Records are written with one fprintf each, so lines from concurrent
// threads do not interleave.
//
// Caller-given text (pool names, messages that quote them) goes through
// CallerText before it reaches a record: control bytes, quotes, backslashes
// and non-ASCII bytes are escaped, so a caller can neither forge a record
// nor write raw bytes, and it is cut at kMaxLoggedCallerBytes. Lines that
// callers can trigger at will (refused calls, before authentication too)
// go through a LogLimiter, so a flood of them costs bounded log space.

#ifndef KVBROKER_SERVER_LOG_H_
#define KVBROKER_SERVER_LOG_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvbroker {

template <typename... Args>
void LogLine(const absl::FormatSpec<Args...>& format, const Args&... args) {
  absl::FPrintF(stderr, "kvbrokerd %s %s\n",
                absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                 absl::UTCTimeZone()),
                absl::StrFormat(format, args...));
}

// Caller text longer than this is cut in log records.
inline constexpr size_t kMaxLoggedCallerBytes = 160;

// `text` as one safe log field: printable ASCII but '"' and '\' passes,
// everything else is escaped C-style (\n, \t, \x00, \xc3 ...); text past
// kMaxLoggedCallerBytes is cut and marked "...(N more bytes)".
std::string CallerText(absl::string_view text);

// At most `burst` lines per key in any `window`-long spell that starts with
// the key's first admitted line. Keys should be few and chosen by the code
// (a method and a reason), never by a caller. Thread-safe.
class LogLimiter {
 public:
  LogLimiter(int burst, absl::Duration window)
      : burst_(burst), window_(window) {}

  // Whether a line with `key` may be written at `now`. When it may, and
  // lines of the key were dropped since its last admitted line,
  // `*suppressed` says how many (else 0).
  bool Admit(absl::string_view key, absl::Time now, int64_t* suppressed)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Spell {
    absl::Time start;
    int admitted = 0;
    int64_t dropped = 0;
  };

  const int burst_;
  const absl::Duration window_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Spell> spells_ ABSL_GUARDED_BY(mu_);
};

// The daemon's limiter for lines about refused or failed calls: 20 per
// second per (method, reason).
LogLimiter& FailureLogLimiter();

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_LOG_H_
