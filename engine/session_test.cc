// The engine Session's calls and its handling of what only the daemon sends
// (pages mapped with their fds, revocations, the end of the session),
// against a peer that plays the daemon's side of attach.proto frame by
// frame over a real socket. The page bundles are real memfds: what the peer
// writes through its own mapping the engine reads through its own, and the
// reverse. A daemon that is slow, refuses or misbehaves is
// session_faults_test.cc; the fixture is testing/session_fixture.h.

#include "engine/session.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "attach/frame.h"
#include "attach/testing/fd_count.h"
#include "engine/testing/faulty_mapper.h"
#include "engine/testing/peer.h"
#include "engine/testing/session_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker::engine {
namespace {

namespace av1 = ::kvbroker::attach::v1;
using testing::Peer;
namespace kv1 = ::kvbroker::v1;
using attach::ProtocolErrorOf;
using attach::ReceivedFrame;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

using testing::AllocReply;
using testing::Layout;
using testing::OpenFds;
using testing::SessionTest;

TEST_F(SessionTest, MapsThePagesOfTheAttachAndSharesTheirBytes) {
  Open({0, 2});
  EXPECT_EQ(session_->hello().session_id(), 77u);
  EXPECT_EQ(session_->mapped_pages(), 2);
  // One frame per page here, so one set-access call each.
  const AttachStats st = session_->attach_stats();
  EXPECT_EQ(st.pages, 2);
  EXPECT_EQ(st.frames, 2);
  EXPECT_EQ(st.access_calls, 2);
  EXPECT_EQ(st.import, absl::ZeroDuration());  // the host imports nothing
  EXPECT_LE(st.receive + st.setup + st.map + st.access, st.total);
  EXPECT_TRUE(session_->page_mapped(0));
  EXPECT_FALSE(session_->page_mapped(1));
  EXPECT_TRUE(session_->page_mapped(2));
  // Block 4 is on page 2 (stride 2 MiB, bundle 4 MiB); its V (buffer 1)
  // starts 1 MiB into the block.
  auto v = session_->BlockAddress(0, 4, 0, 1);
  ASSERT_TRUE(v.ok());
  char* engine_v = reinterpret_cast<char*>(*v);
  EXPECT_EQ(engine_v[0], 'c');
  // What the daemon writes through its mapping the engine reads, and back.
  bundles_[2]->data[1 << 20] = 'D';
  EXPECT_EQ(engine_v[0], 'D');
  engine_v[1] = 'E';
  EXPECT_EQ(bundles_[2]->data[(1 << 20) + 1], 'E');
  // The engine keeps no fd per page: only the two ends of the connection
  // (the engine's socket and the peer's) are new.
  EXPECT_EQ(OpenFds(), fds_before_ + 2);
}

TEST_F(SessionTest, PagesMappedDuringACallAreMappedBeforeItReturns) {
  Open({});
  std::thread daemon([&] {
    ReceivedFrame alloc = peer_.Next();
    ASSERT_TRUE(alloc.frame.has_alloc());
    av1::Frame pm;  // a daemon-initiated notification, seq 0
    pm.mutable_pages_mapped()->add_page_ids(3);
    peer_.Send(pm, {bundles_[3]->fd.get()});
    peer_.Send(AllocReply(alloc.frame.seq(), 3, 6));
  });
  auto ids = session_->Alloc(1);
  daemon.join();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, std::vector<int64_t>{6});
  EXPECT_TRUE(session_->page_mapped(3));
  EXPECT_EQ(*reinterpret_cast<char*>(*session_->BlockAddress(0, 6, 0, 0)), 'd');
}

// A daemon that chose version 1 gets every id listed: it would not read
// block runs.
TEST_F(SessionTest, Version1ListsEveryId) {
  Open({3});
  std::thread daemon([&] {
    ReceivedFrame alloc = peer_.Next();
    ASSERT_TRUE(alloc.frame.has_alloc());
    EXPECT_FALSE(alloc.frame.alloc().block_runs());
    peer_.Send(AllocReply(alloc.frame.seq(), 3, 6));
    ReceivedFrame free = peer_.Next();
    ASSERT_TRUE(free.frame.has_free());
    EXPECT_THAT(free.frame.free().block_ids(), ElementsAre(6, 7));
    EXPECT_THAT(free.frame.free().block_runs(), IsEmpty());
    av1::Frame reply;
    reply.set_seq(free.frame.seq());
    reply.mutable_free_reply()->set_freed_blocks(2);
    peer_.Send(reply);
  });
  auto ids = session_->Alloc(1);
  const std::vector<int64_t> both = {6, 7};
  auto freed = session_->Free(both);
  daemon.join();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(6));
  ASSERT_TRUE(freed.ok()) << freed.status();
}

// From version 2 on, Alloc asks for runs and Free sends them; a reply whose
// runs do not add up to its count is refused, not trusted.
TEST_F(SessionTest, Version2CarriesBlockRuns) {
  Open({2, 3}, absl::Seconds(5), absl::ZeroDuration(), /*version=*/2);
  std::thread daemon([&] {
    ReceivedFrame alloc = peer_.Next();
    ASSERT_TRUE(alloc.frame.has_alloc());
    EXPECT_TRUE(alloc.frame.alloc().block_runs());
    av1::Frame reply;
    reply.set_seq(alloc.frame.seq());
    kv1::AllocResponse* r = reply.mutable_alloc_reply();
    // Block 5 on page 2 and 6, 7 on page 3: one run across the two.
    r->add_block_runs(5);
    r->add_block_runs(3);
    r->set_num_blocks(3);
    peer_.Send(reply);
    ReceivedFrame free = peer_.Next();
    ASSERT_TRUE(free.frame.has_free());
    EXPECT_THAT(free.frame.free().block_ids(), IsEmpty());
    EXPECT_THAT(free.frame.free().block_runs(), ElementsAre(5, 3));
    av1::Frame freed;
    freed.set_seq(free.frame.seq());
    freed.mutable_free_reply()->set_freed_blocks(3);
    peer_.Send(freed);
    ReceivedFrame bad = peer_.Next();
    ASSERT_TRUE(bad.frame.has_alloc());
    reply.set_seq(bad.frame.seq());
    r->set_num_blocks(4);  // the runs name 3
    peer_.Send(reply);
  });
  auto ids = session_->Alloc(3);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(5, 6, 7));
  auto freed = session_->Free(*ids);
  auto bad = session_->Alloc(4);
  daemon.join();
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(freed->freed_blocks(), 3);
  EXPECT_EQ(attach::ProtocolErrorOf(bad.status()), av1::MALFORMED_FRAME)
      << bad.status();
}

// AllocInto writes the ids into the caller's room: a room too small is
// refused before anything is sent, and a reply that lists more ids than
// its count writes nothing past the count.
TEST_F(SessionTest, AllocIntoWritesTheCallersRoomAndNoFurther) {
  Open({2, 3}, absl::Seconds(5), absl::ZeroDuration(), /*version=*/2);
  std::thread daemon([&] {
    ReceivedFrame first = peer_.Next();  // the refused call sent nothing
    ASSERT_TRUE(first.frame.has_alloc());
    EXPECT_EQ(first.frame.alloc().num_blocks(), 3);
    av1::Frame reply;
    reply.set_seq(first.frame.seq());
    kv1::AllocResponse* r = reply.mutable_alloc_reply();
    r->add_block_runs(5);
    r->add_block_runs(3);
    r->set_num_blocks(3);
    peer_.Send(reply);
    ReceivedFrame second = peer_.Next();
    ASSERT_TRUE(second.frame.has_alloc());
    av1::Frame wrong;
    wrong.set_seq(second.frame.seq());
    kv1::AllocResponse* w = wrong.mutable_alloc_reply();
    w->set_num_blocks(2);
    kv1::PageBlocks* page = w->add_pages();
    page->set_page_id(2);
    for (int64_t b : {5, 6, 7}) page->add_block_ids(b);
    peer_.Send(wrong);
  });
  std::vector<int64_t> room(4, -1);
  auto small = session_->AllocInto(5, "", absl::MakeSpan(room));
  auto got = session_->AllocInto(3, "", absl::MakeSpan(room));
  const std::vector<int64_t> after_got = room;
  std::fill(room.begin(), room.end(), -1);
  auto bad = session_->AllocInto(2, "", absl::MakeSpan(room));
  daemon.join();
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument)
      << small.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 3);
  EXPECT_THAT(after_got, ElementsAre(5, 6, 7, -1));
  EXPECT_EQ(attach::ProtocolErrorOf(bad.status()), av1::MALFORMED_FRAME)
      << bad.status();
  EXPECT_THAT(room, ElementsAre(-1, -1, -1, -1));
}

// Alloc(n) and Free(ids) reuse their request frames: nothing a call set
// (a request id, a reservation id, a list of ids, runs) reaches the next
// one.
TEST_F(SessionTest, KeptRequestFramesCarryNothingOver) {
  Open({2, 3}, absl::Seconds(5), absl::ZeroDuration(), /*version=*/2);
  std::vector<av1::Frame> seen;
  std::thread daemon([&] {
    for (int call = 0; call < 6; ++call) {
      ReceivedFrame got = peer_.Next();
      seen.push_back(got.frame);
      av1::Frame reply;
      reply.set_seq(got.frame.seq());
      if (got.frame.has_alloc()) {
        kv1::AllocResponse* r = reply.mutable_alloc_reply();
        r->set_num_blocks(got.frame.alloc().num_blocks());
        r->add_block_runs(5);
        r->add_block_runs(got.frame.alloc().num_blocks());
      } else {
        reply.mutable_free_reply()->set_freed_blocks(1);
      }
      peer_.Send(reply);
    }
  });
  auto a1 = session_->Alloc(2, "first");
  auto a2 = session_->Alloc(3, "", "res-7");
  const std::vector<int64_t> scattered = {5, 9, 13};
  auto f1 = session_->Free(scattered, "gone");
  const std::vector<int64_t> run = {5, 6, 7};
  auto f2 = session_->Free(run);
  auto f3 = session_->Free(scattered);
  auto a3 = session_->Alloc(1, "third");
  daemon.join();
  ASSERT_TRUE(a1.ok() && a2.ok() && f1.ok() && f2.ok() && f3.ok() && a3.ok());
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[0].alloc().request_id(), "first");
  EXPECT_EQ(seen[0].alloc().reservation_id(), "");
  EXPECT_EQ(seen[1].alloc().request_id(), "");
  EXPECT_EQ(seen[1].alloc().reservation_id(), "res-7");
  EXPECT_EQ(seen[1].alloc().num_blocks(), 3);
  EXPECT_TRUE(seen[1].alloc().block_runs());
  EXPECT_THAT(seen[2].free().block_ids(), ElementsAre(5, 9, 13));
  EXPECT_THAT(seen[2].free().block_runs(), IsEmpty());
  EXPECT_EQ(seen[2].free().request_id(), "gone");
  EXPECT_THAT(seen[3].free().block_ids(), IsEmpty());
  EXPECT_THAT(seen[3].free().block_runs(), ElementsAre(5, 3));
  EXPECT_EQ(seen[3].free().request_id(), "");
  EXPECT_THAT(seen[4].free().block_ids(), ElementsAre(5, 9, 13));
  EXPECT_THAT(seen[4].free().block_runs(), IsEmpty());
  EXPECT_EQ(seen[5].alloc().request_id(), "third");
  EXPECT_EQ(seen[5].alloc().reservation_id(), "");
  EXPECT_EQ(seen[5].alloc().num_blocks(), 1);
  // Sequence numbers still move on with every call.
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GT(seen[i].seq(), seen[i - 1].seq());
  }
}

// A layout whose fields do not follow from P, B, L, K and T, or that
// overflows, is refused before any range is reserved or page mapped: the
// engine would otherwise map bundles or hand out addresses outside its
// range.
TEST_F(SessionTest, AttachRefusesALayoutThatDoesNotAddUp) {
  struct Case {
    const char* what;
    void (*change)(av1::PoolLayout*);
  };
  const Case cases[] = {
      {"bundle_bytes",
       [](av1::PoolLayout* l) { l->set_bundle_bytes(8 << 20); }},
      {"stride", [](av1::PoolLayout* l) { l->set_block_stride_bytes(1); }},
      {"layer offset",
       [](av1::PoolLayout* l) { l->set_layer_offset_bytes(3 << 20); }},
      {"buffer offset",
       [](av1::PoolLayout* l) { l->set_buffer_offset_bytes(0); }},
      {"virtual bytes",
       [](av1::PoolLayout* l) { l->set_virtual_bytes_per_device(1); }},
      {"blocks past the pages",
       [](av1::PoolLayout* l) { l->set_max_blocks(9); }},
      {"negative pages", [](av1::PoolLayout* l) { l->set_page_count(-1); }},
      {"zero block bytes", [](av1::PoolLayout* l) { l->set_block_bytes(0); }},
      {"no device", [](av1::PoolLayout* l) { l->clear_devices(); }},
      {"pages past the address space",
       [](av1::PoolLayout* l) {
         // Consistent, and 2^50 bytes: more than a process can reserve.
         l->set_page_count(int64_t{1} << 28);
         l->set_virtual_bytes_per_device(int64_t{1} << 50);
       }},
      {"overflow",
       [](av1::PoolLayout* l) {
         l->set_page_size(int64_t{1} << 62);
         l->set_num_layers(4);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    av1::AttachReply reply;
    *reply.mutable_layout() = Layout();
    c.change(reply.mutable_layout());
    absl::Status s = ConnectAndAttach(reply, {});
    EXPECT_EQ(ProtocolErrorOf(s), av1::MALFORMED_FRAME) << s;
    EXPECT_EQ(session_->device_count(), 0);
    EXPECT_EQ(session_->mapped_pages(), 0);
    peer_.Hangup();
    session_.reset();
  }
}

// Every block id the daemon hands out, by Alloc (each of its three forms)
// or at attach, must lie on pages mapped here; one that does not is
// refused as malformed rather than given to a caller that would fault on
// it.
TEST_F(SessionTest, BlocksOnPagesNotMappedAreRefused) {
  Open({2});
  std::thread daemon([&] {
    // Block 6 lies on page 3, not mapped; block 8 is past the pool.
    for (int64_t block : {6, 8, 6, 6}) {
      ReceivedFrame alloc = peer_.Next();
      ASSERT_TRUE(alloc.frame.has_alloc());
      peer_.Send(AllocReply(alloc.frame.seq(), 3, block));
    }
    ReceivedFrame alloc = peer_.Next();
    av1::Frame pm;
    pm.mutable_pages_mapped()->add_page_ids(3);
    peer_.Send(pm, {bundles_[3]->fd.get()});
    peer_.Send(AllocReply(alloc.frame.seq(), 3, 6));
  });
  auto not_mapped = session_->Alloc(1);
  auto past = session_->Alloc(1);
  std::vector<int64_t> room(1, -1);
  auto into = session_->AllocInto(1, "", absl::MakeSpan(room));
  kv1::AllocRequest request;
  request.set_num_blocks(1);
  auto proto = session_->Alloc(request);
  auto mapped = session_->Alloc(1);
  daemon.join();
  for (const absl::Status& s :
       {not_mapped.status(), past.status(), into.status(), proto.status()}) {
    EXPECT_EQ(ProtocolErrorOf(s), av1::MALFORMED_FRAME) << s;
  }
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(*mapped, std::vector<int64_t>{6});
}

// A reservation id no session could name back (empty, or past the
// protocol's bound) is refused; a well-formed one is returned.
TEST_F(SessionTest, ReserveRefusesANameNoSessionCouldPassBack) {
  Open({2});
  std::thread daemon([&] {
    for (const std::string& id :
         {std::string(), std::string(attach::kMaxIdLength + 1, 'r'),
          std::string(attach::kMaxIdLength, 'r')}) {
      ReceivedFrame reserve = peer_.Next();
      ASSERT_TRUE(reserve.frame.has_reserve());
      av1::Frame reply;
      reply.set_seq(reserve.frame.seq());
      reply.mutable_reserve_reply()->set_reservation_id(id);
      reply.mutable_reserve_reply()->set_num_blocks(1);
      peer_.Send(reply);
    }
  });
  kv1::ReserveRequest request;
  request.set_num_blocks(1);
  auto empty = session_->Reserve(request);
  auto too_long = session_->Reserve(request);
  auto longest = session_->Reserve(request);
  daemon.join();
  EXPECT_EQ(ProtocolErrorOf(empty.status()), av1::MALFORMED_FRAME)
      << empty.status();
  EXPECT_EQ(ProtocolErrorOf(too_long.status()), av1::MALFORMED_FRAME)
      << too_long.status();
  ASSERT_TRUE(longest.ok()) << longest.status();
  EXPECT_EQ(longest->reservation_id().size(), attach::kMaxIdLength);
}

TEST_F(SessionTest, AttachRefusesRedeemedBlocksOnPagesNotMapped) {
  av1::AttachReply reply;
  *reply.mutable_layout() = Layout();
  auto* page = reply.mutable_redeemed()->add_pages();
  page->set_page_id(3);
  page->add_block_ids(7);
  reply.mutable_redeemed()->set_num_blocks(1);
  absl::Status s =
      ConnectAndAttach(reply, {0, 2}, absl::Seconds(5), absl::ZeroDuration(), 1,
                       /*reservation_blocks=*/1);
  EXPECT_EQ(ProtocolErrorOf(s), av1::MALFORMED_FRAME) << s;
  peer_.Hangup();
  session_.reset();
  // The same redemption with its page among those mapped is accepted.
  s = ConnectAndAttach(reply, {0, 3}, absl::Seconds(5), absl::ZeroDuration(), 1,
                       /*reservation_blocks=*/1);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(session_->mapped_pages(), 2);
}

// A refusal by the daemon leaves the session unattached and usable: the
// next Attach is sent.
TEST_F(SessionTest, AnAttachTheDaemonRefusesMayBeTriedAgain) {
  fds_before_ = OpenFds();
  std::thread daemon([&] {
    peer_.AcceptHello();
    ReceivedFrame first = peer_.Next();
    ASSERT_TRUE(first.frame.has_attach());
    peer_.Refuse(first.frame.seq(), absl::NotFoundError("no pool \"kv\""));
    ReceivedFrame second = peer_.Next();
    ASSERT_TRUE(second.frame.has_attach());
    av1::Frame ar;
    ar.set_seq(second.frame.seq());
    *ar.mutable_attach_reply()->mutable_layout() = Layout();
    peer_.Send(ar);
  });
  ConnectOptions c;
  c.socket_path = peer_.path();
  c.holder = "rank0";
  auto s = Session::Connect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  session_ = *std::move(s);
  AttachOptions a;
  a.pool = "kv";
  auto first = session_->Attach(a);
  auto second = session_->Attach(a);
  daemon.join();
  EXPECT_EQ(first.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(second.ok()) << second.status();
}

// With reply_spin the call polls before it sleeps: a reply inside the spin
// and one long after it (the peer waits 20 ms) both arrive, and an event
// sent ahead of the reply is handled first, as without the spin.
TEST_F(SessionTest, ReplySpinReadsRepliesInsideAndPastTheSpin) {
  Open({2}, absl::Seconds(5), absl::Microseconds(200));
  std::thread daemon([&] {
    for (int call = 0; call < 2; ++call) {
      ReceivedFrame alloc = peer_.Next();
      ASSERT_TRUE(alloc.frame.has_alloc());
      if (call == 1) {
        absl::SleepFor(absl::Milliseconds(20));
        av1::Frame pm;
        pm.mutable_pages_mapped()->add_page_ids(3);
        peer_.Send(pm, {bundles_[3]->fd.get()});
      }
      peer_.Send(AllocReply(alloc.frame.seq(), 2 + call, 5 + 2 * call));
    }
  });
  auto first = session_->Alloc(1);
  auto second = session_->Alloc(1);
  daemon.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, std::vector<int64_t>{5});
  EXPECT_EQ(*second, std::vector<int64_t>{7});
  EXPECT_TRUE(session_->page_mapped(3));
}

TEST_F(SessionTest, AFrameOfPagesMapsAsOneBatchOrNotAtAll) {
  Open({});
  av1::Frame pm;
  for (int64_t p : {2, 0, 1}) pm.mutable_pages_mapped()->add_page_ids(p);
  peer_.Send(pm, {bundles_[2]->fd.get(), bundles_[0]->fd.get(),
                  bundles_[1]->fd.get()});
  ASSERT_TRUE(session_->ProcessEvents().ok());
  EXPECT_EQ(session_->mapped_pages(), 3);
  for (int64_t block : {0, 2, 4}) {
    EXPECT_EQ(*reinterpret_cast<char*>(*session_->BlockAddress(0, block, 0, 0)),
              'a' + block / 2);
  }
  // A frame naming page 3 twice maps neither copy; its fds are closed.
  av1::Frame twice;
  twice.mutable_pages_mapped()->add_page_ids(3);
  twice.mutable_pages_mapped()->add_page_ids(3);
  peer_.Send(twice, {bundles_[3]->fd.get(), bundles_[3]->fd.get()});
  EXPECT_EQ(session_->ProcessEvents().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(session_->page_mapped(3));
  EXPECT_EQ(session_->mapped_pages(), 3);
  EXPECT_EQ(OpenFds(), fds_before_ + 2);
}

TEST_F(SessionTest, RevocationUnmapsCallsBackAndAcknowledges) {
  Open({0, 1, 2});
  std::vector<int64_t> revoked;
  session_->SetRevocationCallback([&](absl::Span<const int64_t> pages) {
    revoked.assign(pages.begin(), pages.end());
  });
  av1::Frame rv;
  rv.mutable_revoke()->set_revoke_id(9);
  rv.mutable_revoke()->add_page_ids(0);
  rv.mutable_revoke()->add_page_ids(2);
  peer_.Send(rv);
  // The engine's event loop: the socket is readable, so it processes.
  pollfd p = {session_->event_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_TRUE(session_->ProcessEvents().ok());
  EXPECT_EQ(revoked, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(session_->mapped_pages(), 1);
  EXPECT_FALSE(session_->page_mapped(0));
  EXPECT_TRUE(session_->page_mapped(1));
  ReceivedFrame ack = peer_.Next();
  ASSERT_TRUE(ack.frame.has_revoke_ack());
  EXPECT_EQ(ack.frame.revoke_ack().revoke_id(), 9u);
  EXPECT_EQ(ack.frame.revoke_ack().page_ids_size(), 2);
  // Nothing pending: returns at once.
  EXPECT_TRUE(session_->ProcessEvents().ok());
}

// A device that fails to unmap a revoked page does not stop the others:
// every device unmaps what it can, the page no longer counts as mapped
// (no block on it is handed out), and the engine is called back. The
// revocation is not acknowledged, since a page is still mapped on the
// failing device: the daemon must not hand it to another holder.
TEST_F(SessionTest, AnUnmapThatFailsOnOneDeviceStillUnmapsTheOthers) {
  std::vector<testing::FaultyMapper*> devices;
  create_mapper_ =
      [&devices](
          const std::string& backend, const std::string& uuid,
          int64_t size) -> absl::StatusOr<std::unique_ptr<DeviceMapper>> {
    absl::StatusOr<std::unique_ptr<DeviceMapper>> real =
        CreateMapper(backend, uuid, size);
    if (!real.ok()) return real.status();
    auto faulty = std::make_unique<testing::FaultyMapper>(*std::move(real));
    devices.push_back(faulty.get());
    return faulty;
  };
  av1::AttachReply reply;
  *reply.mutable_layout() = Layout();
  reply.mutable_layout()->add_devices()->set_uuid("host-1");
  ASSERT_TRUE(ConnectAndAttach(reply, {}).ok());
  ASSERT_EQ(devices.size(), 2u);
  av1::Frame pm;  // pages 0 and 1, each on both devices
  pm.mutable_pages_mapped()->add_page_ids(0);
  pm.mutable_pages_mapped()->add_page_ids(1);
  peer_.Send(pm, {bundles_[0]->fd.get(), bundles_[0]->fd.get(),
                  bundles_[1]->fd.get(), bundles_[1]->fd.get()});
  pollfd p = {session_->event_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_TRUE(session_->ProcessEvents().ok());
  ASSERT_EQ(session_->mapped_pages(), 2);
  std::vector<int64_t> revoked;
  session_->SetRevocationCallback([&](absl::Span<const int64_t> pages) {
    revoked.assign(pages.begin(), pages.end());
  });
  devices[1]->fail_unmap = true;
  av1::Frame rv;
  rv.mutable_revoke()->set_revoke_id(9);
  rv.mutable_revoke()->add_page_ids(0);
  rv.mutable_revoke()->add_page_ids(1);
  peer_.Send(rv);
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  absl::Status s = session_->ProcessEvents();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(session_->mapped_pages(), 0);
  EXPECT_FALSE(session_->page_mapped(0));
  EXPECT_FALSE(session_->page_mapped(1));
  EXPECT_EQ(devices[0]->mapped(), 0);
  EXPECT_EQ(devices[1]->mapped(), 2);
  EXPECT_THAT(revoked, ElementsAre(0, 1));
  // The next frame the daemon reads is the Alloc below, not an
  // acknowledgement; a block on page 0 is refused.
  std::thread daemon([&] {
    ReceivedFrame next = peer_.Next();
    ASSERT_TRUE(next.frame.has_alloc()) << next.frame.DebugString();
    peer_.Send(AllocReply(next.frame.seq(), 0, 0));
  });
  auto alloc = session_->Alloc(1);
  daemon.join();
  EXPECT_EQ(ProtocolErrorOf(alloc.status()), av1::MALFORMED_FRAME)
      << alloc.status();
}

TEST_F(SessionTest, WrongFdCountIsRefusedAndClosed) {
  Open({});
  const int before = OpenFds();
  av1::Frame pm;
  pm.mutable_pages_mapped()->add_page_ids(1);
  pm.mutable_pages_mapped()->add_page_ids(2);
  peer_.Send(pm, {bundles_[1]->fd.get()});  // two pages, one fd
  pollfd p = {session_->event_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  EXPECT_EQ(ProtocolErrorOf(session_->ProcessEvents()), av1::UNEXPECTED_FDS);
  EXPECT_EQ(session_->mapped_pages(), 0);
  EXPECT_EQ(OpenFds(), before);
}

TEST_F(SessionTest, SessionEndFromTheDaemon) {
  Open({1});
  av1::Frame end;
  end.mutable_session_end()->set_message("kvbrokerd is stopping");
  peer_.Send(end);
  pollfd p = {session_->event_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  absl::Status s = session_->ProcessEvents();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(s.message().find("kvbrokerd is stopping"), std::string::npos);
  EXPECT_EQ(session_->Alloc(1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(session_->mapped_pages(), 0);
}

// Close is a request: it returns once the daemon's SessionEnd with its seq
// arrives, dropping (and closing the fds of) what comes before it.
TEST_F(SessionTest, CloseWaitsForTheDaemonsSessionEnd) {
  Open({0});
  std::thread daemon([&] {
    ReceivedFrame end = peer_.Next();
    ASSERT_TRUE(end.frame.has_session_end());
    EXPECT_NE(end.frame.seq(), 0u);
    EXPECT_FALSE(end.frame.session_end().release());
    av1::Frame pm;
    pm.mutable_pages_mapped()->add_page_ids(2);
    peer_.Send(pm, {bundles_[2]->fd.get()});
    av1::Frame reply;
    reply.set_seq(end.frame.seq());
    reply.mutable_session_end()->set_message("holder rank0: 0 blocks freed");
    peer_.Send(reply);
  });
  EXPECT_TRUE(session_->Close(/*release=*/false).ok());
  daemon.join();
  EXPECT_EQ(session_->mapped_pages(), 0);
  EXPECT_FALSE(session_->page_mapped(2));
  session_.reset();
  EXPECT_EQ(OpenFds(), fds_before_ + 1);  // the peer's connection
}

// A daemon that died (it closed the connection without a SessionEnd) has
// finished with the session: Close returns OK and unmaps.
TEST_F(SessionTest, CloseAfterTheDaemonDiedIsOk) {
  Open({0});
  peer_.Hangup();
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(session_->mapped_pages(), 0);
  EXPECT_TRUE(session_->Close().ok());
}

// The first call that finds the daemon gone says so and closes the session;
// later calls send nothing, and Close is OK.
TEST_F(SessionTest, ACallThatFindsTheDaemonGoneClosesTheSession) {
  Open({0});
  peer_.Hangup();
  EXPECT_EQ(session_->Capacity().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(session_->Capacity().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session_->ProcessEvents().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(session_->mapped_pages(), 1);
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(session_->mapped_pages(), 0);
}

// A close_timeout longer than poll's int of milliseconds (about 24.8 days)
// is waited as it says, not as the remainder of a wrapped int.
TEST_F(SessionTest, ACloseTimeoutPastPollsRangeIsNotWrapped) {
  // 2^32 ms + 1 ms: 1 ms once wrapped.
  Open({}, absl::Milliseconds((int64_t{1} << 32) + 1));
  absl::Notification closed;
  std::thread daemon([&] {
    ReceivedFrame end = peer_.Next();
    ASSERT_TRUE(end.frame.has_session_end());
    // Close gets up to 2 s to return without this reply; it must wait.
    closed.WaitForNotificationWithTimeout(absl::Seconds(2));
    av1::Frame reply;
    reply.set_seq(end.frame.seq());
    reply.mutable_session_end()->set_message("done");
    peer_.Send(reply);
  });
  absl::Status s = session_->Close();
  closed.Notify();
  daemon.join();
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(SessionTest, CloseGivesUpOnADaemonThatDoesNotAnswer) {
  Open({}, absl::Milliseconds(50));
  EXPECT_EQ(session_->Close().code(), absl::StatusCode::kDeadlineExceeded);
  ReceivedFrame end = peer_.Next();
  EXPECT_TRUE(end.frame.has_session_end());
  EXPECT_TRUE(end.frame.session_end().release());
  EXPECT_TRUE(session_->Close().ok());  // idempotent
}

}  // namespace
}  // namespace kvbroker::engine
