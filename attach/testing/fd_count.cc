// CountOpenFds of fd_count.h.

#include "attach/testing/fd_count.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace kvbroker::testing {

absl::StatusOr<int> CountOpenFds(pid_t pid) {
  const std::string path =
      pid == 0 ? "/proc/self/fd" : absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("opendir ", path, ": ", strerror(errno)));
  }
  const int own = dirfd(dir);
  int count = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    if (pid == 0 && std::to_string(own) == e->d_name) continue;
    ++count;
  }
  closedir(dir);
  return count;
}

}  // namespace kvbroker::testing
