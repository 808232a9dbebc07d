// Outbox: queued frames go out in order with their fds; a Drain with
// nothing queued touches nothing; while the session thread waits, whoever
// queues a frame sends it at once, and a frame that would block stays
// queued until the session thread sends it; a page the engine cannot learn
// of breaks the outbox.

#include "attach/outbox.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "attach/testing/fd_count.h"
#include "gtest/gtest.h"

namespace kvbroker::attach {
namespace {

bool Readable(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

v1::Frame Capacity(uint64_t seq) {
  v1::Frame f;
  f.set_seq(seq);
  f.mutable_capacity();
  return f;
}

TEST(OutboxTest, QueuedFramesGoOutInOrderWithTheirFds) {
  auto pair = FrameChannel::Pair();
  ASSERT_TRUE(pair.ok());
  auto& [daemon, engine] = *pair;
  Outbox outbox(&daemon);
  EXPECT_FALSE(outbox.pending());
  // Nothing queued: Drain sends nothing.
  ASSERT_TRUE(outbox.Drain().ok());
  EXPECT_FALSE(Readable(engine.fd()));

  // Not waiting: queuing sends nothing; the reply follows what was queued.
  outbox.Queue(Capacity(0));
  outbox.Queue(Capacity(0));
  EXPECT_TRUE(outbox.pending());
  EXPECT_FALSE(Readable(engine.fd()));
  ASSERT_TRUE(outbox.SendAfterQueued(Capacity(7)).ok());
  EXPECT_FALSE(outbox.pending());
  for (uint64_t seq : {0, 0, 7}) {
    absl::StatusOr<ReceivedFrame> got = engine.Receive();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->frame.has_capacity());
    EXPECT_EQ(got->frame.seq(), seq);
  }
  EXPECT_FALSE(Readable(engine.fd()));

  // A page announced after a Drain; its fd goes along.
  const int before = testing::CountOpenFds().value_or(-1);
  {
    UniqueFd page(memfd_create("outbox_test", MFD_CLOEXEC));
    outbox.SetDevices({0});
    MappedPage m;
    m.page = 5;
    m.fds = {page.get()};
    outbox.OnPagesMapped(absl::MakeConstSpan(&m, 1));
  }
  EXPECT_TRUE(outbox.pending());
  ASSERT_TRUE(outbox.Drain().ok());
  EXPECT_FALSE(outbox.pending());
  EXPECT_EQ(outbox.pages_sent(), 1);
  {
    absl::StatusOr<ReceivedFrame> got = engine.Receive();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->frame.pages_mapped().page_ids_size(), 1);
    EXPECT_EQ(got->frame.pages_mapped().page_ids(0), 5);
    EXPECT_EQ(got->fds.size(), 1u);
  }
  // The outbox's duplicate closed once sent, the engine's on receipt.
  EXPECT_EQ(testing::CountOpenFds().value_or(-1), before);
}

TEST(OutboxTest, APageNotPassedBreaksTheOutbox) {
  auto pair = FrameChannel::Pair();
  ASSERT_TRUE(pair.ok());
  auto& [daemon, engine] = *pair;
  Outbox outbox(&daemon);
  outbox.SetDevices({0});
  EXPECT_FALSE(outbox.broken());
  outbox.OnPagesNotPassed({PageId{3}});
  // The session thread sees it before its next reply and ends the session.
  EXPECT_TRUE(outbox.pending());
  EXPECT_TRUE(outbox.broken());
  EXPECT_FALSE(Readable(engine.fd()));
}

TEST(OutboxTest, WhileTheSessionWaitsTheQueuingThreadSends) {
  auto pair = FrameChannel::Pair();
  ASSERT_TRUE(pair.ok());
  auto& [daemon, engine] = *pair;
  Outbox outbox(&daemon);
  // Queued before the wait: BeginWait sends it.
  outbox.Queue(Capacity(1));
  outbox.BeginWait();
  EXPECT_FALSE(outbox.pending());
  EXPECT_TRUE(Readable(engine.fd()));
  // Queued during the wait: sent by Queue itself.
  outbox.Queue(Capacity(2));
  EXPECT_FALSE(outbox.pending());
  outbox.EndWait();
  // After the wait: queued, not sent.
  outbox.Queue(Capacity(3));
  EXPECT_TRUE(outbox.pending());
  for (uint64_t seq : {1, 2}) {
    absl::StatusOr<ReceivedFrame> got = engine.Receive();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->frame.seq(), seq);
  }
  EXPECT_FALSE(Readable(engine.fd()));
  ASSERT_TRUE(outbox.Drain().ok());
  absl::StatusOr<ReceivedFrame> got = engine.Receive();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->frame.seq(), 3u);
}

TEST(OutboxTest, AFrameThatWouldBlockStaysQueuedInOrder) {
  auto pair = FrameChannel::Pair();
  ASSERT_TRUE(pair.ok());
  // Named, not bound: the reader thread's lambda captures the engine.
  FrameChannel& daemon = pair->first;
  FrameChannel& engine = pair->second;
  // A small send buffer fills after a few frames.
  const int small = 4096;
  ASSERT_EQ(
      setsockopt(daemon.fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  Outbox outbox(&daemon);
  outbox.BeginWait();
  uint64_t queued = 0;
  while (!outbox.pending() && queued < 100000) outbox.Queue(Capacity(++queued));
  ASSERT_TRUE(outbox.pending()) << "the socket never filled";
  // More frames queue behind the one that would block, none jumps ahead.
  for (int i = 0; i < 3; ++i) outbox.Queue(Capacity(++queued));
  outbox.EndWait();
  // The engine reads; the session thread's drain sends the rest in order.
  uint64_t next = 1;
  while (Readable(engine.fd())) {
    absl::StatusOr<ReceivedFrame> got = engine.Receive();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->frame.seq(), next++);
  }
  ASSERT_LT(next, queued);
  std::thread reader([&] {
    while (next <= queued) {
      absl::StatusOr<ReceivedFrame> got = engine.Receive();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->frame.seq(), next++);
    }
  });
  ASSERT_TRUE(outbox.Drain().ok());
  reader.join();
  EXPECT_FALSE(outbox.pending());
}

}  // namespace
}  // namespace kvbroker::attach
