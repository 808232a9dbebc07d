// Unix socket path checks: probe, stale-file removal, owned unlink.

#include "common/unix_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvbroker {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// "pid 1234 (kvbrokerd)", or "an unknown process" when the kernel does not
// say.
std::string DescribePeer(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      cred.pid <= 0) {
    return "an unknown process";
  }
  std::string comm;
  std::ifstream in(absl::StrCat("/proc/", cred.pid, "/comm"));
  std::getline(in, comm);
  comm = std::string(absl::StripAsciiWhitespace(comm));
  return comm.empty() ? absl::StrCat("pid ", cred.pid)
                      : absl::StrCat("pid ", cred.pid, " (", comm, ")");
}

}  // namespace

std::string StagingPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  return absl::StrCat(path.substr(0, base), ".", path.substr(base), ".",
                      getpid());
}

absl::Status CheckUnixSocketPath(const std::string& path, UnixSocketRole role) {
  sockaddr_un addr{};
  const size_t longest = sizeof(addr.sun_path) - 1;
  if (path.empty() || StagingPath(path).size() > longest) {
    return absl::InvalidArgumentError(
        absl::StrCat(role.flag, ": the path must have 1 to ",
                     longest - (StagingPath(path).size() - path.size()),
                     " bytes, not ", path.size()));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(role.flag, ": cannot inspect ", path, ": ", Errno(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(role.flag, ": ", path,
                     " exists and is not a socket; not replacing it"));
  }
  const int fd = socket(AF_UNIX, role.type | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(role.flag, ": socket(): ", Errno(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int rc =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  if (rc == 0) {
    const std::string holder = DescribePeer(fd);
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(role.flag, ": ", path, " is served by ", holder,
                     "; stop it or choose another path"));
  }
  close(fd);
  if (err != ECONNREFUSED) {
    return absl::FailedPreconditionError(
        absl::StrCat(role.flag, ": cannot probe ", path, ": ", Errno(err),
                     "; not replacing it"));
  }
  // Nobody listens: a stale file. Remove it only if it is still the file
  // just probed.
  struct stat again;
  if (lstat(path.c_str(), &again) == 0 && again.st_dev == st.st_dev &&
      again.st_ino == st.st_ino && unlink(path.c_str()) != 0 &&
      errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat(role.flag, ": cannot remove the stale socket ", path, ": ",
                     Errno(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<UnixSocketFile> UnixSocketFile::Publish(
    const std::string& staging, const std::string& path, UnixSocketRole role) {
  struct stat st;
  if (lstat(staging.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        role.flag, ": the listener's socket ", staging, " is missing"));
  }
  if (link(staging.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(staging.c_str());
    if (err == EEXIST) {
      // Another daemon won the race for the path since the check.
      absl::Status held = CheckUnixSocketPath(path, role);
      return held.ok() ? absl::FailedPreconditionError(absl::StrCat(
                             role.flag, ": ", path, " was taken meanwhile"))
                       : held;
    }
    return absl::FailedPreconditionError(
        absl::StrCat(role.flag, ": cannot create ", path, ": ", Errno(err)));
  }
  unlink(staging.c_str());
  return UnixSocketFile(path, st.st_dev, st.st_ino);
}

bool UnixSocketFile::Remove() const {
  struct stat st;
  if (lstat(path_.c_str(), &st) != 0 || st.st_dev != dev_ ||
      st.st_ino != ino_) {
    return false;
  }
  return unlink(path_.c_str()) == 0;
}

}  // namespace kvbroker
