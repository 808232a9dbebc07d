// The attach protocol's transport: one kvbroker.attach.v1.Frame per
// AF_UNIX SOCK_SEQPACKET packet, with file descriptors as SCM_RIGHTS.
//
// Packet layout: the 4 bytes "KVA1", the body length as a 32-bit
// little-endian integer, then exactly that many bytes of a serialized Frame.
// SOCK_SEQPACKET keeps packet boundaries, so one bad packet never
// desynchronises the stream: the receiver refuses it and reads the next one.
//
// Receiving is strict. Every one of these is refused with a typed error (a
// status carrying a ProtocolError, see ProtocolErrorOf) after closing every
// fd that came with the packet:
//   FRAME_TOO_LARGE   body longer than kMaxFrameBytes (the packet is
//                     detected with MSG_TRUNC, never partially parsed);
//   FRAME_TRUNCATED   shorter than its header, or than the length it states;
//   MALFORMED_FRAME   wrong magic, or a body that does not parse;
//   UNKNOWN_MESSAGE   a Frame with no known body;
//   UNEXPECTED_FDS    fds with any message but PagesMapped;
//   TOO_MANY_FDS      more than kMaxFdsPerFrame fds (MSG_CTRUNC: the kernel
//                     dropped the rest; those it delivered are closed).
// Received fds are close-on-exec. Whether a PagesMapped carries the right
// number of fds depends on the session and is the receiver's check.
//
// Thread safety: a FrameChannel may be used by one sender and one receiver
// thread at the same time (sending and receiving share no state).

#ifndef KVBROKER_ATTACH_FRAME_H_
#define KVBROKER_ATTACH_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attach/unique_fd.h"
#include "google/protobuf/arena.h"
#include "proto/kvbroker/v1/attach.pb.h"

namespace kvbroker::attach {

// The protocol versions of proto/kvbroker/v1/attach.proto this build
// speaks: the daemon answers the lower of the engine's and kProtocolVersion.
// Version 2 adds block runs (AllocRequest.block_runs and
// FreeRequest.block_runs), which a version-1 daemon would ignore.
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr uint32_t kMinProtocolVersion = 1;
// Most fds one frame may carry (one sendmsg carries at most 253 on Linux).
inline constexpr int kMaxFdsPerFrame = 250;
inline constexpr size_t kHeaderBytes = 8;
// Largest frame body. An AF_UNIX packet must fit the socket's send buffer
// (about 208 KiB by default), so bodies stay well below that.
inline constexpr size_t kMaxFrameBytes = 128 * 1024;
inline constexpr char kFrameMagic[4] = {'K', 'V', 'A', '1'};
// Longest request or reservation id on a session, either way: the daemon
// refuses a longer one (INVALID_ARGUMENT), the engine a reply naming one
// (MALFORMED_FRAME).
inline constexpr size_t kMaxIdLength = 128;

// A status carrying `error` (payload kProtocolErrorUrl) with the code the
// protocol assigns to it (INVALID_ARGUMENT for frame errors, UNIMPLEMENTED
// for UNKNOWN_MESSAGE, FAILED_PRECONDITION for session-order errors,
// NOT_FOUND for UNKNOWN_REVOCATION).
inline constexpr absl::string_view kProtocolErrorUrl =
    "type.kvbroker.dev/kvbroker.attach.v1.ProtocolError";
absl::Status ProtocolFailure(v1::ProtocolError error,
                             absl::string_view message);
// The ProtocolError carried by `status`; PROTOCOL_ERROR_UNSPECIFIED if none.
v1::ProtocolError ProtocolErrorOf(const absl::Status& status);

// Status <-> the wire's Error. A status with a kvbroker Failure payload
// (allocator/failure.h) keeps its reason and metadata; one with a
// ProtocolError keeps it; anything else keeps its code and message.
v1::Error ToError(const absl::Status& status);
absl::Status FromError(const v1::Error& error);

// Both ends build the frames of each request and its reply on an arena
// whose first block (kFrameArenaBytes, theirs) is reused: an exchange whose
// frames fit it allocates nothing on the heap for them. The arena is reset
// before an exchange only once more than half of that block is used
// (RecycleFrameArena), so that most exchanges pay neither the reset nor the
// arena's first allocation after one; the half left always holds the
// largest usual exchange, Free(256) and its reply, about 8.2 KiB
// (attach/frame_test.cc). A frame on the arena therefore stays valid at
// least until the next exchange begins.
inline constexpr size_t kFrameArenaBytes = 32768;
google::protobuf::ArenaOptions FrameArenaOptions(char* block, size_t size);
// Resets `arena` when more than kFrameArenaBytes / 2 of it is used (an
// arena that had to take a block from the heap always has); otherwise
// leaves it as it is.
void RecycleFrameArena(google::protobuf::Arena* arena);

// Whether a frame of this body may carry fds (only PagesMapped).
bool CarriesFds(const v1::Frame& frame);

// Polls `fd` without sleeping until a packet can be read (or the peer hung
// up, or the socket failed) or `spin_ns` nanoseconds have passed; 0 returns
// at once. The waiting discipline of engine::ConnectOptions::reply_spin.
void SpinUntilReadable(int fd, int64_t spin_ns);

struct ReceivedFrame {
  v1::Frame frame;
  std::vector<UniqueFd> fds;
};

class FrameChannel {
 public:
  // Takes ownership of a connected SOCK_SEQPACKET socket.
  explicit FrameChannel(UniqueFd socket);

  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // A connected pair (socketpair), for tests and in-process use.
  static absl::StatusOr<std::pair<FrameChannel, FrameChannel>> Pair();
  // Connects to the daemon's attach socket at `path`. UNAVAILABLE with the
  // errno text when nobody listens there.
  static absl::StatusOr<FrameChannel> Connect(absl::string_view path);

  FrameChannel(FrameChannel&&) = default;
  FrameChannel& operator=(FrameChannel&&) = default;

  int fd() const { return socket_.get(); }

  // Sends `frame` with `fds` (not consumed: the caller still owns them).
  // INVALID_ARGUMENT when the body exceeds kMaxFrameBytes or there are more
  // than kMaxFdsPerFrame fds; UNAVAILABLE when the peer is gone. Blocks while
  // the socket's buffer is full; DEADLINE_EXCEEDED when it stayed full past
  // the socket's send timeout (SO_SNDTIMEO). A packet is sent whole or not
  // at all.
  absl::Status Send(const v1::Frame& frame, absl::Span<const int> fds = {});
  // The same without blocking: RESOURCE_EXHAUSTED, and nothing sent, when
  // the socket's buffer is full.
  absl::Status TrySend(const v1::Frame& frame, absl::Span<const int> fds = {});
  // Whether a send found the peer gone (EPIPE, ECONNRESET and the like):
  // nothing can be sent on this connection any more. Sender-side state.
  bool peer_gone() const { return peer_gone_; }

  // Blocks for the next packet. CANCELLED "peer closed" at end of stream
  // (or after shutdown(SHUT_RD) of this end); DEADLINE_EXCEEDED when the
  // socket's receive timeout (SO_RCVTIMEO) passed; UNAVAILABLE for socket
  // errors; the typed errors of the file comment for
  // bad packets (the channel stays usable after those).
  absl::StatusOr<ReceivedFrame> Receive();
  // The same into `*frame` and `*fds` (both replaced): `frame` may live on an
  // arena, so that a session reusing one reads a frame without a heap
  // allocation. On an error `*fds` is empty (what came was closed) and
  // `*frame` is unspecified.
  absl::Status ReceiveInto(v1::Frame* frame, std::vector<UniqueFd>* fds);

 private:
  absl::Status SendWithFlags(const v1::Frame& frame, absl::Span<const int> fds,
                             int flags);

  UniqueFd socket_;
  // Receive buffer, reused: header + kMaxFrameBytes + 1 byte to spot excess.
  std::string buffer_;
  std::string send_buffer_;
  bool peer_gone_ = false;
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_FRAME_H_
