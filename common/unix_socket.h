// The path of a Unix socket kvbrokerd listens on (the gRPC socket, the
// attach socket): claimed only when nobody serves it, and removed on exit
// only while it is still ours (SPEC 9).
//
// Before binding, CheckUnixSocketPath looks at what lies at the path:
//   - nothing: fine;
//   - a socket someone accepts connections on (a probe connect() of the
//     listener's socket type succeeds): refused, naming the listening
//     process (SO_PEERCRED on the probe);
//   - a socket nobody listens on (connect() fails with ECONNREFUSED): a
//     stale file left by a daemon that died; it is removed;
//   - anything else (a regular file, a directory, a socket we may not
//     probe or of another type): refused, and left alone.
// The listener then binds a private staging path beside the public one
// (gRPC also unlinks its listening path before it binds and again when the
// server is destroyed, whoever owns the file by then), and
// UnixSocketFile::Publish hard-links it to the public path, which fails
// rather than replaces when the path exists: of two daemons racing for one
// path, even both past the check, exactly one wins. The staging name is
// then removed, so gRPC's own unlinks find nothing. The published file's
// device and inode are recorded, and Remove unlinks the public path only
// while it still names that file, so a daemon never deletes a socket
// another process bound after it.

#ifndef KVBROKER_COMMON_UNIX_SOCKET_H_
#define KVBROKER_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvbroker {

// What a listening path is for: the socket type a probe must connect with
// (a probe of another type is refused by the kernel, and the path is then
// left alone), and the flag that named the path, for messages.
struct UnixSocketRole {
  int type;                // SOCK_STREAM or SOCK_SEQPACKET
  absl::string_view flag;  // e.g. "--unix_socket"
};

// OK when `path` is free or held a stale socket (now removed).
// FAILED_PRECONDITION when a process serves it (the message names its pid
// and command when the kernel tells them) or when something other than a
// socket of `role.type` nobody listens on lies there; INVALID_ARGUMENT when
// the path (or its staging path) is too long for a Unix socket address.
absl::Status CheckUnixSocketPath(const std::string& path, UnixSocketRole role);

// Where the listener for `path` binds before Publish: a hidden name in the
// same directory, unique to this process and to the public path's name.
std::string StagingPath(const std::string& path);

// The socket file a listener bound.
class UnixSocketFile {
 public:
  // Makes the socket bound at `staging` reachable at `path` unless something
  // already lies there, and removes the staging name. Errors:
  // FAILED_PRECONDITION when `path` exists (naming the process that serves
  // it, when one does), or the link(2) failure.
  static absl::StatusOr<UnixSocketFile> Publish(const std::string& staging,
                                                const std::string& path,
                                                UnixSocketRole role);

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

#endif  // KVBROKER_COMMON_UNIX_SOCKET_H_
