// The Unix socket path of kvbrokerd's gRPC listener: claimed only when
// nobody serves it, and removed on exit only while it is still ours
// (SPEC 9).
//
// Before binding, CheckUnixSocketPath looks at what lies at the path:
//   - nothing: fine;
//   - a socket someone accepts connections on (a probe connect() succeeds):
//     refused, naming the listening process (SO_PEERCRED on the probe);
//   - a socket nobody listens on (connect() fails with ECONNREFUSED): a
//     stale file left by a daemon that died; it is removed;
//   - anything else (a regular file, a directory, a socket we may not
//     probe): refused, and left alone.
// gRPC unlinks its listening path before it binds and again when the
// server is destroyed, whoever owns the file by then. So the listener binds
// a private staging path beside the public one, and UnixSocketFile::Publish
// hard-links it to the public path, which fails rather than replaces when
// the path exists (two daemons racing for one path: exactly one wins), then
// removes the staging name; gRPC's own unlinks then find nothing. The
// published file's device and inode are recorded, and Remove unlinks the
// public path only while it still names that file, so a daemon never
// deletes a socket another process bound after it.

#ifndef KVBROKER_SERVER_UNIX_SOCKET_H_
#define KVBROKER_SERVER_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvbroker {

// OK when `path` is free or held a stale socket (now removed).
// FAILED_PRECONDITION when a process serves it (the message names its pid
// and command when the kernel tells them) or when something other than a
// socket lies there; INVALID_ARGUMENT when the path is too long for a Unix
// socket address.
absl::Status CheckUnixSocketPath(const std::string& path);

// Where the listener for `path` binds before Publish: a hidden name in the
// same directory, unique to this process.
std::string StagingPath(const std::string& path);

// The socket file a listener bound.
class UnixSocketFile {
 public:
  // Makes the socket bound at `staging` reachable at `path` unless something
  // already lies there, and removes the staging name. Errors:
  // FAILED_PRECONDITION when `path` exists (naming the process that serves
  // it, when one does), or the link(2) failure.
  static absl::StatusOr<UnixSocketFile> Publish(const std::string& staging,
                                                const std::string& path);

  // Unlinks the path if it still names the claimed file. Returns whether it
  // did.
  bool Remove() const;

  const std::string& path() const { return path_; }

 private:
  UnixSocketFile(std::string path, dev_t dev, ino_t ino)
      : path_(std::move(path)), dev_(dev), ino_(ino) {}

  std::string path_;
  dev_t dev_;
  ino_t ino_;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_UNIX_SOCKET_H_
