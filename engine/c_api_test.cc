// The C ABI (kvbroker_engine.h) against a peer playing the daemon's side:
// what the ABI adds over Session (conversions, its own locking).

#include <limits>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "attach/frame.h"
#include "engine/kvbroker_engine.h"
#include "engine/testing/peer.h"
#include "gtest/gtest.h"

namespace kvbroker::engine {
namespace {

namespace av1 = ::kvbroker::attach::v1;
using testing::Peer;

// Four pages on one device, whose ordinal the ABI reports.
av1::PoolLayout Layout() {
  av1::PoolLayout l = testing::HostLayout(4);
  l.mutable_devices(0)->set_ordinal(3);
  return l;
}

// Answers the next Attach with Layout() and no pages.
void AnswerAttach(Peer* peer) {
  attach::ReceivedFrame attach = peer->Next();
  ASSERT_TRUE(attach.frame.has_attach());
  av1::Frame reply;
  reply.set_seq(attach.frame.seq());
  *reply.mutable_attach_reply()->mutable_layout() = Layout();
  peer->Send(reply);
}

kvb_session* Connect(Peer* peer) {
  std::thread daemon([peer] { peer->AcceptHello(); });
  kvb_session* s = nullptr;
  kvb_error err;
  EXPECT_EQ(kvb_connect(peer->path().c_str(), "", "rank0", 0, &s, &err), 0)
      << err.message;
  daemon.join();
  return s;
}

// An expiry that int64 nanoseconds cannot hold saturates instead of
// overflowing; the reservation's id still reaches the caller.
TEST(CApiTest, AReservationsExpiryPastInt64NanosecondsSaturates) {
  Peer peer;
  kvb_session* s = Connect(&peer);
  ASSERT_NE(s, nullptr);
  const int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1000000000;
  struct Case {
    int64_t seconds;
    int32_t nanos;
    int64_t want;
  };
  const Case cases[] = {
      {1700000000, 5, int64_t{1700000000} * 1000000000 + 5},
      {kMaxSeconds + 1, 0, std::numeric_limits<int64_t>::max()},
      {kMaxSeconds, 999999999, std::numeric_limits<int64_t>::max()},
      {-kMaxSeconds - 1, 0, std::numeric_limits<int64_t>::min()},
  };
  std::thread daemon([&peer, &cases] {
    AnswerAttach(&peer);
    for (const Case& c : cases) {
      attach::ReceivedFrame reserve = peer.Next();
      ASSERT_TRUE(reserve.frame.has_reserve());
      av1::Frame reply;
      reply.set_seq(reserve.frame.seq());
      auto* r = reply.mutable_reserve_reply();
      r->set_reservation_id("res-1");
      r->set_num_blocks(1);
      r->mutable_expire_time()->set_seconds(c.seconds);
      r->mutable_expire_time()->set_nanos(c.nanos);
      peer.Send(reply);
    }
  });
  kvb_error err;
  ASSERT_EQ(kvb_attach(s, "kv", nullptr, 0, nullptr, 0, nullptr, &err), 0)
      << err.message;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.seconds);
    char id[KVB_MAX_ID_LENGTH + 1];
    int64_t reserved = 0;
    int64_t expire = 0;
    EXPECT_EQ(
        kvb_reserve(s, 1, 0, nullptr, id, sizeof(id), &reserved, &expire, &err),
        0)
        << err.message;
    EXPECT_EQ(std::string(id), "res-1");
    EXPECT_EQ(reserved, 1);
    EXPECT_EQ(expire, c.want);
  }
  daemon.join();
  peer.Hangup();
  EXPECT_EQ(kvb_close(s, 1, &err), 0) << err.message;
}

// kvb_get_layout and kvb_device read the layout under the session's lock:
// called while another thread attaches, they wait for the attach and see
// its layout whole.
TEST(CApiTest, TheLayoutReadDuringAnAttachIsTheAttachs) {
  Peer peer;
  kvb_session* s = Connect(&peer);
  ASSERT_NE(s, nullptr);
  absl::Notification attach_sent, read_returned;
  std::thread daemon([&] {
    attach::ReceivedFrame attach = peer.Next();
    ASSERT_TRUE(attach.frame.has_attach());
    attach_sent.Notify();
    // The reads below wait for this reply; they get up to 2 s to return
    // without it.
    read_returned.WaitForNotificationWithTimeout(absl::Seconds(2));
    av1::Frame reply;
    reply.set_seq(attach.frame.seq());
    *reply.mutable_attach_reply()->mutable_layout() = Layout();
    peer.Send(reply);
  });
  int32_t attached = -1;
  std::thread attacher([&] {
    kvb_error err;
    attached = kvb_attach(s, "kv", nullptr, 0, nullptr, 0, nullptr, &err);
  });
  attach_sent.WaitForNotification();
  kvb_layout layout;
  kvb_error err;
  const int32_t got = kvb_get_layout(s, &layout, &err);
  int32_t ordinal = -1;
  const int32_t device = kvb_device(s, 0, &ordinal, nullptr, nullptr, 0, &err);
  read_returned.Notify();
  attacher.join();
  daemon.join();
  EXPECT_EQ(attached, 0);
  EXPECT_EQ(got, 0);
  EXPECT_EQ(layout.page_count, 4);
  EXPECT_EQ(layout.device_count, 1);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(ordinal, 3);
  peer.Hangup();
  EXPECT_EQ(kvb_close(s, 1, &err), 0) << err.message;
}

}  // namespace
}  // namespace kvbroker::engine
