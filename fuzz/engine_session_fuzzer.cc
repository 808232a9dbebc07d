// Fuzz driver: the engine library's Session (engine/session.h) against a
// daemon that breaks the attach protocol. The engine library runs inside an
// inference engine, so whatever the daemon sends must end in a typed error,
// never in a crash, a hang, a leaked fd, or a block handed out that the
// engine cannot touch.
//
// One listening socket (in a temporary directory) and four page bundles
// (memfds, plus one half a bundle long) live for the whole process. Each
// input is one session: the engine connects, attaches to pool "kv" and runs
// a short script of calls on the main thread, while a peer thread plays the
// daemon, answering every request the engine sends as the input says.
//
// Grammar. The first byte gives the engine's script length (0 to 15), the
// next that many bytes its calls: byte % 8 picks Alloc, AllocInto, the
// proto Alloc, Free of blocks it holds, Reserve, ReleaseReservation,
// Capacity or ProcessEvents, and byte / 8 % 6 the block count. The rest of
// the input is the peer's: for each frame the engine sends that wants an
// answer, a byte says how many unasked frames go first (0 to 3), each one
// of PagesMapped (page ids in or out of the pool, right or wrong fd count,
// the short memfd), Revoke, the daemon's SessionEnd, an Error, raw bytes, a
// reply with another seq, an unexpected HelloReply, or a Frame parsed from
// input bytes; then the answer itself: the well-formed reply (its numbers
// from the input: block ids in and out of range, counts that disagree with
// the ids, a PoolLayout with one field changed, AttachReply's pages), a
// reply of the wrong kind, or a hang-up. An input used up answers every
// request well-formed, so every prefix runs to the end.
//
// The driver aborts (a crash to libFuzzer) unless, after every input:
//   - each block id a successful Alloc or Attach returned can be read and
//     written at the start and end of every layer and buffer (a fault there
//     is a crash of its own);
//   - the process has exactly the fds it had before the input (received
//     fds closed, the session's socket closed).

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "attach/frame.h"
#include "attach/testing/fd_count.h"
#include "attach/testing/raw_packet.h"
#include "attach/unique_fd.h"
#include "engine/session.h"
#include "fuzz/byte_reader.h"
#include "proto/kvbroker/v1/attach.pb.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {
namespace fuzz {
namespace {

namespace av1 = ::kvbroker::attach::v1;
namespace kv1 = ::kvbroker::v1;

// P = 64 KiB, B = 16 KiB, L = 2, K = 2: bundles of 256 KiB, 4 blocks a
// page, T = 4 pages, N = 16 blocks.
constexpr int64_t kPage = 64 << 10;
constexpr int64_t kBlock = 16 << 10;
constexpr int64_t kLayers = 2;
constexpr int64_t kBuffers = 2;
constexpr int64_t kBundle = kPage * kLayers * kBuffers;
constexpr int64_t kPages = 4;
constexpr int64_t kBlocks = 16;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "engine_session_fuzzer: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

av1::PoolLayout Layout() {
  av1::PoolLayout l;
  l.set_pool("kv");
  l.set_pool_uid("uid-1");
  l.set_backend("host");
  l.set_page_size(kPage);
  l.set_block_bytes(kBlock);
  l.set_num_layers(kLayers);
  l.set_num_kv_buffers(kBuffers);
  l.set_bundle_bytes(kBundle);
  l.set_block_stride_bytes(kBlock * kLayers * kBuffers);
  l.set_layer_offset_bytes(kBlock * kBuffers);
  l.set_buffer_offset_bytes(kBlock);
  l.set_page_count(kPages);
  l.set_max_blocks(kBlocks);
  l.set_tokens_per_block(16);
  l.set_virtual_bytes_per_device(kPages * kBundle);
  l.add_devices()->set_uuid("host-0");
  return l;
}

struct World {
  std::string dir, socket_path;
  UniqueFd listener;
  UniqueFd bundles[kPages];
  UniqueFd short_bundle;  // half a bundle: refused by the host mapper
};

UniqueFd MemFd(int64_t bytes) {
  UniqueFd fd(memfd_create("bundle", MFD_CLOEXEC));
  if (!fd.valid() || ftruncate(fd.get(), bytes) != 0) Die(strerror(errno));
  return fd;
}

World* TheWorld() {
  static World* world = [] {
    auto* w = new World();
    // sun_path holds 108 bytes; a test's TMPDIR may be longer.
    char dir[] = "/tmp/kvb-engine-fuzz-XXXXXX";
    if (mkdtemp(dir) == nullptr) Die(strerror(errno));
    w->dir = dir;
    w->socket_path = w->dir + "/attach.sock";
    w->listener.Reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, w->socket_path.c_str(), sizeof(addr.sun_path) - 1);
    if (bind(w->listener.get(), reinterpret_cast<sockaddr*>(&addr),
             sizeof(addr)) != 0 ||
        listen(w->listener.get(), 1) != 0) {
      Die(absl::StrCat("listen on ", w->socket_path, ": ", strerror(errno)));
    }
    for (auto& b : w->bundles) b = MemFd(kBundle);
    w->short_bundle = MemFd(kBundle / 2);
    std::atexit([] {
      unlink(TheWorld()->socket_path.c_str());
      rmdir(TheWorld()->dir.c_str());
    });
    return w;
  }();
  return world;
}

// The daemon's side of one session, answering as `in` says.
class Peer {
 public:
  Peer(ByteReader in, attach::FrameChannel channel)
      : in_(in), channel_(std::move(channel)) {}

  // Answers the engine's requests until it closes the connection or the
  // input hangs up.
  void Run() {
    while (true) {
      absl::StatusOr<attach::ReceivedFrame> got = channel_.Receive();
      if (!got.ok()) return;  // the engine closed, or sent what we refuse
      const av1::Frame& req = got->frame;
      // Acknowledgements and errors want no answer.
      if (req.seq() == 0 || req.has_revoke_ack() || req.has_error()) continue;
      for (int n = in_.Range(0, 3); n > 0; --n) Unasked(req.seq());
      switch (in_.Range(0, 5)) {
        case 0:
        case 1:
        case 2:
        case 3: Answer(req); break;
        case 4: {
          av1::Frame wrong;
          wrong.set_seq(req.seq());
          wrong.mutable_capacity_reply();
          Send(wrong);
          break;
        }
        case 5: return;  // hang up
      }
    }
  }

 private:
  bool Send(const av1::Frame& f, const std::vector<int>& fds = {}) {
    return channel_.Send(f, fds).ok();
  }

  // Up to three page ids, in the pool or just outside it.
  void PageIds(google::protobuf::RepeatedField<int64_t>* ids) {
    for (int n = in_.Range(0, 3); n > 0; --n) ids->Add(in_.Range(-1, kPages));
  }

  // The fds of a PagesMapped of `ids`: one bundle per page, unless the
  // input says a wrong count or the short memfd.
  std::vector<int> FdsFor(const google::protobuf::RepeatedField<int64_t>& ids) {
    World* w = TheWorld();
    std::vector<int> fds;
    for (int64_t p : ids) {
      fds.push_back(p >= 0 && p < kPages ? w->bundles[p].get()
                                         : w->bundles[0].get());
    }
    switch (in_.Range(0, 7)) {
      case 5:
        if (!fds.empty()) fds.back() = w->short_bundle.get();
        break;
      case 6: fds.push_back(w->bundles[1].get()); break;
      case 7:
        if (!fds.empty()) fds.pop_back();
        break;
    }
    return fds;
  }

  // A frame the engine did not ask for, sent ahead of the answer to `seq`.
  void Unasked(uint64_t seq) {
    av1::Frame f;
    switch (in_.Range(0, 7)) {
      case 0: {
        f.set_seq(in_.Bool() ? seq : 0);
        PageIds(f.mutable_pages_mapped()->mutable_page_ids());
        Send(f, FdsFor(f.pages_mapped().page_ids()));
        return;
      }
      case 1:
        f.mutable_revoke()->set_revoke_id(in_.U64(1));
        PageIds(f.mutable_revoke()->mutable_page_ids());
        break;
      case 2:
        f.mutable_session_end()->set_reason(
            static_cast<av1::SessionEndReason>(in_.Range(0, 3)));
        f.mutable_session_end()->set_message("fuzz");
        break;
      case 3:
        f.set_seq(in_.Bool() ? seq : 0);
        f.mutable_error()->set_protocol_error(
            static_cast<av1::ProtocolError>(in_.Range(0, 10)));
        f.mutable_error()->set_message("fuzz");
        break;
      case 4:
        kvbroker::testing::TrySendRaw(channel_.fd(), in_.Bytes(64));
        return;
      case 5:
        f.set_seq(seq + in_.Range(1, 2));
        f.mutable_alloc_reply()->set_num_blocks(0);
        break;
      case 6: f.mutable_hello_reply()->set_protocol_version(2); break;
      case 7: {
        const std::string bytes = in_.Bytes(128);
        if (!f.ParseFromString(bytes)) return;
        break;
      }
    }
    Send(f);
  }

  // Block ids for a reply: mostly of the pool, some outside it.
  void BlockIds(int n, google::protobuf::RepeatedField<int64_t>* ids) {
    for (int i = 0; i < n; ++i) ids->Add(in_.Range(-1, kBlocks));
  }

  // An Alloc reply for `asked` blocks, as pages or runs, its count right or
  // off by one.
  void FillAlloc(int64_t asked, bool runs, kv1::AllocResponse* r) {
    const int n = static_cast<int>(in_.Range(0, asked + 1));
    if (runs && in_.Bool()) {
      // One run of n ids from a fuzzed start.
      r->add_block_runs(in_.Range(-1, kBlocks));
      r->add_block_runs(n);
    } else {
      kv1::PageBlocks* p = r->add_pages();
      p->set_page_id(in_.Range(0, kPages));
      BlockIds(n, p->mutable_block_ids());
    }
    // Mostly the count of the ids, sometimes one off.
    int64_t count = n;
    if (in_.Range(0, 3) == 0) count += in_.Range(-1, 1);
    r->set_num_blocks(count);
  }

  void ChangeOneField(av1::PoolLayout* l) {
    const int64_t v = static_cast<int64_t>(in_.U64(in_.Range(1, 8)));
    switch (in_.Range(0, 12)) {
      case 0: l->set_page_size(v); break;
      case 1: l->set_block_bytes(v); break;
      case 2: l->set_num_layers(v); break;
      case 3: l->set_num_kv_buffers(v); break;
      case 4: l->set_bundle_bytes(v); break;
      case 5: l->set_block_stride_bytes(v); break;
      case 6: l->set_layer_offset_bytes(v); break;
      case 7: l->set_buffer_offset_bytes(v); break;
      case 8: l->set_page_count(v); break;
      case 9: l->set_max_blocks(v); break;
      case 10: l->set_virtual_bytes_per_device(v); break;
      case 11: l->clear_devices(); break;
      case 12: l->set_backend("tpu"); break;
    }
  }

  void Answer(const av1::Frame& req) {
    av1::Frame f;
    f.set_seq(req.seq());
    switch (req.body_case()) {
      case av1::Frame::kHello:
        f.mutable_hello_reply()->set_protocol_version(
            in_.Range(0, 7) == 7 ? 9 : 1 + in_.Range(0, 1));
        f.mutable_hello_reply()->set_session_id(1);
        Send(f);
        return;
      case av1::Frame::kAttach: {
        av1::AttachReply* r = f.mutable_attach_reply();
        *r->mutable_layout() = Layout();
        if (in_.Range(0, 3) == 3) ChangeOneField(r->mutable_layout());
        if (in_.Range(0, 3) == 3) {
          kv1::PageBlocks* held = r->add_held();
          held->set_page_id(in_.Range(0, kPages));
          BlockIds(static_cast<int>(in_.Range(1, 3)),
                   held->mutable_block_ids());
        }
        if (req.attach().reservation_blocks() > 0) {
          FillAlloc(req.attach().reservation_blocks(), false,
                    r->mutable_redeemed());
        }
        // Exactly as many page ids as promised follow with this seq (or
        // the input hangs up), so the engine never waits for a page that
        // is not coming.
        const int pages = static_cast<int>(in_.Range(0, kPages));
        r->set_mapped_pages(pages);
        if (!Send(f)) return;
        for (int i = 0; i < pages; ++i) {
          av1::Frame pm;
          pm.set_seq(req.seq());
          pm.mutable_pages_mapped()->add_page_ids(
              in_.Range(0, 7) == 7 ? in_.Range(-1, kPages) : i);
          if (!Send(pm, FdsFor(pm.pages_mapped().page_ids()))) return;
        }
        return;
      }
      case av1::Frame::kAlloc:
        FillAlloc(req.alloc().num_blocks(), req.alloc().block_runs(),
                  f.mutable_alloc_reply());
        break;
      case av1::Frame::kFree:
        f.mutable_free_reply()->set_freed_blocks(in_.Range(-1, kBlocks));
        break;
      case av1::Frame::kReserve: {
        kv1::ReserveResponse* r = f.mutable_reserve_reply();
        r->set_reservation_id(in_.Bool() ? "res-1" : in_.Bytes(200));
        r->set_num_blocks(in_.Range(-1, kBlocks));
        r->mutable_expire_time()->set_seconds(in_.Range(-1, 1 << 30));
        break;
      }
      case av1::Frame::kReleaseReservation:
        f.mutable_release_reservation_reply()->set_released_blocks(
            in_.Range(-1, kBlocks));
        break;
      case av1::Frame::kCapacity: {
        kv1::CapacitySnapshot* c =
            f.mutable_capacity_reply()->mutable_capacity();
        c->set_available_blocks(in_.Range(-1, kBlocks));
        c->set_allocated_blocks(in_.Range(-1, kBlocks));
        break;
      }
      case av1::Frame::kSessionEnd:
        f.mutable_session_end()->set_reason(
            av1::SESSION_END_REASON_UNSPECIFIED);
        break;
      default:
        f.mutable_error()->set_protocol_error(av1::UNEXPECTED_MESSAGE);
        break;
    }
    Send(f);
  }

  ByteReader in_;
  attach::FrameChannel channel_;
};

// Reads and writes the first and last byte of every layer and buffer of
// `block` through the session's mapping: a block the session handed out
// must be there.
void Touch(engine::Session& s, int64_t block) {
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t k = 0; k < kBuffers; ++k) {
      absl::StatusOr<uint64_t> at = s.BlockAddress(0, block, l, k);
      if (!at.ok()) {
        Die(absl::StrCat("handed out block ", block,
                         " has no address: ", at.status().ToString()));
      }
      for (uint64_t a : {*at, *at + kBlock - 1}) {
        volatile char* p = reinterpret_cast<volatile char*>(a);
        *p = static_cast<char>(*p + 1);
      }
    }
  }
}

void RunScript(engine::Session& s, const std::vector<uint8_t>& script) {
  std::vector<int64_t> held;
  std::string reservation;
  auto keep = [&](absl::Span<const int64_t> ids) {
    for (int64_t b : ids) {
      Touch(s, b);
      held.push_back(b);
    }
  };
  for (uint8_t op : script) {
    const int64_t n = op / 8 % 6;
    switch (op % 8) {
      case 0:
        if (auto r = s.Alloc(n); r.ok()) keep(*r);
        break;
      case 1: {
        std::vector<int64_t> room(static_cast<size_t>(n));
        if (auto r = s.AllocInto(n, "", absl::MakeSpan(room)); r.ok()) {
          keep(absl::MakeConstSpan(room).first(static_cast<size_t>(*r)));
        }
        break;
      }
      case 2: {
        kv1::AllocRequest request;
        request.set_num_blocks(n);
        request.set_reservation_id(reservation);
        if (auto r = s.Alloc(request); r.ok()) {
          for (const kv1::PageBlocks& p : r->pages()) {
            keep(absl::MakeConstSpan(p.block_ids().data(), p.block_ids_size()));
          }
        }
        break;
      }
      case 3:
        s.Free(held).IgnoreError();
        held.clear();
        break;
      case 4: {
        kv1::ReserveRequest request;
        request.set_num_blocks(n + 1);
        if (auto r = s.Reserve(request); r.ok()) {
          reservation = r->reservation_id();
        }
        break;
      }
      case 5: {
        kv1::ReleaseReservationRequest request;
        request.set_reservation_id(reservation);
        s.ReleaseReservation(request).IgnoreError();
        break;
      }
      case 6: s.Capacity().IgnoreError(); break;
      case 7: s.ProcessEvents().IgnoreError(); break;
    }
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace kvbroker

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvbroker;
  using namespace kvbroker::fuzz;
  World* w = TheWorld();
  ByteReader in(data, size);
  std::vector<uint8_t> script(in.Range(0, 15));
  for (uint8_t& op : script) op = in.Byte();
  const bool redeem = in.Bool();
  const int before = kvbroker::testing::CountOpenFds().value_or(-1);

  std::thread daemon([&in, w] {
    UniqueFd conn(accept4(w->listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) Die(absl::StrCat("accept: ", strerror(errno)));
    Peer peer(in, attach::FrameChannel(std::move(conn)));
    peer.Run();
  });
  {
    engine::ConnectOptions c;
    c.socket_path = w->socket_path;
    c.holder = "fuzz-engine";
    c.close_timeout = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<engine::Session>> s =
        engine::Session::Connect(c);
    if (s.ok()) {
      engine::AttachOptions a;
      a.pool = "kv";
      if (redeem) {
        a.reservation_id = "res-sched";
        a.reservation_blocks = 2;
      }
      absl::StatusOr<av1::AttachReply> r = (*s)->Attach(a);
      if (r.ok()) {
        for (const kv1::PageBlocks& p : r->held()) {
          for (int64_t b : p.block_ids()) Touch(**s, b);
        }
        for (const kv1::PageBlocks& p : r->redeemed().pages()) {
          for (int64_t b : p.block_ids()) Touch(**s, b);
        }
      }
      RunScript(**s, script);
      (*s)->Close(/*release=*/true).IgnoreError();
    }
  }
  daemon.join();
  const int after = kvbroker::testing::CountOpenFds().value_or(-1);
  if (before != after) {
    Die(absl::StrCat(before, " fds open before the input, ", after, " after"));
  }
  return 0;
}
