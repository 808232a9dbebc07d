// SendRaw: one SOCK_SEQPACKET packet of arbitrary bytes with arbitrary fds,
// bypassing FrameChannel, as a misbehaving engine would send it. For tests
// of the frame codec's strict receive and of the daemon's socket, and for
// the attach fuzz driver (TrySendRaw, where a refused send is an outcome).

#ifndef KVBROKER_ATTACH_TESTING_RAW_PACKET_H_
#define KVBROKER_ATTACH_TESTING_RAW_PACKET_H_

#include <string>
#include <vector>

namespace kvbroker::testing {

// Sends `bytes` with `fds` (SCM_RIGHTS) in one packet on `socket`; a
// failed or short send is a test failure (gtest ASSERT in this function).
void SendRaw(int socket, const std::string& bytes,
             const std::vector<int>& fds = {});

// The same send without gtest: 0 when the whole packet went out, else the
// errno of the failed sendmsg (EPIPE once the peer closed, EINVAL for more
// fds than one message may carry, ...).
int TrySendRaw(int socket, const std::string& bytes,
               const std::vector<int>& fds = {});

}  // namespace kvbroker::testing

#endif  // KVBROKER_ATTACH_TESTING_RAW_PACKET_H_
