// KvBrokerClient: stub calls with deadlines, credentials, retries and the
// google.rpc.Status -> KvbError translation. See kvbroker_client.h.

#include "client/kvbroker_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace kvbroker {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  // An empty PEM means "the system's roots" to gRPC: a file named but
  // empty (or a directory, which opens but reads nothing) must not turn
  // into trusting every public CA.
  if (out.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " is empty or not a readable file; a PEM file "
                     "was expected"));
  }
  return out.str();
}

// Whether a failed attempt is worth sending again (before counting attempts
// and the deadline).
bool IsRetryableFailure(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return false;
  const KvbError e = GetKvbError(status).value();
  if (e.reason == v1::MAPPING_FAILED || e.reason == v1::DRAINING) {
    return true;  // not run: safe to send again
  }
  // The transport's own failure carries no kvbroker reason. A reason this
  // build does not know (a newer daemon) is the daemon's word: final.
  return e.reason_name == v1::Reason_Name(v1::REASON_UNSPECIFIED);
}

// The wait before attempt `attempt + 1` (attempt >= 1 has just failed).
absl::Duration Backoff(const RetryPolicy& policy, int attempt,
                       const absl::Status& failure) {
  double wait = absl::ToDoubleSeconds(policy.initial_backoff) *
                std::pow(policy.backoff_multiplier, attempt - 1);
  wait = std::min(wait, absl::ToDoubleSeconds(policy.max_backoff));
  if (policy.jitter > 0) {
    thread_local absl::BitGen gen;
    wait *= absl::Uniform(gen, 1.0 - policy.jitter, 1.0 + policy.jitter);
  }
  absl::Duration d = absl::Seconds(wait);
  std::optional<KvbError> e = GetKvbError(failure);
  if (e.has_value() && e->retry_delay.has_value()) {
    d = std::max(d, *e->retry_delay);
  }
  return d;
}

template <typename Container>
std::vector<int64_t> FlattenPages(const Container& pages) {
  std::vector<int64_t> ids;
  for (const v1::PageBlocks& page : pages) {
    ids.insert(ids.end(), page.block_ids().begin(), page.block_ids().end());
  }
  return ids;
}

}  // namespace

absl::Status CheckBearerToken(absl::string_view token) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the bearer token has byte 0x%02x at offset %d; a token must be "
          "printable ASCII (one read from a file may end with a line break)",
          c, i));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Errors.

bool IsCapacityRefusal(v1::Reason reason) {
  return reason == v1::POOL_EXHAUSTED || reason == v1::GPU_MEMORY_EXHAUSTED ||
         reason == v1::SHRINK_PENDING || reason == v1::REQUEST_TOO_LARGE;
}

// ---------------------------------------------------------------------------
// Helpers.

std::vector<int64_t> BlockIds(const v1::AllocResponse& response) {
  return FlattenPages(response.pages());
}

std::vector<int64_t> BlockIds(const v1::ReserveResponse& response) {
  return FlattenPages(response.pages());
}

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

absl::StatusOr<TlsOptions> TlsOptions::FromFiles(
    const std::string& root_ca_path, const std::string& cert_path,
    const std::string& key_path) {
  TlsOptions tls;
  absl::StatusOr<std::string> ca = ReadFile(root_ca_path);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadFile(cert_path);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(key_path);
  if (!key.ok()) return key.status();
  tls.root_ca_pem = *std::move(ca);
  tls.cert_chain_pem = *std::move(cert);
  tls.private_key_pem = *std::move(key);
  return tls;
}

// ---------------------------------------------------------------------------
// CapacityWatch.

CapacityWatch::~CapacityWatch() {
  if (!finished_ && reader_ != nullptr) {
    Cancel();
    v1::WatchCapacityResponse drain;
    while (reader_->Read(&drain)) {
    }
    reader_->Finish();  // CANCELLED, by us
  }
}

bool CapacityWatch::Next(v1::CapacitySnapshot* snapshot) {
  if (finished_) return false;
  v1::WatchCapacityResponse response;
  if (reader_->Read(&response)) {
    *snapshot = std::move(*response.mutable_capacity());
    return true;
  }
  finished_ = true;
  final_status_ = KvbStatusFromGrpc(reader_->Finish());
  return false;
}

absl::Status CapacityWatch::Finish() {
  if (!finished_) {
    v1::CapacitySnapshot ignored;
    while (Next(&ignored)) {
    }
  }
  return final_status_;
}

void CapacityWatch::Cancel() { context_.TryCancel(); }

// ---------------------------------------------------------------------------
// KvBrokerClient.

KvBrokerClient::KvBrokerClient(std::shared_ptr<grpc::Channel> channel,
                               ClientOptions options)
    : options_(std::move(options)),
      token_status_(CheckBearerToken(options_.bearer_token)),
      channel_(std::move(channel)),
      stub_(v1::KvBroker::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<KvBrokerClient>> KvBrokerClient::Connect(
    ClientOptions options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("empty server target");
  }
  if (absl::Status token = CheckBearerToken(options.bearer_token);
      !token.ok()) {
    return token;
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  if (options.tls.has_value()) {
    const TlsOptions& tls = *options.tls;
    if (tls.cert_chain_pem.empty() != tls.private_key_pem.empty()) {
      return absl::InvalidArgumentError(
          "TLS client certificate and key must be given together");
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls.root_ca_pem;
    ssl.pem_cert_chain = tls.cert_chain_pem;
    ssl.pem_private_key = tls.private_key_pem;
    creds = grpc::SslCredentials(ssl);
    if (!tls.target_name_override.empty()) {
      args.SetSslTargetNameOverride(tls.target_name_override);
    }
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, creds, args);
  return std::unique_ptr<KvBrokerClient>(
      new KvBrokerClient(std::move(channel), std::move(options)));
}

std::unique_ptr<KvBrokerClient> KvBrokerClient::FromChannel(
    std::shared_ptr<grpc::Channel> channel, ClientOptions options) {
  return std::unique_ptr<KvBrokerClient>(
      new KvBrokerClient(std::move(channel), std::move(options)));
}

absl::Status KvBrokerClient::WaitReady(
    std::optional<absl::Duration> timeout) const {
  const absl::Duration wait = timeout.value_or(options_.timeout);
  if (channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + wait))) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("no connection to ",
                   options_.target.empty() ? "the server" : options_.target,
                   " within ", absl::FormatDuration(wait)));
}

absl::Time KvBrokerClient::DeadlineOf(const CallOptions& call) const {
  return call.deadline.has_value() ? *call.deadline
                                   : absl::Now() + options_.timeout;
}

void KvBrokerClient::Prepare(grpc::ClientContext* context,
                             absl::Time deadline) const {
  if (deadline != absl::InfiniteFuture()) {
    context->set_deadline(absl::ToChronoTime(deadline));
  }
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.bearer_token));
  }
}

template <typename Response>
absl::StatusOr<Response> KvBrokerClient::Call(
    const CallOptions& call, Idempotency idempotency,
    const std::function<grpc::Status(grpc::ClientContext*, Response*)>&
        attempt) {
  if (!token_status_.ok()) return token_status_;
  const absl::Time deadline = DeadlineOf(call);
  const int max_attempts = idempotency == Idempotency::kRetryable
                               ? std::max(1, options_.retry.max_attempts)
                               : 1;
  absl::Status last;
  for (int n = 1;; ++n) {
    grpc::ClientContext context;
    Prepare(&context, deadline);
    Response response;
    last = KvbStatusFromGrpc(attempt(&context, &response));
    if (last.ok()) return response;
    if (n >= max_attempts || !IsRetryableFailure(last)) return last;
    const absl::Duration wait = Backoff(options_.retry, n, last);
    if (absl::Now() + wait >= deadline) return last;
    absl::SleepFor(wait);
  }
}

absl::StatusOr<v1::PoolInfo> KvBrokerClient::CreatePool(
    const v1::PoolSpec& spec, const CallOptions& call) {
  v1::CreatePoolRequest request;
  *request.mutable_pool() = spec;
  absl::StatusOr<v1::CreatePoolResponse> r = Call<v1::CreatePoolResponse>(
      call, Idempotency::kNone,
      [&](grpc::ClientContext* ctx, v1::CreatePoolResponse* resp) {
        return stub_->CreatePool(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_pool());
}

absl::StatusOr<v1::PoolInfo> KvBrokerClient::GetPool(absl::string_view pool,
                                                     const CallOptions& call) {
  v1::GetPoolRequest request;
  request.set_pool(std::string(pool));
  absl::StatusOr<v1::GetPoolResponse> r = Call<v1::GetPoolResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::GetPoolResponse* resp) {
        return stub_->GetPool(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_pool());
}

absl::StatusOr<std::vector<v1::PoolInfo>> KvBrokerClient::ListPools(
    const CallOptions& call) {
  v1::ListPoolsRequest request;
  absl::StatusOr<v1::ListPoolsResponse> r = Call<v1::ListPoolsResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::ListPoolsResponse* resp) {
        return stub_->ListPools(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return std::vector<v1::PoolInfo>(r->pools().begin(), r->pools().end());
}

absl::Status KvBrokerClient::DeletePool(absl::string_view pool, bool force,
                                        const CallOptions& call) {
  v1::DeletePoolRequest request;
  request.set_pool(std::string(pool));
  request.set_force(force);
  return Call<v1::DeletePoolResponse>(
             call, Idempotency::kNone,
             [&](grpc::ClientContext* ctx, v1::DeletePoolResponse* resp) {
               return stub_->DeletePool(ctx, request, resp);
             })
      .status();
}

absl::StatusOr<v1::CapacitySnapshot> KvBrokerClient::Capacity(
    absl::string_view pool, int64_t max_pages, const CallOptions& call) {
  v1::CapacityRequest request;
  request.set_pool(std::string(pool));
  request.set_max_pages(max_pages);
  absl::StatusOr<v1::CapacityResponse> r = Call<v1::CapacityResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::CapacityResponse* resp) {
        return stub_->Capacity(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_capacity());
}

absl::StatusOr<v1::AllocResponse> KvBrokerClient::Alloc(
    absl::string_view pool, int64_t num_blocks, const AllocOptions& options,
    const CallOptions& call) {
  v1::AllocRequest request;
  request.set_pool(std::string(pool));
  request.set_num_blocks(num_blocks);
  request.set_request_id(options.request_id.empty() ? NewRequestId()
                                                    : options.request_id);
  request.set_reservation_id(options.reservation_id);
  if (options.expected_generation.has_value()) {
    request.set_expected_generation(*options.expected_generation);
  }
  request.set_pool_uid(options.pool_uid);
  return Call<v1::AllocResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::AllocResponse* resp) {
        return stub_->Alloc(ctx, request, resp);
      });
}

absl::StatusOr<v1::FreeResponse> KvBrokerClient::Free(
    absl::string_view pool, absl::Span<const int64_t> block_ids,
    const FreeOptions& options, const CallOptions& call) {
  v1::FreeRequest request;
  request.set_pool(std::string(pool));
  request.mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  request.set_request_id(options.request_id.empty() ? NewRequestId()
                                                    : options.request_id);
  request.set_pool_uid(options.pool_uid);
  return Call<v1::FreeResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::FreeResponse* resp) {
        return stub_->Free(ctx, request, resp);
      });
}

absl::StatusOr<v1::ReserveResponse> KvBrokerClient::Reserve(
    absl::string_view pool, int64_t num_blocks, const ReserveOptions& options,
    const CallOptions& call) {
  v1::ReserveRequest request;
  request.set_pool(std::string(pool));
  request.set_num_blocks(num_blocks);
  request.set_request_id(options.request_id.empty() ? NewRequestId()
                                                    : options.request_id);
  if (options.ttl != absl::ZeroDuration()) {
    const int64_t nanos = absl::ToInt64Nanoseconds(options.ttl);
    request.mutable_ttl()->set_seconds(nanos / 1000000000);
    request.mutable_ttl()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  }
  return Call<v1::ReserveResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::ReserveResponse* resp) {
        return stub_->Reserve(ctx, request, resp);
      });
}

absl::StatusOr<v1::ReleaseReservationResponse>
KvBrokerClient::ReleaseReservation(absl::string_view pool,
                                   absl::string_view reservation_id,
                                   const CallOptions& call) {
  return ReleaseReservation(pool, reservation_id, ReleaseOptions(), call);
}

absl::StatusOr<v1::ReleaseReservationResponse>
KvBrokerClient::ReleaseReservation(absl::string_view pool,
                                   absl::string_view reservation_id,
                                   const ReleaseOptions& options,
                                   const CallOptions& call) {
  v1::ReleaseReservationRequest request;
  request.set_pool(std::string(pool));
  request.set_reservation_id(std::string(reservation_id));
  request.set_pool_uid(options.pool_uid);
  return Call<v1::ReleaseReservationResponse>(
      call, Idempotency::kNone,
      [&](grpc::ClientContext* ctx, v1::ReleaseReservationResponse* resp) {
        return stub_->ReleaseReservation(ctx, request, resp);
      });
}

absl::StatusOr<v1::SetMemoryLimitResponse> KvBrokerClient::SetMemoryLimit(
    absl::string_view pool, int64_t limit_bytes, int64_t revision,
    const CallOptions& call) {
  v1::SetMemoryLimitRequest request;
  request.set_pool(std::string(pool));
  request.set_limit_bytes(limit_bytes);
  request.set_revision(revision);
  return Call<v1::SetMemoryLimitResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::SetMemoryLimitResponse* resp) {
        return stub_->SetMemoryLimit(ctx, request, resp);
      });
}

absl::StatusOr<v1::TrimResponse> KvBrokerClient::Trim(absl::string_view pool,
                                                      int64_t max_pages,
                                                      const CallOptions& call) {
  v1::TrimRequest request;
  request.set_pool(std::string(pool));
  request.set_max_pages(max_pages);
  return Call<v1::TrimResponse>(
      call, Idempotency::kNone,
      [&](grpc::ClientContext* ctx, v1::TrimResponse* resp) {
        return stub_->Trim(ctx, request, resp);
      });
}

absl::StatusOr<std::vector<v1::PageOccupancy>> KvBrokerClient::GetPageOccupancy(
    absl::string_view pool, absl::Span<const int64_t> page_ids,
    const CallOptions& call) {
  v1::GetPageOccupancyRequest request;
  request.set_pool(std::string(pool));
  request.mutable_page_ids()->Add(page_ids.begin(), page_ids.end());
  absl::StatusOr<v1::GetPageOccupancyResponse> r =
      Call<v1::GetPageOccupancyResponse>(
          call, Idempotency::kRetryable,
          [&](grpc::ClientContext* ctx, v1::GetPageOccupancyResponse* resp) {
            return stub_->GetPageOccupancy(ctx, request, resp);
          });
  if (!r.ok()) return r.status();
  return std::vector<v1::PageOccupancy>(r->pages().begin(), r->pages().end());
}

absl::StatusOr<std::vector<v1::EngineSession>> KvBrokerClient::ListSessions(
    absl::string_view pool, const CallOptions& call) {
  v1::ListSessionsRequest request;
  request.set_pool(std::string(pool));
  absl::StatusOr<v1::ListSessionsResponse> r = Call<v1::ListSessionsResponse>(
      call, Idempotency::kRetryable,
      [&](grpc::ClientContext* ctx, v1::ListSessionsResponse* resp) {
        return stub_->ListSessions(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return std::vector<v1::EngineSession>(r->sessions().begin(),
                                        r->sessions().end());
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus>
KvBrokerClient::Health(absl::string_view service, const CallOptions& call) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(service));
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(channel_);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> r =
      Call<grpc::health::v1::HealthCheckResponse>(
          call, Idempotency::kNone,
          [&](grpc::ClientContext* ctx,
              grpc::health::v1::HealthCheckResponse* resp) {
            return health->Check(ctx, request, resp);
          });
  if (!r.ok()) return r.status();
  return r->status();
}

std::unique_ptr<CapacityWatch> KvBrokerClient::WatchCapacity(
    absl::string_view pool, int64_t max_pages, const CallOptions& call) {
  std::unique_ptr<CapacityWatch> watch(new CapacityWatch());
  if (!token_status_.ok()) {
    watch->finished_ = true;
    watch->final_status_ = token_status_;
    return watch;
  }
  Prepare(&watch->context_, call.deadline.value_or(absl::InfiniteFuture()));
  v1::WatchCapacityRequest request;
  request.set_pool(std::string(pool));
  request.set_max_pages(max_pages);
  watch->reader_ = stub_->WatchCapacity(&watch->context_, request);
  return watch;
}

absl::Status KvBrokerClient::WatchCapacity(
    absl::string_view pool, int64_t max_pages,
    const std::function<bool(const v1::CapacitySnapshot&)>& on_snapshot,
    const CallOptions& call) {
  std::unique_ptr<CapacityWatch> watch = WatchCapacity(pool, max_pages, call);
  v1::CapacitySnapshot snapshot;
  while (watch->Next(&snapshot)) {
    if (!on_snapshot(snapshot)) return absl::OkStatus();
  }
  return watch->Finish();
}

}  // namespace kvbroker
