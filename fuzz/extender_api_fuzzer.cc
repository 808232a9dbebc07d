// Fuzz driver: what kvbroker-extender parses from outside, from bytes to
// verdicts.
//
// Each input is parsed as the scheduler's ExtenderArgs (filter and
// prioritize), as its ExtenderBindingArgs (bind), and as a v1.Pod the way
// bind reads one from the Kubernetes API. The driver requires that:
//   - every refusal is a typed INVALID_ARGUMENT with a message;
//   - accepted ExtenderArgs name at most kMaxNodes nodes, each once and
//     non-empty, with one Node object per name in full mode;
//   - a pod's kvbroker request, when it has one, asks for blocks in
//     [1, kMaxRequestBlocks] or tokens in [1, kMaxRequestTokens] (exactly
//     one) of a pool named by the documented characters;
//   - the encoded answers (filter result with every node kept, and every
//     node failed; priorities; bind result; error) are JSON that parses
//     back, with the node names as sent.

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "extender/extender_api.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using namespace kvbroker::extender;  // NOLINT: a driver's file

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "extender_api_fuzzer: %s\n", what.c_str());
  std::abort();
}

void CheckRefusal(const absl::Status& status, const char* what) {
  if (status.code() != absl::StatusCode::kInvalidArgument ||
      status.message().empty()) {
    Die(absl::StrCat(what, ": untyped refusal ", status.ToString()));
  }
}

json Reparse(const std::string& text, const char* what) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) Die(absl::StrCat(what, " is not JSON: ", text));
  return doc;
}

void CheckPod(const json& pod_json) {
  absl::StatusOr<PodView> pod = ParsePod(pod_json);
  if (!pod.ok()) return CheckRefusal(pod.status(), "ParsePod");
  absl::StatusOr<std::optional<KvRequest>> request =
      ParseKvRequest(pod->annotations);
  if (!request.ok()) return CheckRefusal(request.status(), "ParseKvRequest");
  if (!request->has_value()) return;
  const KvRequest& r = **request;
  const bool blocks =
      r.blocks >= 1 && r.blocks <= kMaxRequestBlocks && r.tokens == 0;
  const bool tokens =
      r.tokens >= 1 && r.tokens <= kMaxRequestTokens && r.blocks == 0;
  if (blocks == tokens) Die("a request of neither or both: " + r.DebugString());
  if (r.pool.empty() || r.pool.size() > kMaxPoolNameLength) {
    Die("pool name out of bounds: " + r.pool);
  }
  for (char c : r.pool) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
          c == '-')) {
      Die("pool name with a stray character: " + r.pool);
    }
  }
}

void CheckArgs(const std::string& body) {
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(body);
  if (!args.ok()) return CheckRefusal(args.status(), "ParseExtenderArgs");
  const std::vector<std::string>& names = args->node_names;
  if (names.size() > kMaxNodes) Die("more than kMaxNodes nodes");
  if (std::set<std::string>(names.begin(), names.end()).size() !=
      names.size()) {
    Die("a node named twice was accepted");
  }
  for (const std::string& n : names) {
    if (n.empty()) Die("an empty node name was accepted");
  }
  if (!args->node_names_mode && args->nodes.size() != names.size()) {
    Die("Node objects and names differ in number");
  }
  CheckPod(args->pod);

  FilterVerdict kept;
  FilterVerdict dropped;
  std::vector<std::pair<std::string, int64_t>> scores;
  for (size_t i = 0; i < names.size(); ++i) {
    kept.kept.push_back(i);
    dropped.failed[names[i]] = "POOL_EXHAUSTED: " + names[i];
    scores.push_back({names[i], static_cast<int64_t>(i % 11)});
  }
  const json all = Reparse(EncodeFilterResult(*args, kept), "filter result");
  const json& out =
      args->node_names_mode ? all["NodeNames"] : all["Nodes"]["items"];
  if (!out.is_array() || out.size() != names.size()) {
    Die("the filter result lost nodes");
  }
  const json none =
      Reparse(EncodeFilterResult(*args, dropped), "filter result");
  if (none["FailedNodes"].size() != names.size()) {
    Die("the filter result lost failed nodes");
  }
  if (Reparse(EncodeHostPriorityList(scores), "priorities").size() !=
      names.size()) {
    Die("the priorities lost nodes");
  }
}

void CheckBinding(const std::string& body) {
  absl::StatusOr<BindingArgs> args = ParseBindingArgs(body);
  if (!args.ok()) return CheckRefusal(args.status(), "ParseBindingArgs");
  if (args->pod_name.empty() || args->pod_namespace.empty() ||
      args->pod_uid.empty() || args->node.empty()) {
    Die("binding args with an empty field were accepted");
  }
  Reparse(EncodeBindingResult(args->pod_name), "binding result");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  CheckArgs(body);
  CheckBinding(body);
  // The pod as GET pods/{name} returns it.
  absl::StatusOr<json> pod = ParseJson(body, "pod");
  if (pod.ok()) {
    CheckPod(*pod);
  } else {
    CheckRefusal(pod.status(), "ParseJson");
  }
  Reparse(EncodeError(body), "error");
  return 0;
}
