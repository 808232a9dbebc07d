// Fuzz driver: the attach protocol (kvbrokerd --attach_socket). One
// in-process AttachServer (attach/attach_server.h) over a host-backend
// broker with two pools and one bearer token listens on a socket in a
// temporary directory for the whole process; every input is one connection
// to it, written as a misbehaving engine would write it.
//
// Grammar. The first byte chooses a preamble: with bit 0 set the driver
// first says a valid Hello (the token, holder "fuzz-engine") and attaches to
// pool "kv" or, with bit 1, "other" (which the token may not use), so that
// the rest of the input reaches pool operations. Then, until the input is
// used up, each packet starts with a byte whose value modulo 5 picks:
//   0  raw bytes (up to 255), no header added;
//   1  a header-valid frame: "KVA1", the stated length, and a Frame parsed
//      from up to 1 KiB of input (the bytes themselves when they do not
//      parse), optionally with the stated length off by a small amount;
//   2  a well-formed request built from a few input bytes: Hello, Attach,
//      Alloc, Free, Reserve, ReleaseReservation (of a reservation the
//      daemon returned, or a made-up id), Capacity, RevokeAck (of the last
//      Revoke the daemon sent, or made-up ids), SessionEnd, or a message
//      only the daemon sends; the driver waits for its answer;
//   3  a packet of type 0, 1 or 2 carrying 1 to 253 fds (dups of
//      /dev/null; above 250 is past kMaxFdsPerFrame);
//   4  half-close the connection's writing side and stop.
// A reader thread takes every frame the daemon sends (closing the fds that
// come with PagesMapped) until the daemon closes the connection. After the
// last packet the driver half-closes the connection and waits for that
// close, which the daemon does only after the session has ended and its
// holder's blocks were freed (reattach grace is capped at zero here).
//
// After every input the driver aborts, which libFuzzer reports as a crash,
// unless:
//   - the server has no live session and no holder left;
//   - every pool passes PagePool::CheckInvariants, has no allocated block,
//     and, once the reservations the daemon announced are released, no
//     reserved block and the available blocks it started with;
//   - the process has exactly the open fds it had before the input (no
//     received fd, socket or eventfd leaked by the daemon);
//   - a fresh connection still gets a HelloReply, an AttachReply and a
//     CapacityReply with the exact empty pool, and its SessionEnd answered.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/broker.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "attach/attach_server.h"
#include "attach/frame.h"
#include "attach/testing/fd_count.h"
#include "attach/testing/raw_packet.h"
#include "fuzz/byte_reader.h"
#include "proto/kvbroker/v1/attach.pb.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "server/access.h"

namespace kvbroker {
namespace fuzz {
namespace {

namespace av1 = ::kvbroker::attach::v1;
namespace kv1 = ::kvbroker::v1;

constexpr char kToken[] = "fuzz-token-0123456789";
constexpr char kPools[2][6] = {"kv", "other"};
// Typed requests use seqs from here up, apart from the fuzzed frames' own.
constexpr uint64_t kTypedSeqBase = uint64_t{1} << 48;

// KVB_FUZZ_TRACE=1: every frame the daemon sends, on stderr.
const bool kTrace = std::getenv("KVB_FUZZ_TRACE") != nullptr;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "attach_fuzzer: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// P = 2 MiB, B = 256 KiB, L = 2, K = 2 on devices {0, 1}: 8 blocks per page,
// N = 40 (5 pages).
PoolConfig Config(const std::string& name) {
  PoolConfig c;
  c.name = name;
  c.page_size = MiB(2);
  c.block_bytes = KiB(256);
  c.num_layers = 2;
  c.num_kv_buffers = 2;
  c.devices = {0, 1};
  c.max_blocks = 40;
  c.tokens_per_block = 16;
  return c;
}

struct World {
  HostBackend backend{[] {
    HostBackendOptions o;
    o.device_count = 2;
    o.device_total = MiB(256);
    return o;
  }()};
  std::unique_ptr<Broker> broker;
  std::unique_ptr<attach::AttachServer> server;
  std::string socket_path;
  int64_t initial_available[2] = {0, 0};
  int baseline_fds = 0;  // open before the current input
};

World* TheWorld() {
  static World* world = [] {
    auto* w = new World();
    BrokerOptions bo;
    bo.start_worker = false;
    bo.min_idle_pages = 0;
    bo.max_idle_pages = 0;
    absl::StatusOr<std::unique_ptr<Broker>> b = Broker::Create(&w->backend, bo);
    if (!b.ok()) Die(b.status().ToString());
    w->broker = *std::move(b);
    for (int i = 0; i < 2; ++i) {
      if (auto p = w->broker->CreatePool(Config(kPools[i])); !p.ok()) {
        Die(p.status().ToString());
      }
    }
    // sun_path holds 108 bytes; a test's TMPDIR may be longer.
    char dir[] = "/tmp/kvb-attach-fuzz-XXXXXX";
    if (mkdtemp(dir) == nullptr) Die(strerror(errno));
    w->socket_path = std::string(dir) + "/attach.sock";
    // The server lives until the process exits; its socket file and
    // directory go with it.
    std::atexit([] {
      const std::string& path = TheWorld()->socket_path;
      unlink(path.c_str());
      rmdir(path.substr(0, path.rfind('/')).c_str());
    });
    attach::AttachServerOptions o;
    o.socket_path = w->socket_path;
    o.max_reattach_grace = absl::ZeroDuration();
    o.reap_interval = absl::Milliseconds(1);
    kv1::AuthTokensFile tokens;
    kv1::AuthToken* t = tokens.add_tokens();
    t->set_name("fuzz-engine");
    t->set_token(kToken);
    t->add_pools("kv");
    absl::StatusOr<AccessPolicy> policy = AccessPolicy::Create(tokens);
    if (!policy.ok()) Die(policy.status().ToString());
    o.access = std::make_shared<AccessPolicy>(*std::move(policy));
    absl::StatusOr<std::unique_ptr<attach::AttachServer>> s =
        attach::AttachServer::Start(w->broker.get(), o);
    if (!s.ok()) Die(s.status().ToString());
    w->server = *std::move(s);
    for (int i = 0; i < 2; ++i) {
      w->initial_available[i] = (*w->broker->GetPool(kPools[i]))
                                    ->Capacity()
                                    ->available_blocks.value();
    }
    return w;
  }();
  return world;
}

std::string Packet(const std::string& body) {
  std::string out(attach::kFrameMagic, 4);
  const uint32_t n = body.size();
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  return out + body;
}

std::string Packet(const av1::Frame& frame) {
  return Packet(frame.SerializeAsString());
}

// What the daemon said on the fuzzed connection, kept by the reader thread.
class Replies {
 public:
  // Reads until the daemon closes the connection.
  void ReadAll(attach::FrameChannel* channel) {
    while (true) {
      absl::StatusOr<attach::ReceivedFrame> got = channel->Receive();
      if (!got.ok()) {
        if (attach::ProtocolErrorOf(got.status()) ==
            av1::PROTOCOL_ERROR_UNSPECIFIED) {
          break;
        }
        Die(absl::StrCat("the daemon sent a bad frame: ",
                         got.status().ToString()));
      }
      const av1::Frame& f = got->frame;
      if (kTrace) {
        std::fprintf(stderr, "daemon: %s (%zu fds)\n",
                     f.ShortDebugString().c_str(), got->fds.size());
      }
      absl::MutexLock lock(&mu_);
      if (f.has_reserve_reply()) {
        reservations_.insert(f.reserve_reply().reservation_id());
      }
      if (f.has_revoke()) last_revoke_ = f.revoke();
      if (f.seq() != 0) answered_.insert(f.seq());
    }
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  // Until the daemon answered `seq` or closed the connection.
  void Await(uint64_t seq) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || answered_.count(seq) > 0;
    };
    mu_.Await(absl::Condition(&done));
  }

  std::set<std::string> reservations() const {
    absl::MutexLock lock(&mu_);
    return reservations_;
  }
  std::string any_reservation() const {
    absl::MutexLock lock(&mu_);
    return reservations_.empty() ? "" : *reservations_.rbegin();
  }
  av1::Revoke last_revoke() const {
    absl::MutexLock lock(&mu_);
    return last_revoke_;
  }

 private:
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<uint64_t> answered_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> reservations_ ABSL_GUARDED_BY(mu_);
  av1::Revoke last_revoke_ ABSL_GUARDED_BY(mu_);
};

// A well-formed request chosen by the input. Returns whether the daemon
// answers it (RevokeAck, when accepted, is not answered).
bool TypedFrame(ByteReader& in, const Replies& replies, av1::Frame* f) {
  const std::string pool = in.Bool() ? "" : kPools[in.Range(0, 1)];
  switch (in.Range(0, 10)) {
    case 0: {
      av1::Hello* h = f->mutable_hello();
      h->set_protocol_version(in.Range(0, 3));
      h->set_token(in.Bool() ? kToken : in.Utf8(24));
      h->set_holder(in.Bool() ? "fuzz-engine" : in.Utf8(8));
      h->set_pid(in.Range(-1, 1 << 20));
      if (in.Bool()) h->mutable_reattach_grace()->set_seconds(in.Range(-1, 2));
      return true;
    }
    case 1: {
      av1::AttachRequest* a = f->mutable_attach();
      a->set_pool(kPools[in.Range(0, 1)]);
      for (int i = in.Range(0, 3); i > 0; --i) a->add_devices(in.Range(-1, 2));
      if (in.Bool()) {
        a->set_reservation_id(replies.any_reservation());
        a->set_reservation_blocks(in.Range(-1, 12));
        a->set_request_id(in.Utf8(4));
      }
      return true;
    }
    case 2: {
      kv1::AllocRequest* a = f->mutable_alloc();
      a->set_pool(pool);
      a->set_num_blocks(in.Range(-1, 48));
      a->set_request_id(in.Utf8(4));
      if (in.Bool()) a->set_reservation_id(replies.any_reservation());
      if (in.Bool()) a->set_expected_generation(in.Range(0, 8));
      a->set_block_runs(in.Bool());
      return true;
    }
    case 3: {
      kv1::FreeRequest* r = f->mutable_free();
      r->set_pool(pool);
      for (int i = in.Range(0, 6); i > 0; --i) {
        r->add_block_ids(in.Range(-1, 41));
      }
      // Runs, well-formed or not: odd lengths, counts of 0 or below, runs
      // past the pool and past the session's bound.
      for (int i = in.Range(0, 5); i > 0; --i) {
        r->add_block_runs(in.Bool() ? in.Range(-2, 41)
                                    : in.Range(-1, 1 << 15));
      }
      r->set_request_id(in.Utf8(4));
      return true;
    }
    case 4: {
      kv1::ReserveRequest* r = f->mutable_reserve();
      r->set_pool(pool);
      r->set_num_blocks(in.Range(-1, 48));
      r->mutable_ttl()->set_seconds(in.Range(-1, 3600));
      r->set_request_id(in.Utf8(4));
      return true;
    }
    case 5: {
      kv1::ReleaseReservationRequest* r = f->mutable_release_reservation();
      r->set_pool(pool);
      r->set_reservation_id(in.Bool() ? replies.any_reservation() : in.Utf8(8));
      return true;
    }
    case 6:
      f->mutable_capacity()->set_pool(pool);
      f->mutable_capacity()->set_max_pages(in.Range(-1, 8));
      return true;
    case 7: {
      av1::RevokeAck* ack = f->mutable_revoke_ack();
      const av1::Revoke revoke = replies.last_revoke();
      ack->set_revoke_id(in.Bool() ? revoke.revoke_id() : in.Range(0, 4));
      if (in.Bool()) {
        *ack->mutable_page_ids() = revoke.page_ids();
      } else {
        for (int i = in.Range(0, 3); i > 0; --i) {
          ack->add_page_ids(in.Range(-1, 5));
        }
      }
      return false;
    }
    case 8: f->mutable_session_end()->set_release(in.Bool()); return true;
    case 9:
      f->mutable_pages_mapped()->add_page_ids(in.Range(-1, 5));
      return true;
    default: f->mutable_capacity_reply(); return true;
  }
}

class Connection {
 public:
  explicit Connection(const std::string& path) {
    absl::StatusOr<attach::FrameChannel> c =
        attach::FrameChannel::Connect(path);
    if (!c.ok()) Die(absl::StrCat("connect: ", c.status().ToString()));
    channel_ = std::make_unique<attach::FrameChannel>(*std::move(c));
    reader_ = std::thread([this] { replies_.ReadAll(channel_.get()); });
  }
  ~Connection() {
    HalfClose();
    AwaitClosed();
  }

  // Sends one packet; the daemon may have closed the connection already.
  void Send(const std::string& bytes, const std::vector<int>& fds = {}) {
    const int error = testing::TrySendRaw(channel_->fd(), bytes, fds);
    if (error != 0 && error != EPIPE && error != ECONNRESET &&
        !(error == EINVAL && fds.size() > 253)) {
      Die(absl::StrCat("send: ", strerror(error)));
    }
  }
  void SendAndAwait(av1::Frame frame, bool answered,
                    const std::vector<int>& fds = {}) {
    const uint64_t seq = kTypedSeqBase + ++next_seq_;
    frame.set_seq(seq);
    Send(Packet(frame), fds);
    if (answered && fds.empty()) replies_.Await(seq);
  }
  void HalfClose() { shutdown(channel_->fd(), SHUT_WR); }
  void AwaitClosed() {
    if (reader_.joinable()) reader_.join();
  }
  const Replies& replies() const { return replies_; }

 private:
  std::unique_ptr<attach::FrameChannel> channel_;
  Replies replies_;
  std::thread reader_;
  uint64_t next_seq_ = 0;
};

// One packet of kind 0, 1 or 2 (see the file comment).
void SendOne(ByteReader& in, int kind, Connection& conn,
             const std::vector<int>& fds) {
  switch (kind) {
    case 0: conn.Send(in.Bytes(255), fds); return;
    case 1: {
      const int skew = in.Range(-2, 2) * (in.Range(0, 3) == 0 ? 1 : 0);
      const std::string bytes = in.Bytes(1024);
      av1::Frame frame;
      std::string body =
          frame.ParseFromString(bytes) ? frame.SerializeAsString() : bytes;
      std::string packet = Packet(body);
      const uint32_t stated = body.size() + skew;
      for (int i = 0; i < 4; ++i)
        packet[4 + i] = static_cast<char>(stated >> (8 * i));
      conn.Send(packet, fds);
      return;
    }
    default: {
      av1::Frame frame;
      const bool answered = TypedFrame(in, conn.replies(), &frame);
      conn.SendAndAwait(std::move(frame), answered, fds);
      return;
    }
  }
}

void RunInput(ByteReader& in, Connection& conn) {
  const uint8_t preamble = in.Byte();
  if (preamble & 1) {
    av1::Frame hello;
    hello.mutable_hello()->set_protocol_version(attach::kProtocolVersion);
    hello.mutable_hello()->set_token(kToken);
    hello.mutable_hello()->set_holder("fuzz-engine");
    conn.SendAndAwait(hello, true);
    av1::Frame attach;
    attach.mutable_attach()->set_pool(kPools[(preamble >> 1) & 1]);
    conn.SendAndAwait(attach, true);
  }
  while (!in.empty()) {
    const int op = in.Byte() % 5;
    if (op == 4) {
      conn.HalfClose();
      return;
    }
    if (op < 3) {
      SendOne(in, op, conn, {});
      continue;
    }
    const uint8_t n = in.Byte();
    const int count = n < 192 ? 1 + n % 4 : 240 + n % 14;  // 1..4, 240..253
    std::vector<int> fds;
    for (int i = 0; i < count; ++i) {
      const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) Die(absl::StrCat("open /dev/null: ", strerror(errno)));
      fds.push_back(fd);
    }
    SendOne(in, in.Range(0, 2), conn, fds);
    for (int fd : fds) close(fd);
  }
}

// A fresh engine: Hello, Attach to "kv", Capacity, SessionEnd; each answered
// as the protocol says, with the pool back to where it started.
void Probe(World& w) {
  absl::StatusOr<attach::FrameChannel> c =
      attach::FrameChannel::Connect(w.socket_path);
  if (!c.ok()) Die(absl::StrCat("probe connect: ", c.status().ToString()));
  auto expect = [&](uint64_t seq, av1::Frame::BodyCase body) {
    while (true) {
      absl::StatusOr<attach::ReceivedFrame> got = c->Receive();
      if (!got.ok()) Die(absl::StrCat("probe: ", got.status().ToString()));
      // PagesMapped frames complete an AttachReply (same seq).
      if (got->frame.has_pages_mapped()) continue;
      if (got->frame.seq() != seq || got->frame.body_case() != body) {
        Die(absl::StrCat("probe: expected body ", body, " seq ", seq, ", got ",
                         got->frame.ShortDebugString()));
      }
      return got->frame;
    }
  };
  av1::Frame f;
  f.set_seq(1);
  f.mutable_hello()->set_protocol_version(attach::kProtocolVersion);
  f.mutable_hello()->set_token(kToken);
  f.mutable_hello()->set_holder("probe");
  if (!c->Send(f).ok()) Die("probe: send Hello");
  expect(1, av1::Frame::kHelloReply);
  f.Clear();
  f.set_seq(2);
  f.mutable_attach()->set_pool("kv");
  if (!c->Send(f).ok()) Die("probe: send Attach");
  const av1::Frame reply = expect(2, av1::Frame::kAttachReply);
  if (reply.attach_reply().held_size() != 0) Die("probe: reattached blocks");
  f.Clear();
  f.set_seq(3);
  f.mutable_capacity();
  if (!c->Send(f).ok()) Die("probe: send Capacity");
  const av1::Frame cap = expect(3, av1::Frame::kCapacityReply);
  const kv1::CapacitySnapshot& s = cap.capacity_reply().capacity();
  if (s.allocated_blocks() != 0 || s.reserved_blocks() != 0 ||
      s.available_blocks() != w.initial_available[0]) {
    Die(absl::StrCat("probe: capacity ", s.ShortDebugString()));
  }
  f.Clear();
  f.set_seq(4);
  f.mutable_session_end()->set_release(true);
  if (!c->Send(f).ok()) Die("probe: send SessionEnd");
  expect(4, av1::Frame::kSessionEnd);
  absl::StatusOr<attach::ReceivedFrame> end = c->Receive();
  if (end.ok() || end.status().code() != absl::StatusCode::kCancelled) {
    Die("probe: the daemon did not close after SessionEnd");
  }
}

// Until the server has no session: the daemon closes a connection only
// after its session ended, but the probe's own close is seen first.
void AwaitNoSessions(World& w) {
  while (!w.server->Sessions().empty()) absl::SleepFor(absl::Microseconds(50));
}

void Check(World& w) {
  AwaitNoSessions(w);
  if (!w.server->Holders().empty()) {
    Die(absl::StrCat("holder left: ", w.server->Holders()[0].holder));
  }
  for (int i = 0; i < 2; ++i) {
    std::shared_ptr<PagePool> pool = *w.broker->GetPool(kPools[i]);
    if (absl::Status s = pool->CheckInvariants(); !s.ok()) Die(s.ToString());
    absl::StatusOr<CapacitySnapshot> c = pool->Capacity();
    if (!c.ok()) Die(c.status().ToString());
    if (c->allocated_blocks.value() != 0) {
      Die(absl::StrCat(kPools[i], ": ", c->allocated_blocks.value(),
                       " blocks still allocated after the session"));
    }
  }
}

void ReleaseReservations(World& w, const std::set<std::string>& ids) {
  for (const std::string& id : ids) {
    for (const char* name : kPools) {
      (*w.broker->GetPool(name))->ReleaseReservation(id).IgnoreError();
    }
  }
  for (int i = 0; i < 2; ++i) {
    std::shared_ptr<PagePool> pool = *w.broker->GetPool(kPools[i]);
    if (absl::Status s = pool->CheckInvariants(); !s.ok()) Die(s.ToString());
    CapacitySnapshot c = *pool->Capacity();
    if (c.reserved_blocks.value() != 0 ||
        c.available_blocks.value() != w.initial_available[i]) {
      Die(absl::StrCat(kPools[i], ": reserved ", c.reserved_blocks.value(),
                       ", available ", c.available_blocks.value(), " (was ",
                       w.initial_available[i],
                       ") once every announced "
                       "reservation was released"));
    }
  }
}

void CheckFds(World& w) {
  absl::StatusOr<int> fds = testing::CountOpenFds();
  if (!fds.ok()) Die(fds.status().ToString());
  if (*fds != w.baseline_fds) {
    Die(absl::StrCat(*fds, " fds open, ", w.baseline_fds, " before"));
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace kvbroker

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvbroker::fuzz;  // NOLINT
  World& w = *TheWorld();
  // Counted per input: between inputs libFuzzer may open descriptors of
  // its own (the symbolizer's pipes when it names a new function).
  w.baseline_fds = *kvbroker::testing::CountOpenFds();
  ByteReader in(data, size);
  std::set<std::string> reservations;
  {
    // The daemon closes the connection only once the session ended and its
    // holder's blocks were freed.
    Connection conn(w.socket_path);
    RunInput(in, conn);
    conn.HalfClose();
    conn.AwaitClosed();
    reservations = conn.replies().reservations();
  }
  Check(w);
  ReleaseReservations(w, reservations);
  CheckFds(w);
  Probe(w);
  AwaitNoSessions(w);
  Check(w);
  CheckFds(w);
  return 0;
}
