// `kvbrokerctl top`: a live full-screen view of every pool of a daemon.
//
// A WatchCapacity stream per pool, for the first `max_streams` pools seen,
// keeps their numbers current (a stream that fails is reopened every
// second; one that ends with POOL_NOT_FOUND drops the pool). A ListPools
// every `interval` notices new pools and refreshes every pool without a
// live stream: those past `max_streams` (the daemon allows 1,024 watches
// per caller, and each stream is a thread here) and those whose stream
// failed. A ListSessions at the same pace counts the engines attached to
// each pool (sessions, holders in grace, their blocks, mapped pages,
// pending revocations and quarantined pages). The screen is drawn with
// plain ANSI escape sequences on the alternate screen, with the terminal
// in raw mode (termios); no curses library. Keys: q (or Ctrl-C) quits,
// j/k scroll.
//
// Thread safety: RunTop owns the terminal; call it from one thread.

#ifndef KVBROKER_CLIENT_TOP_H_
#define KVBROKER_CLIENT_TOP_H_

#include <atomic>

#include "absl/time/time.h"
#include "client/kvbroker_client.h"

namespace kvbroker {
namespace cli {

// Runs until `q` is pressed, stdin closes or `interrupted` becomes true (a
// signal handler may set it); restores the terminal. Returns the exit code.
int RunTop(KvBrokerClient& client, absl::Duration interval, int max_streams,
           const std::atomic<bool>& interrupted);

}  // namespace cli
}  // namespace kvbroker

#endif  // KVBROKER_CLIENT_TOP_H_
