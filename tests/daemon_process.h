// A kvbrokerd child process for tests: started with given flags, its stdout
// read line by line and its stderr collected in the background (so a
// chatty daemon never blocks on a full pipe), signalled and reaped.
//
// The binary is $KVBROKERD when set, else server/kvbrokerd from the test's
// runfiles.

#ifndef KVBROKER_TESTS_DAEMON_PROCESS_H_
#define KVBROKER_TESTS_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvbroker {
namespace testing {

class DaemonProcess {
 public:
  explicit DaemonProcess(const std::vector<std::string>& args);
  // SIGKILLs the child if it still runs.
  ~DaemonProcess();

  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // The next line of stdout, or "" after `timeout` or at its end.
  std::string ReadLine(absl::Duration timeout);

  // Waits for the "serving kvbroker.v1.KvBroker" line; returns it ("" if it
  // did not come within `timeout`).
  std::string WaitServing(absl::Duration timeout = absl::Seconds(30));
  // The TCP port of a serving line ("... on 127.0.0.1:PORT ..."), or 0.
  static int PortOf(const std::string& serving_line);

  // The exit status (128 + signal when killed), or -1 if it did not exit
  // within `timeout`. Also waits for stderr to reach its end.
  int WaitExit(absl::Duration timeout);

  // Everything the child wrote to stderr so far.
  std::string Stderr() const ABSL_LOCKS_EXCLUDED(mu_);

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_ = -1;
  std::thread stderr_reader_;
  mutable absl::Mutex mu_;
  std::string stderr_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing
}  // namespace kvbroker

#endif  // KVBROKER_TESTS_DAEMON_PROCESS_H_
