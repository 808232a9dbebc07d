// BrokerDirectory: which kvbrokerd serves which node, found from the
// cluster, with one long-lived gRPC channel per broker.
//
// The brokers are the pods of the kvbroker DaemonSet: the directory lists
// the pods of `namespace_` that match `label_selector` and maps each
// running pod with an IP to its spec.nodeName. The port is the pod's
// container port named `port_name` ("grpc"), else `default_port`. When two
// pods claim one node (a rolling update), the Ready one wins, then the
// newer (by creationTimestamp).
//
// Refreshing: a worker thread relists every `refresh_interval` once started,
// and at once when a lookup misses, at most once per `min_refresh_interval`
// (a new node's broker is found on the first filter after it starts, and a
// node without a broker costs no API call per filter). The lookup waits for
// that relist only until its caller's deadline: a slow API delays a filter
// by no more than the filter allows, and the relist goes on for the next
// one. A failed relist keeps the previous map.
//
// Channels: a broker keeps its channel (its stub and two clients) across
// refreshes while its address is unchanged. `filter` sends each call once
// (the filter's per-node deadline is all it may spend); `bind` retries
// transport failures (Reserve carries the pod's UID as request_id, so a
// retry replays instead of reserving twice).
//
// Thread safety: all methods may be called concurrently.

#ifndef KVBROKER_EXTENDER_BROKER_DIRECTORY_H_
#define KVBROKER_EXTENDER_BROKER_DIRECTORY_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/kvbroker_client.h"
#include "extender/kube_client.h"

namespace kvbroker {
namespace extender {

struct BrokerDirectoryOptions {
  std::string namespace_ = "kvbroker";
  std::string label_selector =
      "app.kubernetes.io/name=kvbroker,app.kubernetes.io/component=kvbrokerd";
  std::string port_name = "grpc";
  int default_port = 50051;
  absl::Duration refresh_interval = absl::Seconds(30);
  absl::Duration min_refresh_interval = absl::Seconds(1);
  // Set: TLS to every broker (brokers are dialled by pod IP, so
  // target_name_override usually names the certificate's DNS name).
  std::optional<TlsOptions> tls;
  // Non-empty: "authorization: Bearer" on every broker call.
  std::string bearer_token;
  // Deadline of a bind-side call (all attempts) when the caller gives none.
  absl::Duration call_timeout = absl::Seconds(5);
};

// One node's broker.
struct Broker {
  std::string node;
  std::string pod;     // namespace/name of the broker pod
  std::string target;  // "ip:port"
  // "Bearer <token>", or empty: the authorization metadata of stub calls.
  std::string authorization;
  // Not OK when the token cannot be sent (CheckBearerToken): then
  // `authorization` is empty, stub calls must not be made, and the clients
  // answer every call with this status, unsent.
  absl::Status credentials;
  // The async stub over the same channel, for the filter's fan-out (every
  // node's Capacity call on one completion queue).
  std::shared_ptr<v1::KvBroker::Stub> stub;
  std::shared_ptr<KvBrokerClient> filter;  // one attempt per call
  std::shared_ptr<KvBrokerClient> bind;    // retries transport failures
};

class BrokerDirectory {
 public:
  // `kube` must outlive the directory.
  BrokerDirectory(const KubeClient* kube, BrokerDirectoryOptions options);
  // Stops the refresher.
  ~BrokerDirectory();
  BrokerDirectory(const BrokerDirectory&) = delete;
  BrokerDirectory& operator=(const BrokerDirectory&) = delete;

  // Pods asked for per page of the broker list. A page is one reply the
  // extender parses whole, so pages keep each reply within the parser's
  // bound on values (kMaxJsonValues) and its memory, in a cluster of
  // thousands of nodes; 500 is kubectl's own page.
  static constexpr int kListPage = 500;
  // A list that has not ended after this many pages (five million pods) is
  // taken as the API's fault, not a cluster's size.
  static constexpr int kMaxListPages = 10000;

  // Lists the broker pods now, page by page; when the API has forgotten
  // the list's continue token (410 Gone) between pages, the list starts
  // over once. Errors: the API's (the map is unchanged).
  absl::Status Refresh() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the periodic relists, the first one at once.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // The node's broker. On a miss, waits until `wait_until` at most for the
  // relist in progress, or for one it asks the worker for (throttled).
  // NOT_FOUND when no running broker pod is on the node as far as the
  // directory knows then.
  absl::StatusOr<std::shared_ptr<const Broker>> Find(
      const std::string& node, absl::Time wait_until = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);

  // Brokers known now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Relists done and failed since construction.
  int64_t refreshes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t refresh_failures() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The worker: relists when asked or when the periodic one is due.
  void Work() ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<const Broker> MakeBroker(const std::string& node,
                                           const std::string& pod,
                                           const std::string& target) const;

  const KubeClient* const kube_;
  const BrokerDirectoryOptions options_;

  // Serializes relists (API call and map swap).
  absl::Mutex refresh_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // node -> its broker.
  std::map<std::string, std::shared_ptr<const Broker>> brokers_
      ABSL_GUARDED_BY(mu_);
  absl::Time last_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Relists begun and ended (refreshes_ <= relists_begun_); a lookup waits
  // for refreshes_ to reach a relist that begins after its miss or was
  // running then.
  int64_t relists_begun_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refresh_failures_ ABSL_GUARDED_BY(mu_) = 0;
  // A lookup missed and asked the worker for a relist.
  bool relist_wanted_ ABSL_GUARDED_BY(mu_) = false;
  // Start() was called: the worker also relists every refresh_interval.
  bool periodic_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: starts after the state it reads
};

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_BROKER_DIRECTORY_H_
