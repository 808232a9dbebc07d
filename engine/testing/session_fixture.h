// The fixture of the engine Session's tests against a scripted daemon
// (peer.h): real memfd bundles the peer maps too, and a Session connected
// and attached while the peer answers Hello and Attach. session_test.cc
// runs the normal calls against it, session_faults_test.cc a daemon that
// is slow, refuses or misbehaves.

#ifndef KVBROKER_ENGINE_TESTING_SESSION_FIXTURE_H_
#define KVBROKER_ENGINE_TESTING_SESSION_FIXTURE_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "attach/frame.h"
#include "attach/testing/fd_count.h"
#include "attach/unique_fd.h"
#include "engine/session.h"
#include "engine/testing/peer.h"
#include "gtest/gtest.h"

namespace kvbroker::engine::testing {

namespace av1 = ::kvbroker::attach::v1;
using attach::kProtocolVersion;
using attach::ReceivedFrame;

constexpr int64_t kBundle = 4 << 20;  // P = 2 MiB, L = 1, K = 2
constexpr int64_t kPages = 4;

inline int OpenFds() {
  return ::kvbroker::testing::CountOpenFds().value_or(-1);
}

// A bundle's memory: the memfd and the peer's own mapping of it.
struct Bundle {
  UniqueFd fd;
  char* data = nullptr;
  explicit Bundle(char fill) : fd(memfd_create("bundle", MFD_CLOEXEC)) {
    EXPECT_EQ(ftruncate(fd.get(), kBundle), 0);
    data = static_cast<char*>(mmap(nullptr, kBundle, PROT_READ | PROT_WRITE,
                                   MAP_SHARED, fd.get(), 0));
    memset(data, fill, kBundle);
  }
  ~Bundle() { munmap(data, kBundle); }
};

inline av1::PoolLayout Layout() { return HostLayout(kPages); }

// The daemon's reply to the Alloc of `seq`: `block` on `page`.
inline av1::Frame AllocReply(uint64_t seq, int64_t page, int64_t block) {
  av1::Frame reply;
  reply.set_seq(seq);
  auto* pages = reply.mutable_alloc_reply()->add_pages();
  pages->set_page_id(page);
  pages->add_block_ids(block);
  reply.mutable_alloc_reply()->set_num_blocks(1);
  return reply;
}

class SessionTest : public ::testing::Test {
 protected:
  // Connects an engine Session while the peer answers Hello and Attach; the
  // attach is followed by PagesMapped of `initial` pages.
  void Open(const std::vector<int64_t>& initial,
            absl::Duration close_timeout = absl::Seconds(5),
            absl::Duration reply_spin = absl::ZeroDuration(),
            uint32_t version = 1) {
    av1::AttachReply reply;
    *reply.mutable_layout() = Layout();
    absl::Status attached =
        ConnectAndAttach(reply, initial, close_timeout, reply_spin, version);
    ASSERT_TRUE(attached.ok()) << attached;
  }

  // Connects a Session while the peer answers Hello with `version` and the
  // Attach with `reply`, its mapped_pages (unless `reply` sets them) those
  // of `initial`, which follow one per frame. Returns the Attach's status
  // (the Connect must succeed).
  absl::Status ConnectAndAttach(
      av1::AttachReply reply, const std::vector<int64_t>& initial,
      absl::Duration close_timeout = absl::Seconds(5),
      absl::Duration reply_spin = absl::ZeroDuration(), uint32_t version = 1,
      int64_t reservation_blocks = 0) {
    fds_before_ = OpenFds();
    std::thread daemon([&] {
      peer_.Accept();
      ReceivedFrame hello = peer_.Next();
      ASSERT_TRUE(hello.frame.has_hello());
      EXPECT_EQ(hello.frame.hello().holder(), "rank0");
      EXPECT_EQ(hello.frame.hello().pid(), getpid());
      av1::Frame hr;
      hr.set_seq(hello.frame.seq());
      EXPECT_EQ(hello.frame.hello().protocol_version(), kProtocolVersion);
      hr.mutable_hello_reply()->set_protocol_version(version);
      hr.mutable_hello_reply()->set_session_id(77);
      peer_.Send(hr);
      ReceivedFrame attach = peer_.Next();
      ASSERT_TRUE(attach.frame.has_attach());
      av1::Frame ar;
      ar.set_seq(attach.frame.seq());
      *ar.mutable_attach_reply() = reply;
      if (reply.mapped_pages() == 0) {
        ar.mutable_attach_reply()->set_mapped_pages(initial.size());
      }
      peer_.Send(ar);
      // One page per frame, with this attach's seq.
      for (int64_t p : initial) {
        av1::Frame pm;
        pm.set_seq(attach.frame.seq());
        pm.mutable_pages_mapped()->add_page_ids(p);
        peer_.Send(pm, {bundles_[p]->fd.get()});
      }
    });
    ConnectOptions c;
    c.socket_path = peer_.path();
    c.holder = "rank0";
    c.close_timeout = close_timeout;
    c.reply_spin = reply_spin;
    c.call_timeout = call_timeout_;
    auto s = Session::Connect(c);
    if (!s.ok()) {
      daemon.join();
      ADD_FAILURE() << s.status();
      return s.status();
    }
    session_ = *std::move(s);
    AttachOptions a;
    a.pool = "kv";
    a.create_mapper = create_mapper_;
    if (reservation_blocks > 0) {
      a.reservation_id = "res-1";
      a.reservation_blocks = reservation_blocks;
    }
    auto r = session_->Attach(a);
    daemon.join();
    return r.status();
  }

  // A session still open closes against a peer that hangs up: its Close
  // does not wait for a reply that never comes.
  void TearDown() override {
    peer_.Hangup();
    session_.reset();
  }

  void SetUp() override {
    for (int p = 0; p < kPages; ++p) {
      bundles_.push_back(std::make_unique<Bundle>('a' + p));
    }
  }

  Peer peer_;
  std::vector<std::unique_ptr<Bundle>> bundles_;
  std::unique_ptr<Session> session_;
  int fds_before_ = 0;
  absl::Duration call_timeout_ = absl::Seconds(30);
  std::function<absl::StatusOr<std::unique_ptr<DeviceMapper>>(
      const std::string&, const std::string&, int64_t)>
      create_mapper_;
};

}  // namespace kvbroker::engine::testing

#endif  // KVBROKER_ENGINE_TESTING_SESSION_FIXTURE_H_
