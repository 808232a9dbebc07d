// The frame codec of frame.h.

#include "attach/frame.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/failure.h"

namespace kvbroker::attach {
namespace {

absl::StatusCode ProtocolCode(v1::ProtocolError error) {
  switch (error) {
    case v1::UNKNOWN_MESSAGE: return absl::StatusCode::kUnimplemented;
    case v1::UNEXPECTED_MESSAGE:
    case v1::UNSUPPORTED_VERSION:
    case v1::HOLDER_BUSY: return absl::StatusCode::kFailedPrecondition;
    case v1::UNKNOWN_REVOCATION: return absl::StatusCode::kNotFound;
    default: return absl::StatusCode::kInvalidArgument;
  }
}

absl::Status Errno(absl::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(err)));
}

void PutLittleEndian32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetLittleEndian32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return v;
}

// Room for kMaxFdsPerFrame fds in one SCM_RIGHTS message.
constexpr size_t kControlBytes = CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame);

}  // namespace

absl::Status ProtocolFailure(v1::ProtocolError error,
                             absl::string_view message) {
  absl::Status status(ProtocolCode(error), message);
  status.SetPayload(kProtocolErrorUrl, absl::Cord(absl::StrCat(error)));
  return status;
}

v1::ProtocolError ProtocolErrorOf(const absl::Status& status) {
  auto payload = status.GetPayload(kProtocolErrorUrl);
  int value = 0;
  if (!payload.has_value() ||
      !absl::SimpleAtoi(std::string(*payload), &value) ||
      !v1::ProtocolError_IsValid(value)) {
    return v1::PROTOCOL_ERROR_UNSPECIFIED;
  }
  return static_cast<v1::ProtocolError>(value);
}

v1::Error ToError(const absl::Status& status) {
  v1::Error error;
  error.set_code(static_cast<int32_t>(status.code()));
  error.set_message(std::string(status.message()));
  error.set_protocol_error(ProtocolErrorOf(status));
  if (std::optional<Failure> failure = GetFailure(status)) {
    error.set_reason(static_cast<kvbroker::v1::Reason>(failure->reason));
    for (const auto& [key, value] : failure->metadata) {
      (*error.mutable_metadata())[key] = value;
    }
  }
  return error;
}

absl::Status FromError(const v1::Error& error) {
  const FailureReason reason = static_cast<FailureReason>(error.reason());
  if (error.reason() != kvbroker::v1::REASON_UNSPECIFIED &&
      static_cast<int>(reason) <= kMaxFailureReason) {
    FailureMetadata metadata(error.metadata().begin(), error.metadata().end());
    return MakeFailure(reason, error.message(), std::move(metadata));
  }
  if (error.protocol_error() != v1::PROTOCOL_ERROR_UNSPECIFIED) {
    return ProtocolFailure(error.protocol_error(), error.message());
  }
  absl::StatusCode code = static_cast<absl::StatusCode>(error.code());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  return absl::Status(code, error.message());
}

bool CarriesFds(const v1::Frame& frame) { return frame.has_pages_mapped(); }

void SpinUntilReadable(int fd, int64_t spin_ns) {
  if (spin_ns <= 0) return;
  const int64_t until = absl::GetCurrentTimeNanos() + spin_ns;
  pollfd p = {fd, POLLIN, 0};
  while (poll(&p, 1, 0) == 0 && absl::GetCurrentTimeNanos() < until) {
  }
}

FrameChannel::FrameChannel(UniqueFd socket) : socket_(std::move(socket)) {}

absl::StatusOr<std::pair<FrameChannel, FrameChannel>> FrameChannel::Pair() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return Errno("socketpair", errno);
  }
  return std::make_pair(FrameChannel(UniqueFd(fds[0])),
                        FrameChannel(UniqueFd(fds[1])));
}

absl::StatusOr<FrameChannel> FrameChannel::Connect(absl::string_view path) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach socket path \"", path, "\" is empty or longer than ",
        sizeof(addr.sun_path) - 1, " bytes"));
  }
  memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket", errno);
  int r;
  do {
    r = connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (r != 0 && errno == EINTR);
  if (r != 0) return Errno(absl::StrCat("connect ", path), errno);
  return FrameChannel(std::move(fd));
}

google::protobuf::ArenaOptions FrameArenaOptions(char* block, size_t size) {
  google::protobuf::ArenaOptions options;
  options.initial_block = block;
  options.initial_block_size = size;
  return options;
}

void RecycleFrameArena(google::protobuf::Arena* arena) {
  if (arena->SpaceUsed() > kFrameArenaBytes / 2) arena->Reset();
}

absl::Status FrameChannel::Send(const v1::Frame& frame,
                                absl::Span<const int> fds) {
  return SendWithFlags(frame, fds, MSG_NOSIGNAL);
}

absl::Status FrameChannel::TrySend(const v1::Frame& frame,
                                   absl::Span<const int> fds) {
  return SendWithFlags(frame, fds, MSG_NOSIGNAL | MSG_DONTWAIT);
}

absl::Status FrameChannel::SendWithFlags(const v1::Frame& frame,
                                         absl::Span<const int> fds, int flags) {
  const size_t body = frame.ByteSizeLong();
  if (body > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of ", body, " bytes exceeds ", kMaxFrameBytes, " bytes"));
  }
  if (fds.size() > static_cast<size_t>(kMaxFdsPerFrame)) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " fds exceed ", kMaxFdsPerFrame, " per frame"));
  }
  send_buffer_.resize(kHeaderBytes + body);
  memcpy(send_buffer_.data(), kFrameMagic, 4);
  PutLittleEndian32(static_cast<uint32_t>(body), send_buffer_.data() + 4);
  // ByteSizeLong above cached every submessage's size: serialize with them
  // rather than walking the message twice more (SerializeToArray would).
  uint8_t* const begin =
      reinterpret_cast<uint8_t*>(send_buffer_.data() + kHeaderBytes);
  if (frame.SerializeWithCachedSizesToArray(begin) != begin + body) {
    return absl::InternalError("frame does not serialize");
  }
  iovec iov = {send_buffer_.data(), send_buffer_.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[kControlBytes];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(socket_.get(), &msg, flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (flags & MSG_DONTWAIT) &&
      (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::ResourceExhaustedError("the socket's buffer is full");
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::DeadlineExceededError(
        "the socket's buffer stayed full past its send timeout");
  }
  if (n < 0) {
    if (errno == EPIPE || errno == ECONNRESET || errno == ECONNREFUSED ||
        errno == ENOTCONN) {
      peer_gone_ = true;
    }
    return Errno("sendmsg", errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedFrame> FrameChannel::Receive() {
  ReceivedFrame out;
  absl::Status s = ReceiveInto(&out.frame, &out.fds);
  if (!s.ok()) return s;
  return out;
}

absl::Status FrameChannel::ReceiveInto(v1::Frame* frame,
                                       std::vector<UniqueFd>* fds) {
  fds->clear();
  buffer_.resize(kHeaderBytes + kMaxFrameBytes + 1);
  iovec iov = {buffer_.data(), buffer_.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[kControlBytes];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    // MSG_TRUNC: the return value is the packet's real length even when it
    // did not fit.
    n = recvmsg(socket_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::DeadlineExceededError("no frame within the receive timeout");
  }
  if (n < 0) return Errno("recvmsg", errno);

  // Take ownership of every fd first, so that each return below closes them.
  std::vector<UniqueFd> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, data + i * sizeof(int), sizeof(int));
      got.emplace_back(fd);
    }
  }
  if (n == 0 && got.empty() && (msg.msg_flags & MSG_CTRUNC) == 0) {
    // End of stream and an empty packet both read as 0 bytes; only the
    // former leaves the socket hung up.
    pollfd p = {socket_.get(), POLLRDHUP, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP))) {
      return absl::CancelledError("peer closed");
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return ProtocolFailure(
        v1::TOO_MANY_FDS,
        absl::StrCat("more than ", kMaxFdsPerFrame,
                     " fds in one frame; the frame was dropped"));
  }
  const size_t length = static_cast<size_t>(n);
  if (length > kHeaderBytes + kMaxFrameBytes) {
    return ProtocolFailure(
        v1::FRAME_TOO_LARGE,
        absl::StrCat("packet of ", length, " bytes exceeds ",
                     kHeaderBytes + kMaxFrameBytes, " bytes"));
  }
  if (length < kHeaderBytes) {
    return ProtocolFailure(
        v1::FRAME_TRUNCATED,
        absl::StrCat("packet of ", length, " bytes is shorter than the ",
                     kHeaderBytes, "-byte header"));
  }
  if (memcmp(buffer_.data(), kFrameMagic, 4) != 0) {
    return ProtocolFailure(v1::MALFORMED_FRAME,
                           "packet does not start with the frame magic");
  }
  const uint32_t stated = GetLittleEndian32(buffer_.data() + 4);
  if (stated > kMaxFrameBytes) {
    return ProtocolFailure(v1::FRAME_TOO_LARGE,
                           absl::StrCat("header states ", stated,
                                        " bytes, more than ", kMaxFrameBytes));
  }
  if (length - kHeaderBytes < stated) {
    return ProtocolFailure(
        v1::FRAME_TRUNCATED,
        absl::StrCat("header states ", stated, " bytes, the packet holds ",
                     length - kHeaderBytes));
  }
  if (length - kHeaderBytes > stated) {
    return ProtocolFailure(
        v1::MALFORMED_FRAME,
        absl::StrCat("packet holds ", length - kHeaderBytes - stated,
                     " bytes past the stated ", stated));
  }
  if (!frame->ParseFromArray(buffer_.data() + kHeaderBytes,
                             static_cast<int>(stated))) {
    return ProtocolFailure(v1::MALFORMED_FRAME, "frame body does not parse");
  }
  if (frame->body_case() == v1::Frame::BODY_NOT_SET) {
    return ProtocolFailure(v1::UNKNOWN_MESSAGE,
                           "frame holds no message this version knows");
  }
  if (!got.empty() && !CarriesFds(*frame)) {
    return ProtocolFailure(
        v1::UNEXPECTED_FDS,
        absl::StrCat(got.size(), " fds came with a message that carries ",
                     "none; they were closed"));
  }
  *fds = std::move(got);
  return absl::OkStatus();
}

}  // namespace kvbroker::attach
