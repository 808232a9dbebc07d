// Outbox: the eventfd is readable exactly while frames wait, a Drain with
// nothing queued touches nothing, and queued frames go out in order with
// their fds.

#include "attach/outbox.h"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

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

TEST(OutboxTest, EventFdIsReadableExactlyWhileFramesWait) {
  auto pair = FrameChannel::Pair();
  ASSERT_TRUE(pair.ok());
  auto& [daemon, engine] = *pair;
  Outbox outbox;
  ASSERT_GE(outbox.event_fd(), 0);
  EXPECT_FALSE(Readable(outbox.event_fd()));
  // Nothing queued: Drain sends nothing and leaves the eventfd alone.
  ASSERT_TRUE(outbox.Drain(daemon).ok());
  EXPECT_FALSE(Readable(engine.fd()));
  EXPECT_FALSE(Readable(outbox.event_fd()));

  outbox.Queue(Capacity(0));
  outbox.Queue(Capacity(0));
  EXPECT_TRUE(Readable(outbox.event_fd()));
  ASSERT_TRUE(outbox.Drain(daemon).ok());
  EXPECT_FALSE(Readable(outbox.event_fd()));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ReceivedFrame> got = engine.Receive();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->frame.has_capacity());
  }
  EXPECT_FALSE(Readable(engine.fd()));

  // A page announced after a Drain signals again; its fd goes along.
  const int before = testing::CountOpenFds().value_or(-1);
  {
    UniqueFd page(memfd_create("outbox_test", MFD_CLOEXEC));
    outbox.SetDevices({0});
    MappedPage m;
    m.page = 5;
    m.fds = {page.get()};
    outbox.OnPagesMapped(absl::MakeConstSpan(&m, 1));
  }
  EXPECT_TRUE(Readable(outbox.event_fd()));
  ASSERT_TRUE(outbox.Drain(daemon).ok());
  EXPECT_FALSE(Readable(outbox.event_fd()));
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

}  // namespace
}  // namespace kvbroker::attach
