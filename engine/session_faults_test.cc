// The engine Session against a daemon that is slow, refuses or
// misbehaves: a refused Hello, calls past their timeout and the late
// replies that follow, events that fail a call, a daemon that reads
// nothing, an Attach that fails after the daemon's reply. The scripted
// daemon and the fixture are those of session_test.cc
// (testing/session_fixture.h).

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "attach/frame.h"
#include "engine/session.h"
#include "engine/testing/peer.h"
#include "engine/testing/session_fixture.h"
#include "gtest/gtest.h"

namespace kvbroker::engine {
namespace {

namespace av1 = ::kvbroker::attach::v1;
using attach::ProtocolErrorOf;
using attach::ReceivedFrame;
using testing::AllocReply;
using testing::Layout;
using testing::Peer;
using testing::SessionTest;

// A Hello the daemon refuses began no session: the engine closes the
// connection without a SessionEnd (which the daemon would have no session
// to confirm) and returns the refusal at once.
TEST(SessionConnectTest, ARefusedHelloClosesWithoutASessionEnd) {
  Peer peer;
  std::thread daemon([&] {
    peer.Accept();
    ReceivedFrame hello = peer.Next();
    ASSERT_TRUE(hello.frame.has_hello());
    peer.Refuse(hello.frame.seq(), absl::UnauthenticatedError("no such token"));
    absl::StatusOr<ReceivedFrame> next = peer.TryNext();
    EXPECT_TRUE(absl::IsCancelled(next.status()))
        << (next.ok() ? next->frame.DebugString() : next.status().ToString());
  });
  ConnectOptions o;
  o.socket_path = peer.path();
  o.holder = "rank0";
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Connect(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnauthenticated)
      << s.status();
  daemon.join();
}

// A call whose reply does not come within call_timeout returns
// DEADLINE_EXCEEDED; the reply that comes later is dropped, and the next
// call gets its own.
TEST_F(SessionTest, ACallPastItsTimeoutGivesUpAndDropsTheLateReply) {
  Open({2});
  // Short only for the call that is meant to time out: the attach's frames
  // and the next reply may be slow on a loaded machine.
  session_->set_call_timeout(absl::Milliseconds(50));
  std::thread daemon([&] {
    ReceivedFrame slow = peer_.Next();
    ASSERT_TRUE(slow.frame.has_alloc());
    // Twenty timeouts late: the call has given up by then.
    absl::SleepFor(absl::Seconds(1));
    peer_.Send(AllocReply(slow.frame.seq(), 2, 5));
    ReceivedFrame next = peer_.Next();
    ASSERT_TRUE(next.frame.has_alloc());
    peer_.Send(AllocReply(next.frame.seq(), 2, 4));
  });
  auto slow = session_->Alloc(1, "req-1");
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded)
      << slow.status();
  session_->set_call_timeout(absl::Seconds(30));
  auto next = session_->Alloc(1);
  daemon.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, std::vector<int64_t>{4});
}

// Answers the next `n` Capacity calls, in order.
void AnswerCapacity(Peer* peer, int n) {
  for (int i = 0; i < n; ++i) {
    ReceivedFrame call = peer->Next();
    ASSERT_TRUE(call.frame.has_capacity());
    av1::Frame reply;
    reply.set_seq(call.frame.seq());
    reply.mutable_capacity_reply();
    peer->Send(reply);
  }
}

// An event that fails during a call fails the call with the event's error;
// the call's reply, which follows, is dropped as a late one, and the calls
// after it get their own replies.
TEST_F(SessionTest, AnEventThatFailsACallLeavesLaterCallsInStep) {
  Open({});
  std::thread daemon([&] {
    ReceivedFrame alloc = peer_.Next();
    ASSERT_TRUE(alloc.frame.has_alloc());
    av1::Frame pm;  // two pages, one fd
    pm.mutable_pages_mapped()->add_page_ids(1);
    pm.mutable_pages_mapped()->add_page_ids(2);
    peer_.Send(pm, {bundles_[1]->fd.get()});
    peer_.Send(AllocReply(alloc.frame.seq(), 3, 6));
    AnswerCapacity(&peer_, 1);
    // A frame the channel refuses (a Revoke may carry no fd), then the
    // reply.
    ReceivedFrame free = peer_.Next();
    ASSERT_TRUE(free.frame.has_free());
    av1::Frame rv;
    rv.mutable_revoke()->set_revoke_id(1);
    peer_.Send(rv, {bundles_[0]->fd.get()});
    av1::Frame freed;
    freed.set_seq(free.frame.seq());
    freed.mutable_free_reply()->set_freed_blocks(1);
    peer_.Send(freed);
    AnswerCapacity(&peer_, 2);
  });
  auto alloc = session_->Alloc(1);
  auto first = session_->Capacity();
  const std::vector<int64_t> six = {6};
  auto free = session_->Free(six);
  auto second = session_->Capacity();
  auto third = session_->Capacity();
  daemon.join();
  EXPECT_EQ(ProtocolErrorOf(alloc.status()), av1::UNEXPECTED_FDS)
      << alloc.status();
  EXPECT_EQ(session_->mapped_pages(), 0);
  EXPECT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ProtocolErrorOf(free.status()), av1::UNEXPECTED_FDS)
      << free.status();
  EXPECT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(third.ok()) << third.status();
}

// Late replies are recognised by their seq alone, however many calls gave
// up before them.
TEST_F(SessionTest, LateRepliesOfManyTimedOutCallsAreDropped) {
  Open({});
  session_->set_call_timeout(absl::Milliseconds(5));
  constexpr int kTimedOut = 100;
  std::vector<uint64_t> seqs;
  std::thread reader([&] {
    for (int i = 0; i < kTimedOut; ++i)
      seqs.push_back(peer_.Next().frame.seq());
  });
  for (int i = 0; i < kTimedOut; ++i) {
    EXPECT_EQ(session_->Capacity().status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  reader.join();
  // Every call has returned; now their replies come, oldest first.
  for (uint64_t seq : seqs) {
    av1::Frame reply;
    reply.set_seq(seq);
    reply.mutable_capacity_reply();
    peer_.Send(reply);
  }
  session_->set_call_timeout(absl::Seconds(30));
  std::thread daemon([&] { AnswerCapacity(&peer_, 1); });
  auto after = session_->Capacity();
  daemon.join();
  EXPECT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(session_->ProcessEvents().ok());
}

// A reply that answers no call made yet, or a reply-shaped frame with seq
// 0, is still refused.
TEST_F(SessionTest, AReplyToNoCallIsRefused) {
  Open({});
  av1::Frame ahead;
  ahead.set_seq(1000);
  ahead.mutable_capacity_reply();
  peer_.Send(ahead);
  pollfd p = {session_->event_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  EXPECT_EQ(ProtocolErrorOf(session_->ProcessEvents()),
            av1::UNEXPECTED_MESSAGE);
  av1::Frame zero;
  zero.mutable_capacity_reply();
  peer_.Send(zero);
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  EXPECT_EQ(ProtocolErrorOf(session_->ProcessEvents()),
            av1::UNEXPECTED_MESSAGE);
}

// An Attach that runs out of time ends the session: the daemon may have
// announced pages to it that the engine never mapped.
TEST_F(SessionTest, AnAttachPastItsTimeoutEndsTheSession) {
  call_timeout_ = absl::Milliseconds(50);
  av1::AttachReply reply;
  *reply.mutable_layout() = Layout();
  reply.set_mapped_pages(1);  // and the page never comes
  absl::Status r = ConnectAndAttach(reply, {});
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded) << r;
  EXPECT_EQ(session_->Capacity().status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The daemon sees the connection end.
  absl::StatusOr<ReceivedFrame> after = peer_.TryNext();
  EXPECT_FALSE(after.ok());
}

// Fills the send buffer of the engine's socket `fd` with packets the peer
// never reads, so that the session's next send waits for room.
void FillSendBuffer(int fd) {
  const std::string packet(1024, 'x');
  while (send(fd, packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >
         0) {
  }
  ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << strerror(errno);
}

// Hangs the peer up unless `done` is notified within 20 s: a send that
// waits for ever then fails instead, and the test reports it.
std::thread Watchdog(Peer* peer, absl::Notification* done) {
  return std::thread([peer, done] {
    if (!done->WaitForNotificationWithTimeout(absl::Seconds(20))) {
      peer->Hangup();
    }
  });
}

// A daemon that reads nothing cannot hold a call past call_timeout: the
// send that finds no room gives up, and the session ends.
TEST_F(SessionTest, ASendPastTheCallTimeoutEndsTheSession) {
  Open({0});
  session_->set_call_timeout(absl::Milliseconds(50));
  FillSendBuffer(session_->event_fd());
  absl::Notification done;
  std::thread watchdog = Watchdog(&peer_, &done);
  absl::Status blocked = session_->Capacity().status();
  absl::Status later = session_->Capacity().status();
  done.Notify();
  watchdog.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kDeadlineExceeded) << blocked;
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_EQ(session_->ProcessEvents().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(session_->mapped_pages(), 1);
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(session_->mapped_pages(), 0);
}

// Close's own SessionEnd waits for room at most close_timeout, whatever
// call_timeout says.
TEST_F(SessionTest, CloseOnADaemonThatReadsNothingIsBounded) {
  Open({0}, /*close_timeout=*/absl::Milliseconds(50));
  session_->set_call_timeout(absl::InfiniteDuration());
  FillSendBuffer(session_->event_fd());
  absl::Notification done;
  std::thread watchdog = Watchdog(&peer_, &done);
  absl::Status closed = session_->Close();
  done.Notify();
  watchdog.join();
  EXPECT_EQ(closed.code(), absl::StatusCode::kDeadlineExceeded) << closed;
  EXPECT_EQ(session_->mapped_pages(), 0);
  EXPECT_TRUE(session_->Close().ok());
}

// An Attach that fails after the daemon's AttachReply (the daemon has
// attached the session and announced its pages) ends the session with the
// failure's own code: the daemon sees the connection end, and no later call
// runs on a half-attached session.
TEST_F(SessionTest, AnAttachThatFailsAfterTheReplyEndsTheSession) {
  struct Case {
    const char* what;
    void (*change)(av1::AttachReply*);
    absl::StatusCode code;
    av1::ProtocolError error;
    // Pages the daemon announces: none where the engine stops reading
    // before them (the peer's sends would fail).
    std::vector<int64_t> initial;
    int64_t mapped;  // pages mapped when the Attach returns
  };
  const Case cases[] = {
      {"a backend this build cannot map",
       [](av1::AttachReply* r) { r->mutable_layout()->set_backend("tape"); },
       absl::StatusCode::kUnimplemented,
       av1::PROTOCOL_ERROR_UNSPECIFIED,
       {},
       0},
      {"a malformed layout",
       [](av1::AttachReply* r) { r->mutable_layout()->set_bundle_bytes(1); },
       absl::StatusCode::kInvalidArgument,
       av1::MALFORMED_FRAME,
       {},
       0},
      {"held blocks on a page not mapped",
       [](av1::AttachReply* r) {
         auto* page = r->add_held();
         page->set_page_id(3);
         page->add_block_ids(7);
       },
       absl::StatusCode::kInvalidArgument,
       av1::MALFORMED_FRAME,
       {0, 2},
       2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    av1::AttachReply reply;
    *reply.mutable_layout() = Layout();
    c.change(&reply);
    absl::Status s = ConnectAndAttach(reply, c.initial);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(ProtocolErrorOf(s), c.error) << s;
    EXPECT_EQ(session_->mapped_pages(), c.mapped);
    ASSERT_EQ(session_->ProcessEvents().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(session_->Capacity().status().code(),
              absl::StatusCode::kFailedPrecondition);
    AttachOptions again;
    again.pool = "kv";
    EXPECT_EQ(session_->Attach(again).status().code(),
              absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<ReceivedFrame> after = peer_.TryNext();
    EXPECT_TRUE(absl::IsCancelled(after.status())) << after.status();
    EXPECT_TRUE(session_->Close().ok());
    EXPECT_EQ(session_->mapped_pages(), 0);
    peer_.Hangup();
    session_.reset();
  }
}

}  // namespace
}  // namespace kvbroker::engine
