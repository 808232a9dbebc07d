// KubeClient: the few Kubernetes API calls kvbroker-extender makes, over
// libcurl, authenticated with a service account token.
//
//   GET   /api/v1/namespaces/{ns}/pods/{name}
//   GET   /api/v1/namespaces/{ns}/pods?labelSelector=...&limit=...
//         [&continue=...]                                  (the brokers)
//   PATCH /api/v1/namespaces/{ns}/pods/{name}
//         Content-Type: application/merge-patch+json
//         {"metadata":{"annotations":{key: value | null},
//                      "resourceVersion"?}}
//   POST  /api/v1/namespaces/{ns}/pods/{name}/binding
//         {"apiVersion":"v1","kind":"Binding",
//          "metadata":{"name","namespace","uid","resourceVersion"?},
//          "target":{"apiVersion":"v1","kind":"Node","name"}}
//
// A resourceVersion, when given, is a precondition: the API server refuses
// the patch or the Binding with 409 Conflict when the pod has changed since
// that version (optimistic concurrency).
//
// The token file is read again for every request (projected service account
// tokens are rotated in place). TLS verifies the API server against
// `ca_file` (the service account's ca.crt in a pod).
//
// Errors map from the HTTP status: 400/422 INVALID_ARGUMENT, 401
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS
// (e.g. a pod that is already bound), 429 and 5xx and transport failures
// UNAVAILABLE, anything else UNKNOWN; the message carries the API's own
// Status message when it sent one.
//
// Thread safety: every method may be called from any thread concurrently.

#ifndef KVBROKER_EXTENDER_KUBE_CLIENT_H_
#define KVBROKER_EXTENDER_KUBE_CLIENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {

struct KubeClientOptions {
  // "https://host:port" (in a pod: from KUBERNETES_SERVICE_HOST/PORT) or
  // "http://..." for tests.
  std::string api_server;
  // Bearer token file; empty: no Authorization header.
  std::string token_file;
  // PEM CA of the API server; empty: the system's roots.
  std::string ca_file;
  // Per request.
  absl::Duration timeout = absl::Seconds(10);
};

class KubeClient {
 public:
  // INVALID_ARGUMENT when api_server is not an http(s) URL.
  static absl::StatusOr<std::unique_ptr<KubeClient>> Create(
      KubeClientOptions options);

  absl::StatusOr<nlohmann::json> GetPod(const std::string& ns,
                                        const std::string& name) const;
  // A v1.PodList; `label_selector` as kubectl's -l takes it. With `limit`
  // > 0, one page of at most that many pods, from `continue_token` (empty:
  // the first page); the next page's token is the reply's
  // metadata.continue, absent after the last page. A token the API no
  // longer honours (410 Gone) is FAILED_PRECONDITION: list again.
  absl::StatusOr<nlohmann::json> ListPods(
      const std::string& ns, const std::string& label_selector, int limit = 0,
      const std::string& continue_token = "") const;
  // Sets (value) or removes (nullopt) each annotation with one merge patch;
  // the pod as patched. `resource_version` non-empty: only if the pod is
  // still at that version (else ALREADY_EXISTS, the API's 409).
  absl::StatusOr<nlohmann::json> PatchPodAnnotations(
      const std::string& ns, const std::string& name,
      const std::map<std::string, std::optional<std::string>>& annotations,
      const std::string& resource_version = "") const;
  // Binds the pod (of that uid: the API refuses a replaced pod) to `node`;
  // `resource_version` non-empty: only if the pod is still at that version.
  absl::Status CreateBinding(const std::string& ns, const std::string& name,
                             const std::string& uid, const std::string& node,
                             const std::string& resource_version = "") const;

 private:
  explicit KubeClient(KubeClientOptions options)
      : options_(std::move(options)) {}

  // One request; the parsed JSON reply of a 2xx.
  absl::StatusOr<nlohmann::json> Request(const std::string& method,
                                         const std::string& path,
                                         const std::string& content_type,
                                         const std::string& body) const;

  const KubeClientOptions options_;
};

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_KUBE_CLIENT_H_
