// Peer: the daemon's side of an attach session for engine tests. It listens
// on a socket of its own and plays the daemon frame by frame, as the test
// drives it.

#ifndef KVBROKER_ENGINE_TESTING_PEER_H_
#define KVBROKER_ENGINE_TESTING_PEER_H_

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "attach/frame.h"
#include "attach/unique_fd.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/attach.pb.h"

namespace kvbroker::engine::testing {

// A host pool's layout, every field following from P = 2 MiB, B = 1 MiB,
// L = 1, K = 2 and `pages` pages (4 MiB bundles, two blocks a page), on one
// device "host-0".
inline attach::v1::PoolLayout HostLayout(int64_t pages) {
  constexpr int64_t kBundle = 4 << 20;
  attach::v1::PoolLayout l;
  l.set_pool("kv");
  l.set_backend("host");
  l.set_page_size(2 << 20);
  l.set_block_bytes(1 << 20);
  l.set_num_layers(1);
  l.set_num_kv_buffers(2);
  l.set_bundle_bytes(kBundle);
  l.set_block_stride_bytes(2 << 20);
  l.set_layer_offset_bytes(2 << 20);
  l.set_buffer_offset_bytes(1 << 20);
  l.set_page_count(pages);
  l.set_max_blocks(2 * pages);
  l.set_virtual_bytes_per_device(pages * kBundle);
  l.add_devices()->set_uuid("host-0");
  return l;
}

// The daemon's side of one session, driven by the test.
class Peer {
 public:
  Peer() {
    char dir[] = "/tmp/kvb-session-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/attach.sock";
    listener_.Reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(
        bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
        0);
    EXPECT_EQ(listen(listener_.get(), 1), 0);
  }
  ~Peer() {
    channel_.reset();
    listener_.Reset();
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }

  void Accept() {
    channel_.emplace(
        UniqueFd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC)));
  }
  attach::ReceivedFrame Next() {
    absl::StatusOr<attach::ReceivedFrame> got = channel_->Receive();
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *std::move(got) : attach::ReceivedFrame{};
  }
  absl::StatusOr<attach::ReceivedFrame> TryNext() {
    return channel_->Receive();
  }
  void Send(const attach::v1::Frame& f, std::vector<int> fds = {}) {
    ASSERT_TRUE(channel_->Send(f, fds).ok());
  }
  // Accepts the engine's connection and answers its Hello with protocol
  // version 1.
  void AcceptHello() {
    Accept();
    attach::ReceivedFrame hello = Next();
    ASSERT_TRUE(hello.frame.has_hello());
    attach::v1::Frame reply;
    reply.set_seq(hello.frame.seq());
    reply.mutable_hello_reply()->set_protocol_version(1);
    Send(reply);
  }
  // Answers the request of `seq` with the daemon's refusal `why`.
  void Refuse(uint64_t seq, const absl::Status& why) {
    attach::v1::Frame refusal;
    refusal.set_seq(seq);
    *refusal.mutable_error() = attach::ToError(why);
    Send(refusal);
  }
  // Closes the connection (the engine sees the end of the stream).
  void Hangup() { channel_.reset(); }

 private:
  std::string dir_, path_;
  UniqueFd listener_;
  std::optional<attach::FrameChannel> channel_;
};

}  // namespace kvbroker::engine::testing

#endif  // KVBROKER_ENGINE_TESTING_PEER_H_
