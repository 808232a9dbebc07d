// Counting a process's open file descriptors through /proc, so tests can
// prove that no path leaks one.

#ifndef KVBROKER_ATTACH_TESTING_FD_COUNT_H_
#define KVBROKER_ATTACH_TESTING_FD_COUNT_H_

#include <sys/types.h>

#include "absl/status/statusor.h"

namespace kvbroker::testing {

// Entries of /proc/<pid>/fd (this process when pid is 0), not counting the
// descriptor used to read the directory itself.
absl::StatusOr<int> CountOpenFds(pid_t pid = 0);

}  // namespace kvbroker::testing

#endif  // KVBROKER_ATTACH_TESTING_FD_COUNT_H_
