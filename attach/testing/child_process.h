// ChildProcess: a test's handle on a separately exec'd program (kvbrokerd,
// the test engine), with its stdout read line by line. Started with
// posix_spawn, never a plain fork of the test process.

#ifndef KVBROKER_ATTACH_TESTING_CHILD_PROCESS_H_
#define KVBROKER_ATTACH_TESTING_CHILD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kvbroker::testing {

class ChildProcess {
 public:
  // Starts `binary` with `args`; pid() is -1 when that failed.
  ChildProcess(const std::string& binary, const std::vector<std::string>& args);
  // SIGKILLs and reaps the child if it is still running.
  ~ChildProcess();

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The next line of stdout without its newline; "" at end of stream or
  // after `timeout`.
  std::string ReadLine(absl::Duration timeout = absl::Seconds(60));
  // Reads lines until one starts with `prefix`; returns it ("" if none came).
  std::string ReadUntil(const std::string& prefix,
                        absl::Duration timeout = absl::Seconds(60));
  // Writes `line` and a newline to the child's stdin.
  bool WriteLine(const std::string& line);
  // Sends `signal` and reaps; returns the wait status.
  int Kill(int signal);
  // Waits for the exit; the exit code, 128 + signal, or -1 on timeout.
  int Wait(absl::Duration timeout = absl::Seconds(60));

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffered_;
};

// A runfile's path: $TEST_SRCDIR/kvbroker/<path> under Bazel, else <path>.
std::string Runfile(const std::string& path);

}  // namespace kvbroker::testing

#endif  // KVBROKER_ATTACH_TESTING_CHILD_PROCESS_H_
