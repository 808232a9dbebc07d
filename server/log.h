// One-line log records on stderr, the daemon's only log sink:
//   kvbrokerd 2026-01-02T03:04:05.678Z <text>
// Records are written with one fprintf each, so lines from concurrent
// threads do not interleave.

#ifndef KVBROKER_SERVER_LOG_H_
#define KVBROKER_SERVER_LOG_H_

#include <cstdio>

#include "absl/strings/str_format.h"
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

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_LOG_H_
