// AttachServer over a real socket, with engine::Session as the client: hello
// and tokens, the pool layout, exact Alloc/Free on the session, holders'
// ownership, session end and reattach within grace, and bad frames refused
// with typed errors and no fd left open.

#include "attach/attach_server.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "allocator/broker.h"
#include "allocator/clock.h"
#include "allocator/failure.h"
#include "allocator/host_backend.h"
#include "attach/frame.h"
#include "attach/testing/fd_count.h"
#include "engine/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/access.h"
#include "server/request_bounds.h"

namespace kvbroker::attach {
namespace {

namespace kv1 = ::kvbroker::v1;
using engine::AttachOptions;
using engine::ConnectOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kToken[] = "engine-token-0123456789";
constexpr char kOtherPoolToken[] = "other-pool-token-0123456789";
constexpr char kSecondToken[] = "second-engine-token-0123456789";

// P = 2 MiB, B = 256 KiB, L = 2, K = 2 on devices {0, 1}, N = 40: 8 blocks
// per page, T = 5 pages of 8 MiB bundles.
PoolConfig Config() {
  PoolConfig c;
  c.name = "kv";
  c.page_size = MiB(2);
  c.block_bytes = KiB(256);
  c.num_layers = 2;
  c.num_kv_buffers = 2;
  c.devices = {0, 1};
  c.max_blocks = 40;
  c.tokens_per_block = 16;
  return c;
}

class AttachServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostBackendOptions ho;
    ho.device_count = 2;
    ho.device_total = MiB(512);
    backend_ = std::make_unique<HostBackend>(ho);
    BrokerOptions bo;
    bo.start_worker = false;
    bo.min_idle_pages = 0;
    bo.max_idle_pages = 0;
    bo.clock = manual_clock_.get();  // null: the real clock
    broker_ = *Broker::Create(backend_.get(), bo);
    ASSERT_TRUE(broker_->CreatePool(Config()).ok());
    PoolConfig other = Config();
    other.name = "other";
    ASSERT_TRUE(broker_->CreatePool(other).ok());
    // Socket paths must fit sun_path (108 bytes): Bazel's TMPDIR does not.
    char dir[] = "/tmp/kvb-attach-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/attach.sock";
  }
  void TearDown() override {
    if (server_) server_->Stop();
    unlink((path_ + ".stale").c_str());
    rmdir(dir_.c_str());
  }

  void StartServer(bool with_tokens = false) {
    AttachServerOptions o;
    o.socket_path = path_;
    o.reap_interval = absl::Milliseconds(5);
    o.send_timeout = send_timeout_;
    o.hello_timeout = hello_timeout_;
    o.max_sessions = max_sessions_;
    if (with_tokens) {
      kv1::AuthTokensFile file;
      auto* t = file.add_tokens();
      t->set_name("engine");
      t->set_token(kToken);
      t->add_pools("kv");
      t = file.add_tokens();
      t->set_name("other-engine");
      t->set_token(kOtherPoolToken);
      t->add_pools("other");
      t = file.add_tokens();
      t->set_name("engine-2");
      t->set_token(kSecondToken);
      t->add_pools("kv");
      o.access = std::make_shared<AccessPolicy>(*AccessPolicy::Create(file));
    }
    absl::StatusOr<std::unique_ptr<AttachServer>> s =
        AttachServer::Start(broker_.get(), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  absl::StatusOr<std::unique_ptr<engine::Session>> Connect(
      const std::string& holder, absl::Duration grace = absl::ZeroDuration(),
      const std::string& token = "") {
    ConnectOptions o;
    o.socket_path = path_;
    o.holder = holder;
    o.reattach_grace = grace;
    o.token = token;
    return engine::Session::Connect(o);
  }

  std::unique_ptr<engine::Session> Attached(const std::string& holder,
                                            absl::Duration grace = {}) {
    auto s = Connect(holder, grace);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    AttachOptions a;
    a.pool = "kv";
    auto r = (*s)->Attach(a);
    EXPECT_TRUE(r.ok()) << r.status();
    return *std::move(s);
  }

  int64_t Allocated() {
    return (*broker_->GetPool("kv"))->Capacity()->allocated_blocks.value();
  }

  // Waits (bounded by the test's own timeout) until `pred` holds: the
  // server notices a closed connection on its own thread.
  template <typename Pred>
  void Eventually(Pred pred) {
    while (!pred()) absl::SleepFor(absl::Milliseconds(1));
  }

  // Set before SetUp for a broker on a clock that moves only when told;
  // outlives the broker.
  std::unique_ptr<ManualClock> manual_clock_;
  std::unique_ptr<HostBackend> backend_;
  std::unique_ptr<Broker> broker_;
  std::unique_ptr<AttachServer> server_;
  absl::Duration send_timeout_ = absl::Seconds(10);
  absl::Duration hello_timeout_ = absl::Seconds(5);
  int max_sessions_ = 256;
  std::string dir_;
  std::string path_;
};

TEST_F(AttachServerTest, AttachReturnsTheExactLayout) {
  StartServer();
  auto s = Connect("engine-a");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->hello().protocol_version(), kProtocolVersion);
  EXPECT_EQ((*s)->hello().max_fds_per_frame(), 250);
  EXPECT_FALSE((*s)->hello().reattached());
  AttachOptions a;
  a.pool = "kv";
  auto r = (*s)->Attach(a);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::PoolLayout& l = r->layout();
  EXPECT_EQ(l.pool(), "kv");
  EXPECT_EQ(l.bundle_bytes(), 8 * kMiB);
  EXPECT_EQ(l.block_stride_bytes(), 1 * kMiB);
  EXPECT_EQ(l.layer_offset_bytes(), 512 * kKiB);
  EXPECT_EQ(l.buffer_offset_bytes(), 256 * kKiB);
  EXPECT_EQ(l.page_count(), 5);
  EXPECT_EQ(l.virtual_bytes_per_device(), 40 * kMiB);
  EXPECT_EQ(l.max_blocks(), 40);
  EXPECT_EQ(l.tokens_per_block(), 16);
  EXPECT_EQ(l.backend(), "host");
  ASSERT_EQ(l.devices_size(), 2);
  EXPECT_EQ(l.devices(0).ordinal(), 0);
  EXPECT_EQ(l.devices(0).uuid(), "host-0");
  EXPECT_EQ(l.devices(1).uuid(), "host-1");
  // Block 3, layer 1, buffer 1 of device 1.
  absl::StatusOr<uint64_t> at = (*s)->BlockAddress(1, 3, 1, 1);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(*at, (*s)->device_base(1) + 3 * kMiB + 512 * kKiB + 256 * kKiB);
  EXPECT_EQ((*s)->BlockAddress(0, 40, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->BlockAddress(2, 0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(server_->Sessions().size(), 1u);
  EXPECT_EQ(server_->Sessions()[0].holder, "engine-a");
  EXPECT_EQ(server_->Sessions()[0].pool, "kv");
  EXPECT_EQ(server_->Sessions()[0].pid, getpid());
}

TEST_F(AttachServerTest, AttachToOneDeviceAndRefusals) {
  StartServer();
  auto s = Connect("engine-a");
  ASSERT_TRUE(s.ok());
  AttachOptions a;
  a.pool = "nope";
  EXPECT_EQ(GetReason((*s)->Attach(a).status()), FailureReason::kPoolNotFound);
  a.pool = "kv";
  a.devices = {3};
  EXPECT_EQ(GetReason((*s)->Attach(a).status()),
            FailureReason::kInvalidArgument);
  a.devices = {1, 1};
  EXPECT_EQ(GetReason((*s)->Attach(a).status()),
            FailureReason::kInvalidArgument);
  a.devices = {1};
  auto r = (*s)->Attach(a);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->layout().devices_size(), 1);
  EXPECT_EQ(r->layout().devices(0).ordinal(), 1);
  EXPECT_EQ((*s)->Attach(a).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(AttachServerTest, PoolOperationsBeforeAttachAreOutOfOrder) {
  StartServer();
  auto s = Connect("engine-a");
  ASSERT_TRUE(s.ok());
  // The library refuses locally; a raw frame is refused by the daemon.
  EXPECT_EQ(ProtocolErrorOf((*s)->Alloc(1).status()), v1::UNEXPECTED_MESSAGE);
  auto raw = FrameChannel::Connect(path_);
  ASSERT_TRUE(raw.ok());
  v1::Frame f;
  f.set_seq(3);
  f.mutable_alloc()->set_num_blocks(1);
  ASSERT_TRUE(raw->Send(f).ok());
  auto got = raw->Receive();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->frame.seq(), 3u);
  EXPECT_EQ(got->frame.error().protocol_error(), v1::UNEXPECTED_MESSAGE);
}

TEST_F(AttachServerTest, ExactCapacityOnTheSession) {
  StartServer();
  auto s = Attached("engine-a");
  ASSERT_NE(s, nullptr);
  auto cap = s->Capacity();
  ASSERT_TRUE(cap.ok()) << cap.status();
  EXPECT_EQ(cap->capacity().available_blocks(), 40);
  auto all = s->Alloc(40, "first");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 40u);
  EXPECT_EQ(GetReason(s->Alloc(1).status()), FailureReason::kPoolExhausted);
  // A retry of the same request id replays.
  kv1::AllocRequest again;
  again.set_num_blocks(40);
  again.set_request_id("first");
  auto replay = s->Alloc(again);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_TRUE(replay->replayed());
  EXPECT_EQ(Allocated(), 40);
  auto freed = s->Free(*all);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 40);
  EXPECT_EQ(Allocated(), 0);
  EXPECT_EQ(GetReason(s->Alloc(41).status()), FailureReason::kRequestTooLarge);
  kv1::AllocRequest elsewhere;
  elsewhere.set_pool("other");
  elsewhere.set_num_blocks(1);
  EXPECT_EQ(GetReason(s->Alloc(elsewhere).status()),
            FailureReason::kInvalidArgument);
  EXPECT_EQ(GetReason(s->Alloc(kMaxSessionBlocks + 1).status()),
            FailureReason::kInvalidArgument);
}

TEST_F(AttachServerTest, OnlyTheHolderFreesItsBlocks) {
  StartServer();
  auto a = Attached("engine-a");
  auto b = Attached("engine-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto mine = a->Alloc(3);
  auto theirs = b->Alloc(2);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  // b cannot free a's block, even mixed with its own; nothing is freed.
  std::vector<int64_t> mixed = {(*theirs)[0], (*mine)[0]};
  absl::Status refused = b->Free(mixed).status();
  EXPECT_EQ(GetReason(refused), FailureReason::kBlockNotAllocated) << refused;
  EXPECT_EQ(GetFailure(refused)->metadata.at("holder"), "engine-b");
  EXPECT_EQ(Allocated(), 5);
  std::vector<int64_t> twice = {(*mine)[1], (*mine)[1]};
  EXPECT_EQ(GetReason(a->Free(twice).status()),
            FailureReason::kInvalidArgument);
  EXPECT_EQ(Allocated(), 5);
  // Request ids are per holder: b's "x" does not replay a's "x".
  auto ax = a->Alloc(1, "x");
  auto bx = b->Alloc(1, "x");
  ASSERT_TRUE(ax.ok() && bx.ok());
  EXPECT_NE((*ax)[0], (*bx)[0]);
  EXPECT_EQ(Allocated(), 7);
  // A retried Free replays rather than failing on blocks already gone.
  ASSERT_TRUE(a->Free(*mine, "free-1").ok());
  auto retry = a->Free(*mine, "free-1");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->replayed());
  EXPECT_EQ(Allocated(), 4);
}

// No two (holder, request id) pairs share a key in the pool, however the
// holder and the id split a string, and no gRPC request id can be a
// session's: holder "a" with id "b/c" and holder "a/b" with id "c" each get
// their own blocks, and a gRPC caller's ids never replay a session's.
TEST_F(AttachServerTest, HolderRequestIdsNeverShareAKey) {
  StartServer();
  auto a = Attached("a");
  auto ab = Attached("a/b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(ab, nullptr);
  auto mine = a->Alloc(2, "b/c");
  ASSERT_TRUE(mine.ok()) << mine.status();
  auto other = ab->Alloc(2, "c");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*mine)[0], (*other)[0]);
  EXPECT_EQ(Allocated(), 4);
  // What the keys used to be, sent as a gRPC caller would: new blocks.
  std::shared_ptr<PagePool> pool = *broker_->GetPool("kv");
  AllocRequest grpc;
  grpc.num_blocks = 1;
  grpc.request_id = "attach/a/b/c";
  auto fresh = pool->Alloc(grpc);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->replayed);
  EXPECT_EQ(Allocated(), 5);
  // The byte session keys begin with is refused in every gRPC request id.
  const std::string marked = std::string(1, kSessionRequestIdMark) + "1:ab/c";
  kv1::AllocRequest alloc;
  alloc.set_request_id(marked);
  EXPECT_EQ(GetReason(CheckBounds(alloc)), FailureReason::kInvalidArgument);
  kv1::FreeRequest free;
  free.set_request_id("x" + marked);
  EXPECT_EQ(GetReason(CheckBounds(free)), FailureReason::kInvalidArgument);
  kv1::ReserveRequest reserve;
  reserve.set_request_id(marked);
  EXPECT_EQ(GetReason(CheckBounds(reserve)), FailureReason::kInvalidArgument);
  alloc.set_request_id("attach/a/b/c");
  EXPECT_TRUE(CheckBounds(alloc).ok());
}

// The broker on a clock that moves only when told to.
class AttachServerManualClockTest : public AttachServerTest {
 protected:
  AttachServerManualClockTest() {
    manual_clock_ = std::make_unique<ManualClock>(absl::Now());
  }
};

// A retried Free is answered from the holder's memory of it and never
// reaches the pool: once the pool's window forgot the id, the freed blocks
// (handed to someone else meanwhile) or another holder's are not freed.
TEST_F(AttachServerManualClockTest, RetriedFreeNeverFreesAnotherHoldersBlock) {
  StartServer();
  auto a = Attached("engine-a");
  auto b = Attached("engine-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto mine = a->Alloc(1);
  auto theirs = b->Alloc(1);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  ASSERT_TRUE(a->Free(*mine, "f1").ok());
  EXPECT_EQ(Allocated(), 1);
  // Within the window: the same ids replay, other ids are refused.
  auto retry = a->Free(*mine, "f1");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->replayed());
  EXPECT_EQ(retry->freed_blocks(), 1);
  EXPECT_EQ(GetReason(a->Free(*theirs, "f1").status()),
            FailureReason::kRequestIdReused);
  EXPECT_EQ(Allocated(), 1);
  // Past the window (pool and holder forgot "f1"): a's freed block is now
  // b's, and neither it nor b's first block is freed by a's retries.
  manual_clock_->Advance(absl::Minutes(11));
  auto again = b->Alloc(1);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(*again, *mine);
  EXPECT_EQ(Allocated(), 2);
  EXPECT_EQ(GetReason(a->Free(*theirs, "f1").status()),
            FailureReason::kBlockNotAllocated);
  EXPECT_EQ(GetReason(a->Free(*mine, "f1").status()),
            FailureReason::kBlockNotAllocated);
  EXPECT_EQ(Allocated(), 2);
  // b still owns both and frees both.
  auto c = Attached("engine-c");
  ASSERT_NE(c, nullptr);
  auto cs = c->Alloc(1);
  ASSERT_TRUE(cs.ok());
  EXPECT_NE((*cs)[0], (*theirs)[0]);
  EXPECT_NE((*cs)[0], (*mine)[0]);
  ASSERT_TRUE(b->Free(*theirs).ok());
  ASSERT_TRUE(b->Free(*again).ok());
  EXPECT_EQ(Allocated(), 1);
}

// Session requests meet the bounds of their gRPC twins: a reservation ttl
// past 24 hours, a pool name past 128 bytes and a request id with byte 0x01
// are refused with INVALID_ARGUMENT, and nothing is reserved or allocated.
TEST_F(AttachServerTest, SessionRequestsMeetTheGrpcBounds) {
  StartServer();
  auto a = Attached("engine-a");
  ASSERT_NE(a, nullptr);
  std::shared_ptr<PagePool> pool = *broker_->GetPool("kv");
  kv1::ReserveRequest r;
  r.set_num_blocks(4);
  r.mutable_ttl()->set_seconds(int64_t{1} << 40);
  auto refused = a->Reserve(r);
  EXPECT_EQ(GetReason(refused.status()), FailureReason::kInvalidArgument)
      << refused.status();
  EXPECT_EQ(GetFailure(refused.status())->metadata.at("field"), "ttl");
  r.mutable_ttl()->set_seconds(24 * 3600);
  r.mutable_ttl()->set_nanos(1);
  EXPECT_EQ(GetReason(a->Reserve(r).status()), FailureReason::kInvalidArgument);
  EXPECT_EQ(pool->Capacity()->reserved_blocks.value(), 0);
  r.mutable_ttl()->set_nanos(0);
  auto day = a->Reserve(r);
  ASSERT_TRUE(day.ok()) << day.status();
  EXPECT_EQ(pool->Capacity()->reserved_blocks.value(), 4);
  kv1::AllocRequest alloc;
  alloc.set_num_blocks(1);
  alloc.set_request_id(std::string(1, kSessionRequestIdMark));
  EXPECT_EQ(GetReason(a->Alloc(alloc).status()),
            FailureReason::kInvalidArgument);
  kv1::CapacityRequest capacity;
  capacity.set_pool(std::string(129, 'p'));
  EXPECT_EQ(GetReason(a->Capacity(capacity).status()),
            FailureReason::kInvalidArgument);
  EXPECT_EQ(Allocated(), 0);
  auto b = Connect("engine-b");
  ASSERT_TRUE(b.ok());
  AttachOptions o;
  o.pool = std::string(129, 'p');
  EXPECT_EQ(GetReason((*b)->Attach(o).status()),
            FailureReason::kInvalidArgument);
}

// A holder in grace is reattached only with the token that made it: a
// token of another pool, or another token of the same pool, is refused at
// Hello and cannot free or take its blocks.
TEST_F(AttachServerTest, OnlyTheHoldersTokenReattachesIt) {
  StartServer(/*with_tokens=*/true);
  auto a = Connect("victim", absl::Minutes(1), kToken);
  ASSERT_TRUE(a.ok()) << a.status();
  AttachOptions ao;
  ao.pool = "kv";
  ASSERT_TRUE((*a)->Attach(ao).ok());
  ASSERT_TRUE((*a)->Alloc(3).ok());
  ASSERT_TRUE((*a)->Close(/*release=*/false).ok());
  EXPECT_EQ(Allocated(), 3);
  for (const char* token : {kOtherPoolToken, kSecondToken}) {
    auto m = Connect("victim", absl::ZeroDuration(), token);
    EXPECT_EQ(GetReason(m.status()), FailureReason::kPermissionDenied) << token;
    EXPECT_EQ(Allocated(), 3);
  }
  ASSERT_EQ(server_->Holders().size(), 1u);
  EXPECT_EQ(server_->Holders()[0].blocks, 3);
  EXPECT_FALSE(server_->Holders()[0].live);
  auto again = Connect("victim", absl::ZeroDuration(), kToken);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->hello().reattached());
  ASSERT_TRUE((*again)->Close(/*release=*/true).ok());
  EXPECT_EQ(Allocated(), 0);
}

// An engine that keeps sending and never reads is dropped at its first
// reply that cannot be sent within the send timeout: the session ends (its
// socket shut both ways), its queued requests are not answered, and Stop
// has nothing left to wait for.
TEST_F(AttachServerTest, AnEngineThatDoesNotReadIsDropped) {
  send_timeout_ = absl::Milliseconds(50);
  StartServer();
  auto ch = FrameChannel::Connect(path_);
  ASSERT_TRUE(ch.ok());
  v1::Frame hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.mutable_hello()->set_holder("stuck");
  ASSERT_TRUE(ch->Send(hello).ok());
  // Repeated Hellos, each answered with an Error, until the daemon hangs
  // up (the deadline only bounds a daemon that never does).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  int sent = 0;
  absl::Status s;
  while (absl::Now() < deadline) {
    hello.set_seq(2 + sent);
    s = ch->TrySend(hello);
    if (s.ok()) {
      ++sent;
    } else if (absl::IsResourceExhausted(s)) {
      absl::SleepFor(absl::Milliseconds(1));
    } else {
      break;
    }
  }
  ASSERT_FALSE(s.ok() || absl::IsResourceExhausted(s))
      << "still connected after " << sent << " requests";
  Eventually([&] { return server_->Sessions().empty(); });
  EXPECT_TRUE(server_->Holders().empty());
  // What the daemon sent before it gave up, then the end of the stream.
  int replies = 0;
  while (ch->Receive().ok()) ++replies;
  EXPECT_GT(replies, 0);
  EXPECT_LT(replies, sent + 1);
  server_->Stop();
  EXPECT_TRUE(server_->Sessions().empty());
}

// A connection that says nothing is ended at the Hello deadline, with a
// SessionEnd saying why.
TEST_F(AttachServerTest, AConnectionWithoutHelloIsEndedAtItsDeadline) {
  hello_timeout_ = absl::Milliseconds(50);
  StartServer();
  auto ch = FrameChannel::Connect(path_);
  ASSERT_TRUE(ch.ok());
  // An upper bound for a daemon that never ends the session.
  const timeval bound = {20, 0};
  setsockopt(ch->fd(), SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  auto end = ch->Receive();
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_TRUE(end->frame.has_session_end()) << end->frame.DebugString();
  EXPECT_THAT(end->frame.session_end().message(), HasSubstr("no Hello"));
  EXPECT_FALSE(ch->Receive().ok());
  Eventually([&] { return server_->Sessions().empty(); });
}

// Connections that never say Hello cannot keep engines out: with every
// place taken by them, each engine takes the place of the oldest, and only
// sessions that said Hello keep theirs.
TEST_F(AttachServerTest, SilentConnectionsGiveTheirPlacesToEngines) {
  max_sessions_ = 2;
  hello_timeout_ = absl::Hours(1);
  StartServer();
  auto first = FrameChannel::Connect(path_);
  ASSERT_TRUE(first.ok());
  Eventually([&] { return server_->Sessions().size() == 1; });
  auto second = FrameChannel::Connect(path_);
  ASSERT_TRUE(second.ok());
  Eventually([&] { return server_->Sessions().size() == 2; });
  auto a = Connect("engine-a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(first->Receive().ok());  // closed for engine-a
  auto b = Connect("engine-b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(second->Receive().ok());
  Eventually([&] { return server_->Sessions().size() == 2; });
  EXPECT_FALSE(Connect("engine-c").ok());
  ASSERT_EQ(server_->Sessions().size(), 2u);
  EXPECT_EQ(server_->Sessions()[0].holder, "engine-a");
  EXPECT_EQ(server_->Sessions()[1].holder, "engine-b");
}

// A holder's end frees every block it still has, though some were freed
// behind its back over gRPC (which checks no holder): the pool refuses a
// Free naming any of those, and the rest are freed without them. A block
// freed that way and handed to another holder since stays that holder's.
TEST_F(AttachServerTest, EndFreesWhatIsLeftAfterBlocksWereFreedElsewhere) {
  StartServer();
  auto b = Attached("engine-b");
  ASSERT_NE(b, nullptr);
  auto theirs = b->Alloc(6);
  ASSERT_TRUE(theirs.ok());
  ASSERT_EQ(theirs->size(), 6u);
  std::shared_ptr<PagePool> pool = *broker_->GetPool("kv");
  // Two freed as a gRPC caller would; one of them allocated to c.
  const std::vector<int64_t> elsewhere = {(*theirs)[1], (*theirs)[4]};
  FreeRequest grpc;
  grpc.block_ids = elsewhere;
  ASSERT_TRUE(pool->Free(grpc).ok());
  EXPECT_EQ(Allocated(), 4);
  auto c = Attached("engine-c");
  ASSERT_NE(c, nullptr);
  auto cs = c->Alloc(1);
  ASSERT_TRUE(cs.ok());
  ASSERT_EQ(*cs, std::vector<int64_t>{(*theirs)[1]});
  EXPECT_EQ(Allocated(), 5);
  ASSERT_TRUE(b->Close(/*release=*/true).ok());
  EXPECT_EQ(Allocated(), 1);
  ASSERT_TRUE(c->Free(*cs).ok());
  EXPECT_EQ(Allocated(), 0);
}

// Out of fds, the accept loop waits between attempts instead of spinning:
// in a child process with no fd to spare, a connection waiting in the
// backlog for half a second costs a few failed accepts, not one per pass.
TEST_F(AttachServerTest, AcceptBacksOffWhenOutOfFds) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        StartServer();
        UniqueFd client(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
        sockaddr_un addr = {};
        addr.sun_family = AF_UNIX;
        memcpy(addr.sun_path, path_.data(), path_.size());
        // The lowest free fd: a limit of it leaves no fd to open.
        const int spare = dup(0);
        close(spare);
        rlimit before;
        getrlimit(RLIMIT_NOFILE, &before);
        rlimit none = before;
        none.rlim_cur = static_cast<rlim_t>(spare);
        setrlimit(RLIMIT_NOFILE, &none);
        if (connect(client.get(), reinterpret_cast<sockaddr*>(&addr),
                    sizeof(addr)) != 0) {
          _exit(2);
        }
        // The first failure (bounded by the test's own timeout), then half
        // a second of failures after it.
        while (server_->accept_failures() == 0) {
          absl::SleepFor(absl::Milliseconds(1));
        }
        const int64_t first = server_->accept_failures();
        const absl::Time start = absl::Now();
        absl::SleepFor(absl::Milliseconds(500));
        const int64_t failures = server_->accept_failures() - first;
        // One attempt per 100 ms back-off, with room to spare: however long
        // the sleep took, a loop that backs off stays within it, and one
        // that spins (hundreds of thousands) does not.
        const int64_t allowed =
            2 + (absl::Now() - start) / absl::Milliseconds(50);
        setrlimit(RLIMIT_NOFILE, &before);
        fprintf(stderr, "accept failures: %lld of %lld allowed\n",
                static_cast<long long>(failures),
                static_cast<long long>(allowed));
        _exit(failures <= allowed ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "accept failures");
}

// The holder's set checks runs of consecutive ids a word at a time: a run
// with one id the holder lacks, a repeat across runs, and ids at the top of
// int64 are refused whole, and the set is left exactly as it was.
TEST_F(AttachServerTest, RunsOfIdsAreRefusedWhole) {
  StartServer();
  auto a = Attached("engine-a");
  ASSERT_NE(a, nullptr);
  auto mine = a->Alloc(3);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const int64_t x = (*mine)[0];
  ASSERT_EQ(*mine, (std::vector<int64_t>{x, x + 1, x + 2}));
  const std::vector<int64_t> one_more = {x, x + 1, x + 2, x + 3};
  EXPECT_EQ(GetReason(a->Free(one_more).status()),
            FailureReason::kBlockNotAllocated);
  const std::vector<int64_t> across = {x, x + 1, x + 2, x + 1};
  EXPECT_EQ(GetReason(a->Free(across).status()),
            FailureReason::kInvalidArgument);
  constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> top = {x, kTop - 1, kTop};
  EXPECT_EQ(GetReason(a->Free(top).status()),
            FailureReason::kBlockNotAllocated);
  const std::vector<int64_t> negative = {-2, -1};
  EXPECT_EQ(GetReason(a->Free(negative).status()),
            FailureReason::kBlockNotAllocated);
  EXPECT_EQ(Allocated(), 3);
  auto freed = a->Free(*mine);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 3);
  EXPECT_EQ(Allocated(), 0);
}

// Version 2's block runs: an Alloc that asks for them gets each page's
// blocks as (first, count) pairs, a Free may name runs beside ids, and bad
// runs are refused whole with nothing freed.
TEST_F(AttachServerTest, BlockRunsOnTheSession) {
  StartServer();
  auto s = Attached("engine-a");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->hello().protocol_version(), 2u);
  kv1::AllocRequest alloc;
  alloc.set_num_blocks(12);
  alloc.set_block_runs(true);
  auto got = s->Alloc(alloc);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->num_blocks(), 12);
  // 8 blocks per page: the first page whole and 4 of the next, one run.
  EXPECT_EQ(got->pages_size(), 0);
  EXPECT_THAT(got->block_runs(), ElementsAre(0, 12));
  EXPECT_EQ(Allocated(), 12);

  auto refused = [&](std::vector<int64_t> block_ids,
                     std::vector<int64_t> runs) {
    kv1::FreeRequest free;
    free.mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
    free.mutable_block_runs()->Add(runs.begin(), runs.end());
    return GetReason(s->Free(free).status());
  };
  constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(refused({}, {0, 2, 4}), FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({}, {0, 0}), FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({}, {0, -1}), FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({}, {kTop, 2}), FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({}, {0, kMaxSessionBlocks + 1}),
            FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({0}, {0, kMaxSessionBlocks}),
            FailureReason::kInvalidArgument);
  // Ids the pool judges as it judges block_ids: a repeat across the two
  // lists, one past the allocation, ids that are no blocks at all.
  EXPECT_EQ(refused({3}, {0, 4}), FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({}, {0, 13}), FailureReason::kBlockNotAllocated);
  EXPECT_EQ(refused({}, {-3, 3}), FailureReason::kBlockNotAllocated);
  EXPECT_EQ(refused({}, {kTop - 1, 2}), FailureReason::kBlockNotAllocated);
  // Runs alone, the first taken whole before the next fails: a repeat
  // across them, a run past the allocation. The holder keeps all twelve
  // (the Frees below need every one of them).
  EXPECT_EQ(refused({}, {0, 4, 2, 2}), FailureReason::kInvalidArgument);
  EXPECT_EQ(refused({}, {0, 4, 4, 9}), FailureReason::kBlockNotAllocated);
  EXPECT_EQ(Allocated(), 12);

  kv1::FreeRequest free;
  free.add_block_ids(11);
  for (int64_t v : {4, 3, 8, 3}) free.add_block_runs(v);
  auto freed = s->Free(free);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 7);
  EXPECT_EQ(Allocated(), 5);
  // The fast path sends the rest, 0 .. 3 and 7, as two runs.
  const std::vector<int64_t> rest = {0, 1, 2, 3, 7};
  auto last = s->Free(rest);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->freed_blocks(), 5);
  EXPECT_EQ(Allocated(), 0);
}

// The daemon keeps its Alloc and Free reply frames from request to
// request: nothing of one reply (pages, runs, a replay, an error) shows in
// the next.
TEST_F(AttachServerTest, KeptRepliesCarryNothingOver) {
  StartServer();
  auto s = Attached("engine-a");
  ASSERT_NE(s, nullptr);
  kv1::AllocRequest by_pages;
  by_pages.set_num_blocks(10);
  by_pages.set_request_id("ten");
  auto ten = s->Alloc(by_pages);
  ASSERT_TRUE(ten.ok()) << ten.status();
  EXPECT_EQ(ten->pages_size(), 2);  // 8 blocks per page
  EXPECT_THAT(ten->block_runs(), IsEmpty());
  auto again = s->Alloc(by_pages);  // a replay
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed());
  kv1::AllocRequest by_runs;
  by_runs.set_num_blocks(3);
  by_runs.set_block_runs(true);
  auto three = s->Alloc(by_runs);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->pages_size(), 0);
  EXPECT_THAT(three->block_runs(), ElementsAre(10, 3));
  EXPECT_FALSE(three->replayed());
  EXPECT_EQ(three->num_blocks(), 3);
  kv1::AllocRequest one;
  one.set_num_blocks(1);
  auto single = s->Alloc(one);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_EQ(single->pages_size(), 1);
  EXPECT_THAT(single->pages(0).block_ids(), ElementsAre(13));
  EXPECT_THAT(single->block_runs(), IsEmpty());
  // A refused Free, then Frees that succeed.
  const std::vector<int64_t> foreign = {40};
  EXPECT_EQ(GetReason(s->Free(foreign).status()),
            FailureReason::kBlockNotAllocated);
  const std::vector<int64_t> first_ten = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto freed = s->Free(first_ten);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 10);
  EXPECT_FALSE(freed->replayed());
  const std::vector<int64_t> rest = {10, 11, 12, 13};
  auto last = s->Free(rest);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->freed_blocks(), 4);
  EXPECT_EQ(Allocated(), 0);
}

// The daemon answers the lower of the engine's version and its own, and
// refuses a version below its lowest; the fast path works on version 1.
TEST_F(AttachServerTest, ProtocolVersions) {
  StartServer();
  ConnectOptions o;
  o.socket_path = path_;
  o.holder = "old-engine";
  o.protocol_version = 1;
  auto old = engine::Session::Connect(o);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ((*old)->hello().protocol_version(), 1u);
  AttachOptions a;
  a.pool = "kv";
  ASSERT_TRUE((*old)->Attach(a).ok());
  auto ids = (*old)->Alloc(10);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), 10u);
  EXPECT_EQ(Allocated(), 10);
  auto freed = (*old)->Free(*ids);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 10);
  EXPECT_EQ(Allocated(), 0);

  o.holder = "no-version";
  o.protocol_version = 0;
  absl::Status refused = engine::Session::Connect(o).status();
  EXPECT_EQ(ProtocolErrorOf(refused), v1::UNSUPPORTED_VERSION) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("speaks 1 to 2"));
}

TEST_F(AttachServerTest, SessionEndFreesTheHoldersBlocks) {
  StartServer();
  auto a = Attached("engine-a");
  ASSERT_TRUE(a->Alloc(9).ok());
  EXPECT_EQ(Allocated(), 9);
  a.reset();  // the connection drops; no grace was chosen
  Eventually([&] { return Allocated() == 0; });
  Eventually([&] { return server_->Holders().empty(); });
  EXPECT_TRUE(server_->Sessions().empty());
}

TEST_F(AttachServerTest, DeletingThePoolRevokesItsPagesAndEndsTheSession) {
  StartServer();
  const int baseline = *testing::CountOpenFds();
  std::shared_ptr<PagePool> pool = *broker_->GetPool("kv");
  auto a = Attached("engine-a", absl::Minutes(1));
  ASSERT_EQ(a->Alloc(12).value().size(), 12u);  // pages 0 and 1
  EXPECT_EQ(a->mapped_pages(), 2);

  // Without force the pool holds blocks: refused, nothing changes.
  EXPECT_EQ(GetReason(broker_->DeletePool("kv", /*force=*/false)),
            FailureReason::kPoolNotEmpty);
  EXPECT_TRUE(a->Capacity().ok());
  EXPECT_EQ(a->mapped_pages(), 2);

  // Forced: the engine is asked to unmap both pages (they stay held until
  // it has), then told why the session ends.
  ASSERT_TRUE(broker_->DeletePool("kv", /*force=*/true).ok());
  EXPECT_EQ(pool->backend_handles(), 4);
  absl::Status s = a->ProcessEvents();
  while (s.ok()) {
    absl::SleepFor(absl::Milliseconds(1));
    s = a->ProcessEvents();
  }
  EXPECT_EQ(GetReason(s), FailureReason::kPoolNotFound) << s;
  EXPECT_EQ(a->end_reason(), v1::POOL_DELETED);
  EXPECT_EQ(a->mapped_pages(), 0);
  // The acknowledgement lets the daemon release the pages; the session
  // ends and its holder is gone (its blocks went with the pool, whatever
  // its grace).
  Eventually([&] { return server_->Sessions().empty(); });
  Eventually([&] { return pool->backend_handles() == 0; });
  EXPECT_TRUE(server_->Holders().empty());
  EXPECT_EQ(GetReason(a->Capacity().status()), FailureReason::kUnspecified);
  EXPECT_TRUE(a->Close().ok());
  a.reset();
  pool.reset();
  Eventually([&] { return *testing::CountOpenFds() == baseline; });
}

TEST_F(AttachServerTest, ReattachWithinGraceKeepsTheBlocks) {
  StartServer();
  auto a = Attached("engine-a", absl::Hours(1));
  auto blocks = a->Alloc(5);
  ASSERT_TRUE(blocks.ok());
  // A second live session of the same holder is refused.
  EXPECT_EQ(ProtocolErrorOf(Connect("engine-a").status()), v1::HOLDER_BUSY);
  a.reset();
  Eventually([&] {
    auto h = server_->Holders();
    return h.size() == 1 && !h[0].live;
  });
  EXPECT_EQ(server_->Holders()[0].blocks, 5);
  EXPECT_EQ(Allocated(), 5);

  auto again = Connect("engine-a", absl::Hours(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->hello().reattached());
  AttachOptions o;
  o.pool = "kv";
  auto r = (*again)->Attach(o);
  ASSERT_TRUE(r.ok());
  std::vector<int64_t> held;
  for (const auto& p : r->held()) {
    held.insert(held.end(), p.block_ids().begin(), p.block_ids().end());
  }
  std::vector<int64_t> want = *blocks;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(held, want);
  // The reattached session owns them: it can free them.
  ASSERT_TRUE((*again)->Free(held).ok());
  EXPECT_EQ(Allocated(), 0);
  // Ending with release frees at once whatever the grace.
  ASSERT_TRUE((*again)->Alloc(2).ok());
  ASSERT_TRUE((*again)->Close(/*release=*/true).ok());
  Eventually([&] { return Allocated() == 0 && server_->Holders().empty(); });
}

// Close waits for the daemon's SessionEnd reply, which comes after the
// holder's blocks were parked or freed: the very next Hello under the same
// name is admitted, many times over, and no Eventually is needed.
TEST_F(AttachServerTest, CloseThenReattachAtOnceIsNeverHolderBusy) {
  StartServer();
  auto a = Attached("engine-a", absl::Hours(1));
  ASSERT_TRUE(a->Alloc(5).ok());
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(a->Close(/*release=*/false).ok()) << "round " << round;
    auto holders = server_->Holders();
    ASSERT_EQ(holders.size(), 1u);
    EXPECT_FALSE(holders[0].live);
    EXPECT_EQ(holders[0].blocks, 5);
    auto again = Connect("engine-a", absl::Hours(1));
    ASSERT_TRUE(again.ok()) << "round " << round << ": " << again.status();
    EXPECT_TRUE((*again)->hello().reattached());
    AttachOptions o;
    o.pool = "kv";
    ASSERT_TRUE((*again)->Attach(o).ok());
    a = *std::move(again);
  }
  EXPECT_EQ(Allocated(), 5);
  // With release, the blocks are free by the time Close returns.
  ASSERT_TRUE(a->Close(/*release=*/true).ok());
  EXPECT_EQ(Allocated(), 0);
  EXPECT_TRUE(server_->Holders().empty());
}

TEST_F(AttachServerTest, GraceRunsOut) {
  StartServer();
  auto a = Attached("engine-a", absl::Milliseconds(20));
  ASSERT_TRUE(a->Alloc(4).ok());
  a.reset();
  Eventually([&] { return Allocated() == 0 && server_->Holders().empty(); });
}

TEST_F(AttachServerTest, RedeemsAReservationAtAttach) {
  StartServer();
  auto reserved = (*broker_->GetPool("kv"))->Reserve({6, absl::Minutes(1), ""});
  ASSERT_TRUE(reserved.ok());
  auto s = Connect("engine-a");
  ASSERT_TRUE(s.ok());
  AttachOptions a;
  a.pool = "kv";
  a.reservation_id = reserved->reservation_id;
  a.reservation_blocks = 6;
  auto r = (*s)->Attach(a);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->redeemed().num_blocks(), 6);
  auto cap = (*broker_->GetPool("kv"))->Capacity();
  EXPECT_EQ(cap->reserved_blocks.value(), 0);
  EXPECT_EQ(cap->allocated_blocks.value(), 6);
  EXPECT_EQ(server_->Holders()[0].blocks, 6);
}

// A connection whose Hello was refused holds nothing: the SessionEnd it
// sends next is confirmed at once (not refused as "the first message must
// be Hello", which left the engine waiting out its close timeout).
TEST_F(AttachServerTest, ASessionEndBeforeASuccessfulHelloIsConfirmed) {
  StartServer(/*with_tokens=*/true);
  auto ch = FrameChannel::Connect(path_);
  ASSERT_TRUE(ch.ok());
  v1::Frame hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.mutable_hello()->set_holder("engine-a");
  hello.mutable_hello()->set_token("wrong-token-0123456789");
  ASSERT_TRUE(ch->Send(hello).ok());
  absl::StatusOr<ReceivedFrame> refused = ch->Receive();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->frame.seq(), 1u);
  EXPECT_TRUE(refused->frame.has_error());
  v1::Frame end;
  end.set_seq(2);
  end.mutable_session_end()->set_release(true);
  ASSERT_TRUE(ch->Send(end).ok());
  absl::StatusOr<ReceivedFrame> confirmed = ch->Receive();
  ASSERT_TRUE(confirmed.ok()) << confirmed.status();
  EXPECT_EQ(confirmed->frame.seq(), 2u);
  EXPECT_TRUE(confirmed->frame.has_session_end())
      << confirmed->frame.DebugString();
  Eventually([&] { return server_->Sessions().empty(); });
  EXPECT_TRUE(server_->Holders().empty());
}

TEST_F(AttachServerTest, TokensAreCheckedAndScopedToPools) {
  StartServer(/*with_tokens=*/true);
  EXPECT_EQ(
      GetReason(Connect("engine-a", {}, "wrong-token-0123456789").status()),
      FailureReason::kUnauthenticated);
  EXPECT_EQ(GetReason(Connect("engine-a").status()),
            FailureReason::kUnauthenticated);
  // A valid token for another pool: hello passes, attach is refused.
  auto s = Connect("engine-a", {}, kOtherPoolToken);
  ASSERT_TRUE(s.ok()) << s.status();
  AttachOptions a;
  a.pool = "kv";
  absl::Status refused = (*s)->Attach(a).status();
  EXPECT_EQ(GetReason(refused), FailureReason::kPermissionDenied) << refused;
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  auto good = Connect("engine-b", {}, kToken);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Attach(a).ok());
}

TEST_F(AttachServerTest, RefusesToTakeOverALiveSocketButReplacesAStaleOne) {
  StartServer();
  AttachServerOptions o;
  o.socket_path = path_;
  absl::StatusOr<std::unique_ptr<AttachServer>> second =
      AttachServer::Start(broker_.get(), o);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(absl::StrCat("pid ", getpid())),
            std::string::npos)
      << second.status();
  // The live server is unharmed.
  EXPECT_TRUE(Connect("engine-a").ok());

  // A socket file nobody listens on is replaced.
  const std::string stale = path_ + ".stale";
  {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  o.socket_path = stale;
  absl::StatusOr<std::unique_ptr<AttachServer>> fresh =
      AttachServer::Start(broker_.get(), o);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  (*fresh)->Stop();
}

TEST_F(AttachServerTest, StopLeavesASocketAnotherServerBoundAtThePath) {
  StartServer();
  // The path now names another server's socket (this one was thought gone).
  ASSERT_EQ(unlink(path_.c_str()), 0);
  const int other = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(other, 4), 0);
  server_->Stop();
  struct stat st;
  EXPECT_EQ(lstat(path_.c_str(), &st), 0) << "Stop removed another's socket";
  const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  close(probe);
  close(other);
  unlink(path_.c_str());
}

}  // namespace
}  // namespace kvbroker::attach
