// The frame codec against real SOCK_SEQPACKET pairs: round trips with and
// without fds, and every malformed packet refused with its typed error and
// no fd left open.

#include "attach/frame.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "allocator/failure.h"
#include "attach/testing/fd_count.h"
#include "attach/testing/raw_packet.h"
#include "gtest/gtest.h"

namespace kvbroker::attach {
namespace {

using ::kvbroker::testing::SendRaw;

using ::kvbroker::testing::CountOpenFds;

int OpenFds() {
  absl::StatusOr<int> n = CountOpenFds();
  EXPECT_TRUE(n.ok()) << n.status();
  return n.value_or(-1);
}

UniqueFd Memfd() { return UniqueFd(memfd_create("frame_test", MFD_CLOEXEC)); }

ino_t Inode(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  return st.st_ino;
}

std::string Header(uint32_t length) {
  std::string h(kFrameMagic, 4);
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<char>(length >> (8 * i)));
  return h;
}

std::string Serialized(const v1::Frame& frame) {
  std::string body = frame.SerializeAsString();
  return Header(static_cast<uint32_t>(body.size())) + body;
}

v1::Frame HelloFrame() {
  v1::Frame f;
  f.set_seq(7);
  f.mutable_hello()->set_protocol_version(kProtocolVersion);
  f.mutable_hello()->set_holder("engine-0");
  f.mutable_hello()->set_pid(1234);
  return f;
}

class FrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = FrameChannel::Pair();
    ASSERT_TRUE(pair.ok()) << pair.status();
    a_.emplace(std::move(pair->first));
    b_.emplace(std::move(pair->second));
    fds_before_ = OpenFds();
  }
  void TearDown() override { EXPECT_EQ(OpenFds(), fds_before_); }

  // Expects the next packet to be refused with `error`, then proves the
  // channel still works by a good frame.
  void ExpectRefused(v1::ProtocolError error) {
    absl::StatusOr<ReceivedFrame> got = b_->Receive();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(ProtocolErrorOf(got.status()), error) << got.status();
    ASSERT_TRUE(a_->Send(HelloFrame()).ok());
    got = b_->Receive();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->frame.hello().holder(), "engine-0");
  }

  std::optional<FrameChannel> a_, b_;
  int fds_before_ = 0;
};

TEST_F(FrameTest, RoundTripWithoutFds) {
  ASSERT_TRUE(a_->Send(HelloFrame()).ok());
  absl::StatusOr<ReceivedFrame> got = b_->Receive();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->frame.seq(), 7u);
  EXPECT_EQ(got->frame.hello().pid(), 1234);
  EXPECT_TRUE(got->fds.empty());
}

// The largest session exchanges, Free(256) and Alloc(256) (its ids on 4
// pages): each end recycles its frame arena before an exchange
// (RecycleFrameArena: reset only past half of its first block) and holds
// one frame received and one built there. Even with just under half of the
// block used by earlier exchanges, each fits what is left, so an exchange
// takes no heap memory for its frames.
TEST_F(FrameTest, TheLargestExchangesFitTheFrameArenasFirstBlock) {
  alignas(std::max_align_t) char block[kFrameArenaBytes];
  google::protobuf::Arena arena(FrameArenaOptions(block, sizeof(block)));
  v1::Frame alloc_reply;
  for (int page = 0; page < 4; ++page) {
    kvbroker::v1::PageBlocks* p =
        alloc_reply.mutable_alloc_reply()->add_pages();
    p->set_page_id(1000 + page);
    for (int i = 0; i < 64; ++i) p->add_block_ids(64000 + page * 64 + i);
  }
  alloc_reply.mutable_alloc_reply()->set_num_blocks(256);
  alloc_reply.mutable_alloc_reply()->set_pool_uid(std::string(36, 'u'));
  v1::Frame free_request;
  for (int i = 0; i < 256; ++i) {
    free_request.mutable_free()->add_block_ids(64000 + i);
  }
  for (const v1::Frame* sent : {&free_request, &alloc_reply}) {
    arena.Reset();
    // Earlier exchanges' frames, up to the most RecycleFrameArena keeps.
    google::protobuf::Arena::CreateArray<char>(
        &arena, kFrameArenaBytes / 2 - arena.SpaceUsed());
    ASSERT_EQ(arena.SpaceUsed(), kFrameArenaBytes / 2);
    RecycleFrameArena(&arena);
    ASSERT_EQ(arena.SpaceUsed(), kFrameArenaBytes / 2) << "kept, not reset";
    auto* built = google::protobuf::Arena::CreateMessage<v1::Frame>(&arena);
    if (sent == &free_request) {
      built->mutable_free_reply()->set_freed_blocks(256);
    } else {
      built->mutable_alloc()->set_num_blocks(256);
    }
    ASSERT_TRUE(a_->Send(*sent).ok());
    auto* got = google::protobuf::Arena::CreateMessage<v1::Frame>(&arena);
    std::vector<UniqueFd> fds;
    ASSERT_TRUE(b_->ReceiveInto(got, &fds).ok());
    EXPECT_EQ(got->SerializeAsString(), sent->SerializeAsString());
    EXPECT_EQ(arena.SpaceAllocated(), kFrameArenaBytes)
        << got->body_case() << ": " << arena.SpaceUsed() << " B used";
    // Past half: the next exchange starts on an empty arena.
    RecycleFrameArena(&arena);
    EXPECT_EQ(arena.SpaceUsed(), 0u);
  }
}

TEST_F(FrameTest, PagesMappedCarriesFdsToTheSameFiles) {
  std::vector<UniqueFd> files;
  std::vector<int> raw;
  for (int i = 0; i < 3; ++i) {
    files.push_back(Memfd());
    raw.push_back(files.back().get());
  }
  v1::Frame f;
  f.mutable_pages_mapped()->add_page_ids(4);
  f.mutable_pages_mapped()->add_page_ids(5);
  f.mutable_pages_mapped()->add_page_ids(9);
  ASSERT_TRUE(a_->Send(f, raw).ok());
  absl::StatusOr<ReceivedFrame> got = b_->Receive();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->fds.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(got->fds[i].get(), raw[i]);
    EXPECT_EQ(Inode(got->fds[i].get()), Inode(raw[i]));
    EXPECT_EQ(fcntl(got->fds[i].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  }
  EXPECT_EQ(got->frame.pages_mapped().page_ids_size(), 3);
  // 3 sent (still ours) + 3 received.
  EXPECT_EQ(OpenFds(), fds_before_ + 6);
}

TEST_F(FrameTest, TwoHundredFiftyFdsPass) {
  std::vector<UniqueFd> files;
  std::vector<int> raw;
  UniqueFd one = Memfd();
  for (int i = 0; i < kMaxFdsPerFrame; ++i) raw.push_back(one.get());
  v1::Frame f;
  f.mutable_pages_mapped()->add_page_ids(0);
  ASSERT_TRUE(a_->Send(f, raw).ok());
  absl::StatusOr<ReceivedFrame> got = b_->Receive();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->fds.size(), static_cast<size_t>(kMaxFdsPerFrame));
}

TEST_F(FrameTest, MoreThan250FdsAreRefusedAndClosed) {
  UniqueFd one = Memfd();
  std::vector<int> raw(253, one.get());
  v1::Frame f;
  f.mutable_pages_mapped()->add_page_ids(0);
  SendRaw(a_->fd(), Serialized(f), raw);
  ExpectRefused(v1::TOO_MANY_FDS);
}

TEST_F(FrameTest, SendRefusesTooManyFdsAndOversizedFrames) {
  UniqueFd one = Memfd();
  std::vector<int> raw(kMaxFdsPerFrame + 1, one.get());
  v1::Frame f;
  f.mutable_pages_mapped()->add_page_ids(0);
  EXPECT_EQ(a_->Send(f, raw).code(), absl::StatusCode::kInvalidArgument);
  v1::Frame big;
  big.mutable_hello()->set_token(std::string(kMaxFrameBytes, 'x'));
  EXPECT_EQ(a_->Send(big).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FrameTest, FdsWithAMessageThatCarriesNoneAreClosed) {
  UniqueFd one = Memfd();
  UniqueFd two = Memfd();
  SendRaw(a_->fd(), Serialized(HelloFrame()), {one.get(), two.get()});
  ExpectRefused(v1::UNEXPECTED_FDS);
}

TEST_F(FrameTest, Garbage) {
  SendRaw(a_->fd(), "this is not a frame at all");
  ExpectRefused(v1::MALFORMED_FRAME);
}

TEST_F(FrameTest, GarbageWithFdsClosesThem) {
  UniqueFd one = Memfd();
  SendRaw(a_->fd(), "\x01\x02\x03\x04\x05\x06\x07\x08garbage", {one.get()});
  ExpectRefused(v1::MALFORMED_FRAME);
}

TEST_F(FrameTest, BodyThatDoesNotParse) {
  const std::string body = "\xff\xff\xff\xff\xff";
  SendRaw(a_->fd(), Header(body.size()) + body);
  ExpectRefused(v1::MALFORMED_FRAME);
}

TEST_F(FrameTest, BytesPastTheStatedLength) {
  SendRaw(a_->fd(), Serialized(HelloFrame()) + "tail");
  ExpectRefused(v1::MALFORMED_FRAME);
}

TEST_F(FrameTest, ShorterThanTheHeader) {
  SendRaw(a_->fd(), "KVA");
  ExpectRefused(v1::FRAME_TRUNCATED);
}

TEST_F(FrameTest, EmptyPacket) {
  SendRaw(a_->fd(), "");
  ExpectRefused(v1::FRAME_TRUNCATED);
}

TEST_F(FrameTest, ShorterThanTheStatedLength) {
  std::string packet = Serialized(HelloFrame());
  packet.resize(packet.size() - 3);
  SendRaw(a_->fd(), packet);
  ExpectRefused(v1::FRAME_TRUNCATED);
}

TEST_F(FrameTest, OversizedPacket) {
  SendRaw(a_->fd(), Header(kMaxFrameBytes + 100) +
                        std::string(kMaxFrameBytes + 100, '\0'));
  ExpectRefused(v1::FRAME_TOO_LARGE);
}

TEST_F(FrameTest, HeaderStatingTooMuch) {
  SendRaw(a_->fd(), Header(0xffffffffu) + "abc");
  ExpectRefused(v1::FRAME_TOO_LARGE);
}

TEST_F(FrameTest, UnknownMessage) {
  // Field 999, varint 1: a body from a newer protocol.
  const std::string body = "\xb8\x3e\x01";
  SendRaw(a_->fd(), Header(body.size()) + body);
  ExpectRefused(v1::UNKNOWN_MESSAGE);
}

TEST_F(FrameTest, EmptyFrameIsAnUnknownMessage) {
  SendRaw(a_->fd(), Header(0));
  ExpectRefused(v1::UNKNOWN_MESSAGE);
}

TEST_F(FrameTest, PeerClosed) {
  a_.reset();
  absl::StatusOr<ReceivedFrame> got = b_->Receive();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
  fds_before_ -= 1;
}

TEST(ErrorTest, FailureRoundTrip) {
  absl::Status s = MakeFailure(FailureReason::kPoolExhausted, "no room",
                               {{"requested_blocks", "5"}});
  v1::Error e = ToError(s);
  EXPECT_EQ(e.reason(), kvbroker::v1::POOL_EXHAUSTED);
  EXPECT_EQ(e.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  absl::Status back = FromError(e);
  EXPECT_EQ(back.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(GetReason(back), FailureReason::kPoolExhausted);
  EXPECT_EQ(GetFailure(back)->metadata.at("requested_blocks"), "5");
  EXPECT_EQ(back.message(), "no room");
}

TEST(ErrorTest, ProtocolErrorRoundTrip) {
  absl::Status s = ProtocolFailure(v1::UNEXPECTED_MESSAGE, "alloc first");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  v1::Error e = ToError(s);
  EXPECT_EQ(e.protocol_error(), v1::UNEXPECTED_MESSAGE);
  EXPECT_EQ(e.reason(), kvbroker::v1::REASON_UNSPECIFIED);
  absl::Status back = FromError(e);
  EXPECT_EQ(ProtocolErrorOf(back), v1::UNEXPECTED_MESSAGE);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvbroker::attach
