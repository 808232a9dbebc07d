// AttachServer::Session: one engine's connection (attach_server.h says
// what a session is and which rules its holder's blocks follow). Its own
// thread receives each request, answers it in order and sends what the
// outbox queued meanwhile; the holder's entry it points at belongs to the
// server and is touched under the server's lock.
//
// Private to the attach_server library: only attach_server.cc and
// session.cc include it.

#ifndef KVBROKER_ATTACH_SESSION_H_
#define KVBROKER_ATTACH_SESSION_H_

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attach/attach_server.h"
#include "attach/frame.h"
#include "attach/outbox.h"
#include "google/protobuf/arena.h"

namespace kvbroker::attach {

class AttachServer::Session {
 public:
  Session(AttachServer* server, uint64_t id, UniqueFd socket);

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  uint64_t id() const { return id_; }
  // Ends the session's wait for the engine (Stop): its next receive reads
  // end of stream. Called under the server's lock.
  void Interrupt() { shutdown(channel_.fd(), SHUT_RD); }
  // Ends a session that has not said Hello, to make room for another
  // connection: its socket is shut both ways. Called under the server's
  // lock, which Hello takes, so the session cannot be greeted afterwards.
  void Evict() {
    evicted_ = true;
    shutdown(channel_.fd(), SHUT_RDWR);
  }
  // Read and written under the server's lock.
  bool evicted() const { return evicted_; }
  // Set once by Hello / Attach on the session's thread, read under the
  // server's lock by Sessions().
  const std::string& holder() const { return holder_; }
  int64_t pid() const { return pid_; }
  const std::string& pool_name() const { return pool_name_; }
  // The page-delivery fields of `info`; called under the server's lock.
  void FillPageInfo(SessionInfo* info) const;
  // Whether the engine asked for its blocks to go now (SessionEnd.release).
  bool release_on_end() const { return release_on_end_; }
  absl::Duration grace() const { return grace_; }
  absl::Time attached_since() const { return attached_since_; }

 private:
  void Run();
  // Answers the engine's SessionEnd (when it asked with a seq) once
  // Finished has freed or parked the holder's blocks; `outcome` says which.
  void ConfirmEnd(const std::string& outcome);
  // Answers one frame; false when the session ends.
  bool Handle(const v1::Frame& f);
  // Sends `out` with `seq` as the reply, or an Error of `status` instead
  // when it is not OK.
  void Reply(uint64_t seq, const absl::Status& status, v1::Frame* out);
  // A reply that is an Error.
  void Reply(uint64_t seq, const absl::Status& failure);
  // The handlers write their reply into `out` (a frame of frames_); a
  // refusal returned leaves `out` to be replaced by its Error.
  absl::Status OnHello(const v1::Hello& hello, v1::Frame* out);
  absl::Status OnAttach(const v1::AttachRequest& request, v1::Frame* out);
  absl::Status OnAlloc(const ::kvbroker::v1::AllocRequest& request,
                       v1::Frame* out);
  absl::Status OnFree(const ::kvbroker::v1::FreeRequest& request,
                      v1::Frame* out);
  absl::Status OnReserve(const ::kvbroker::v1::ReserveRequest& request,
                         v1::Frame* out);
  absl::Status OnRelease(
      const ::kvbroker::v1::ReleaseReservationRequest& request, v1::Frame* out);
  absl::Status OnCapacity(const ::kvbroker::v1::CapacityRequest& request,
                          v1::Frame* out);
  // Page delivery (attach/outbox.h): registers the outbox with the pool and
  // queues the snapshot; returns how many pages it names.
  absl::StatusOr<int64_t> SubscribeToPages(const std::vector<int>& devices);
  // Sends what the outbox holds; false when the session must end.
  bool FlushOutbox();
  // False when the outbox broke (the session must end; the engine was
  // told once) or a send failed (the session ends as a dropped
  // connection); true otherwise, sending nothing.
  bool CheckOutbox();
  // SO_RCVTIMEO of the session's socket.
  void SetReceiveTimeout(absl::Duration timeout);
  // Unregisters the outbox from the pool (the session ends); its pending
  // revocations count as acknowledged.
  void UnsubscribeFromPages();
  // The engine unmapped a revocation's pages. Answered only when refused.
  void OnRevokeAck(uint64_t seq, const v1::RevokeAck& ack);
  // Refuses a pool operation before Attach or naming another pool.
  absl::Status CheckPool(absl::string_view pool) const;
  // Allocates through the pool into `response` (its blocks as runs when
  // `as_runs`) and records the blocks as the holder's.
  absl::Status AllocForHolder(AllocRequest alloc,
                              ::kvbroker::v1::AllocResponse* response,
                              bool as_runs = false);
  // Takes the ids a Free names (`named_ids()`) out of the holder's set if
  // it owns each exactly once; otherwise changes nothing and refuses
  // (INVALID_ARGUMENT for a repeat, BLOCK_NOT_ALLOCATED for one it does not
  // own). `runs`, when not empty, are (first, count) pairs that expand to
  // exactly those ids (a Free that named its blocks by runs only): each is
  // taken a word at a time, and only a refusal asks for the ids.
  static absl::Status TakeOwned(
      Holder& h, absl::Span<const int64_t> runs,
      absl::FunctionRef<absl::Span<const int64_t>()> named_ids,
      const std::string& holder);
  // Forgets the holder's Frees older than the pool's idempotency window.
  void ForgetOldFrees(Holder& h, absl::Time now) const;
  // Remembers a Free's outcome under its request id (bounded), for its
  // retry.
  static void RememberFree(Holder& h, const std::string& request_id,
                           std::string fingerprint, const FreeResult& result,
                           absl::Time now);

  // A frame of frames_, valid until the next request is received.
  v1::Frame* NewFrame() {
    return google::protobuf::Arena::CreateMessage<v1::Frame>(&frames_);
  }
  // The frame to answer a request of kind `request` in: the kept reply of
  // an Alloc or a Free (its body cleared, its room kept), else NewFrame().
  v1::Frame* ReplyFrame(v1::Frame::BodyCase request);

  AttachServer* const server_;
  const uint64_t id_;
  FrameChannel channel_;
  std::thread thread_;
  // The request being answered and its reply (frame.h, kFrameArenaBytes),
  // beside those of earlier requests until RecycleFrameArena resets it
  // before a receive. Touched only by the session's thread.
  alignas(std::max_align_t) char frame_block_[kFrameArenaBytes];
  google::protobuf::Arena frames_;
  // The replies of Alloc and Free, the usual requests, kept from request to
  // request on the heap so that those build no reply frame (ReplyFrame). An
  // Alloc reply that grew past kKeptReplyBlocks ids is dropped after use.
  v1::Frame alloc_reply_;
  v1::Frame free_reply_;

  // Session state, touched only by the session's thread (holder_, pid_,
  // grace_ and pool_name_ are also read by Sessions(), after being written
  // under the server's lock).
  bool greeted_ = false;
  // When the session must have said Hello by (hello_timeout).
  const absl::Time hello_deadline_;
  // Evict() was called (under the server's lock).
  bool evicted_ = false;
  std::string holder_;
  // The holder's entry in server_->holders_, set by Hello; stays while
  // this session is its live session (only Finished, on this thread,
  // erases it then). Used under the server's lock.
  Holder* holder_entry_ = nullptr;
  int64_t pid_ = 0;
  absl::Duration grace_;
  const AccessPolicy::Grant* grant_ = nullptr;
  std::shared_ptr<PagePool> pool_;
  std::string pool_name_;
  bool release_on_end_ = false;
  // The seq of the frame being answered.
  uint64_t seq_ = 0;
  // The ids of a Free that names block_runs, expanded; reused so that a
  // session's Frees allocate once.
  std::vector<int64_t> expanded_ids_;
  // Frames the daemon starts; registered with pool_ while attached.
  Outbox outbox_;
  bool subscribed_ = false;
  // The PAGE_NOT_PASSED SessionEnd of a broken outbox was sent.
  bool broken_sent_ = false;
  // When Hello was accepted; written under the server's lock.
  absl::Time attached_since_;
  // The seq of the engine's SessionEnd; 0 when it sent none or sent it
  // without a seq (then it is not answered).
  uint64_t end_seq_ = 0;
};

}  // namespace kvbroker::attach

#endif  // KVBROKER_ATTACH_SESSION_H_
