// Extender: the filter, prioritize and bind verbs of kvbroker-extender
// (the Kubernetes scheduler extender protocol, extender_api.h), over the
// brokers of BrokerDirectory and the Kubernetes API of KubeClient.
//
// Filter. A pod without kvbroker annotations gets every candidate back and
// no broker is asked. Otherwise every candidate node's broker is asked for
// the pool's Capacity at once (GetPool when the pod asks in tokens, to
// learn tokens_per_block), all under one deadline `node_timeout` away: the
// calls are started together on one gRPC completion queue, which the
// calling thread drains (no thread per node; on a small machine 32
// blocking calls on 32 threads cost several times more). A node is kept iff
// its broker answers available_blocks >= the blocks asked for: exactly the
// condition under which Alloc or Reserve of that many succeeds now. Every
// dropped node is named with a reason:
//   "REQUEST_TOO_LARGE: requested_blocks=4 pool_total_blocks=3 ..."
//   (the broker's reason and figures; the reason is derived from the
//   snapshot in the broker's own order: POOL_FAILED, REQUEST_TOO_LARGE,
//   SHRINK_PENDING, POOL_EXHAUSTED when even every unmapped page of the
//   pool would not do, else GPU_MEMORY_EXHAUSTED), the typed reason of a
//   refused call (POOL_NOT_FOUND, PERMISSION_DENIED, ...),
//   "broker unreachable: ..." for transport failures and deadlines, and
//   "no kvbroker on node" when the directory has no broker there.
// REQUEST_TOO_LARGE, POOL_NOT_FOUND, POOL_FAILED, a pool without
// tokens_per_block and a node without a broker go to
// FailedAndUnresolvableNodes (evicting pods cannot help); the rest to
// FailedNodes.
//
// Prioritize. Scores in [0, kMaxExtenderPriority] by `policy`, from the
// same Capacity answers: a node that cannot take the pod scores 0; among
// those that can, with a = its available blocks and lo, hi the least and
// most available among them,
//   kMostFree:  1 + round(9 (a - lo) / (hi - lo))   (spread pods out)
//   kLeastFree: 1 + round(9 (hi - a) / (hi - lo))   (pack pools full)
// and 10 when hi == lo. Pods without annotations score 0 everywhere.
//
// Bind. Reads the pod (its UID must be the one the scheduler names), then:
// Reserve(pool, blocks, ttl = reservation_ttl, request_id = the pod's UID)
// on the chosen node; a merge patch writes kvbroker.io/reservation,
// kvbroker.io/reservation-node, kvbroker.io/reservation-expire-time and,
// when the broker reports one, kvbroker.io/pool-uid; then the pod's
// Binding is created. The patch is conditional on the resourceVersion the
// bind read, the Binding on the one the patch left; a 409 or a failure of
// either step reads the pod again (StandOf in extender.cc) and takes the
// step again (three times in all) where that is what the pod needs, since
// a bind under the same request id (a retry, another replica) shares the
// reservation and the API may have done a write whose answer was lost. A retried bind is
// idempotent: Reserve with the same request_id replays the first
// reservation, the patch writes the same values, and a pod already bound to
// that node is success.
//
// Giving a bind up. A reservation is released only after the pod records
// the release: kvbroker.io/released-binds = n + 1 for request id n ("<uid>"
// is 0, "<uid>/<n>" after n releases), written on condition of a version at
// which the pod does not name the reservation, or together with the removal
// of our annotations from the unbound pod that does. Every Binding is
// conditional on a version at which its bind saw the pod name the
// reservation, and a bind that finds the pod unclaimed with a count past its
// own n gives up, so no Binding can use a released reservation. A pod
// "names" a reservation when its id, node and pool uid all match (each
// broker numbers its own). A pod found bound here naming it is success (the
// other bind got there). A pod that cannot be read or written in three
// rounds keeps the reservation until it expires; the scheduler's retry
// replays it. Releases name the pool's incarnation. The count lives only on
// the pod, so any replica, or the same one after a restart, continues it.
//
// HTTP (Handle): POST /filter, /prioritize, /bind; GET /healthz (200 while
// serving), /readyz (200 once the broker pods have been listed), /metrics
// (Prometheus text). A body that is not valid protocol JSON, or a pod with
// malformed kvbroker annotations, is answered 400 with {"Error": why} and
// nothing is reserved. Failures of the scheduling itself (no broker, a
// refusal at bind) are protocol answers (200 with Error set).
//
// Thread safety: all methods may be called concurrently.

#ifndef KVBROKER_EXTENDER_EXTENDER_H_
#define KVBROKER_EXTENDER_EXTENDER_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "extender/broker_directory.h"
#include "extender/extender_api.h"
#include "extender/http_server.h"
#include "extender/kube_client.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {
namespace extender {

enum class ScorePolicy { kMostFree, kLeastFree };

// "most_free" / "least_free".
absl::StatusOr<ScorePolicy> ParseScorePolicy(absl::string_view name);

struct ExtenderOptions {
  // Deadline of each node's Capacity call in filter and prioritize, and
  // how long their lookups wait for a relist when a node is unknown.
  absl::Duration node_timeout = absl::Milliseconds(500);
  // Deadline of each broker call in bind (all attempts), and how long its
  // lookup waits for a relist.
  absl::Duration bind_timeout = absl::Seconds(5);
  ScorePolicy policy = ScorePolicy::kMostFree;
  // TTL of the reservation made at bind; the engine must redeem it by then.
  absl::Duration reservation_ttl = absl::Minutes(10);
};

// One node's answer, as filter and prioritize use it.
struct NodeCheck {
  bool fits = false;
  // Blocks the pod needs on this node (tokens converted with its pool).
  int64_t blocks = 0;
  int64_t available_blocks = 0;
  // Dropped nodes: why (see the file comment), and whether preemption could
  // change it.
  std::string reason;
  bool unresolvable = false;
  // The metric label of the verdict: "fits", a kvbroker reason name,
  // "BROKER_UNREACHABLE", "NO_BROKER", "NO_TOKENS_PER_BLOCK",
  // "BAD_BROKER_TOKEN".
  std::string verdict;
};

class Extender {
 public:
  // `directory` and `kube` must outlive the extender.
  Extender(BrokerDirectory* directory, const KubeClient* kube,
           ExtenderOptions options);
  Extender(const Extender&) = delete;
  Extender& operator=(const Extender&) = delete;

  // The whole HTTP surface (see the file comment).
  HttpResponse Handle(const HttpRequest& request);

  HttpResponse Filter(const std::string& body);
  HttpResponse Prioritize(const std::string& body);
  HttpResponse Bind(const std::string& body);

  // Prometheus text of the extender's metrics.
  std::string RenderMetrics();

 private:
  // Asks every node's broker at once whether it can take `request` now.
  std::vector<NodeCheck> CheckAll(const std::vector<std::string>& nodes,
                                  const KvRequest& request);
  static NodeCheck NoBroker(const std::string& node);
  // One node's answer.
  static NodeCheck Verdict(const KvRequest& request, const grpc::Status& status,
                           const v1::CapacityResponse& capacity,
                           const v1::GetPoolResponse& pool);
  // Bind's steps after the pod was read (at `resource_version`); returns
  // the protocol error ("" = bound). Reserve's request id is the pod's UID,
  // "<uid>/<n>" after n released binds.
  std::string BindKvPod(const BindingArgs& args, const KvRequest& request,
                        int released_binds,
                        const std::string& resource_version);
  void Count(const std::string& verb, int code);

  BrokerDirectory* const directory_;
  const KubeClient* const kube_;
  const ExtenderOptions options_;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& node_verdicts_;
  prometheus::Family<prometheus::Counter>& binds_;
  prometheus::Counter& released_;
  prometheus::Counter& kept_;
  prometheus::Family<prometheus::Gauge>& brokers_;
};

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_EXTENDER_H_
