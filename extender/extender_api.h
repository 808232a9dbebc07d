// The JSON of the Kubernetes scheduler extender protocol
// (k8s.io/kube-scheduler/extender/v1) and the pod annotations through which
// a pod asks kvbroker for KV-cache memory.
//
// Field names. The Go types of extender/v1 carry no JSON tags, so
// kube-scheduler sends and expects the Go field names ("Pod", "Nodes",
// "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error",
// "Host", "Score", "PodName", "PodNamespace", "PodUID", "Node"), and Go's
// decoder matches keys case-insensitively. The parsers here do the same
// (an exact match first, else any casing), so lowercase senders work too;
// the encoders write the Go field names.
//
//   ExtenderArgs          {Pod, Nodes: NodeList{items: [Node]}, NodeNames}
//   ExtenderFilterResult  {Nodes | NodeNames, FailedNodes,
//                          FailedAndUnresolvableNodes, Error}
//   HostPriorityList      [{Host, Score}], Score in [0, kMaxExtenderPriority]
//   ExtenderBindingArgs   {PodName, PodNamespace, PodUID, Node}
//   ExtenderBindingResult {Error}
//
// Node-cache-capable mode (nodeCacheCapable: true in the scheduler's
// configuration) sends NodeNames and expects NodeNames back; otherwise the
// scheduler sends full Node objects and expects the kept ones back, as sent.
//
// Annotations (all values strings, as Kubernetes requires):
//   kvbroker.io/pool    the pool name on every node's broker
//   kvbroker.io/blocks  KV blocks to reserve, a decimal integer in
//                       [1, kMaxRequestBlocks]
//   kvbroker.io/tokens  or tokens, [1, kMaxRequestTokens]; converted to
//                       ceil(tokens / tokens_per_block) with each node's pool
// Exactly one of blocks and tokens goes with pool. A pod with none of the
// three is not a kvbroker pod and passes through untouched.

#ifndef KVBROKER_EXTENDER_EXTENDER_API_H_
#define KVBROKER_EXTENDER_EXTENDER_API_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {

inline constexpr char kPoolAnnotation[] = "kvbroker.io/pool";
inline constexpr char kBlocksAnnotation[] = "kvbroker.io/blocks";
inline constexpr char kTokensAnnotation[] = "kvbroker.io/tokens";
// Written by bind: the broker's reservation id, the pool incarnation it was
// made in (when the broker reports one), the node, and when it expires
// (RFC 3339).
inline constexpr char kReservationAnnotation[] = "kvbroker.io/reservation";
inline constexpr char kPoolUidAnnotation[] = "kvbroker.io/pool-uid";
inline constexpr char kReservationNodeAnnotation[] =
    "kvbroker.io/reservation-node";
inline constexpr char kReservationExpiryAnnotation[] =
    "kvbroker.io/reservation-expire-time";
// Written by a bind that reserved and then released (its patch or Binding
// failed): how many times, so that the next bind reserves under a new
// request id instead of replaying the released reservation.
inline constexpr char kReleasedBindsAnnotation[] = "kvbroker.io/released-binds";

// The broker's own bound on a pool's block ids.
inline constexpr int64_t kMaxRequestBlocks = int64_t{1} << 27;
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 40;
// Pool names the extender accepts: [A-Za-z0-9._-], at most this long.
inline constexpr size_t kMaxPoolNameLength = 128;
// extender/v1 MaxExtenderPriority; scores are in [0, 10].
inline constexpr int64_t kMaxExtenderPriority = 10;

// What a pod asks for.
struct KvRequest {
  std::string pool;
  // Exactly one is positive.
  int64_t blocks = 0;
  int64_t tokens = 0;

  // "4 blocks of pool demo" / "100 tokens of pool demo".
  std::string DebugString() const;
};

// The pod's kvbroker request: nullopt when it carries none of the three
// annotations. INVALID_ARGUMENT, naming the annotation, when one is missing
// its partner, both blocks and tokens are given, a number is not a decimal
// integer in range, or the pool name is empty, too long or has other
// characters.
absl::StatusOr<std::optional<KvRequest>> ParseKvRequest(
    const std::map<std::string, std::string>& annotations);

// The parts of a v1.Pod the extender uses.
struct PodView {
  std::string name;
  std::string namespace_;
  std::string uid;
  std::string resource_version;  // metadata.resourceVersion
  std::string node_name;         // spec.nodeName; empty while unscheduled
  std::map<std::string, std::string> annotations;
};

// INVALID_ARGUMENT when `pod` is not an object or metadata.annotations holds
// a non-string value. Missing fields stay empty.
absl::StatusOr<PodView> ParsePod(const nlohmann::json& pod);

// A parsed ExtenderArgs.
struct ExtenderArgs {
  nlohmann::json pod;
  // True when the scheduler sent NodeNames (node-cache-capable mode).
  bool node_names_mode = false;
  // The candidates' names in the order sent (both modes).
  std::vector<std::string> node_names;
  // Full mode: the Node objects, parallel to node_names.
  std::vector<nlohmann::json> nodes;
};

// INVALID_ARGUMENT for a body that is not JSON, has no Pod object, has
// neither Nodes nor NodeNames, or has a node without metadata.name or a
// non-string name, names a node twice, or has more than kMaxNodes
// candidates.
inline constexpr size_t kMaxNodes = 100000;
absl::StatusOr<ExtenderArgs> ParseExtenderArgs(absl::string_view body);

// Filter verdicts. Every candidate is either kept or named in exactly one of
// the two maps, with its reason.
struct FilterVerdict {
  // Indices into ExtenderArgs::node_names, ascending.
  std::vector<size_t> kept;
  // Preemption on the node might help (capacity now, broker unreachable).
  std::map<std::string, std::string> failed;
  // Preemption would not help (request too large, no such pool, pool failed).
  std::map<std::string, std::string> unresolvable;
  std::string error;
};

// ExtenderFilterResult in the mode the arguments came in (the kept Node
// objects are moved out of `args`).
std::string EncodeFilterResult(ExtenderArgs args, const FilterVerdict& verdict);

// HostPriorityList, in the given order.
std::string EncodeHostPriorityList(
    const std::vector<std::pair<std::string, int64_t>>& scores);

struct BindingArgs {
  std::string pod_name;
  std::string pod_namespace;
  std::string pod_uid;
  std::string node;
};

// INVALID_ARGUMENT for a body that is not JSON or lacks one of the four
// strings.
absl::StatusOr<BindingArgs> ParseBindingArgs(absl::string_view body);

// ExtenderBindingResult; an empty error means bound.
std::string EncodeBindingResult(const std::string& error);

// {"Error": message} for refusals of the whole call (HTTP 400).
std::string EncodeError(const std::string& message);

// JSON nested deeper than this is refused before it is built: the library
// builds, copies and frees documents recursively, so a body of a few
// megabytes of '[' would otherwise exhaust the stack.
inline constexpr int kMaxJsonDepth = 128;
// Nor more values (scalars, arrays and objects) than this: the document
// costs up to about 180 bytes a value, several times its text, so 16 MiB
// of "{"a":0}," would otherwise build about 400 MB. A NodeNames body of
// 100,000 names holds about as many values; a full NodeList about 500 a
// node.
inline constexpr size_t kMaxJsonValues = 500000;

// The parsed document. INVALID_ARGUMENT ("`what`: ...") when `text` is not
// JSON or nests deeper than kMaxJsonDepth.
absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text,
                                         absl::string_view what);

// obj[key] where key matches `name` exactly, else case-insensitively;
// nullptr when absent or `obj` is not an object.
const nlohmann::json* FindField(const nlohmann::json& obj,
                                absl::string_view name);
// The same in a document the caller owns, for moving parts out of it.
nlohmann::json* FindField(nlohmann::json& obj, absl::string_view name);

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_EXTENDER_API_H_
