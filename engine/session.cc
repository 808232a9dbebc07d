// kvbroker::engine::Session: the request loop, page mapping and revocation.

#include "engine/session.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/failure.h"
#include "common/block_runs.h"
#include "common/error_keys.h"

namespace kvbroker::engine {

namespace av1 = ::kvbroker::attach::v1;
namespace kv1 = ::kvbroker::v1;
using attach::FrameChannel;
using attach::ProtocolFailure;
using attach::ReceivedFrame;

// The most ids the kept Free request keeps room for between calls (8 KiB
// in each of its two lists); a larger Free's room is given back after it.
constexpr int kKeptRequestIds = 1024;

namespace {

// Sets the socket option SO_RCVTIMEO or SO_SNDTIMEO to `timeout`: a
// blocking receive or send gives up with EAGAIN after that long (at least
// 1 us); InfiniteDuration sets {0, 0}, which never does.
void SetSocketTimeout(int fd, int option, absl::Duration timeout) {
  timeval tv = {0, 0};
  if (timeout != absl::InfiniteDuration()) {
    const int64_t us = std::clamp<int64_t>(absl::ToInt64Microseconds(timeout),
                                           1, int64_t{1} << 50);
    tv.tv_sec = static_cast<time_t>(us / 1000000);
    tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  }
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

}  // namespace

Session::Session(FrameChannel channel, const ConnectOptions& options)
    : channel_(std::move(channel)),
      close_timeout_(options.close_timeout),
      reply_spin_ns_(absl::ToInt64Nanoseconds(options.reply_spin)),
      call_timeout_(options.call_timeout),
      frames_(attach::FrameArenaOptions(frame_block_, sizeof(frame_block_))) {
  PlainMutexLock lock(&mu_);
  ApplyCallTimeout();
}

Session::~Session() { Close(/*release=*/false).IgnoreError(); }

absl::StatusOr<std::unique_ptr<Session>> Session::Connect(
    const ConnectOptions& options) {
  absl::StatusOr<FrameChannel> channel =
      FrameChannel::Connect(options.socket_path);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<Session> session(new Session(std::move(*channel), options));
  PlainMutexLock lock(&session->mu_);
  av1::Frame* hello = session->NewRequest();
  av1::Hello* h = hello->mutable_hello();
  h->set_protocol_version(options.protocol_version);
  h->set_token(options.token);
  h->set_holder(options.holder);
  h->set_pid(getpid());
  const absl::Duration grace = options.reattach_grace;
  h->mutable_reattach_grace()->set_seconds(absl::ToInt64Seconds(grace));
  h->mutable_reattach_grace()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(
          grace - absl::Seconds(absl::ToInt64Seconds(grace)))));
  absl::StatusOr<const av1::Frame*> reply = session->Call(hello);
  if (!reply.ok()) {
    // No session began (the daemon refused the Hello, or never answered
    // it): the connection just closes, with no SessionEnd to wait for.
    session->closed_ = true;
    shutdown(session->channel_.fd(), SHUT_RDWR);
    return reply.status();
  }
  if (!(*reply)->has_hello_reply()) {
    return ProtocolFailure(av1::UNEXPECTED_MESSAGE,
                           "the daemon did not answer Hello with HelloReply");
  }
  const av1::HelloReply& r = (*reply)->hello_reply();
  if (r.protocol_version() < attach::kMinProtocolVersion ||
      r.protocol_version() > options.protocol_version) {
    return ProtocolFailure(
        av1::UNSUPPORTED_VERSION,
        absl::StrCat("the daemon chose protocol version ", r.protocol_version(),
                     "; this session offered ", attach::kMinProtocolVersion,
                     " to ", options.protocol_version));
  }
  session->hello_ = r;
  session->runs_ = r.protocol_version() >= 2;
  return session;
}

av1::Frame* Session::NewRequest() {
  attach::RecycleFrameArena(&frames_);
  return google::protobuf::Arena::CreateMessage<av1::Frame>(&frames_);
}

absl::StatusOr<const av1::Frame*> Session::Call(av1::Frame* request,
                                                bool* answered) {
  if (answered != nullptr) *answered = false;
  if (closed_) return absl::FailedPreconditionError("session is closed");
  const uint64_t seq = next_seq_++;
  request->set_seq(seq);
  if (absl::Status s = channel_.Send(*request); !s.ok()) {
    if (absl::IsDeadlineExceeded(s)) return EndAfterSendTimeout();
    // The daemon is gone (it closed the connection or died): the session
    // has ended, and what it sent before it went may say why.
    if (!channel_.peer_gone()) return s;
    closed_ = true;
    absl::Status why = ReadAfterHangup();
    return why.ok() ? s : why;
  }
  // Events read first parse into the same frame, which is then reused.
  av1::Frame* const got =
      google::protobuf::Arena::CreateMessage<av1::Frame>(&frames_);
  std::vector<UniqueFd> fds;
  // A frame, the peer's hangup or an error end the spin: the receive that
  // follows reads or reports them.
  attach::SpinUntilReadable(channel_.fd(), reply_spin_ns_);
  while (true) {
    // The socket's receive timeout is call_timeout_ (ApplyCallTimeout).
    if (absl::Status s = channel_.ReceiveInto(got, &fds); !s.ok()) {
      if (absl::IsDeadlineExceeded(s)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no reply from the daemon within ",
            absl::FormatDuration(call_timeout_),
            "; the call's outcome is unknown (retry it with the same "
            "request_id to learn it)"));
      }
      // A bad frame from the daemon is a bug there; the peer going away ends
      // the session.
      if (absl::IsCancelled(s)) closed_ = true;
      return s;
    }
    if (got->seq() != seq) {
      // An event that fails fails the call at once: the event's error is
      // what the caller must see, and a bad frame may have been the reply
      // itself, so waiting for the reply could wait for nothing. The reply,
      // when it comes, is then that of an earlier call and is dropped
      // (HandleEvent); the call's outcome is unknown, as after a timeout.
      if (absl::Status s = HandleEvent(*got, std::move(fds)); !s.ok()) return s;
      continue;
    }
    if (answered != nullptr) *answered = true;
    if (got->has_error()) return attach::FromError(got->error());
    if (!fds.empty()) {
      return ProtocolFailure(av1::UNEXPECTED_FDS,
                             "a reply came with fds; they were closed");
    }
    return got;
  }
}

void Session::set_reply_spin(absl::Duration spin) {
  PlainMutexLock lock(&mu_);
  reply_spin_ns_ = absl::ToInt64Nanoseconds(spin);
}

void Session::set_call_timeout(absl::Duration timeout) {
  PlainMutexLock lock(&mu_);
  call_timeout_ = timeout;
  ApplyCallTimeout();
}

void Session::ApplyCallTimeout() {
  // Every blocking receive and send of the socket gives up after this long
  // (the channel's DEADLINE_EXCEEDED). A send waits only while the socket's
  // buffer is full, that is while the daemon reads nothing, and a call must
  // not wait on that for longer than on the reply. Bounds kept on the
  // socket cost the hot path no extra system call.
  SetSocketTimeout(channel_.fd(), SO_RCVTIMEO, call_timeout_);
  SetSocketTimeout(channel_.fd(), SO_SNDTIMEO, call_timeout_);
}

absl::Status Session::EndAfterSendTimeout() {
  // A SOCK_SEQPACKET packet goes whole or not at all, so nothing was sent;
  // but the daemon has read nothing for call_timeout_ while the frames
  // already queued wait for it. Every later call (and each revocation's
  // acknowledgement) would wait as long again under the lock, so the
  // session ends, as a timed-out Attach does; the holder's grace applies.
  closed_ = true;
  shutdown(channel_.fd(), SHUT_RDWR);
  return absl::DeadlineExceededError(absl::StrCat(
      "the daemon read nothing from the session for ",
      absl::FormatDuration(call_timeout_), "; the session is closed"));
}

absl::StatusOr<const av1::Frame*> Session::CallAttached(
    av1::Frame* request, av1::Frame::BodyCase expected, const char* what) {
  if (absl::Status s = CheckAttached(); !s.ok()) return s;
  absl::StatusOr<const av1::Frame*> reply = Call(request);
  if (!reply.ok()) return reply.status();
  if ((*reply)->body_case() != expected) {
    return ProtocolFailure(av1::UNEXPECTED_MESSAGE,
                           absl::StrCat("expected ", what));
  }
  return reply;
}

absl::Status Session::HandleEvent(const av1::Frame& f,
                                  std::vector<UniqueFd> fds) {
  switch (f.body_case()) {
    case av1::Frame::kPagesMapped:
      return MapPages(f.pages_mapped(), std::move(fds));
    case av1::Frame::kRevoke: return Revoke(f.revoke());
    case av1::Frame::kSessionEnd: {
      closed_ = true;
      end_reason_ = f.session_end().reason();
      const std::string why =
          absl::StrCat("the daemon ended the session (",
                       av1::SessionEndReason_Name(f.session_end().reason()),
                       "): ", f.session_end().message());
      // The pool is gone: the daemon's typed reason, as any call on it
      // would get now.
      if (end_reason_ == av1::POOL_DELETED) {
        return MakeFailure(FailureReason::kPoolNotFound, why,
                           {{std::string(error_key::kPool), layout_.pool()}});
      }
      return absl::CancelledError(why);
    }
    case av1::Frame::kError:
      // An answer to a frame of ours the daemon could not read at all; the
      // call that sent it gets its own reply.
      return absl::OkStatus();
    default:
      // Calls are synchronous under mu_, so a reply whose seq is below
      // next_seq_ (and is not that of the call in progress, which Call reads
      // itself) answers a call that already returned: it gave up waiting, or
      // an event or a bad frame failed it first. Only replies are dropped by
      // their seq, never the events above: the daemon sends an attach's
      // PagesMapped with the attach's seq and believes those pages mapped.
      if (f.seq() != 0 && f.seq() < next_seq_) return absl::OkStatus();
      return ProtocolFailure(av1::UNEXPECTED_MESSAGE,
                             absl::StrCat("unexpected message ", f.body_case(),
                                          " with seq ", f.seq()));
  }
}

absl::Status Session::ReadAfterHangup() {
  while (true) {
    pollfd p = {channel_.fd(), POLLIN, 0};
    if (poll(&p, 1, 0) != 1) return absl::OkStatus();
    absl::StatusOr<ReceivedFrame> got = channel_.Receive();
    if (!got.ok()) return absl::OkStatus();
    // A Revoke is carried out (its acknowledgement cannot be sent); the
    // SessionEnd says why the session ended.
    const bool end = got->frame.has_session_end();
    absl::Status s = HandleEvent(got->frame, std::move(got->fds));
    if (end) return s;
  }
}

absl::Status Session::CheckAttached() const {
  if (!attached_) {
    return ProtocolFailure(av1::UNEXPECTED_MESSAGE, "not attached to a pool");
  }
  return absl::OkStatus();
}

absl::Status Session::MapPages(const av1::PagesMapped& pages,
                               std::vector<UniqueFd> fds) {
  if (!attached_) {
    return ProtocolFailure(av1::UNEXPECTED_MESSAGE,
                           "PagesMapped before AttachReply");
  }
  const size_t devices = mappers_.size();
  if (fds.size() != static_cast<size_t>(pages.page_ids_size()) * devices) {
    return ProtocolFailure(
        av1::UNEXPECTED_FDS,
        absl::StrCat("PagesMapped of ", pages.page_ids_size(), " pages on ",
                     devices, " devices came with ", fds.size(), " fds"));
  }
  const int64_t bundle = layout_.bundle_bytes();
  const int count = pages.page_ids_size();
  for (int64_t p : pages.page_ids()) {
    if (p < 0 || p >= layout_.page_count()) {
      return absl::InternalError(absl::StrCat("daemon sent page ", p));
    }
    // A page the daemon remapped without our seeing its revocation (it was
    // unmapped while we were detached from events): replace it.
    if (mapped_[p]) {
      for (auto& m : mappers_) m->Unmap(p * bundle).IgnoreError();
      mapped_[p] = false;
      --mapped_count_;
    }
  }
  // One batch per device (mapper.h: MapMany), or bundle by bundle.
  for (size_t j = 0; j < devices; ++j) {
    std::vector<BundleFd> batch(count);
    for (int i = 0; i < count; ++i) {
      batch[i] = {pages.page_ids(i) * bundle, std::move(fds[i * devices + j])};
    }
    absl::Status s;
    if (batch_map_) {
      s = mappers_[j]->MapMany(bundle, absl::MakeSpan(batch));
    } else {
      for (int i = 0; i < count && s.ok(); ++i) {
        s = mappers_[j]->Map(batch[i].offset, bundle, std::move(batch[i].fd));
      }
    }
    if (!s.ok()) {
      // No page of the frame stays half mapped.
      for (size_t k = 0; k <= j; ++k) {
        for (int64_t p : pages.page_ids()) {
          mappers_[k]->Unmap(p * bundle).IgnoreError();
        }
      }
      return s;
    }
  }
  for (int64_t p : pages.page_ids()) {
    mapped_[p] = true;
    ++mapped_count_;
  }
  return absl::OkStatus();
}

absl::Status Session::Revoke(const av1::Revoke& revoke) {
  const int64_t bundle = layout_.bundle_bytes();
  av1::Frame ack;
  ack.mutable_revoke_ack()->set_revoke_id(revoke.revoke_id());
  absl::Status failed;  // the first unmap that failed
  for (int64_t p : revoke.page_ids()) {
    if (p < 0 || p >= static_cast<int64_t>(mapped_.size()) || !mapped_[p]) {
      continue;
    }
    bool unmapped = false;
    for (auto& m : mappers_) {
      absl::Status s = m->Unmap(p * bundle);
      unmapped = unmapped || s.ok();
      if (failed.ok()) failed = s;
    }
    // A page unmapped on any device no longer counts as mapped here: no
    // block on it is handed out (CheckHandedOut), and the engine is told
    // through the callback to stop using it.
    if (unmapped) {
      mapped_[p] = false;
      --mapped_count_;
      ack.mutable_revoke_ack()->add_page_ids(p);
    }
  }
  if (on_revoke_) {
    on_revoke_(absl::MakeConstSpan(revoke.page_ids().data(),
                                   revoke.page_ids().size()));
  }
  // An acknowledgement tells the daemon that every page of the revocation
  // is unmapped here, and it then hands them to other holders. A page still
  // mapped on some device must not be handed on: without the
  // acknowledgement the daemon quarantines the revocation's pages past its
  // deadline (never reused) until the session ends.
  if (!failed.ok()) return failed;
  absl::Status sent = channel_.Send(ack);
  if (absl::IsDeadlineExceeded(sent)) return EndAfterSendTimeout();
  // Closed already: this revocation was read by ReadAfterHangup, which goes
  // on reading.
  if (sent.ok() || !channel_.peer_gone() || closed_) return sent;
  closed_ = true;
  absl::Status why = ReadAfterHangup();
  return why.ok() ? sent : why;
}

namespace {

// The most virtual bytes a layout may ask an engine to reserve per device:
// the 47-bit user address space of x86-64 and of arm64's default layout,
// and the daemon's own bound on a pool (kMaxVirtualBytesPerDevice).
constexpr int64_t kMaxVirtualBytes = int64_t{1} << 47;
// Sessions map at most this many devices (a node's GPUs, with room).
constexpr int kMaxSessionDevices = 256;

// a * b, or nullopt past int64.
std::optional<int64_t> Product(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// Writes the ids of `r` (its pages' lists, then its runs) to `out`, which
// has room for exactly r.num_blocks(); a reply that lists another number
// is malformed, and nothing past `out` is written.
absl::Status WriteAllocIds(const kv1::AllocResponse& r,
                           absl::Span<int64_t> out) {
  size_t at = 0;
  absl::Status why;  // what made the list wrong, when it is
  for (const kv1::PageBlocks& p : r.pages()) {
    const size_t n = static_cast<size_t>(p.block_ids_size());
    if (n > out.size() - at) {
      why = absl::InvalidArgumentError("its pages list more");
      break;
    }
    std::copy(p.block_ids().begin(), p.block_ids().end(), out.begin() + at);
    at += n;
  }
  if (why.ok()) why = WriteBlockRuns(r.block_runs(), out.subspan(at), &at);
  if (!why.ok() || at != out.size()) {
    return ProtocolFailure(
        av1::MALFORMED_FRAME,
        absl::StrCat("the daemon's Alloc reply says ", r.num_blocks(),
                     " blocks and lists ", at, " ", why.message()));
  }
  return absl::OkStatus();
}

// MALFORMED_FRAME unless the Alloc reply `r` hands out between 0 and
// `asked` blocks (`what` names the call in the message).
absl::Status CheckAllocCount(const kv1::AllocResponse& r, int64_t asked,
                             absl::string_view what) {
  if (r.num_blocks() < 0 || r.num_blocks() > asked) {
    return ProtocolFailure(
        av1::MALFORMED_FRAME,
        absl::StrCat("the daemon answered ", what, " of ", asked,
                     " blocks with ", r.num_blocks(), " blocks"));
  }
  return absl::OkStatus();
}

// The daemon's PoolLayout is redundant (SPEC section 2 defines every field
// from P, B, L, K and T); an engine maps pages at offsets and hands out
// addresses computed from it, so a layout whose fields disagree, overflow,
// or place a block past the range would have it map or write outside the
// range it reserved. Checked before anything is reserved.
absl::Status CheckLayout(const av1::PoolLayout& l) {
  auto bad = [](absl::string_view why) {
    return ProtocolFailure(av1::MALFORMED_FRAME,
                           absl::StrCat("the daemon's pool layout: ", why));
  };
  if (l.page_size() <= 0 || l.block_bytes() <= 0 || l.num_layers() <= 0 ||
      l.num_kv_buffers() <= 0 || l.page_count() < 0 || l.max_blocks() < 0) {
    return bad(absl::StrCat(
        "page_size ", l.page_size(), ", block_bytes ", l.block_bytes(),
        ", num_layers ", l.num_layers(), ", num_kv_buffers ",
        l.num_kv_buffers(), ", page_count ", l.page_count(), ", max_blocks ",
        l.max_blocks(), " (sizes and counts must be positive)"));
  }
  if (l.devices_size() < 1 || l.devices_size() > kMaxSessionDevices) {
    return bad(absl::StrCat(l.devices_size(), " devices"));
  }
  const std::optional<int64_t> lk = Product(l.num_layers(), l.num_kv_buffers());
  const std::optional<int64_t> bundle =
      lk ? Product(l.page_size(), *lk) : std::nullopt;
  const std::optional<int64_t> stride =
      lk ? Product(l.block_bytes(), *lk) : std::nullopt;
  const std::optional<int64_t> range =
      bundle ? Product(*bundle, l.page_count()) : std::nullopt;
  const std::optional<int64_t> blocks_end =
      Product(l.block_bytes(), l.max_blocks());
  const std::optional<int64_t> pages_end =
      Product(l.page_size(), l.page_count());
  if (!bundle || !stride || !range || !blocks_end || !pages_end ||
      *range > kMaxVirtualBytes) {
    return bad(absl::StrCat("a range of ", l.page_count(), " pages of ",
                            l.page_size(), " B x ", l.num_layers(), " x ",
                            l.num_kv_buffers(), " overflows or exceeds ",
                            kMaxVirtualBytes, " bytes"));
  }
  if (l.bundle_bytes() != *bundle || l.block_stride_bytes() != *stride ||
      l.layer_offset_bytes() != l.num_kv_buffers() * l.block_bytes() ||
      l.buffer_offset_bytes() != l.block_bytes() ||
      l.virtual_bytes_per_device() != *range) {
    return bad(absl::StrCat(
        "bundle_bytes ", l.bundle_bytes(), ", block_stride_bytes ",
        l.block_stride_bytes(), ", layer_offset_bytes ", l.layer_offset_bytes(),
        ", buffer_offset_bytes ", l.buffer_offset_bytes(),
        ", virtual_bytes_per_device ", l.virtual_bytes_per_device(),
        " do not follow from P, B, L, K, T"));
  }
  if (*blocks_end > *pages_end) {
    return bad(absl::StrCat(l.max_blocks(), " blocks of ", l.block_bytes(),
                            " B do not fit ", l.page_count(), " pages of ",
                            l.page_size(), " B"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Session::CheckHandedOut(absl::Span<const int64_t> ids) const {
  const int64_t block_bytes = layout_.block_bytes();
  const int64_t page_size = layout_.page_size();
  for (int64_t id : ids) {
    bool ok = id >= 0 && id < layout_.max_blocks();
    if (ok) {
      // CheckLayout: max_blocks * block_bytes fits the pages, so neither
      // product overflows and both pages lie below page_count.
      const int64_t first = id * block_bytes / page_size;
      const int64_t last = ((id + 1) * block_bytes - 1) / page_size;
      for (int64_t p = first; ok && p <= last; ++p) ok = mapped_[p];
    }
    if (!ok) {
      return ProtocolFailure(
          av1::MALFORMED_FRAME,
          absl::StrCat("the daemon handed out block ", id,
                       ", which is not on a page mapped here (",
                       layout_.max_blocks(), " blocks, ", mapped_count_, " of ",
                       layout_.page_count(), " pages mapped)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Session::ReadHandedOut(const kv1::AllocResponse& r,
                                    absl::Span<int64_t> out) const {
  KVB_RETURN_IF_ERROR(WriteAllocIds(r, out));
  return CheckHandedOut(out);
}

absl::StatusOr<std::vector<int64_t>> Session::HandedOutIds(
    const kv1::AllocResponse& r, int64_t asked, absl::string_view what) const {
  KVB_RETURN_IF_ERROR(CheckAllocCount(r, asked, what));
  std::vector<int64_t> ids(static_cast<size_t>(r.num_blocks()));
  KVB_RETURN_IF_ERROR(ReadHandedOut(r, absl::MakeSpan(ids)));
  return ids;
}

absl::StatusOr<av1::AttachReply> Session::Attach(const AttachOptions& options) {
  PlainMutexLock lock(&mu_);
  if (attached_) {
    return absl::FailedPreconditionError(
        absl::StrCat("already attached to pool ", layout_.pool()));
  }
  if (closed_) return absl::FailedPreconditionError("session is closed");
  av1::Frame* request = NewRequest();
  av1::AttachRequest* a = request->mutable_attach();
  a->set_pool(options.pool);
  for (int d : options.devices) a->add_devices(d);
  a->set_reservation_id(options.reservation_id);
  a->set_reservation_blocks(options.reservation_blocks);
  a->set_request_id(options.request_id);
  AttachStats stats;
  const absl::Time start = absl::Now();
  // Unless the daemon refused the attach, it may have attached the session
  // and announced pages (with the attach's seq) that this engine has not
  // mapped: engine and daemon disagree, and the session cannot go on. It
  // ends as if the engine had died (the holder's grace applies); the
  // failure keeps its code and payload.
  auto give_up =
      [this](const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        closed_ = true;
        shutdown(channel_.fd(), SHUT_RDWR);
        absl::Status out(
            why.code(), absl::StrCat(why.message(), "; the session is closed"));
        why.ForEachPayload(
            [&out](absl::string_view url, const absl::Cord& payload) {
              out.SetPayload(url, payload);
            });
        return out;
      };
  bool answered = false;
  absl::StatusOr<const av1::Frame*> reply = Call(request, &answered);
  stats.receive = absl::Now() - start;
  // The daemon's own error reply leaves it unattached; the session may try
  // again.
  if (!reply.ok()) return answered ? reply.status() : give_up(reply.status());
  if (!(*reply)->has_attach_reply()) {
    return give_up(ProtocolFailure(
        av1::UNEXPECTED_MESSAGE, "the daemon did not answer with AttachReply"));
  }
  // On frames_, which the page frames below do not reset.
  const av1::AttachReply& r = (*reply)->attach_reply();
  const av1::PoolLayout& layout = r.layout();
  if (absl::Status s = CheckLayout(layout); !s.ok()) return give_up(s);
  std::vector<std::unique_ptr<DeviceMapper>> mappers;
  absl::Time t0 = absl::Now();
  for (const av1::Device& d : layout.devices()) {
    absl::StatusOr<std::unique_ptr<DeviceMapper>> m =
        options.create_mapper
            ? options.create_mapper(layout.backend(), d.uuid(),
                                    layout.virtual_bytes_per_device())
            : CreateMapper(layout.backend(), d.uuid(),
                           layout.virtual_bytes_per_device());
    if (!m.ok()) return give_up(m.status());
    mappers.push_back(std::move(*m));
  }
  stats.setup = absl::Now() - t0;
  layout_ = layout;
  mappers_ = std::move(mappers);
  batch_map_ = options.batch_map;
  mapped_.assign(layout.page_count(), false);
  attached_ = true;
  // The pages mapped now follow, with this call's seq.
  const uint64_t seq = next_seq_ - 1;
  int64_t received = 0;
  while (received < r.mapped_pages()) {
    t0 = absl::Now();
    absl::StatusOr<ReceivedFrame> got = channel_.Receive();
    stats.receive += absl::Now() - t0;
    if (absl::IsDeadlineExceeded(got.status())) {
      return give_up(absl::DeadlineExceededError(absl::StrCat(
          "the daemon sent ", received, " of the ", r.mapped_pages(),
          " pages of its AttachReply and then nothing for ",
          absl::FormatDuration(call_timeout_))));
    }
    if (!got.ok()) return give_up(got.status());
    if (got->frame.seq() == seq && got->frame.has_pages_mapped()) {
      received += got->frame.pages_mapped().page_ids_size();
      ++stats.frames;
    }
    if (absl::Status s = HandleEvent(got->frame, std::move(got->fds));
        !s.ok()) {
      return give_up(s);
    }
  }
  // What the holder owns after the attach is on pages mapped by now.
  if (absl::Status s = HandedOutIds(r.redeemed(), options.reservation_blocks,
                                    "the redemption")
                           .status();
      !s.ok()) {
    return give_up(s);
  }
  for (const kv1::PageBlocks& p : r.held()) {
    if (absl::Status s = CheckHandedOut(
            absl::MakeConstSpan(p.block_ids().data(), p.block_ids_size()));
        !s.ok()) {
      return give_up(s);
    }
  }
  stats.total = absl::Now() - start;
  stats.pages = mapped_count_;
  for (const auto& m : mappers_) {
    const MapperStats& ms = m->stats();
    stats.access_calls += ms.access_calls;
    stats.import += ms.import;
    stats.map += ms.map;
    stats.access += ms.access;
  }
  attach_stats_ = stats;
  return r;
}

uint64_t Session::device_base(int device_index) const {
  PlainMutexLock lock(&mu_);
  if (device_index < 0 || device_index >= static_cast<int>(mappers_.size())) {
    return 0;
  }
  return mappers_[device_index]->base();
}

absl::StatusOr<uint64_t> Session::BlockAddress(int device_index, int64_t block,
                                               int64_t layer,
                                               int64_t buffer) const {
  const uint64_t base = device_base(device_index);
  if (base == 0) {
    return InvalidField(
        "device_index",
        absl::StrCat("no session device ", device_index,
                     " (attached: ", layout_.devices_size(), " devices)"));
  }
  if (block < 0 || block >= layout_.max_blocks() || layer < 0 ||
      layer >= layout_.num_layers() || buffer < 0 ||
      buffer >= layout_.num_kv_buffers()) {
    return InvalidField(
        "block",
        absl::StrCat("block ", block, " layer ", layer, " buffer ", buffer,
                     " outside the pool (", layout_.max_blocks(), " blocks, ",
                     layout_.num_layers(), " layers, ",
                     layout_.num_kv_buffers(), " buffers)"));
  }
  return base + block * layout_.block_stride_bytes() +
         layer * layout_.layer_offset_bytes() +
         buffer * layout_.buffer_offset_bytes();
}

std::optional<av1::PoolLayout> Session::attached_layout() const {
  PlainMutexLock lock(&mu_);
  if (layout_.devices_size() == 0) return std::nullopt;
  return layout_;
}

bool Session::page_mapped(int64_t page_id) const {
  PlainMutexLock lock(&mu_);
  return page_id >= 0 && page_id < static_cast<int64_t>(mapped_.size()) &&
         mapped_[page_id];
}

attach::v1::SessionEndReason Session::end_reason() const {
  PlainMutexLock lock(&mu_);
  return end_reason_;
}

int64_t Session::mapped_pages() const {
  PlainMutexLock lock(&mu_);
  return mapped_count_;
}

AttachStats Session::attach_stats() const {
  PlainMutexLock lock(&mu_);
  return attach_stats_;
}

absl::StatusOr<kv1::AllocResponse> Session::Alloc(kv1::AllocRequest request) {
  PlainMutexLock lock(&mu_);
  av1::Frame* f = NewRequest();
  *f->mutable_alloc() = std::move(request);
  const int64_t asked = f->alloc().num_blocks();
  absl::StatusOr<const av1::Frame*> reply =
      CallAttached(f, av1::Frame::kAllocReply, "an Alloc reply");
  if (!reply.ok()) return reply.status();
  const kv1::AllocResponse& r = (*reply)->alloc_reply();
  KVB_RETURN_IF_ERROR(HandedOutIds(r, asked, "an Alloc").status());
  return r;
}

absl::StatusOr<const kv1::AllocResponse*> Session::CallAlloc(
    int64_t num_blocks, const std::string& request_id,
    const std::string& reservation_id) {
  attach::RecycleFrameArena(&frames_);  // for the reply
  kv1::AllocRequest* request = alloc_request_.mutable_alloc();
  request->set_num_blocks(num_blocks);
  // An empty id is proto3's default and is not sent; clearing it keeps the
  // string's room for the next id.
  if (request_id.empty()) {
    request->clear_request_id();
  } else {
    request->set_request_id(request_id);
  }
  if (reservation_id.empty()) {
    request->clear_reservation_id();
  } else {
    request->set_reservation_id(reservation_id);
  }
  request->set_block_runs(runs_);
  absl::StatusOr<const av1::Frame*> reply =
      CallAttached(&alloc_request_, av1::Frame::kAllocReply, "an Alloc reply");
  if (!reply.ok()) return reply.status();
  const kv1::AllocResponse& r = (*reply)->alloc_reply();
  KVB_RETURN_IF_ERROR(CheckAllocCount(r, num_blocks, "an Alloc"));
  return &r;
}

absl::StatusOr<std::vector<int64_t>> Session::Alloc(
    int64_t num_blocks, const std::string& request_id,
    const std::string& reservation_id) {
  PlainMutexLock lock(&mu_);
  absl::StatusOr<const kv1::AllocResponse*> r =
      CallAlloc(num_blocks, request_id, reservation_id);
  if (!r.ok()) return r.status();
  std::vector<int64_t> ids(static_cast<size_t>((*r)->num_blocks()));
  KVB_RETURN_IF_ERROR(ReadHandedOut(**r, absl::MakeSpan(ids)));
  return ids;
}

absl::StatusOr<int64_t> Session::AllocInto(int64_t num_blocks,
                                           const std::string& request_id,
                                           absl::Span<int64_t> out,
                                           const std::string& reservation_id) {
  if (num_blocks > static_cast<int64_t>(out.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("room for ", out.size(), " ids, not ", num_blocks));
  }
  PlainMutexLock lock(&mu_);
  absl::StatusOr<const kv1::AllocResponse*> r =
      CallAlloc(num_blocks, request_id, reservation_id);
  if (!r.ok()) return r.status();
  const int64_t n = (*r)->num_blocks();
  KVB_RETURN_IF_ERROR(ReadHandedOut(**r, out.first(static_cast<size_t>(n))));
  return n;
}

absl::StatusOr<kv1::FreeResponse> Session::Free(kv1::FreeRequest request) {
  PlainMutexLock lock(&mu_);
  av1::Frame* f = NewRequest();
  *f->mutable_free() = std::move(request);
  absl::StatusOr<const av1::Frame*> reply =
      CallAttached(f, av1::Frame::kFreeReply, "a Free reply");
  if (!reply.ok()) return reply.status();
  return (*reply)->free_reply();
}

absl::StatusOr<kv1::FreeResponse> Session::Free(
    absl::Span<const int64_t> block_ids, const std::string& request_id) {
  PlainMutexLock lock(&mu_);
  attach::RecycleFrameArena(&frames_);  // for the reply
  kv1::FreeRequest* request = free_request_.mutable_free();
  request->clear_block_ids();
  request->clear_block_runs();
  // Runs where they are shorter: scattered ids stay a list.
  if (!runs_ || !BlockRunsIfShorter(block_ids, request->mutable_block_runs())) {
    request->mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  }
  if (request_id.empty()) {
    request->clear_request_id();
  } else {
    request->set_request_id(request_id);
  }
  absl::StatusOr<const av1::Frame*> reply =
      CallAttached(&free_request_, av1::Frame::kFreeReply, "a Free reply");
  // What a large Free made room for is not kept.
  if (request->block_ids().Capacity() > kKeptRequestIds ||
      request->block_runs().Capacity() > kKeptRequestIds) {
    free_request_.Clear();
  }
  if (!reply.ok()) return reply.status();
  return (*reply)->free_reply();
}

absl::StatusOr<kv1::ReserveResponse> Session::Reserve(
    kv1::ReserveRequest request) {
  PlainMutexLock lock(&mu_);
  av1::Frame* f = NewRequest();
  *f->mutable_reserve() = std::move(request);
  absl::StatusOr<const av1::Frame*> reply =
      CallAttached(f, av1::Frame::kReserveReply, "a Reserve reply");
  if (!reply.ok()) return reply.status();
  const kv1::ReserveResponse& r = (*reply)->reserve_reply();
  // A name no session could pass back (to Alloc or ReleaseReservation).
  if (r.reservation_id().empty() ||
      r.reservation_id().size() > attach::kMaxIdLength) {
    return ProtocolFailure(
        av1::MALFORMED_FRAME,
        absl::StrCat("the daemon named its reservation with ",
                     r.reservation_id().size(), " bytes (1 to ",
                     attach::kMaxIdLength, " allowed)"));
  }
  return r;
}

absl::StatusOr<kv1::ReleaseReservationResponse> Session::ReleaseReservation(
    kv1::ReleaseReservationRequest request) {
  PlainMutexLock lock(&mu_);
  av1::Frame* f = NewRequest();
  *f->mutable_release_reservation() = std::move(request);
  absl::StatusOr<const av1::Frame*> reply = CallAttached(
      f, av1::Frame::kReleaseReservationReply, "a ReleaseReservation reply");
  if (!reply.ok()) return reply.status();
  return (*reply)->release_reservation_reply();
}

absl::StatusOr<kv1::CapacityResponse> Session::Capacity(
    kv1::CapacityRequest request) {
  PlainMutexLock lock(&mu_);
  av1::Frame* f = NewRequest();
  *f->mutable_capacity() = std::move(request);
  absl::StatusOr<const av1::Frame*> reply =
      CallAttached(f, av1::Frame::kCapacityReply, "a Capacity reply");
  if (!reply.ok()) return reply.status();
  return (*reply)->capacity_reply();
}

absl::Status Session::ProcessEvents() {
  PlainMutexLock lock(&mu_);
  if (closed_) return absl::CancelledError("session is closed");
  while (true) {
    pollfd p = {channel_.fd(), POLLIN, 0};
    if (poll(&p, 1, 0) != 1) return absl::OkStatus();
    absl::StatusOr<ReceivedFrame> got = channel_.Receive();
    if (!got.ok()) {
      if (absl::IsCancelled(got.status())) closed_ = true;
      return got.status();
    }
    if (absl::Status s = HandleEvent(got->frame, std::move(got->fds));
        !s.ok()) {
      return s;
    }
  }
}

void Session::SetRevocationCallback(
    std::function<void(absl::Span<const int64_t>)> cb) {
  PlainMutexLock lock(&mu_);
  on_revoke_ = std::move(cb);
}

absl::Status Session::Close(bool release) {
  PlainMutexLock lock(&mu_);
  if (closed_ && mappers_.empty()) return absl::OkStatus();
  absl::Status status;
  if (!closed_) {
    av1::Frame end;
    const uint64_t seq = next_seq_++;
    end.set_seq(seq);
    end.mutable_session_end()->set_release(release);
    // close_timeout_ bounds the whole of Close: the send too, which waits
    // while the daemon reads nothing.
    const absl::Time deadline = absl::Now() + close_timeout_;
    SetSocketTimeout(channel_.fd(), SO_SNDTIMEO, close_timeout_);
    status = channel_.Send(end);
    if (status.ok()) {
      status = AwaitSessionEnd(seq, deadline);
    } else if (absl::IsDeadlineExceeded(status)) {
      status = absl::DeadlineExceededError(
          absl::StrCat("the daemon read nothing from the session for ",
                       absl::FormatDuration(close_timeout_),
                       "; it did not see the end of the session"));
    } else if (channel_.peer_gone()) {
      // The daemon closed the connection (it died or gave up on the
      // session): as when it closes it while Close waits, it has finished
      // with the session.
      status = absl::OkStatus();
    }
    closed_ = true;
  }
  mappers_.clear();
  mapped_.clear();
  mapped_count_ = 0;
  shutdown(channel_.fd(), SHUT_RDWR);
  return status;
}

absl::Status Session::AwaitSessionEnd(uint64_t seq, absl::Time deadline) {
  while (true) {
    // poll takes an int of milliseconds (about 24.8 days at most): a longer
    // wait polls again.
    const int64_t left_ms =
        std::min<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()),
                          std::numeric_limits<int>::max());
    pollfd p = {channel_.fd(), POLLIN, 0};
    const int n = left_ms > 0 ? poll(&p, 1, static_cast<int>(left_ms)) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the daemon did not confirm the end of the session within ",
          absl::FormatDuration(close_timeout_)));
    }
    absl::StatusOr<ReceivedFrame> got = channel_.Receive();
    if (!got.ok()) {
      // The daemon closed the connection: it has finished with the session.
      if (absl::IsCancelled(got.status())) return absl::OkStatus();
      if (attach::ProtocolErrorOf(got.status()) ==
          av1::PROTOCOL_ERROR_UNSPECIFIED) {
        return got.status();
      }
      continue;  // a bad frame: dropped
    }
    if (got->frame.has_session_end() &&
        (got->frame.seq() == seq || got->frame.seq() == 0)) {
      return absl::OkStatus();
    }
    // Pages mapped or revoked meanwhile no longer matter: the session's
    // revocations count as acknowledged once it ends, and the fds that came
    // along close here.
  }
}

}  // namespace kvbroker::engine
