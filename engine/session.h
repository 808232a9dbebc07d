// kvbroker::engine::Session: an inference engine's connection to kvbrokerd's
// attach socket (SPEC section 10).
//
//   auto s = Session::Connect({.socket_path = "/run/kvbroker/attach.sock",
//                              .holder = "vllm-rank0", .token = ...});
//   (*s)->Attach({.pool = "llama"});          // maps the pool's pages
//   auto blocks = (*s)->Alloc(16);            // owned by "vllm-rank0"
//   char* k = (char*)(*s)->BlockAddress(0, b, layer, 0);   // K of block b
//   ...
//   (*s)->Free(ids);
//   (*s)->Close();
//
// Mapping: Attach creates one DeviceMapper (mapper.h) per device the engine
// names and maps every page the daemon reports; afterwards the daemon sends
// PagesMapped before it hands out any block on a new page, and the session
// maps those pages while it reads the socket, which it does inside every
// call and in ProcessEvents. Each PagesMapped frame maps as one batch per
// device (DeviceMapper::MapMany), on every device or on none. Block b,
// layer l, buffer k of session device i is at
//   device_base(i) + b * block_stride_bytes + (l * K + k) * block_bytes.
//
// Revocations: when the daemon asks to unmap pages, the session unmaps them,
// calls the revocation callback (if any) with their ids, and acknowledges.
// When a device fails to unmap a page, the other devices still unmap it and
// the page no longer counts as mapped; the callback runs, but nothing is
// acknowledged (a page is still mapped here, so the daemon must not hand it
// to another holder: it quarantines the revocation's pages until the
// session ends), and the call returns the unmap's error.
// Nothing needs polling in the engine's hot loop: revocations that arrive
// during a call are handled by that call, and between calls the engine
// watches event_fd() (readable when the daemon sent something) in its event
// loop and then calls ProcessEvents().
//
// Errors: the daemon's typed failures come back as absl::Status with the
// kvbroker Failure payload (allocator/failure.h: GetReason) or a
// ProtocolError (attach/frame.h: ProtocolErrorOf), exactly as over gRPC.
// A call that fails because of what the daemon sent while it waited (pages
// that cannot be mapped, a failed revocation, a bad frame) returns that
// error at once; as after DEADLINE_EXCEEDED, its outcome is unknown and its
// reply, when it comes, is dropped.
//
// Thread safety: every method may be called from any thread; calls are
// serialised by an internal lock. The revocation callback runs on the
// calling thread with that lock held: it must not call into the Session.

#ifndef KVBROKER_ENGINE_SESSION_H_
#define KVBROKER_ENGINE_SESSION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attach/frame.h"
#include "common/plain_mutex.h"
#include "engine/mapper.h"
#include "proto/kvbroker/v1/attach.pb.h"

namespace kvbroker::engine {

struct ConnectOptions {
  // The daemon's --attach_socket.
  std::string socket_path;
  // A bearer token of the daemon's --auth_tokens; empty without tokens.
  std::string token;
  // Names the holder of the blocks this session allocates.
  std::string holder;
  // How long the daemon keeps the holder's blocks after the connection
  // drops, for a reattach under the same holder.
  absl::Duration reattach_grace = absl::ZeroDuration();
  // How long Close waits for the daemon to confirm the end of the session
  // (its SessionEnd reply, sent once the holder's blocks were freed or set
  // aside for the grace), sending its SessionEnd included.
  absl::Duration close_timeout = absl::Seconds(5);
  // How long a call polls the socket for the daemon's reply before it
  // sleeps in the kernel. Zero (the default) sleeps at once. A few tens of
  // microseconds keep the calling thread from being put to sleep and woken
  // for each reply (bench/RESULTS.md, "Polling for the reply"), at the
  // price of that thread's CPU while it waits; the daemon's side is
  // unchanged.
  absl::Duration reply_spin = absl::ZeroDuration();
  // How long a call waits for the daemon's reply (an Attach also for the
  // pages that complete it) before it returns DEADLINE_EXCEEDED; a wedged
  // daemon then cannot wedge the engine. Every frame the daemon sends
  // meanwhile (pages mapped, a revocation) starts the wait again. The
  // call's outcome is unknown: a
  // retry with the same request_id learns it. A reply that comes later is
  // dropped; an Attach that runs out of time ends the session, since the
  // pages the daemon announced to it are unknown. It also bounds each send
  // (a request, a revocation's acknowledgement), which waits only while the
  // daemon reads nothing: a send that times out returns DEADLINE_EXCEEDED
  // and ends the session, since the daemon has stopped reading it.
  // InfiniteDuration waits forever. set_call_timeout changes it.
  absl::Duration call_timeout = absl::Seconds(30);
  // The highest attach protocol version to offer (attach/frame.h). From 2
  // on, Alloc(n) and Free(ids) carry their blocks as runs of consecutive
  // ids; 1 lists every id, as a version-1 daemon needs (benchmarks offer 1
  // to compare).
  uint32_t protocol_version = attach::kProtocolVersion;
};

struct AttachOptions {
  std::string pool;
  // Pool device ordinals to map; empty: all of them.
  std::vector<int> devices;
  // Redeem a scheduler's reservation (AttachRequest).
  std::string reservation_id;
  int64_t reservation_blocks = 0;
  std::string request_id;
  // Map each PagesMapped frame's bundles as one batch per device
  // (DeviceMapper::MapMany: one set-access call per run of adjacent
  // bundles); false maps them one by one, as a baseline for benchmarks.
  bool batch_map = true;
  // Creates the mapper of each session device; empty: CreateMapper
  // (mapper.h). Tests wrap the real mappers to inject faults.
  std::function<absl::StatusOr<std::unique_ptr<DeviceMapper>>(
      const std::string& backend, const std::string& device_uuid, int64_t size)>
      create_mapper;
};

// Where the last Attach's time went (Session::attach_stats). Durations are
// wall-clock; import, map and access are summed over the session's devices
// (MapperStats), so with several devices they may add up to more than
// `total`.
struct AttachStats {
  int64_t pages = 0;         // pages mapped by the attach
  int64_t frames = 0;        // PagesMapped frames read
  int64_t access_calls = 0;  // set-access calls, every device
  absl::Duration total;      // AttachRequest sent to the last page mapped
  // Waiting for and reading the daemon's AttachReply and frames: the
  // daemon's work for the attach (its exports, unless the pool exports at
  // map time) and the transfer.
  absl::Duration receive;
  absl::Duration setup;  // creating the mappers (driver, context, range)
  absl::Duration import;
  absl::Duration map;
  absl::Duration access;
};

class Session {
 public:
  // Connects and says hello. UNAVAILABLE when nobody listens; the daemon's
  // typed refusal (UNAUTHENTICATED, UNSUPPORTED_VERSION, HOLDER_BUSY, ...)
  // otherwise.
  static absl::StatusOr<std::unique_ptr<Session>> Connect(
      const ConnectOptions& options);

  // Unmaps everything and closes the connection (the holder's grace
  // applies, as when the process dies).
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Attaches to a pool and maps its pages. FAILED_PRECONDITION when already
  // attached; the daemon's failures (POOL_NOT_FOUND, PERMISSION_DENIED,
  // INVALID_ARGUMENT for a device not in the pool, the reservation's
  // reasons), after which the session may attach again. Any other failure
  // (UNAVAILABLE when a page cannot be mapped here or the backend's driver
  // is missing, a malformed layout or reply, DEADLINE_EXCEEDED) leaves the
  // daemon and the engine disagreeing on what is attached and mapped, so it
  // also closes the session, keeping its own code.
  absl::StatusOr<attach::v1::AttachReply> Attach(const AttachOptions& options)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Set by Connect / Attach.
  const attach::v1::HelloReply& hello() const { return hello_; }
  // REQUIRES: attached. Constant once attached.
  const attach::v1::PoolLayout& layout() const { return layout_; }
  // A copy of the layout, taken under the lock; nullopt before an Attach
  // set it. For a thread that may run while another attaches.
  std::optional<attach::v1::PoolLayout> attached_layout() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Session devices, in the layout's order; REQUIRES: attached.
  int device_count() const { return layout_.devices_size(); }
  uint64_t device_base(int device_index) const;
  // The address of block `block`, layer `layer`, buffer `buffer` on session
  // device `device_index`: arithmetic only (the page may be unmapped).
  // INVALID_ARGUMENT outside the pool's geometry or before Attach.
  absl::StatusOr<uint64_t> BlockAddress(int device_index, int64_t block,
                                        int64_t layer, int64_t buffer) const;
  bool page_mapped(int64_t page_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Why the daemon ended the session; SESSION_END_REASON_UNSPECIFIED while
  // it has not (or the engine ended it).
  attach::v1::SessionEndReason end_reason() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t mapped_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Of the last successful Attach; all zero before one.
  AttachStats attach_stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Pool operations on the attached pool, with kvbroker.v1's semantics. The
  // request's `pool` may be left empty. Pages the call maps are mapped here
  // before it returns.
  absl::StatusOr<kvbroker::v1::AllocResponse> Alloc(
      kvbroker::v1::AllocRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  // All block ids of an Alloc, flattened in page order. A non-empty
  // `reservation_id` takes that reservation's blocks first (as
  // AllocRequest.reservation_id).
  absl::StatusOr<std::vector<int64_t>> Alloc(
      int64_t num_blocks, const std::string& request_id = "",
      const std::string& reservation_id = "") ABSL_LOCKS_EXCLUDED(mu_);
  // The same ids written to `out` instead, for a caller that keeps its own
  // buffer (the C ABI writes straight into the caller's array); returns how
  // many. INVALID_ARGUMENT, before anything is sent, when `out` has room
  // for fewer than `num_blocks` ids.
  absl::StatusOr<int64_t> AllocInto(int64_t num_blocks,
                                    const std::string& request_id,
                                    absl::Span<int64_t> out,
                                    const std::string& reservation_id = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<kvbroker::v1::FreeResponse> Free(
      kvbroker::v1::FreeRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<kvbroker::v1::FreeResponse> Free(
      absl::Span<const int64_t> block_ids, const std::string& request_id = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<kvbroker::v1::ReserveResponse> Reserve(
      kvbroker::v1::ReserveRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<kvbroker::v1::ReleaseReservationResponse> ReleaseReservation(
      kvbroker::v1::ReleaseReservationRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<kvbroker::v1::CapacityResponse> Capacity(
      kvbroker::v1::CapacityRequest request = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // ConnectOptions::reply_spin from the next call on (negative: zero).
  void set_reply_spin(absl::Duration spin) ABSL_LOCKS_EXCLUDED(mu_);
  // ConnectOptions::call_timeout from the next call on (zero or negative:
  // the call gives up at once unless the reply is there).
  void set_call_timeout(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Readable whenever the daemon has sent something (a revocation, new
  // pages); watch it with poll/epoll and call ProcessEvents.
  int event_fd() const { return channel_.fd(); }
  // Handles every message waiting on the socket without blocking: maps new
  // pages, carries out revocations. CANCELLED once the daemon ended the
  // session; when it ended it because the pool was deleted, the call that
  // read the SessionEnd gets POOL_NOT_FOUND (GetReason), after the
  // revocations sent before it were carried out and acknowledged.
  absl::Status ProcessEvents() ABSL_LOCKS_EXCLUDED(mu_);
  // Called with the page ids of each revocation after they were unmapped.
  void SetRevocationCallback(std::function<void(absl::Span<const int64_t>)> cb)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the session: with `release`, the holder's blocks are freed now;
  // otherwise its reattach grace applies. Sends SessionEnd and waits (up to
  // ConnectOptions::close_timeout) for the daemon's SessionEnd reply, so
  // that when Close returns OK the daemon has finished with the session: the
  // holder's blocks are free or parked, and a new session may say hello
  // under the same holder name at once (no HOLDER_BUSY). Messages arriving
  // meanwhile are dropped (their fds closed). DEADLINE_EXCEEDED when the
  // daemon did not answer in time; OK too when the daemon had already ended
  // the session or closed the socket. Unmaps every page in every case.
  // Idempotent.
  absl::Status Close(bool release = true) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Session(attach::FrameChannel channel, const ConnectOptions& options);

  // Sends Alloc(num_blocks) and returns the daemon's reply, whose block
  // count is checked to lie in [0, num_blocks].
  absl::StatusOr<const kvbroker::v1::AllocResponse*> CallAlloc(
      int64_t num_blocks, const std::string& request_id,
      const std::string& reservation_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a call: the frames of the last one are dropped and a fresh
  // request frame of frames_ is returned.
  attach::v1::Frame* NewRequest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `request` (from NewRequest) with a fresh seq and reads until its
  // reply, handling daemon-initiated messages on the way. The reply is a
  // frame of frames_: valid until the next NewRequest. DEADLINE_EXCEEDED
  // when no frame came for call_timeout_. Returns at once, with the event's
  // error, when an event read on the way fails; a reply that comes after
  // its call returned is dropped (HandleEvent).
  // `answered`, when given, says whether the call's own reply was read (an
  // error reply included).
  absl::StatusOr<const attach::v1::Frame*> Call(attach::v1::Frame* request,
                                                bool* answered = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the socket's receive and send timeouts to call_timeout_.
  void ApplyCallTimeout() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a send that timed out (the daemon reads nothing): closes the
  // session and returns DEADLINE_EXCEEDED.
  absl::Status EndAfterSendTimeout() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Call on an attached session, refusing a reply that is not `expected`
  // (`what` names it: "an Alloc reply").
  absl::StatusOr<const attach::v1::Frame*> CallAttached(
      attach::v1::Frame* request, attach::v1::Frame::BodyCase expected,
      const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed send (the daemon closed the connection): handles what
  // the daemon sent before it closed, without blocking; returns the status
  // of its SessionEnd (OK when none came).
  absl::Status ReadAfterHangup() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handles a frame that is not the reply of the call in progress: a
  // message the daemon started (PagesMapped, Revoke, SessionEnd, Error),
  // or the late reply of a call that already returned, which is dropped.
  absl::Status HandleEvent(const attach::v1::Frame& f,
                           std::vector<UniqueFd> fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MapPages(const attach::v1::PagesMapped& pages,
                        std::vector<UniqueFd> fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Revoke(const attach::v1::Revoke& revoke)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckAttached() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // MALFORMED_FRAME unless every id names a block of the pool whose pages
  // are all mapped here: the daemon announces a page before it hands out a
  // block on it (SPEC section 10), and an engine that wrote to a block on
  // a page it has not mapped would fault.
  absl::Status CheckHandedOut(absl::Span<const int64_t> ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the ids of the Alloc reply `r` to `out` (room for exactly
  // r.num_blocks()), then CheckHandedOut.
  absl::Status ReadHandedOut(const kvbroker::v1::AllocResponse& r,
                             absl::Span<int64_t> out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same into a vector, after checking that `r` hands out at most
  // `asked` blocks (`what` names the call).
  absl::StatusOr<std::vector<int64_t>> HandedOutIds(
      const kvbroker::v1::AllocResponse& r, int64_t asked,
      absl::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads until the daemon's SessionEnd answering `seq`, the daemon's own
  // SessionEnd, or the end of the stream, until `deadline`.
  absl::Status AwaitSessionEnd(uint64_t seq, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  attach::FrameChannel channel_;
  const absl::Duration close_timeout_;
  attach::v1::HelloReply hello_;
  // The daemon chose protocol version 2 or later: Alloc(n) and Free(ids)
  // carry block runs. Written once by Connect.
  bool runs_ = false;
  // Written once by Attach (under mu_), then read without it by what
  // requires an attached session; attached_layout() reads it under mu_.
  attach::v1::PoolLayout layout_;

  mutable PlainMutex mu_;
  // ConnectOptions::reply_spin, in ns (0 or less: none); set_reply_spin
  // changes it.
  int64_t reply_spin_ns_ ABSL_GUARDED_BY(mu_);
  absl::Duration call_timeout_ ABSL_GUARDED_BY(mu_);
  // The frames of the call in progress (attach/frame.h, kFrameArenaBytes).
  alignas(std::max_align_t) char frame_block_[attach::kFrameArenaBytes];
  google::protobuf::Arena frames_ ABSL_GUARDED_BY(mu_);
  // The request frames of Alloc(n) and Free(ids), kept from call to call
  // (on the heap, with their bodies and repeated fields) so that those
  // calls build no request: each sets every field it sends.
  attach::v1::Frame alloc_request_ ABSL_GUARDED_BY(mu_);
  attach::v1::Frame free_request_ ABSL_GUARDED_BY(mu_);
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  attach::v1::SessionEndReason end_reason_ ABSL_GUARDED_BY(mu_) =
      attach::v1::SESSION_END_REASON_UNSPECIFIED;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // One per session device, in layout_.devices order.
  std::vector<std::unique_ptr<DeviceMapper>> mappers_ ABSL_GUARDED_BY(mu_);
  // Page ids mapped on every session device.
  std::vector<bool> mapped_ ABSL_GUARDED_BY(mu_);
  int64_t mapped_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool batch_map_ ABSL_GUARDED_BY(mu_) = true;
  AttachStats attach_stats_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Span<const int64_t>)> on_revoke_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvbroker::engine

#endif  // KVBROKER_ENGINE_SESSION_H_
