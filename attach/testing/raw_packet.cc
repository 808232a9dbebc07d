// One raw packet with fds; see raw_packet.h.

#include "attach/testing/raw_packet.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "gtest/gtest.h"

namespace kvbroker::testing {

int TrySendRaw(int socket, const std::string& bytes,
               const std::vector<int>& fds) {
  iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  const ssize_t sent = sendmsg(socket, &msg, MSG_NOSIGNAL);
  if (sent < 0) return errno;
  return sent == static_cast<ssize_t>(bytes.size()) ? 0 : EMSGSIZE;
}

void SendRaw(int socket, const std::string& bytes,
             const std::vector<int>& fds) {
  const int error = TrySendRaw(socket, bytes, fds);
  ASSERT_EQ(error, 0) << strerror(error);
}

}  // namespace kvbroker::testing
