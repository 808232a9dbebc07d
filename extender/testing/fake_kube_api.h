// FakeKubeApi: a Kubernetes API server for the extender's tests, over real
// HTTP (HttpServer). It serves the pods the test adds and the broker pods
// of the kvbroker DaemonSet, records every annotation patch and Binding,
// and checks the shape of every request it receives: the bearer token, the
// path, the method, the content type and the JSON body of patches and
// Bindings. Anything off is answered with an error status and remembered
// in violations(), which a test expects to be empty at its end. Every
// change of a pod sets a new metadata.resourceVersion, and a patch or a
// Binding that names another one is refused 409 Conflict, as the API
// server's preconditions do.
//
// Thread safety: all methods may be called concurrently with requests.

#ifndef KVBROKER_EXTENDER_TESTING_FAKE_KUBE_API_H_
#define KVBROKER_EXTENDER_TESTING_FAKE_KUBE_API_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "extender/http_server.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {
namespace testing {

struct RecordedBinding {
  std::string ns;
  std::string pod;
  std::string uid;
  std::string node;
};

struct RecordedPatch {
  std::string ns;
  std::string pod;
  nlohmann::json annotations;  // the patch's metadata.annotations
};

class FakeKubeApi {
 public:
  static constexpr char kBrokerNamespace[] = "kvbroker";
  static constexpr char kBrokerSelector[] =
      "app.kubernetes.io/name=kvbroker,app.kubernetes.io/component=kvbrokerd";

  // Listens on 127.0.0.1:0; requests must carry "Bearer <token>".
  explicit FakeKubeApi(std::string token);

  std::string url() const;

  // An unscheduled pod with these annotations.
  void AddPod(const std::string& ns, const std::string& name,
              const std::string& uid,
              const std::map<std::string, std::string>& annotations)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A running, ready kvbroker pod on `node` whose "grpc" port is `port` on
  // 127.0.0.1.
  void AddBroker(const std::string& node, int port) ABSL_LOCKS_EXCLUDED(mu_);
  // A change of the pod that is not the extender's (a controller's label):
  // a new resourceVersion.
  void Touch(const std::string& ns, const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Any pod, as the broker pod list returns it.
  void AddBrokerPod(nlohmann::json pod) ABSL_LOCKS_EXCLUDED(mu_);
  // The broker list answers 500 while set.
  void FailBrokerList(bool fail) ABSL_LOCKS_EXCLUDED(mu_);
  // The next `n` broker lists that name a continue token answer 410 Gone,
  // as the API does once the list's resourceVersion has been compacted.
  void ExpireContinueTokens(int n) ABSL_LOCKS_EXCLUDED(mu_);
  // How many pages of the broker list were served, and the most pods one
  // of them held.
  int broker_list_pages() ABSL_LOCKS_EXCLUDED(mu_);
  size_t largest_broker_list_page() ABSL_LOCKS_EXCLUDED(mu_);

  // The pod as stored now (annotations patched, spec.nodeName bound).
  nlohmann::json Pod(const std::string& ns, const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, std::string> Annotations(const std::string& ns,
                                                 const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Called with every request before it is handled (not under the fake's
  // lock, so it may make requests of its own); null: none.
  void OnRequest(std::function<void(const HttpRequest&)> hook)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Answer Binding requests with this HTTP status (0: normally).
  void RefuseBindings(int code) ABSL_LOCKS_EXCLUDED(mu_);
  void RefusePatches(int code) ABSL_LOCKS_EXCLUDED(mu_);
  // Answer reads of one pod (GET .../pods/{name}) with this status.
  void RefusePodReads(int code) ABSL_LOCKS_EXCLUDED(mu_);
  // Each request about one pod (a read, a patch, a Binding) fails with 500
  // at `chance`, drawn from a generator seeded with `seed`; half of the
  // failing patches and Bindings take effect before the 500, as when the
  // API server's answer is lost after the write. 0 turns it off.
  void FailPodRequestsAtRandom(double chance, uint64_t seed)
      ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<RecordedBinding> bindings() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<RecordedPatch> patches() ABSL_LOCKS_EXCLUDED(mu_);
  // "GET /api/v1/..." per request, in order.
  std::vector<std::string> requests() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> violations() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  HttpResponse Handle(const HttpRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  HttpResponse HandleLocked(const HttpRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  HttpResponse Violation(int code, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string token_;
  absl::Mutex mu_;
  // "ns/name" -> v1.Pod.
  std::map<std::string, nlohmann::json> pods_ ABSL_GUARDED_BY(mu_);
  std::vector<nlohmann::json> brokers_ ABSL_GUARDED_BY(mu_);
  int expire_continue_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int broker_list_pages_ ABSL_GUARDED_BY(mu_) = 0;
  size_t largest_broker_list_page_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const HttpRequest&)> hook_ ABSL_GUARDED_BY(mu_);
  int64_t resource_version_ ABSL_GUARDED_BY(mu_) = 1;
  int refuse_bindings_ ABSL_GUARDED_BY(mu_) = 0;
  int refuse_patches_ ABSL_GUARDED_BY(mu_) = 0;
  int refuse_pod_reads_ ABSL_GUARDED_BY(mu_) = 0;
  double fail_chance_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
  bool fail_broker_list_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RecordedBinding> bindings_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedPatch> patches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HttpServer> server_;  // last: stops before the state goes
};

}  // namespace testing
}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_TESTING_FAKE_KUBE_API_H_
