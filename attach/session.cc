// AttachServer::Session: a session's loop, its handlers and the holder's
// bookkeeping of the blocks it allocates and frees.

#include "attach/session.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "server/log.h"
#include "server/proto_convert.h"
#include "server/request_bounds.h"

namespace kvbroker::attach {
namespace {

namespace kv1 = ::kvbroker::v1;

// Free request ids remembered per holder for replays.
constexpr size_t kRememberedFrees = 1024;
// How long a session thread waits for its engine before it looks at its
// outbox and its pool again (SO_RCVTIMEO): the longest a frame that could
// not be sent at once, or a deleted pool's end, waits for it.
constexpr absl::Duration kIdleTick = absl::Milliseconds(100);
// The largest Alloc whose reply frame is kept for the next (its ids, as
// pages for a version-1 engine, take 8 KiB at most).
constexpr int64_t kKeptReplyBlocks = 1024;

// What a Free named, as the pool tells a retry from another request: the
// number of ids and a hash of them in order.
std::string FreeFingerprint(absl::Span<const int64_t> ids) {
  return absl::StrCat(ids.size(), "/",
                      absl::Hex(absl::Hash<absl::Span<const int64_t>>{}(ids)));
}

bool ValidHolder(absl::string_view holder) {
  if (holder.empty() || holder.size() > kMaxHolderLength) return false;
  return std::all_of(holder.begin(), holder.end(), [](char c) {
    return absl::ascii_isgraph(static_cast<unsigned char>(c));
  });
}

absl::Status CheckId(absl::string_view field, absl::string_view id) {
  if (id.size() > kMaxIdLength) {
    return InvalidField(
        field, absl::StrCat("longer than ", kMaxIdLength, " characters"));
  }
  return absl::OkStatus();
}

// The pool's key of a holder's request id. The holder's length comes
// first, so that no two (holder, id) pairs share a key whatever bytes
// either holds; the leading mark is a byte no gRPC request id may contain
// (server/request_bounds.h), so that no gRPC call shares one either.
std::string HolderRequestId(absl::string_view holder, absl::string_view id) {
  if (id.empty()) return "";
  return absl::StrCat(absl::string_view(&kSessionRequestIdMark, 1),
                      holder.size(), ":", holder, id);
}

}  // namespace

AttachServer::Session::Session(AttachServer* server, uint64_t id,
                               UniqueFd socket)
    : server_(server),
      id_(id),
      channel_(std::move(socket)),
      frames_(FrameArenaOptions(frame_block_, sizeof(frame_block_))),
      outbox_(&channel_),
      hello_deadline_(absl::Now() + server->options_.hello_timeout) {
  SetReceiveTimeout(kIdleTick);
}

void AttachServer::Session::Run() {
  bool closing = false;
  while (true) {
    // After the pool's deletion was announced (its SessionEnd sent), the
    // session waits for the engine's acknowledgements while any revocation
    // is within its deadline (on the pool's clock: looked at every 10 ms),
    // then ends; pages still unacknowledged are released as it leaves.
    if (outbox_.pool_closed_sent()) {
      release_on_end_ = true;  // the blocks went with the pool
      if (pool_->revocations_in_time(&outbox_) == 0) break;
      if (!closing) {
        closing = true;
        SetReceiveTimeout(absl::Milliseconds(10));
      }
    }
    // The wait is on the socket alone (outbox.h): frames the daemon starts
    // meanwhile are sent by whoever queues them, Stop shuts the socket's
    // reading side, and the receive timeout bounds how long a frame that
    // could not be sent at once, or a closing pool, waits for this thread.
    if (!FlushOutbox()) break;
    // The frames of the last request and its reply are gone (sent or
    // dropped): once they fill half the arena, its memory is taken again,
    // without the heap (frame.h).
    RecycleFrameArena(&frames_);
    v1::Frame* const request = NewFrame();
    // Only PagesMapped carries fds, and the daemon sends it: any that come
    // are closed at the end of this turn.
    std::vector<UniqueFd> fds;
    outbox_.BeginWait();
    absl::Status got = channel_.ReceiveInto(request, &fds);
    outbox_.EndWait();
    // Stop shuts only the reading side, and requests already in the socket
    // are still read: each would be answered, and each answer to an engine
    // that does not read waits out the send timeout.
    if (server_->stopping()) {
      if (!outbox_.failed()) {
        v1::Frame end;
        end.mutable_session_end()->set_message("kvbrokerd is stopping");
        end.mutable_session_end()->set_reason(v1::DAEMON_STOPPING);
        outbox_.Send(end).IgnoreError();
      }
      break;
    }
    // Looked at after every receive, whatever came: frames other than Hello
    // do not keep a connection that never says it.
    if (!greeted_ && absl::Now() >= hello_deadline_) {
      LogLine("attach: session %d: no Hello within %s; closing it", id_,
              absl::FormatDuration(server_->options_.hello_timeout));
      v1::Frame end;
      end.mutable_session_end()->set_message(
          absl::StrCat("no Hello within ",
                       absl::FormatDuration(server_->options_.hello_timeout)));
      outbox_.Send(end).IgnoreError();
      break;
    }
    if (!got.ok()) {
      if (absl::IsDeadlineExceeded(got)) continue;
      if (ProtocolErrorOf(got) == v1::PROTOCOL_ERROR_UNSPECIFIED) {
        break;  // peer closed, or the socket failed
      }
      Reply(0, got);
      continue;
    }
    if (!Handle(*request)) break;
  }
  if (outbox_.failed()) {
    LogLine(
        "attach: session %d (%s): a send to the engine failed; ended as "
        "a dropped connection",
        id_, holder_);
  }
  UnsubscribeFromPages();
  ConfirmEnd(server_->Finished(this));
}

void AttachServer::Session::SetReceiveTimeout(absl::Duration timeout) {
  const int64_t us = absl::ToInt64Microseconds(timeout);
  const timeval tv = {static_cast<time_t>(us / 1000000),
                      static_cast<suseconds_t>(us % 1000000)};
  setsockopt(channel_.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

void AttachServer::Session::ConfirmEnd(const std::string& outcome) {
  if (end_seq_ == 0) return;
  v1::Frame end;
  end.set_seq(end_seq_);
  end.mutable_session_end()->set_message(outcome);
  outbox_.Send(end).IgnoreError();
}

void AttachServer::Session::Reply(uint64_t seq, const absl::Status& status,
                                  v1::Frame* out) {
  if (!status.ok()) {
    out->Clear();
    *out->mutable_error() = ToError(status);
  }
  out->set_seq(seq);
  // An attach's reply precedes its snapshot; every other reply follows
  // what was queued before it (outbox.h). A failed send fails the outbox,
  // which ends the loop before the next receive (FlushOutbox).
  if (out->has_attach_reply()) {
    outbox_.Send(*out).IgnoreError();
    FlushOutbox();
  } else if (CheckOutbox()) {
    outbox_.SendAfterQueued(*out).IgnoreError();
  }
}

void AttachServer::Session::Reply(uint64_t seq, const absl::Status& failure) {
  Reply(seq, failure, NewFrame());
}

v1::Frame* AttachServer::Session::ReplyFrame(v1::Frame::BodyCase request) {
  switch (request) {
    case v1::Frame::kAlloc:
      alloc_reply_.mutable_alloc_reply()->Clear();
      return &alloc_reply_;
    case v1::Frame::kFree:
      free_reply_.mutable_free_reply()->Clear();
      return &free_reply_;
    default: return NewFrame();
  }
}

bool AttachServer::Session::Handle(const v1::Frame& f) {
  const uint64_t seq = f.seq();
  seq_ = seq;
  // A connection that ends before its Hello succeeded (one whose Hello was
  // refused, say) holds nothing: its SessionEnd is confirmed at once, so
  // the engine's close does not wait out its timeout.
  if (!greeted_ && !f.has_hello() && !f.has_session_end()) {
    Reply(seq, ProtocolFailure(v1::UNEXPECTED_MESSAGE,
                               "the first message must be Hello"));
    return true;
  }
  v1::Frame* const out = ReplyFrame(f.body_case());
  switch (f.body_case()) {
    case v1::Frame::kHello:
      Reply(seq, OnHello(f.hello(), out), out);
      return true;
    case v1::Frame::kAttach:
      Reply(seq, OnAttach(f.attach(), out), out);
      return true;
    case v1::Frame::kAlloc:
      Reply(seq, OnAlloc(f.alloc(), out), out);
      if (f.alloc().num_blocks() > kKeptReplyBlocks) alloc_reply_.Clear();
      return true;
    case v1::Frame::kFree: Reply(seq, OnFree(f.free(), out), out); return true;
    case v1::Frame::kReserve:
      Reply(seq, OnReserve(f.reserve(), out), out);
      return true;
    case v1::Frame::kReleaseReservation:
      Reply(seq, OnRelease(f.release_reservation(), out), out);
      return true;
    case v1::Frame::kCapacity:
      Reply(seq, OnCapacity(f.capacity(), out), out);
      return true;
    case v1::Frame::kRevokeAck: OnRevokeAck(seq, f.revoke_ack()); return true;
    case v1::Frame::kSessionEnd:
      release_on_end_ = f.session_end().release();
      end_seq_ = seq;
      return false;
    default:
      Reply(seq,
            ProtocolFailure(v1::UNEXPECTED_MESSAGE,
                            absl::StrCat("message ", f.body_case(),
                                         " is sent by the daemon, not to it")));
      return true;
  }
}

absl::Status AttachServer::Session::OnHello(const v1::Hello& hello,
                                            v1::Frame* out) {
  if (greeted_) {
    return ProtocolFailure(v1::UNEXPECTED_MESSAGE, "Hello was already said");
  }
  if (hello.protocol_version() < kMinProtocolVersion) {
    return ProtocolFailure(
        v1::UNSUPPORTED_VERSION,
        absl::StrCat("protocol version ", hello.protocol_version(),
                     " is not supported; this daemon speaks ",
                     kMinProtocolVersion, " to ", kProtocolVersion));
  }
  if (server_->options_.access != nullptr) {
    absl::StatusOr<const AccessPolicy::Grant*> grant =
        server_->options_.access->Authenticate(
            absl::StrCat("Bearer ", hello.token()));
    if (!grant.ok()) return grant.status();
    grant_ = *grant;
  }
  if (!ValidHolder(hello.holder())) {
    return InvalidField("hello.holder",
                        absl::StrCat("1 to ", kMaxHolderLength,
                                     " printable characters without spaces"));
  }
  const absl::Duration grace = FromProto(hello.reattach_grace());
  if (grace < absl::ZeroDuration() ||
      grace > server_->options_.max_reattach_grace) {
    return InvalidField(
        "hello.reattach_grace",
        absl::StrCat("must be in [0, ",
                     absl::FormatDuration(server_->options_.max_reattach_grace),
                     "]"));
  }
  bool reattached = false;
  {
    absl::MutexLock lock(&server_->mu_);
    auto it = server_->holders_.find(hello.holder());
    if (it != server_->holders_.end()) {
      if (it->second.session != nullptr) {
        return ProtocolFailure(
            v1::HOLDER_BUSY,
            absl::StrCat("holder ", hello.holder(), " has a live session (",
                         it->second.session->id(), ")"));
      }
      // A holder's blocks go only to a session of the token that made the
      // holder (any session, when the daemon has no tokens), and only while
      // that token may still use the blocks' pool: its name alone proves
      // nothing.
      const Holder& kept = it->second;
      if (kept.grant != grant_) {
        return MakeFailure(
            FailureReason::kPermissionDenied,
            absl::StrCat("holder ", hello.holder(),
                         " was made with another token; it cannot be "
                         "reattached with this one"),
            {{"holder", hello.holder()}});
      }
      if (grant_ != nullptr && kept.pool != nullptr) {
        KVB_RETURN_IF_ERROR(
            AccessPolicy::Authorize(*grant_, kept.pool->name(), "Hello"));
      }
      it->second.session = this;
      reattached = true;
    } else {
      it = server_->holders_.emplace(hello.holder(), Holder()).first;
      it->second.session = this;
      it->second.grant = grant_;
    }
    holder_entry_ = &it->second;
    holder_ = hello.holder();
    pid_ = hello.pid();
    attached_since_ = absl::Now();
    grace_ = grace;
  }
  greeted_ = true;
  v1::HelloReply* r = out->mutable_hello_reply();
  r->set_protocol_version(std::min(hello.protocol_version(), kProtocolVersion));
  r->set_session_id(id_);
  r->set_reattached(reattached);
  r->set_max_frame_bytes(kMaxFrameBytes);
  r->set_max_fds_per_frame(kMaxFdsPerFrame);
  return absl::OkStatus();
}

absl::Status AttachServer::Session::OnAttach(const v1::AttachRequest& request,
                                             v1::Frame* out) {
  if (pool_ != nullptr) {
    return ProtocolFailure(v1::UNEXPECTED_MESSAGE,
                           absl::StrCat("already attached to ", pool_name_));
  }
  KVB_RETURN_IF_ERROR(CheckPoolName("attach.pool", request.pool()));
  if (grant_ != nullptr) {
    KVB_RETURN_IF_ERROR(
        AccessPolicy::Authorize(*grant_, request.pool(), "Attach"));
  }
  KVB_RETURN_IF_ERROR(
      CheckId("attach.reservation_id", request.reservation_id()));
  KVB_RETURN_IF_ERROR(CheckId("attach.request_id", request.request_id()));
  if (request.reservation_blocks() < 0 ||
      request.reservation_blocks() > kMaxSessionBlocks) {
    return InvalidField(
        "attach.reservation_blocks",
        absl::StrCat("must be in [0, ", kMaxSessionBlocks, "]"));
  }
  if (request.reservation_id().empty() != (request.reservation_blocks() == 0)) {
    return InvalidField("attach.reservation_blocks",
                        "a reservation is redeemed with its id and a block "
                        "count, both or neither");
  }
  absl::StatusOr<std::shared_ptr<PagePool>> pool =
      server_->broker_->GetPool(request.pool());
  if (!pool.ok()) return pool.status();
  const Geometry& g = (*pool)->geometry();
  // Session devices: indices into the pool's device list, in the order
  // asked (or all of them).
  std::vector<int> indices;
  if (request.devices().empty()) {
    for (int i = 0; i < g.device_count(); ++i) indices.push_back(i);
  } else {
    for (int ordinal : request.devices()) {
      auto it = std::find(g.devices().begin(), g.devices().end(), ordinal);
      if (it == g.devices().end()) {
        return InvalidField(
            "attach.devices",
            absl::StrCat("device ", ordinal, " is not a device of pool ",
                         request.pool()));
      }
      const int index = static_cast<int>(it - g.devices().begin());
      if (std::find(indices.begin(), indices.end(), index) != indices.end()) {
        return InvalidField("attach.devices",
                            absl::StrCat("device ", ordinal, " repeated"));
      }
      indices.push_back(index);
    }
  }

  v1::AttachReply* reply = out->mutable_attach_reply();
  {
    absl::MutexLock lock(&server_->mu_);
    Holder& h = *holder_entry_;
    if (h.pool != nullptr && h.pool != *pool) {
      // A reattach to another pool: what the holder kept elsewhere goes.
      server_->FreeAll(holder_, h);
    }
    h.pool = *pool;
    const std::vector<int64_t> held = h.blocks.Sorted();
    for (int64_t b : held) {
      const int64_t page = g.page_of(b);
      if (reply->held_size() == 0 ||
          reply->held(reply->held_size() - 1).page_id() != page) {
        reply->add_held()->set_page_id(page);
      }
      reply->mutable_held(reply->held_size() - 1)->add_block_ids(b);
    }
    pool_ = *pool;
    pool_name_ = request.pool();
  }
  if (!request.reservation_id().empty()) {
    AllocRequest alloc;
    alloc.num_blocks = request.reservation_blocks();
    alloc.reservation_id = request.reservation_id();
    alloc.request_id = HolderRequestId(holder_, request.request_id());
    absl::Status redeemed =
        AllocForHolder(std::move(alloc), reply->mutable_redeemed());
    if (!redeemed.ok()) {
      absl::MutexLock lock(&server_->mu_);
      pool_ = nullptr;
      pool_name_.clear();
      return redeemed;
    }
  }

  v1::PoolLayout* layout = reply->mutable_layout();
  const PoolConfig& c = g.config();
  layout->set_pool(c.name);
  layout->set_virtual_bytes_per_device(g.virtual_bytes_per_device().value());
  layout->set_bundle_bytes(g.bundle_bytes().value());
  layout->set_block_stride_bytes(g.block_stride().value());
  layout->set_layer_offset_bytes(c.block_bytes.value() * c.num_kv_buffers);
  layout->set_buffer_offset_bytes(c.block_bytes.value());
  layout->set_page_size(c.page_size.value());
  layout->set_block_bytes(c.block_bytes.value());
  layout->set_num_layers(c.num_layers);
  layout->set_num_kv_buffers(c.num_kv_buffers);
  layout->set_page_count(g.page_count().value());
  layout->set_max_blocks(c.max_blocks);
  layout->set_tokens_per_block(c.tokens_per_block);
  layout->set_backend(server_->broker_->backend()->name());
  for (int index : indices) {
    v1::Device* d = layout->add_devices();
    d->set_ordinal(g.devices()[index]);
    d->set_uuid(server_->broker_->backend()->device_uuid(g.devices()[index]));
  }
  // Last, after any redemption mapped its pages: the snapshot names them.
  absl::StatusOr<int64_t> mapped = SubscribeToPages(indices);
  if (!mapped.ok()) {
    absl::MutexLock lock(&server_->mu_);
    pool_ = nullptr;
    pool_name_.clear();
    return mapped.status();
  }
  reply->set_mapped_pages(*mapped);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Page delivery

absl::StatusOr<int64_t> AttachServer::Session::SubscribeToPages(
    const std::vector<int>& devices) {
  outbox_.SetDevices(devices);
  int64_t pages = 0;
  absl::Status s =
      pool_->AddPageListener(&outbox_, [&](absl::Span<const MappedPage> now) {
        pages = outbox_.QueueSnapshot(now, seq_);
      });
  if (GetReason(s) == FailureReason::kPoolNotFound) return s;  // deleted
  if (!s.ok()) {
    return MakeFailure(
        FailureReason::kMappingFailed,
        absl::StrCat("the pool's pages cannot be exported: ", s.message()));
  }
  subscribed_ = true;
  return pages;
}

bool AttachServer::Session::FlushOutbox() {
  return CheckOutbox() && outbox_.Drain().ok();
}

bool AttachServer::Session::CheckOutbox() {
  // The hot path: nothing queued, nothing broken or failed (either stays
  // pending).
  if (!outbox_.pending()) return true;
  if (outbox_.failed()) return false;  // the socket is shut down already
  if (outbox_.broken()) {
    if (broken_sent_) return false;
    broken_sent_ = true;
    LogLine("attach: session %d (%s): a page could not be passed; ending it",
            id_, holder_);
    v1::Frame end;
    end.mutable_session_end()->set_message(
        "kvbrokerd could not pass a mapped page (out of file descriptors)");
    end.mutable_session_end()->set_reason(v1::PAGE_NOT_PASSED);
    outbox_.Send(end).IgnoreError();
    return false;
  }
  return true;
}

void AttachServer::Session::OnRevokeAck(uint64_t seq,
                                        const v1::RevokeAck& ack) {
  absl::Status s = subscribed_ ? pool_->AckRevocation(&outbox_, ack.revoke_id())
                               : absl::NotFoundError("not attached");
  if (!s.ok()) {
    Reply(seq,
          ProtocolFailure(v1::UNKNOWN_REVOCATION,
                          absl::StrCat("revocation ", ack.revoke_id(),
                                       " is not pending on this session")));
  }
}

void AttachServer::Session::FillPageInfo(SessionInfo* info) const {
  info->mapped_pages = outbox_.pages_sent() - outbox_.pages_revoked();
  if (pool_ == nullptr) return;
  info->pending_revocations = pool_->pending_revocations(&outbox_);
  info->quarantined_pages = pool_->quarantined_pages(&outbox_);
}

void AttachServer::Session::UnsubscribeFromPages() {
  if (!subscribed_) return;
  pool_->RemovePageListener(&outbox_);
  subscribed_ = false;
}

absl::Status AttachServer::Session::CheckPool(absl::string_view pool) const {
  if (pool_ == nullptr) {
    return ProtocolFailure(v1::UNEXPECTED_MESSAGE,
                           "attach to a pool before using it");
  }
  if (!pool.empty() && pool != pool_name_) {
    return InvalidField("pool", absl::StrCat("the session is attached to ",
                                             pool_name_, ", not ", pool));
  }
  return absl::OkStatus();
}

absl::Status AttachServer::Session::AllocForHolder(AllocRequest alloc,
                                                   kv1::AllocResponse* response,
                                                   bool as_runs) {
  alloc.holder = holder_;
  alloc.as_runs = as_runs;
  absl::StatusOr<AllocResult> result = pool_->Alloc(alloc);
  if (!result.ok()) return result.status();
  ToProto(*result, response);
  if (!result->replayed) {
    absl::MutexLock lock(&server_->mu_);
    for (const PageBlocks& p : result->pages) {
      holder_entry_->blocks.InsertAscending(p.block_ids);
    }
    const BlockRuns& runs = result->block_runs;
    for (size_t i = 0; i + 1 < runs.size(); i += 2) {
      holder_entry_->blocks.InsertRange(runs[i], runs[i] + runs[i + 1]);
    }
  }
  return absl::OkStatus();
}

absl::Status AttachServer::Session::TakeOwned(
    Holder& h, absl::Span<const int64_t> runs,
    absl::FunctionRef<absl::Span<const int64_t>()> named_ids,
    const std::string& holder) {
  constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
  // The caller's runs first: a run the holder owns whole is erased whole (a
  // repeat across runs finds its ids gone). At the first that fails, those
  // erased go back and the ids below find and name the culprit.
  size_t erased = 0;
  for (; erased + 1 < runs.size(); erased += 2) {
    const int64_t first = runs[erased], count = runs[erased + 1];
    if (first < 0 || count < 1 || first > kLargest - count ||
        !h.blocks.EraseRange(first, first + count)) {
      break;
    }
  }
  if (!runs.empty() && erased == runs.size()) return absl::OkStatus();
  for (size_t i = 0; i < erased; i += 2) {
    h.blocks.InsertRange(runs[i], runs[i] + runs[i + 1]);
  }
  const absl::Span<const int64_t> ids = named_ids();
  // Each id is taken out as it is checked, so a repeat finds itself gone;
  // on a refusal the ones taken go back and nothing changed.
  // Runs of consecutive ids go a word at a time; a run with an id the
  // holder lacks is walked one by one up to it.
  size_t taken = 0;
  while (taken < ids.size()) {
    size_t run = taken + 1;
    while (run < ids.size() && ids[run - 1] < kLargest &&
           ids[run] == ids[run - 1] + 1) {
      ++run;
    }
    if (ids[run - 1] < kLargest &&
        h.blocks.EraseRange(ids[taken], ids[run - 1] + 1)) {
      taken = run;
      continue;
    }
    while (taken < run && h.blocks.erase(ids[taken])) ++taken;
    break;
  }
  if (taken == ids.size()) return absl::OkStatus();
  const int64_t b = ids[taken];
  const bool repeated =
      std::find(ids.begin(), ids.begin() + taken, b) != ids.begin() + taken;
  h.blocks.insert(ids.begin(), ids.begin() + taken);
  // Foreign blocks are refused here, as the pool would refuse a block that
  // is not allocated at all.
  if (repeated) {
    return InvalidField("block_ids", absl::StrCat("block ", b, " repeated"));
  }
  return MakeFailure(FailureReason::kBlockNotAllocated,
                     absl::StrCat("block ", b, " is not allocated to holder ",
                                  holder, "; nothing was freed"),
                     {{"block_id", Num(b)}, {"holder", holder}});
}

void AttachServer::Session::ForgetOldFrees(Holder& h, absl::Time now) const {
  const absl::Duration window = server_->broker_->options().idempotency_window;
  while (!h.free_request_ids.empty()) {
    auto it = h.remembered_frees.find(h.free_request_ids.front());
    if (it != h.remembered_frees.end() && now - it->second.at < window) break;
    if (it != h.remembered_frees.end()) h.remembered_frees.erase(it);
    h.free_request_ids.pop_front();
  }
}

void AttachServer::Session::RememberFree(Holder& h,
                                         const std::string& request_id,
                                         std::string fingerprint,
                                         const FreeResult& result,
                                         absl::Time now) {
  if (request_id.empty()) return;
  auto [it, inserted] = h.remembered_frees.try_emplace(request_id);
  it->second = {std::move(fingerprint), result, now};
  if (!inserted) return;
  h.free_request_ids.push_back(request_id);
  if (h.free_request_ids.size() > kRememberedFrees) {
    h.remembered_frees.erase(h.free_request_ids.front());
    h.free_request_ids.pop_front();
  }
}

absl::Status AttachServer::Session::OnAlloc(const kv1::AllocRequest& request,
                                            v1::Frame* out) {
  // Every pool request meets the bounds of its gRPC twin first
  // (server/request_bounds.h: ids, lists, names, the reservation ttl), then
  // the session's own tighter ones, which keep each reply in one frame.
  KVB_RETURN_IF_ERROR(CheckBounds(request));
  KVB_RETURN_IF_ERROR(CheckPool(request.pool()));
  if (request.num_blocks() < 0 || request.num_blocks() > kMaxSessionBlocks) {
    return InvalidField(
        "num_blocks", absl::StrCat("must be in [0, ", kMaxSessionBlocks, "]"));
  }
  KVB_RETURN_IF_ERROR(CheckId("request_id", request.request_id()));
  KVB_RETURN_IF_ERROR(CheckId("reservation_id", request.reservation_id()));
  AllocRequest alloc;
  alloc.num_blocks = request.num_blocks();
  alloc.request_id = HolderRequestId(holder_, request.request_id());
  alloc.reservation_id = request.reservation_id();
  if (request.has_expected_generation()) {
    alloc.expected_generation = request.expected_generation();
  }
  return AllocForHolder(std::move(alloc), out->mutable_alloc_reply(),
                        request.block_runs());
}

absl::Status AttachServer::Session::OnFree(const kv1::FreeRequest& request,
                                           v1::Frame* out) {
  KVB_RETURN_IF_ERROR(CheckBounds(request));
  KVB_RETURN_IF_ERROR(CheckPool(request.pool()));
  if (request.block_ids_size() > kMaxSessionBlocks) {
    return InvalidField("block_ids",
                        absl::StrCat("more than ", kMaxSessionBlocks, " ids"));
  }
  KVB_RETURN_IF_ERROR(CheckId("request_id", request.request_id()));
  const std::string request_id = HolderRequestId(holder_, request.request_id());
  expanded_ids_.clear();
  absl::StatusOr<FreeRequest> named =
      FromProto(request, kMaxSessionBlocks, &expanded_ids_);
  if (!named.ok()) return named.status();
  // Runs stand for the ids only when they are all the Free named; then the
  // pool reads them as they are, and a list of ids is made only off the
  // usual path (a refusal, a request id).
  const absl::Span<const int64_t> runs = named->block_ids.empty()
                                             ? named->block_runs
                                             : absl::Span<const int64_t>();
  auto ids = [&]() -> absl::Span<const int64_t> {
    if (runs.empty()) return named->block_ids;
    if (expanded_ids_.empty()) {  // FromProto checked the runs already
      (void)ExpandBlockRuns(runs, kMaxSessionBlocks, &expanded_ids_);
    }
    return expanded_ids_;
  };
  const absl::Time now = server_->broker_->clock()->Now();
  // A Free's request id makes it idempotent for the holder: its outcome is
  // remembered here and a retry naming the same ids is answered with it. A
  // retry is never sent to the pool, whose window may have forgotten the
  // id while the freed blocks went to another holder: the pool would free
  // them again.
  std::string fingerprint;
  {
    absl::MutexLock lock(&server_->mu_);
    Holder& h = *holder_entry_;
    if (!request_id.empty()) {
      fingerprint = FreeFingerprint(ids());
      ForgetOldFrees(h, now);
      auto seen = h.remembered_frees.find(request_id);
      if (seen != h.remembered_frees.end()) {
        if (seen->second.fingerprint != fingerprint) {
          return MakeFailure(
              FailureReason::kRequestIdReused,
              absl::StrCat("request_id ", request.request_id(),
                           " was already used by holder ", holder_,
                           " to free other blocks"),
              {{"request_id", request.request_id()}, {"holder", holder_}});
        }
        FreeResult replay = seen->second.result;
        replay.replayed = true;
        ToProto(replay, out->mutable_free_reply());
        return absl::OkStatus();
      }
    }
    KVB_RETURN_IF_ERROR(TakeOwned(h, runs, ids, holder_));
  }
  FreeRequest free = *named;
  free.request_id = request_id;
  absl::StatusOr<FreeResult> result = pool_->Free(free);
  // The usual Free (freed, no request id) has nothing to settle.
  const bool settled = result.ok() && !result->replayed && request_id.empty();
  if (!settled) {
    absl::MutexLock lock(&server_->mu_);
    Holder& h = *holder_entry_;
    if (!result.ok() || result->replayed) {
      const absl::Span<const int64_t> back = ids();
      h.blocks.insert(back.begin(), back.end());
    } else {
      RememberFree(h, request_id, std::move(fingerprint), *result, now);
    }
  }
  if (!result.ok()) return result.status();
  ToProto(*result, out->mutable_free_reply());
  return absl::OkStatus();
}

absl::Status AttachServer::Session::OnReserve(
    const kv1::ReserveRequest& request, v1::Frame* out) {
  KVB_RETURN_IF_ERROR(CheckBounds(request));
  KVB_RETURN_IF_ERROR(CheckPool(request.pool()));
  if (request.num_blocks() > kMaxSessionBlocks) {
    return InvalidField("num_blocks",
                        absl::StrCat("more than ", kMaxSessionBlocks));
  }
  KVB_RETURN_IF_ERROR(CheckId("request_id", request.request_id()));
  ReserveRequest reserve = FromProto(request);
  reserve.request_id = HolderRequestId(holder_, request.request_id());
  absl::StatusOr<ReservationInfo> result = pool_->Reserve(reserve);
  if (!result.ok()) return result.status();
  ToProto(*result, out->mutable_reserve_reply());
  return absl::OkStatus();
}

absl::Status AttachServer::Session::OnRelease(
    const kv1::ReleaseReservationRequest& request, v1::Frame* out) {
  KVB_RETURN_IF_ERROR(CheckBounds(request));
  KVB_RETURN_IF_ERROR(CheckPool(request.pool()));
  KVB_RETURN_IF_ERROR(CheckId("reservation_id", request.reservation_id()));
  absl::StatusOr<ReleaseResult> result =
      pool_->ReleaseReservation(request.reservation_id());
  if (!result.ok()) return result.status();
  ToProto(*result, out->mutable_release_reservation_reply());
  return absl::OkStatus();
}

absl::Status AttachServer::Session::OnCapacity(
    const kv1::CapacityRequest& request, v1::Frame* out) {
  KVB_RETURN_IF_ERROR(CheckBounds(request));
  KVB_RETURN_IF_ERROR(CheckPool(request.pool()));
  if (request.max_pages() < 0 || request.max_pages() > kMaxSessionPageList) {
    return InvalidField(
        "max_pages", absl::StrCat("must be in [0, ", kMaxSessionPageList, "]"));
  }
  absl::StatusOr<CapacitySnapshot> capacity =
      pool_->Capacity(CapacityQuery{request.max_pages()});
  if (!capacity.ok()) return capacity.status();
  ToProto(*capacity, out->mutable_capacity_reply()->mutable_capacity());
  return absl::OkStatus();
}

}  // namespace kvbroker::attach
