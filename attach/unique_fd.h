// UniqueFd: sole ownership of one POSIX file descriptor, closed on
// destruction. Used wherever fds travel between the daemon, the socket and
// the engine, so that no path can leak one.
//
// Thread safety: like an int; a UniqueFd is used by one thread at a time.

#ifndef KVBROKER_ATTACH_UNIQUE_FD_H_
#define KVBROKER_ATTACH_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace kvbroker {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int Release() { return std::exchange(fd_, -1); }
  // Closes the current fd (if any) and owns `fd`.
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace kvbroker

#endif  // KVBROKER_ATTACH_UNIQUE_FD_H_
