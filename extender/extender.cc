// The three verbs. Broker calls go through the directory's clients; every
// outcome is counted in the registry that /metrics renders.

#include "extender/extender.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/support/async_unary_call.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/text_serializer.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {
namespace extender {

namespace {

HttpResponse Json(int code, std::string body) {
  return {code, "application/json", std::move(body)};
}

HttpResponse Text(int code, std::string body) {
  return {code, "text/plain; charset=utf-8", std::move(body)};
}

// "k=v k=v" of a refusal's ErrorInfo metadata (keys carry units).
std::string Figures(const std::map<std::string, std::string>& metadata) {
  std::string out;
  for (const auto& [k, v] : metadata) {
    absl::StrAppend(&out, out.empty() ? "" : " ", k, "=", v);
  }
  return out;
}

// The pool incarnation a message reports, when its proto has a pool_uid
// field; "" otherwise.
std::string PoolUidOf(const google::protobuf::Message& m) {
  const google::protobuf::FieldDescriptor* f =
      m.GetDescriptor()->FindFieldByName("pool_uid");
  if (f == nullptr || f->is_repeated()) return "";
  const google::protobuf::Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(m, f);
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(m, f));
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(m, f));
    default: return "";
  }
}

// The verdict of a Capacity snapshot for `blocks`, in the broker's order.
NodeCheck Judge(const v1::CapacitySnapshot& s, int64_t blocks) {
  NodeCheck c;
  c.blocks = blocks;
  c.available_blocks = s.available_blocks();
  const std::string figures = absl::StrCat(
      "requested_blocks=", blocks, " available_blocks=", s.available_blocks(),
      " pool_total_blocks=", s.total_blocks(),
      " reserved_blocks=", s.reserved_blocks(),
      " allocated_blocks=", s.allocated_blocks());
  auto refuse = [&](v1::Reason reason, bool unresolvable,
                    const std::string& extra) {
    c.verdict = v1::Reason_Name(reason);
    c.reason = absl::StrCat(c.verdict, ": ", figures, extra);
    c.unresolvable = unresolvable;
    return c;
  };
  if (!s.healthy()) {
    return refuse(v1::POOL_FAILED, true, absl::StrCat(" (", s.failure(), ")"));
  }
  if (blocks <= s.available_blocks()) {
    c.fits = true;
    c.verdict = "fits";
    return c;
  }
  if (blocks > s.total_blocks()) return refuse(v1::REQUEST_TOO_LARGE, true, "");
  if (s.limit().state() == v1::LIMIT_STATE_DEFERRED) {
    return refuse(v1::SHRINK_PENDING, false,
                  absl::StrCat(" target_pages=", s.limit().target_pages()));
  }
  if (blocks > s.total_blocks() - s.allocated_blocks() - s.reserved_blocks()) {
    return refuse(v1::POOL_EXHAUSTED, false, "");
  }
  return refuse(v1::GPU_MEMORY_EXHAUSTED, false,
                absl::StrCat(" affordable_pages=", s.affordable_bundles()));
}

// The verdict of a failed broker call.
NodeCheck FromError(const absl::Status& status) {
  NodeCheck c;
  const KvbError e = GetKvbError(status).value();
  if (e.reason == v1::REASON_UNSPECIFIED) {
    c.verdict = "BROKER_UNREACHABLE";
    c.reason = absl::StrCat(
        "broker unreachable: ", absl::StatusCodeToString(status.code()), ": ",
        status.message());
    return c;
  }
  c.verdict = e.reason_name.empty() ? v1::Reason_Name(e.reason) : e.reason_name;
  c.reason = absl::StrCat(c.verdict, ": ", e.message);
  if (!e.metadata.empty()) absl::StrAppend(&c.reason, " ", Figures(e.metadata));
  c.unresolvable = e.reason == v1::POOL_NOT_FOUND ||
                   e.reason == v1::POOL_FAILED ||
                   e.reason == v1::REQUEST_TOO_LARGE;
  return c;
}

// The verdict when the broker token cannot be sent (Broker::credentials):
// no call is made, and no node passes until the token is fixed.
NodeCheck BadBrokerToken(const absl::Status& status) {
  NodeCheck c;
  c.verdict = "BAD_BROKER_TOKEN";
  c.reason = absl::StrCat("INVALID_ARGUMENT: ", status.message());
  c.unresolvable = true;
  return c;
}

int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// What Filter and Prioritize read from their body: the scheduler's
// arguments and the pod's kvbroker request (none for a pod without the
// annotations). A malformed body, pod or annotation is the status.
struct ScheduleCall {
  ExtenderArgs args;
  std::optional<KvRequest> request;
};

absl::StatusOr<ScheduleCall> ParseScheduleCall(const std::string& body) {
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(body);
  if (!args.ok()) return args.status();
  absl::StatusOr<PodView> pod = ParsePod(args->pod);
  if (!pod.ok()) return pod.status();
  absl::StatusOr<std::optional<KvRequest>> request =
      ParseKvRequest(pod->annotations);
  if (!request.ok()) return request.status();
  return ScheduleCall{*std::move(args), *std::move(request)};
}

HttpResponse BadRequest(const absl::Status& status) {
  return Json(400, EncodeError(std::string(status.message())));
}

// Where a pod stands when read again after the API refused bind's patch or
// Binding with 409, or after a failure, for a bind holding reservation
// `ours` on `node`. Two attempts under the same request id (a retry,
// another replica) hold the same reservation, so a pod naming `ours` may
// have been patched or bound by the other one.
enum class PodStand {
  kBoundWithOurs,         // bound to `node`, naming ours: done
  kBoundHereWithAnother,  // bound to `node` with another bind's: ours spare
  kUnboundWithOurs,       // another attempt patched it: bind it
  kUnboundUnclaimed,      // changed by someone else: patch again
  kLost,                  // bound elsewhere, or another bind is ahead
};

// A kvbroker.io/released-binds above this is not the extender's (the pod's
// author wrote it): it counts as absent, and n + 1 never overflows.
constexpr int kMaxReleasedBinds = 1000000;

// How many of the pod's binds reserved and then released: request ids
// "<uid>" and "<uid>/1" .. "<uid>/<n-1>" are spent.
int ReleasedBindsOn(const PodView& pod) {
  int n = 0;
  auto a = pod.annotations.find(kReleasedBindsAnnotation);
  if (a == pod.annotations.end() || !absl::SimpleAtoi(a->second, &n) || n < 0 ||
      n > kMaxReleasedBinds) {
    return 0;
  }
  return n;
}

// `ours` is what this bind writes: the reservation, its node and, when the
// broker reports one, the pool's uid. Reservation ids are a broker's own
// (two brokers, or one before and after a restart, may hand out the same
// one), so a pod names ours only when all of them match.
PodStand StandOf(const PodView& pod, const std::string& node,
                 const std::map<std::string, std::optional<std::string>>& ours,
                 int released_binds) {
  const bool claimed = pod.annotations.count(kReservationAnnotation) != 0;
  bool is_ours = claimed;
  for (const auto& [key, value] : ours) {
    auto on_pod = pod.annotations.find(key);
    if (on_pod == pod.annotations.end() || on_pod->second != value) {
      is_ours = false;
    }
  }
  if (!pod.node_name.empty()) {
    if (pod.node_name != node || !claimed) return PodStand::kLost;
    return is_ours ? PodStand::kBoundWithOurs : PodStand::kBoundHereWithAnother;
  }
  if (is_ours) return PodStand::kUnboundWithOurs;
  // An unbound pod naming another reservation is another bind between its
  // patch and its Binding, or a leftover of one that could not clear it;
  // one counting past ours had our reservation given up by an attempt
  // under our request id. Either way this attempt gives up, and the
  // scheduler's retry reads the pod afresh.
  if (claimed || ReleasedBindsOn(pod) > released_binds) return PodStand::kLost;
  return PodStand::kUnboundUnclaimed;
}

}  // namespace

absl::StatusOr<ScorePolicy> ParseScorePolicy(absl::string_view name) {
  if (name == "most_free") return ScorePolicy::kMostFree;
  if (name == "least_free") return ScorePolicy::kLeastFree;
  return absl::InvalidArgumentError(absl::StrCat(
      "score policy \"", name, "\" is neither most_free nor least_free"));
}

Extender::Extender(BrokerDirectory* directory, const KubeClient* kube,
                   ExtenderOptions options)
    : directory_(directory),
      kube_(kube),
      options_(options),
      registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("kvbroker_extender_requests_total")
                    .Help("Extender HTTP requests by verb and status code.")
                    .Register(*registry_)),
      latency_(prometheus::BuildHistogram()
                   .Name("kvbroker_extender_request_seconds")
                   .Help("Time to answer a verb, broker calls included.")
                   .Register(*registry_)),
      node_verdicts_(prometheus::BuildCounter()
                         .Name("kvbroker_extender_node_verdicts_total")
                         .Help("Filtered nodes by verdict: fits, or why "
                               "the node was dropped.")
                         .Register(*registry_)),
      binds_(prometheus::BuildCounter()
                 .Name("kvbroker_extender_binds_total")
                 .Help("Bind calls by outcome.")
                 .Register(*registry_)),
      released_(prometheus::BuildCounter()
                    .Name("kvbroker_extender_reservations_released_total")
                    .Help("Reservations released because their bind failed.")
                    .Register(*registry_)
                    .Add({})),
      kept_(prometheus::BuildCounter()
                .Name("kvbroker_extender_reservations_kept_total")
                .Help("Reservations a failed bind kept until they expire, "
                      "the pod being unreadable or unwritable then.")
                .Register(*registry_)
                .Add({})),
      brokers_(prometheus::BuildGauge()
                   .Name("kvbroker_extender_brokers")
                   .Help("Broker pods known (by node), and relists that "
                         "failed.")
                   .Register(*registry_)) {}

void Extender::Count(const std::string& verb, int code) {
  requests_.Add({{"verb", verb}, {"code", absl::StrCat(code)}}).Increment();
}

HttpResponse Extender::Handle(const HttpRequest& request) {
  const std::string& path = request.path;
  if (path == "/healthz") return Text(200, "ok\n");
  if (path == "/readyz") {
    return directory_->refreshes() > directory_->refresh_failures()
               ? Text(200, "ok\n")
               : Text(503, "the broker pods have not been listed yet\n");
  }
  if (path == "/metrics") {
    return {200, "text/plain; version=0.0.4; charset=utf-8", RenderMetrics()};
  }
  std::string verb;
  if (path == "/filter" || path == "/prioritize" || path == "/bind") {
    verb = path.substr(1);
  } else {
    return Text(404,
                "kvbroker-extender serves POST /filter, /prioritize, "
                "/bind and GET /healthz, /readyz, /metrics\n");
  }
  if (request.method != "POST") {
    Count(verb, 405);
    return Text(405, absl::StrCat("/", verb, " takes POST\n"));
  }
  const absl::Time start = absl::Now();
  HttpResponse response = verb == "filter"       ? Filter(request.body)
                          : verb == "prioritize" ? Prioritize(request.body)
                                                 : Bind(request.body);
  latency_
      .Add({{"verb", verb}},
           prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005,
                                                   0.01, 0.02, 0.05, 0.1, 0.2,
                                                   0.5, 1, 2, 5})
      .Observe(absl::ToDoubleSeconds(absl::Now() - start));
  Count(verb, response.code);
  return response;
}

NodeCheck Extender::NoBroker(const std::string& node) {
  NodeCheck c;
  c.verdict = "NO_BROKER";
  c.reason = absl::StrCat("no kvbroker on node ", node);
  c.unresolvable = true;
  return c;
}

NodeCheck Extender::Verdict(const KvRequest& request,
                            const grpc::Status& status,
                            const v1::CapacityResponse& capacity,
                            const v1::GetPoolResponse& pool) {
  if (!status.ok()) return FromError(KvbStatusFromGrpc(status));
  if (request.blocks > 0) return Judge(capacity.capacity(), request.blocks);
  const int64_t per_block = pool.pool().spec().tokens_per_block();
  if (per_block <= 0) {
    NodeCheck c;
    c.verdict = "NO_TOKENS_PER_BLOCK";
    c.reason = absl::StrCat("pool ", request.pool,
                            " has no tokens_per_block on this node; ask in ",
                            kBlocksAnnotation);
    c.unresolvable = true;
    return c;
  }
  return Judge(pool.pool().capacity(), CeilDiv(request.tokens, per_block));
}

std::vector<NodeCheck> Extender::CheckAll(const std::vector<std::string>& nodes,
                                          const KvRequest& request) {
  // One in-flight call per node; ClientContext cannot move, hence the
  // pointers.
  struct Call {
    grpc::ClientContext context;
    grpc::Status status;
    v1::CapacityResponse capacity;
    v1::GetPoolResponse pool;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::CapacityResponse>>
        capacity_reader;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::GetPoolResponse>>
        pool_reader;
  };
  std::vector<NodeCheck> checks(nodes.size());
  std::vector<std::unique_ptr<Call>> calls(nodes.size());
  // Brokers first: a node the directory does not know waits for a relist
  // of the broker pods, all lookups together for at most node_timeout, and
  // then the brokers get their own whole node_timeout.
  std::vector<std::shared_ptr<const Broker>> brokers(nodes.size());
  const absl::Time lookups_until = absl::Now() + options_.node_timeout;
  for (size_t i = 0; i < nodes.size(); ++i) {
    absl::StatusOr<std::shared_ptr<const Broker>> broker =
        directory_->Find(nodes[i], lookups_until);
    if (broker.ok()) {
      brokers[i] = *std::move(broker);
    } else {
      checks[i] = NoBroker(nodes[i]);
    }
  }
  grpc::CompletionQueue cq;
  const auto deadline = absl::ToChronoTime(absl::Now() + options_.node_timeout);
  v1::CapacityRequest capacity_request;
  capacity_request.set_pool(request.pool);
  v1::GetPoolRequest pool_request;
  pool_request.set_pool(request.pool);
  size_t outstanding = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::shared_ptr<const Broker>& broker = brokers[i];
    if (broker == nullptr) continue;
    if (!broker->credentials.ok()) {
      checks[i] = BadBrokerToken(broker->credentials);
      continue;
    }
    auto call = std::make_unique<Call>();
    call->context.set_deadline(deadline);
    if (!broker->authorization.empty()) {
      call->context.AddMetadata("authorization", broker->authorization);
    }
    void* tag = reinterpret_cast<void*>(i);
    if (request.blocks > 0) {
      call->capacity_reader =
          broker->stub->AsyncCapacity(&call->context, capacity_request, &cq);
      call->capacity_reader->Finish(&call->capacity, &call->status, tag);
    } else {
      call->pool_reader =
          broker->stub->AsyncGetPool(&call->context, pool_request, &cq);
      call->pool_reader->Finish(&call->pool, &call->status, tag);
    }
    calls[i] = std::move(call);
    ++outstanding;
  }
  void* tag = nullptr;
  bool ok = false;
  while (outstanding > 0 && cq.Next(&tag, &ok)) {
    const size_t i = reinterpret_cast<size_t>(tag);
    checks[i] =
        Verdict(request, calls[i]->status, calls[i]->capacity, calls[i]->pool);
    --outstanding;
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return checks;
}

HttpResponse Extender::Filter(const std::string& body) {
  absl::StatusOr<ScheduleCall> call = ParseScheduleCall(body);
  if (!call.ok()) return BadRequest(call.status());
  ExtenderArgs& args = call->args;
  FilterVerdict verdict;
  if (!call->request.has_value()) {
    for (size_t i = 0; i < args.node_names.size(); ++i)
      verdict.kept.push_back(i);
    return Json(200, EncodeFilterResult(std::move(args), verdict));
  }
  const std::vector<NodeCheck> checks =
      CheckAll(args.node_names, *call->request);
  for (size_t i = 0; i < checks.size(); ++i) {
    node_verdicts_.Add({{"verdict", checks[i].verdict}}).Increment();
    if (checks[i].fits) {
      verdict.kept.push_back(i);
    } else if (checks[i].unresolvable) {
      verdict.unresolvable[args.node_names[i]] = checks[i].reason;
    } else {
      verdict.failed[args.node_names[i]] = checks[i].reason;
    }
  }
  return Json(200, EncodeFilterResult(std::move(args), verdict));
}

HttpResponse Extender::Prioritize(const std::string& body) {
  absl::StatusOr<ScheduleCall> call = ParseScheduleCall(body);
  if (!call.ok()) return BadRequest(call.status());
  const ExtenderArgs& args = call->args;
  std::vector<std::pair<std::string, int64_t>> scores;
  for (const std::string& node : args.node_names) scores.push_back({node, 0});
  if (!call->request.has_value()) {
    return Json(200, EncodeHostPriorityList(scores));
  }
  const std::vector<NodeCheck> checks =
      CheckAll(args.node_names, *call->request);
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const NodeCheck& c : checks) {
    if (!c.fits) continue;
    lo = std::min(lo, c.available_blocks);
    hi = std::max(hi, c.available_blocks);
  }
  for (size_t i = 0; i < checks.size(); ++i) {
    if (!checks[i].fits) continue;
    if (hi == lo) {
      scores[i].second = kMaxExtenderPriority;
      continue;
    }
    const int64_t a = checks[i].available_blocks;
    const double x = options_.policy == ScorePolicy::kMostFree
                         ? static_cast<double>(a - lo) / (hi - lo)
                         : static_cast<double>(hi - a) / (hi - lo);
    scores[i].second = 1 + std::llround((kMaxExtenderPriority - 1) * x);
  }
  return Json(200, EncodeHostPriorityList(scores));
}

HttpResponse Extender::Bind(const std::string& body) {
  absl::StatusOr<BindingArgs> args = ParseBindingArgs(body);
  if (!args.ok()) return BadRequest(args.status());
  auto outcome = [&](const std::string& name) {
    binds_.Add({{"outcome", name}}).Increment();
  };
  absl::StatusOr<nlohmann::json> pod_json =
      kube_->GetPod(args->pod_namespace, args->pod_name);
  if (!pod_json.ok()) {
    outcome("pod_error");
    return Json(200,
                EncodeBindingResult(std::string(pod_json.status().message())));
  }
  absl::StatusOr<PodView> pod = ParsePod(*pod_json);
  if (!pod.ok()) {
    outcome("pod_error");
    return Json(200, EncodeBindingResult(std::string(pod.status().message())));
  }
  if (pod->uid != args->pod_uid) {
    outcome("pod_error");
    return Json(
        200, EncodeBindingResult(absl::StrCat(
                 "pod ", args->pod_namespace, "/", args->pod_name, " has uid ",
                 pod->uid, ", not ", args->pod_uid, ": it was replaced")));
  }
  absl::StatusOr<std::optional<KvRequest>> request =
      ParseKvRequest(pod->annotations);
  if (!request.ok()) {
    outcome("bad_annotations");
    return BadRequest(request.status());
  }
  if (!pod->node_name.empty()) {
    if (pod->node_name == args->node &&
        (!request->has_value() ||
         pod->annotations.count(kReservationAnnotation) != 0)) {
      outcome("already_bound");
      return Json(200, EncodeBindingResult(""));
    }
    outcome("pod_error");
    return Json(200, EncodeBindingResult(absl::StrCat(
                         "pod is already bound to node ", pod->node_name)));
  }
  if (!request->has_value()) {
    absl::Status bound = kube_->CreateBinding(
        args->pod_namespace, args->pod_name, args->pod_uid, args->node);
    outcome(bound.ok() ? "bound" : "binding_failed");
    return Json(200, EncodeBindingResult(std::string(bound.message())));
  }
  return Json(200, EncodeBindingResult(BindKvPod(*args, **request,
                                                 ReleasedBindsOn(*pod),
                                                 pod->resource_version)));
}

std::string Extender::BindKvPod(const BindingArgs& args,
                                const KvRequest& request, int released_binds,
                                const std::string& resource_version) {
  auto outcome = [&](const std::string& name) {
    binds_.Add({{"outcome", name}}).Increment();
  };
  absl::StatusOr<std::shared_ptr<const Broker>> broker =
      directory_->Find(args.node, absl::Now() + options_.bind_timeout);
  if (!broker.ok()) {
    outcome("no_broker");
    return std::string(broker.status().message());
  }
  KvBrokerClient& client = *(*broker)->bind;
  auto call = [&] { return CallOptions::WithTimeout(options_.bind_timeout); };
  int64_t blocks = request.blocks;
  if (blocks == 0) {
    absl::StatusOr<v1::PoolInfo> info = client.GetPool(request.pool, call());
    if (!info.ok()) {
      outcome("reserve_refused");
      return FromError(info.status()).reason;
    }
    if (info->spec().tokens_per_block() <= 0) {
      outcome("reserve_refused");
      return absl::StrCat("pool ", request.pool, " has no tokens_per_block");
    }
    blocks = CeilDiv(request.tokens, info->spec().tokens_per_block());
  }
  ReserveOptions reserve;
  reserve.request_id = released_binds == 0
                           ? args.pod_uid
                           : absl::StrCat(args.pod_uid, "/", released_binds);
  reserve.ttl = options_.reservation_ttl;
  absl::StatusOr<v1::ReserveResponse> reservation =
      client.Reserve(request.pool, blocks, reserve, call());
  if (!reservation.ok()) {
    outcome("reserve_refused");
    return absl::StrCat("Reserve ", blocks, " blocks of pool ", request.pool,
                        " on node ", args.node, ": ",
                        FromError(reservation.status()).reason);
  }
  std::string pool_uid = PoolUidOf(*reservation);
  if (pool_uid.empty() && v1::CapacitySnapshot::descriptor()->FindFieldByName(
                              "pool_uid") != nullptr) {
    absl::StatusOr<v1::CapacitySnapshot> s =
        client.Capacity(request.pool, 0, call());
    if (s.ok()) pool_uid = PoolUidOf(*s);
  }
  // Releases name the incarnation: a pool deleted and created again numbers
  // its reservations from the start, and ours may be another's id there.
  ReleaseOptions ours_only;
  ours_only.pool_uid = pool_uid;
  const std::string expiry = absl::FormatTime(
      absl::RFC3339_sec,
      absl::FromUnixSeconds(reservation->expire_time().seconds()),
      absl::UTCTimeZone());
  std::map<std::string, std::optional<std::string>> annotations = {
      {kReservationAnnotation, reservation->reservation_id()},
      {kReservationNodeAnnotation, args.node},
      {kReservationExpiryAnnotation, expiry}};
  if (!pool_uid.empty()) annotations[kPoolUidAnnotation] = pool_uid;

  // The pod again, after a 409 or a failure; one under the same name with
  // another UID is NOT_FOUND (ours was deleted).
  auto reread = [&]() -> absl::StatusOr<PodView> {
    absl::StatusOr<nlohmann::json> again =
        kube_->GetPod(args.pod_namespace, args.pod_name);
    if (!again.ok()) return again.status();
    absl::StatusOr<PodView> view = ParsePod(*again);
    if (view.ok() && view->uid != args.pod_uid) {
      return absl::NotFoundError(absl::StrCat("pod ", args.pod_namespace, "/",
                                              args.pod_name, " was replaced"));
    }
    return view;
  };
  auto bound_here = [&] {
    outcome(reservation->replayed() ? "bound_replayed" : "bound");
    return std::string();
  };
  // Bound here with another bind's reservation (its own request id): ours
  // is spare.
  auto spare = [&] {
    (void)client.ReleaseReservation(request.pool, reservation->reservation_id(),
                                    ours_only, call());
    outcome("already_bound");
    return std::string();
  };
  // Releases the reservation of a bind that failed.
  auto release = [&](const std::string& failed, const absl::Status& why) {
    absl::Status released =
        client
            .ReleaseReservation(request.pool, reservation->reservation_id(),
                                ours_only, call())
            .status();
    if (released.ok()) released_.Increment();
    outcome(failed);
    return absl::StrCat(failed, ": ", why.message(),
                        released.ok()
                            ? "; the reservation was released"
                            : absl::StrCat("; releasing the reservation "
                                           "failed too (it expires at ",
                                           expiry, "): ", released.message()));
  };
  // A failed bind whose pod may still name the reservation keeps it until
  // it expires; the scheduler's retry replays it.
  auto keep = [&](const std::string& failed, const absl::Status& why,
                  const absl::Status& blocker) {
    kept_.Increment();
    outcome(failed);
    return absl::StrCat(failed, ": ", why.message(),
                        "; the reservation is kept until ", expiry,
                        " (the pod may name it: ", blocker.message(),
                        "), and a retry of this bind uses it again");
  };
  // Gives this bind up after a failed patch or Binding (extender.h, "Giving
  // a bind up"): the pod is read again, and the release is recorded on it
  // at the version read, together with the removal of our annotations from
  // an unbound pod that names our reservation, before the reservation is
  // released. A read or a write that fails is tried again, three rounds in
  // all, before the reservation is kept.
  auto give_up = [&](const std::string& failed,
                     const absl::Status& why) -> std::string {
    absl::Status last;  // what kept the release from being recorded
    for (int attempt = 0; attempt < 3; ++attempt) {
      absl::StatusOr<PodView> view = reread();
      // A pod that is gone can be bound by no one.
      if (view.status().code() == absl::StatusCode::kNotFound) {
        return release(failed, why);
      }
      if (!view.ok()) {
        last = view.status();
        continue;
      }
      const PodStand stand =
          StandOf(*view, args.node, annotations, released_binds);
      if (stand == PodStand::kBoundWithOurs) return bound_here();
      if (stand == PodStand::kBoundHereWithAnother) return spare();
      const int on_pod = ReleasedBindsOn(*view);
      if (stand != PodStand::kUnboundWithOurs && on_pod > released_binds) {
        return release(failed, why);  // recorded already
      }
      std::map<std::string, std::optional<std::string>> record = {
          {kReleasedBindsAnnotation,
           absl::StrCat(std::max(on_pod, released_binds + 1))}};
      if (stand == PodStand::kUnboundWithOurs) {
        for (const auto& [k, v] : annotations) record[k] = std::nullopt;
      }
      absl::StatusOr<nlohmann::json> recorded = kube_->PatchPodAnnotations(
          args.pod_namespace, args.pod_name, record, view->resource_version);
      if (recorded.ok()) return release(failed, why);
      // Changed since (409), or failed, perhaps after taking effect: the
      // next reading tells.
      last = recorded.status();
    }
    return keep(failed, why, last);
  };

  // Both steps are conditional on the pod's version: another bind of the
  // same pod (another replica, a retry) that changed it in between makes
  // ours read the pod again (StandOf) rather than overwrite its
  // reservation; a change by anyone else is retried, up to three times. So
  // is a step the API failed (a 500, an answer lost after the write took
  // effect): the pod read again tells which.
  std::string version = resource_version;
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<nlohmann::json> patched = kube_->PatchPodAnnotations(
        args.pod_namespace, args.pod_name, annotations, version);
    if (patched.ok()) {
      absl::StatusOr<PodView> view = ParsePod(*patched);
      version = view.ok() ? view->resource_version : std::string();
      break;
    }
    if (attempt == 2) return give_up("patch_failed", patched.status());
    absl::StatusOr<PodView> view = reread();
    if (!view.ok()) return give_up("patch_failed", patched.status());
    const PodStand stand =
        StandOf(*view, args.node, annotations, released_binds);
    if (stand == PodStand::kBoundWithOurs) return bound_here();
    if (stand == PodStand::kBoundHereWithAnother) return spare();
    if (stand == PodStand::kLost) {
      return give_up("patch_failed", patched.status());
    }
    version = view->resource_version;
    if (stand == PodStand::kUnboundWithOurs) break;  // patched already
  }
  absl::Status bound;
  for (int attempt = 0;; ++attempt) {
    bound = kube_->CreateBinding(args.pod_namespace, args.pod_name,
                                 args.pod_uid, args.node, version);
    if (bound.ok()) break;
    // 409: the pod is bound already, or changed since the patch; or the
    // API failed, perhaps after binding it.
    absl::StatusOr<PodView> view = reread();
    if (!view.ok()) break;
    const PodStand stand =
        StandOf(*view, args.node, annotations, released_binds);
    if (stand == PodStand::kBoundWithOurs) return bound_here();
    if (stand == PodStand::kBoundHereWithAnother) return spare();
    if (stand != PodStand::kUnboundWithOurs || attempt == 2) break;
    version = view->resource_version;  // changed otherwise: bind again
  }
  if (!bound.ok()) return give_up("binding_failed", bound);
  return bound_here();
}

std::string Extender::RenderMetrics() {
  brokers_.Add({{"state", "known"}})
      .Set(static_cast<double>(directory_->size()));
  brokers_.Add({{"state", "relist_failures"}})
      .Set(static_cast<double>(directory_->refresh_failures()));
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace extender
}  // namespace kvbroker
