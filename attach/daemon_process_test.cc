// The attach socket of a real kvbrokerd process (host backend): malformed
// frames of every kind get typed errors and leave no fd open in the daemon;
// a test engine process killed with SIGKILL loses its blocks, and one that
// comes back within its grace keeps them.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "allocator/failure.h"
#include "attach/frame.h"
#include "attach/testing/child_process.h"
#include "attach/testing/fd_count.h"
#include "attach/testing/raw_packet.h"
#include "engine/session.h"
#include "gtest/gtest.h"

namespace kvbroker::attach {
namespace {

using ::kvbroker::testing::SendRaw;

using ::kvbroker::testing::ChildProcess;
using ::kvbroker::testing::CountOpenFds;
using ::kvbroker::testing::Runfile;

constexpr char kToken[] = "engine-token-0123456789";
constexpr char kOtherToken[] = "other-pool-token-0123456789";

std::string Header(uint32_t length) {
  std::string h(kFrameMagic, 4);
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<char>(length >> (8 * i)));
  return h;
}

std::string Packet(const v1::Frame& f) {
  const std::string body = f.SerializeAsString();
  return Header(body.size()) + body;
}

class DaemonProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvb-attachd-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/attach.sock";
    std::ofstream(dir_ + "/pools.textproto")
        << "pools { name: \"kv\" page_size: 2097152 block_bytes: 262144 "
           "num_layers: 2 num_kv_buffers: 2 max_blocks: 64 }\n"
           "pools { name: \"other\" page_size: 2097152 block_bytes: 262144 "
           "max_blocks: 16 }\n";
    std::ofstream(dir_ + "/tokens.textproto")
        << "tokens { name: \"engine\" token: \"" << kToken
        << "\" pools: \"kv\" }\n"
        << "tokens { name: \"other\" token: \"" << kOtherToken
        << "\" pools: \"other\" }\n";
    daemon_ = std::make_unique<ChildProcess>(
        Runfile("server/kvbrokerd"),
        std::vector<std::string>{
            "--backend=host", "--listen=127.0.0.1:0",
            absl::StrCat("--attach_socket=", socket_),
            absl::StrCat("--pools=", dir_, "/pools.textproto"),
            absl::StrCat("--auth_tokens=", dir_, "/tokens.textproto"),
            "--min_idle_pages=0", "--host_device_memory=1GiB"});
    ASSERT_GT(daemon_->pid(), 0);
    const std::string line = daemon_->ReadUntil("kvbrokerd:");
    ASSERT_TRUE(absl::StrContains(line, "engines attach on " + socket_))
        << line;
  }

  void TearDown() override {
    daemon_.reset();
    unlink((dir_ + "/pools.textproto").c_str());
    unlink((dir_ + "/tokens.textproto").c_str());
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  // The daemon's open fds other than the host backend's page memfds (how
  // many pages are mapped is the pool's business, not the socket's), and -1
  // when /proc cannot be read. `foreign` counts fds naming `leak_name`.
  int DaemonFds(const char* leak_name = nullptr, int* foreign = nullptr) {
    const std::string dir = absl::StrCat("/proc/", daemon_->pid(), "/fd");
    std::error_code ec;
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      char target[256] = {};
      if (readlink(e.path().c_str(), target, sizeof(target) - 1) < 0) continue;
      if (absl::StartsWith(target, "/memfd:kvbroker-page")) continue;
      if (leak_name != nullptr && foreign != nullptr &&
          absl::StrContains(target, leak_name)) {
        ++*foreign;
      }
      ++n;
    }
    return ec ? -1 : n;
  }

  // Waits until the daemon holds `n` fds (it closes a finished session on
  // its own thread); returns the last count seen.
  int AwaitDaemonFds(int n) {
    int seen = DaemonFds();
    for (int i = 0; i < 20000 && seen != n; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
      seen = DaemonFds();
    }
    return seen;
  }

  // The daemon's fd count once it has stopped moving (the first session's
  // socket is closed on the daemon's own thread, a little after the engine
  // closed it): the same count for 200 ms.
  int SteadyDaemonFds() {
    int last = DaemonFds();
    for (int same = 0, i = 0; same < 10 && i < 1000; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
      const int now = DaemonFds();
      same = now == last ? same + 1 : 0;
      last = now;
    }
    return last;
  }

  std::unique_ptr<engine::Session> Observer() {
    engine::ConnectOptions c;
    c.socket_path = socket_;
    c.holder = "observer";
    c.token = kToken;
    auto s = engine::Session::Connect(c);
    EXPECT_TRUE(s.ok()) << s.status();
    engine::AttachOptions a;
    a.pool = "kv";
    EXPECT_TRUE((*s)->Attach(a).ok());
    return *std::move(s);
  }

  int64_t Allocated(engine::Session& observer) {
    auto c = observer.Capacity();
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->capacity().allocated_blocks() : -1;
  }

  std::unique_ptr<ChildProcess> Engine(const std::string& holder,
                                       int64_t grace_ms) {
    return std::make_unique<ChildProcess>(
        Runfile("engine/test_engine"),
        std::vector<std::string>{absl::StrCat("--socket=", socket_),
                                 absl::StrCat("--holder=", holder),
                                 absl::StrCat("--token=", kToken), "--pool=kv",
                                 absl::StrCat("--grace_ms=", grace_ms)});
  }

  std::string dir_;
  std::string socket_;
  std::unique_ptr<ChildProcess> daemon_;
};

// Receives the daemon's answer to a bad packet.
v1::Error NextError(FrameChannel& c) {
  absl::StatusOr<ReceivedFrame> got = c.Receive();
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return {};
  EXPECT_TRUE(got->frame.has_error()) << got->frame.DebugString();
  EXPECT_TRUE(got->fds.empty());
  return got->frame.error();
}

TEST_F(DaemonProcessTest, BadFramesGetTypedErrorsAndLeakNoFd) {
  // A first session lets the daemon reach its steady set of fds.
  { Observer(); }
  const int baseline = SteadyDaemonFds();
  ASSERT_GT(baseline, 0);

  absl::StatusOr<FrameChannel> c = FrameChannel::Connect(socket_);
  ASSERT_TRUE(c.ok()) << c.status();
  UniqueFd memfd(memfd_create("bad-input", MFD_CLOEXEC));

  SendRaw(c->fd(), "garbage that is no frame");
  EXPECT_EQ(NextError(*c).protocol_error(), v1::MALFORMED_FRAME);

  SendRaw(c->fd(), Header(150000) + std::string(150000, 'x'));
  EXPECT_EQ(NextError(*c).protocol_error(), v1::FRAME_TOO_LARGE);

  SendRaw(c->fd(), Header(100) + std::string(10, 'x'));
  EXPECT_EQ(NextError(*c).protocol_error(), v1::FRAME_TRUNCATED);

  SendRaw(c->fd(), "KV");
  EXPECT_EQ(NextError(*c).protocol_error(), v1::FRAME_TRUNCATED);

  SendRaw(c->fd(), Header(3) + "\xb8\x3e\x01");  // field 999: unknown
  v1::Error unknown = NextError(*c);
  EXPECT_EQ(unknown.protocol_error(), v1::UNKNOWN_MESSAGE);
  EXPECT_EQ(unknown.code(), static_cast<int>(absl::StatusCode::kUnimplemented));

  v1::Frame hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.mutable_hello()->set_holder("bad-engine");
  hello.mutable_hello()->set_token(kOtherToken);
  SendRaw(c->fd(), Packet(hello), {memfd.get(), memfd.get(), memfd.get()});
  EXPECT_EQ(NextError(*c).protocol_error(), v1::UNEXPECTED_FDS);

  v1::Frame pages;
  pages.mutable_pages_mapped()->add_page_ids(0);
  SendRaw(c->fd(), Packet(pages), std::vector<int>(253, memfd.get()));
  EXPECT_EQ(NextError(*c).protocol_error(), v1::TOO_MANY_FDS);

  // PagesMapped may carry fds, but only from the daemon.
  SendRaw(c->fd(), Packet(pages), {memfd.get(), memfd.get()});
  EXPECT_EQ(NextError(*c).protocol_error(), v1::UNEXPECTED_MESSAGE);

  // A bad token, then a token for another pool: typed refusals.
  v1::Frame bad_token = hello;
  bad_token.mutable_hello()->set_token("not-a-token-0123456789");
  ASSERT_TRUE(c->Send(bad_token).ok());
  v1::Error unauthenticated = NextError(*c);
  EXPECT_EQ(unauthenticated.reason(), kvbroker::v1::UNAUTHENTICATED);
  EXPECT_EQ(unauthenticated.code(),
            static_cast<int>(absl::StatusCode::kUnauthenticated));

  ASSERT_TRUE(c->Send(hello).ok());
  absl::StatusOr<ReceivedFrame> greeted = c->Receive();
  ASSERT_TRUE(greeted.ok());
  ASSERT_TRUE(greeted->frame.has_hello_reply()) << greeted->frame.DebugString();

  v1::Frame attach;
  attach.set_seq(2);
  attach.mutable_attach()->set_pool("kv");
  ASSERT_TRUE(c->Send(attach).ok());
  v1::Error denied = NextError(*c);
  EXPECT_EQ(denied.reason(), kvbroker::v1::PERMISSION_DENIED);
  EXPECT_EQ(denied.code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));

  // All of that left the session usable.
  attach.set_seq(3);
  attach.mutable_attach()->set_pool("other");
  ASSERT_TRUE(c->Send(attach).ok());
  absl::StatusOr<ReceivedFrame> attached = c->Receive();
  ASSERT_TRUE(attached.ok());
  ASSERT_TRUE(attached->frame.has_attach_reply())
      << attached->frame.DebugString();
  v1::Frame alloc;
  alloc.set_seq(4);
  alloc.mutable_alloc()->set_num_blocks(3);
  ASSERT_TRUE(c->Send(alloc).ok());
  // The page the Alloc mapped is announced (seq 0, one fd) before the reply.
  absl::StatusOr<ReceivedFrame> announced = c->Receive();
  ASSERT_TRUE(announced.ok());
  ASSERT_TRUE(announced->frame.has_pages_mapped())
      << announced->frame.DebugString();
  EXPECT_EQ(announced->frame.seq(), 0u);
  EXPECT_EQ(announced->frame.pages_mapped().page_ids_size(), 1);
  EXPECT_EQ(announced->fds.size(), 1u);
  absl::StatusOr<ReceivedFrame> allocated = c->Receive();
  ASSERT_TRUE(allocated.ok());
  EXPECT_EQ(allocated->frame.seq(), 4u);
  EXPECT_EQ(allocated->frame.alloc_reply().num_blocks(), 3);

  // Of the 264 fds sent, none stayed in the daemon: besides its pages'
  // memfds it holds exactly one more than before, this connection (a
  // session needs no other fd: outbox.h).
  int leaked = 0;
  EXPECT_EQ(DaemonFds("memfd:bad-input", &leaked), baseline + 1);
  EXPECT_EQ(leaked, 0);
  c = absl::UnavailableError("closed");  // closes the connection
  EXPECT_EQ(AwaitDaemonFds(baseline), baseline);
  EXPECT_EQ(daemon_->Wait(absl::ZeroDuration()), -1) << "the daemon exited";
}

TEST_F(DaemonProcessTest, KilledEngineLosesItsBlocks) {
  auto observer = Observer();
  auto engine = Engine("engine-1", 0);
  ASSERT_TRUE(absl::StartsWith(engine->ReadUntil("attached"), "attached"));
  ASSERT_TRUE(engine->WriteLine("alloc 7"));
  const std::string blocks = engine->ReadLine();
  ASSERT_TRUE(absl::StartsWith(blocks, "blocks ")) << blocks;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(blocks, ' ')).size(), 8u);
  EXPECT_EQ(Allocated(*observer), 7);
  engine->Kill(SIGKILL);
  for (int i = 0; i < 20000 && Allocated(*observer) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(Allocated(*observer), 0);
}

TEST_F(DaemonProcessTest, EngineReattachingWithinGraceKeepsItsBlocks) {
  auto observer = Observer();
  auto engine = Engine("engine-2", 600000);
  ASSERT_TRUE(absl::StartsWith(engine->ReadUntil("attached"), "attached"));
  ASSERT_TRUE(engine->WriteLine("alloc 5"));
  const std::string blocks = engine->ReadLine();
  ASSERT_TRUE(absl::StartsWith(blocks, "blocks ")) << blocks;
  engine->Kill(SIGKILL);
  EXPECT_EQ(Allocated(*observer), 5);

  // The same holder comes back in a new process (the daemon may not have
  // noticed the death yet: HOLDER_BUSY until it has).
  std::string line;
  std::unique_ptr<ChildProcess> again;
  for (int i = 0; i < 2000; ++i) {
    again = Engine("engine-2", 600000);
    line = again->ReadUntil("");
    if (!absl::StrContains(line, "HOLDER_BUSY")) break;
    again->Wait();
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(absl::StartsWith(line, "attached"));
  EXPECT_TRUE(absl::StrContains(line, "reattached=1 held=5")) << line;
  EXPECT_EQ(Allocated(*observer), 5);
  // Its blocks are its own to free.
  ASSERT_TRUE(again->WriteLine("free" + blocks.substr(6)));
  EXPECT_EQ(again->ReadLine(), "freed 5");
  EXPECT_EQ(Allocated(*observer), 0);
  ASSERT_TRUE(again->WriteLine("alloc 2"));
  ASSERT_TRUE(absl::StartsWith(again->ReadLine(), "blocks "));
  ASSERT_TRUE(again->WriteLine("end release"));
  EXPECT_EQ(again->Wait(), 0);
  for (int i = 0; i < 20000 && Allocated(*observer) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(Allocated(*observer), 0);
}

}  // namespace
}  // namespace kvbroker::attach
