// KvBrokerClient: the C++ client of kvbrokerd (SPEC sections 5 and 6).
//
// It hides the generated stub and returns absl::Status / absl::StatusOr.
// Replies are the kvbroker.v1 messages themselves (they are plain data and
// print as JSON with protobuf's util); BlockIds() flattens an Alloc or
// Reserve reply.
//
//   ClientOptions options;
//   options.target = "unix:/tmp/kvbroker.sock";   // or "10.0.0.7:50051"
//   auto client = KvBrokerClient::Connect(options);
//   if (!client.ok()) return client.status();
//   absl::StatusOr<v1::CapacitySnapshot> cap = (*client)->Capacity("demo");
//   absl::StatusOr<v1::AllocResponse> blocks = (*client)->Alloc("demo", 3);
//   if (!blocks.ok()) {
//     KvbError e = GetKvbError(blocks.status()).value();
//     if (e.reason == v1::POOL_EXHAUSTED) { ... wait for frees ... }
//   }
//
// Errors. Every failed call returns a status whose code is the gRPC code
// (absl and gRPC codes are equal number for number) and whose payload
// (kKvbErrorPayloadUrl) is the google.rpc.Status of the grpc-status-details-bin
// trailer. GetKvbError() turns it into a KvbError: the SPEC 6 reason (the
// proto's kvbroker.v1.Reason, from the ErrorInfo of domain "kvbroker"), the
// metadata map, BadRequest field violations and RetryInfo. Errors that the
// gRPC library produced itself (connection refused, deadline exceeded, ...)
// have no payload: their KvbError has reason REASON_UNSPECIFIED. Key on the
// reason, never on the code alone.
//
// Deadlines. Every unary call runs under one deadline that covers all its
// attempts: CallOptions::deadline, else now + ClientOptions::timeout.
// WatchCapacity has no deadline unless CallOptions gives one.
//
// Retries. Only idempotent calls are retried, and only on UNAVAILABLE that
// is either the transport's own (no kvbroker reason), MAPPING_FAILED (a
// driver error that was rolled back) or DRAINING. Capacity refusals
// (POOL_EXHAUSTED, GPU_MEMORY_EXHAUSTED, ...) and every other kvbroker
// reason, one this build does not know included, are returned at once.
// Idempotent calls: GetPool, ListPools, Capacity, GetPageOccupancy,
// ListSessions (read-only); SetMemoryLimit (its revision makes a replay
// harmless); Alloc, Reserve and Free, because they always carry a request_id:
// the caller's, or a random 128-bit hex id generated once per call and sent
// unchanged on every attempt, so the daemon replays the first outcome instead
// of allocating twice. CreatePool, DeletePool, ReleaseReservation and Trim are
// sent once. Attempts are bounded by RetryPolicy::max_attempts and by the
// deadline; the wait between attempts grows exponentially with random jitter,
// and is at least the server's RetryInfo delay when it sent one.
//
// Authentication. With TlsOptions set the channel uses
// grpc::SslCredentials (root CA; client certificate and key for mTLS);
// otherwise it is insecure (a Unix socket, or TCP on a trusted network).
// With a bearer token, every call carries "authorization: Bearer <token>".
//
// Thread safety: a KvBrokerClient is thread-safe; calls may run concurrently
// from any number of threads. A CapacityWatch is used by one thread, except
// Cancel(), which any thread may call.

#ifndef KVBROKER_CLIENT_KVBROKER_CLIENT_H_
#define KVBROKER_CLIENT_KVBROKER_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/error_codec.h"
#include "common/error_keys.h"
#include "proto/google/rpc/error_details.pb.h"
#include "proto/google/rpc/status.pb.h"
#include "proto/grpc/health/v1/health.pb.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {

// ---------------------------------------------------------------------------
// Typed errors.

// The failure codec (KvbError, GetKvbError, GetKvbReason, KvbStatusFromGrpc,
// GetDetail) is client/error_codec.h, shared with the tests; the domain and
// the metadata keys are named in common/error_keys.h.
inline constexpr absl::string_view kKvbErrorDomain = kErrorDomain;

// True for the refusals that mean "not enough capacity now or ever":
// POOL_EXHAUSTED, GPU_MEMORY_EXHAUSTED, SHRINK_PENDING, REQUEST_TOO_LARGE.
bool IsCapacityRefusal(v1::Reason reason);

// ---------------------------------------------------------------------------
// Options.

struct TlsOptions {
  // PEM. Empty root_ca_pem: the system's default roots.
  std::string root_ca_pem;
  // PEM, for mutual TLS; both or neither.
  std::string cert_chain_pem;
  std::string private_key_pem;
  // Overrides the name checked against the server certificate (tests).
  std::string target_name_override;

  // Reads the PEM files; an empty path leaves its field empty.
  // Errors: NOT_FOUND for a file that cannot be opened; INVALID_ARGUMENT
  // for one that is empty or reads nothing (a directory), which would
  // otherwise mean "the system's roots".
  static absl::StatusOr<TlsOptions> FromFiles(const std::string& root_ca_path,
                                              const std::string& cert_path,
                                              const std::string& key_path);
};

struct RetryPolicy {
  // Attempts per call including the first; 1 disables retries.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  double backoff_multiplier = 2.0;
  // Each wait is drawn uniformly from [w * (1 - jitter), w * (1 + jitter)].
  double jitter = 0.2;
};

struct ClientOptions {
  // "host:port", "unix:/path/to.sock" (anything gRPC accepts as a target).
  std::string target = "127.0.0.1:50051";
  // Set: TLS. Unset: insecure.
  std::optional<TlsOptions> tls;
  // Non-empty: "authorization: Bearer <token>" on every call. Printable
  // ASCII only (gRPC cannot send other bytes in a header): Connect refuses
  // anything else with INVALID_ARGUMENT, never naming the token.
  std::string bearer_token;
  // The deadline of a unary call (all attempts) when CallOptions gives none.
  absl::Duration timeout = absl::Seconds(10);
  RetryPolicy retry;
};

// Per call.
struct CallOptions {
  // When the call, all attempts included, must finish. Unset: now +
  // ClientOptions::timeout (unary calls) or none (WatchCapacity).
  std::optional<absl::Time> deadline;

  static CallOptions WithTimeout(absl::Duration timeout) {
    CallOptions o;
    o.deadline = absl::Now() + timeout;
    return o;
  }
};

struct AllocOptions {
  // Idempotency key. Empty: a random one, reused across retries.
  std::string request_id;
  // Take blocks from this reservation first. Empty: none.
  std::string reservation_id;
  // Refuse with GENERATION_MISMATCH unless the pool is at this generation.
  std::optional<uint64_t> expected_generation;
  // Refuse with POOL_NOT_FOUND unless the pool is this incarnation (e.g. the
  // one the reservation came from). Empty: not checked.
  std::string pool_uid;
};

struct ReserveOptions {
  // Idempotency key. Empty: a random one, reused across retries.
  std::string request_id;
  // Lifetime of the reservation. Zero: the server's default (30 s).
  absl::Duration ttl = absl::ZeroDuration();
};

struct FreeOptions {
  // Idempotency key. Empty: a random one, reused across retries.
  std::string request_id;
  // The incarnation the blocks came from (AllocResponse::pool_uid): if the
  // pool was deleted and created again since, POOL_NOT_FOUND and nothing is
  // freed. Empty: not checked.
  std::string pool_uid;
};

struct ReleaseOptions {
  // The incarnation the reservation came from (ReserveResponse::pool_uid).
  // Empty: not checked.
  std::string pool_uid;
};

// Every block id of an Alloc or Reserve reply, in reply order (ascending
// page, then ascending id).
std::vector<int64_t> BlockIds(const v1::AllocResponse& response);
std::vector<int64_t> BlockIds(const v1::ReserveResponse& response);

// A random 128-bit id as 32 lowercase hex digits.
std::string NewRequestId();

// OK iff `token` can be sent as a bearer token: gRPC aborts the process on
// a header value with a byte outside printable ASCII (a token read from a
// file often ends with a line break), so Connect, and anything else that
// puts a token in call metadata, refuses such a token before any call.
// INVALID_ARGUMENT names the byte and its offset, never the token.
absl::Status CheckBearerToken(absl::string_view token);

// ---------------------------------------------------------------------------
// Watching capacity.

// Iterator-style reader of one WatchCapacity stream:
//   auto watch = client->WatchCapacity("demo");
//   v1::CapacitySnapshot snap;
//   while (watch->Next(&snap)) { ... }
//   absl::Status end = watch->Finish();  // POOL_NOT_FOUND when deleted
class CapacityWatch {
 public:
  ~CapacityWatch();
  CapacityWatch(const CapacityWatch&) = delete;
  CapacityWatch& operator=(const CapacityWatch&) = delete;

  // Blocks until the next snapshot. False once the stream has ended (then
  // call Finish).
  bool Next(v1::CapacitySnapshot* snapshot);
  // How the stream ended: OK when the server is shutting down, the pool's
  // POOL_NOT_FOUND when it was deleted, CANCELLED after Cancel(), or a
  // transport error. REQUIRES: Next returned false.
  absl::Status Finish();
  // Ends the stream; a blocked Next returns false. Any thread, any time.
  void Cancel();

 private:
  friend class KvBrokerClient;
  CapacityWatch() = default;

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::WatchCapacityResponse>> reader_;
  bool finished_ = false;
  absl::Status final_status_;
};

// ---------------------------------------------------------------------------
// The client.

class KvBrokerClient {
 public:
  // Creates the channel (lazily connected: an unreachable server shows up
  // as UNAVAILABLE on the first call, or from WaitReady). Errors:
  // INVALID_ARGUMENT for an empty target, a bearer token that is not
  // printable ASCII or a TLS certificate without its key.
  static absl::StatusOr<std::unique_ptr<KvBrokerClient>> Connect(
      ClientOptions options);

  // Over an existing channel (tests: Server::InProcessChannel).
  // `options.target` and `options.tls` are ignored.
  static std::unique_ptr<KvBrokerClient> FromChannel(
      std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});

  KvBrokerClient(const KvBrokerClient&) = delete;
  KvBrokerClient& operator=(const KvBrokerClient&) = delete;

  const ClientOptions& options() const { return options_; }

  // Blocks until the channel holds a connection to the daemon, trying again
  // meanwhile (a daemon still starting, a first attempt that failed), for at
  // most `timeout` (default: ClientOptions::timeout). Worth calling before a
  // first call that is sent once, such as CreatePool: on a channel whose
  // last attempt failed, a call fails at once until the reconnect backoff
  // has passed. UNAVAILABLE (no kvbroker reason) naming the target when no
  // connection came in time.
  absl::Status WaitReady(std::optional<absl::Duration> timeout = {}) const;

  // Pool lifecycle. Reasons: CreatePool INVALID_ARGUMENT, INVALID_GEOMETRY,
  // POOL_ALREADY_EXISTS, GPU_MEMORY_EXHAUSTED, MAPPING_FAILED; GetPool,
  // DeletePool POOL_NOT_FOUND; DeletePool POOL_NOT_EMPTY unless `force`.
  absl::StatusOr<v1::PoolInfo> CreatePool(const v1::PoolSpec& spec,
                                          const CallOptions& call = {});
  absl::StatusOr<v1::PoolInfo> GetPool(absl::string_view pool,
                                       const CallOptions& call = {});
  // Ordered by name.
  absl::StatusOr<std::vector<v1::PoolInfo>> ListPools(
      const CallOptions& call = {});
  absl::Status DeletePool(absl::string_view pool, bool force = false,
                          const CallOptions& call = {});

  // Exact capacity (SPEC 4); with max_pages > 0 also the per-page list (at
  // most that many entries). Reasons: POOL_NOT_FOUND.
  absl::StatusOr<v1::CapacitySnapshot> Capacity(absl::string_view pool,
                                                int64_t max_pages = 0,
                                                const CallOptions& call = {});

  // All or nothing. Reasons: see kvbroker.proto (capacity refusals,
  // RESERVATION_*, GENERATION_MISMATCH, REQUEST_ID_REUSED, MAPPING_FAILED,
  // POOL_FAILED, ...).
  absl::StatusOr<v1::AllocResponse> Alloc(absl::string_view pool,
                                          int64_t num_blocks,
                                          const AllocOptions& options = {},
                                          const CallOptions& call = {});
  // All or nothing. Reasons: INVALID_ARGUMENT, POOL_NOT_FOUND,
  // BLOCK_NOT_ALLOCATED, BLOCK_IN_RESERVATION, REQUEST_ID_REUSED.
  absl::StatusOr<v1::FreeResponse> Free(absl::string_view pool,
                                        absl::Span<const int64_t> block_ids,
                                        const FreeOptions& options = {},
                                        const CallOptions& call = {});
  // All or nothing; the same refusals as Alloc.
  absl::StatusOr<v1::ReserveResponse> Reserve(
      absl::string_view pool, int64_t num_blocks,
      const ReserveOptions& options = {}, const CallOptions& call = {});
  // Reasons: POOL_NOT_FOUND, RESERVATION_NOT_FOUND, RESERVATION_EXPIRED.
  absl::StatusOr<v1::ReleaseReservationResponse> ReleaseReservation(
      absl::string_view pool, absl::string_view reservation_id,
      const CallOptions& call = {});
  // The same, refused (POOL_NOT_FOUND) unless the pool is still the
  // incarnation of `options.pool_uid`.
  absl::StatusOr<v1::ReleaseReservationResponse> ReleaseReservation(
      absl::string_view pool, absl::string_view reservation_id,
      const ReleaseOptions& options, const CallOptions& call = {});

  // SPEC 7. STALE and CONFLICT are outcomes in the reply, not errors.
  // Reasons: INVALID_ARGUMENT, POOL_NOT_FOUND, POOL_FAILED.
  absl::StatusOr<v1::SetMemoryLimitResponse> SetMemoryLimit(
      absl::string_view pool, int64_t limit_bytes, int64_t revision,
      const CallOptions& call = {});
  // Unmaps at most `max_pages` IDLE pages (<= 0: all). Reasons:
  // POOL_NOT_FOUND, POOL_FAILED.
  absl::StatusOr<v1::TrimResponse> Trim(absl::string_view pool,
                                        int64_t max_pages = 0,
                                        const CallOptions& call = {});
  // In the order of `page_ids`. Reasons: INVALID_ARGUMENT, POOL_NOT_FOUND.
  absl::StatusOr<std::vector<v1::PageOccupancy>> GetPageOccupancy(
      absl::string_view pool, absl::Span<const int64_t> page_ids,
      const CallOptions& call = {});
  // Engines attached on the daemon's attach socket, and holders in grace,
  // ordered by pool then holder; `pool` empty: every one the caller may
  // see. Reasons: INVALID_ARGUMENT, PERMISSION_DENIED, POOL_NOT_FOUND.
  absl::StatusOr<std::vector<v1::EngineSession>> ListSessions(
      absl::string_view pool = "", const CallOptions& call = {});

  // grpc.health.v1.Health/Check: the serving status of `service`, "" for the
  // daemon as a whole or "kvbroker.v1.KvBroker" (NOT_SERVING while draining
  // or when the backend has failed). Open without a token, sent once (a probe
  // wants the answer now). Reasons: NOT_FOUND for a service the daemon does
  // not know, UNAVAILABLE when it cannot be reached.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      absl::string_view service = "", const CallOptions& call = {});

  // Opens a WatchCapacity stream (never retried; reopen it to resume).
  std::unique_ptr<CapacityWatch> WatchCapacity(absl::string_view pool,
                                               int64_t max_pages = 0,
                                               const CallOptions& call = {});
  // Callback style: calls `on_snapshot` for each snapshot until it returns
  // false (then cancels the stream and returns OK) or the stream ends
  // (returns CapacityWatch::Finish()).
  absl::Status WatchCapacity(
      absl::string_view pool, int64_t max_pages,
      const std::function<bool(const v1::CapacitySnapshot&)>& on_snapshot,
      const CallOptions& call = {});

 private:
  KvBrokerClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // Whether a failed attempt may be sent again.
  enum class Idempotency { kNone, kRetryable };

  // Sets the deadline and credentials metadata of one attempt.
  void Prepare(grpc::ClientContext* context, absl::Time deadline) const;
  absl::Time DeadlineOf(const CallOptions& call) const;

  // Runs `attempt` (one RPC over a fresh ClientContext) until it succeeds,
  // fails for good, runs out of attempts or the deadline passes.
  template <typename Response>
  absl::StatusOr<Response> Call(
      const CallOptions& call, Idempotency idempotency,
      const std::function<grpc::Status(grpc::ClientContext*, Response*)>&
          attempt);

  const ClientOptions options_;
  // INVALID_ARGUMENT when options_.bearer_token cannot be sent (a client
  // made by FromChannel); every call returns it unsent.
  const absl::Status token_status_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::KvBroker::Stub> stub_;
};

}  // namespace kvbroker

#endif  // KVBROKER_CLIENT_KVBROKER_CLIENT_H_
