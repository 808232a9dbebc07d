// JSON codec of the extender protocol and the pod annotations, over
// nlohmann/json (parsing never throws out of this file).

#include "extender/extender_api.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvbroker {
namespace extender {

using nlohmann::json;

std::string KvRequest::DebugString() const {
  return blocks > 0 ? absl::StrCat(blocks, " blocks of pool ", pool)
                    : absl::StrCat(tokens, " tokens of pool ", pool);
}

const json* FindField(const json& obj, absl::string_view name) {
  if (!obj.is_object()) return nullptr;
  auto exact = obj.find(std::string(name));
  if (exact != obj.end()) return &*exact;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (absl::EqualsIgnoreCase(it.key(), name)) return &it.value();
  }
  return nullptr;
}

json* FindField(json& obj, absl::string_view name) {
  return const_cast<json*>(FindField(std::as_const(obj), name));
}

namespace {

// A positive decimal integer in [1, max], digits only.
absl::StatusOr<int64_t> ParseCount(const std::string& annotation,
                                   const std::string& value, int64_t max) {
  int64_t n = 0;
  const bool digits = !value.empty() && value.size() <= 19 &&
                      std::all_of(value.begin(), value.end(), [](char c) {
                        return absl::ascii_isdigit(c);
                      });
  if (!digits || !absl::SimpleAtoi(value, &n) || n < 1 || n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("annotation ", annotation, "=\"", value.substr(0, 64),
                     "\" must be a decimal integer in [1, ", max, "]"));
  }
  return n;
}

// Never throws: invalid UTF-8 (a truncated value in a message) is replaced.
std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string StringField(const json& obj, absl::string_view name) {
  const json* v = FindField(obj, name);
  return v != nullptr && v->is_string() ? v->get<std::string>() : "";
}

// Counts nesting and values on the parser's event stream (iterative, no
// document) and stops the parse at the first level past kMaxJsonDepth or
// the first value past kMaxJsonValues.
class SizeGuard : public json::json_sax_t {
 public:
  bool too_deep() const { return too_deep_; }
  bool too_many() const { return too_many_; }

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override {
    return Value();
  }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Leave(); }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override { return Leave(); }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool Value() {
    too_many_ = ++values_ > kMaxJsonValues;
    return !too_many_;
  }
  bool Enter() {
    too_deep_ = ++depth_ > kMaxJsonDepth;
    return !too_deep_ && Value();
  }
  bool Leave() {
    --depth_;
    return true;
  }

  int depth_ = 0;
  size_t values_ = 0;
  bool too_deep_ = false;
  bool too_many_ = false;
};

// `args` when no node is named twice (each name costs a broker call, and
// the verdicts are keyed by name).
absl::StatusOr<ExtenderArgs> NamedOnce(ExtenderArgs args) {
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(args.node_names.size());
  for (const std::string& name : args.node_names) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ExtenderArgs: node ", name.substr(0, 253), " is named twice"));
    }
  }
  return args;
}

}  // namespace

absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view what) {
  SizeGuard guard;
  if (!json::sax_parse(text.begin(), text.end(), &guard,
                       json::input_format_t::json, /*strict=*/true)) {
    return absl::InvalidArgumentError(
        guard.too_deep()   ? absl::StrCat(what, ": the body nests deeper than ",
                                          kMaxJsonDepth, " levels")
        : guard.too_many() ? absl::StrCat(what, ": the body holds more than ",
                                          kMaxJsonValues, " JSON values")
                           : absl::StrCat(what, ": the body is not JSON"));
  }
  json doc = json::parse(text.begin(), text.end(), nullptr,
                         /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the body is not JSON"));
  }
  return doc;
}

absl::StatusOr<std::optional<KvRequest>> ParseKvRequest(
    const std::map<std::string, std::string>& annotations) {
  auto get = [&](const char* key) -> const std::string* {
    auto it = annotations.find(key);
    return it == annotations.end() ? nullptr : &it->second;
  };
  const std::string* pool = get(kPoolAnnotation);
  const std::string* blocks = get(kBlocksAnnotation);
  const std::string* tokens = get(kTokensAnnotation);
  if (pool == nullptr && blocks == nullptr && tokens == nullptr) {
    return std::nullopt;
  }
  if (pool == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("annotation ",
                     blocks != nullptr ? kBlocksAnnotation : kTokensAnnotation,
                     " needs ", kPoolAnnotation));
  }
  if (blocks == nullptr && tokens == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("annotation ", kPoolAnnotation, " needs ",
                     kBlocksAnnotation, " or ", kTokensAnnotation));
  }
  if (blocks != nullptr && tokens != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give one of ", kBlocksAnnotation, " and ", kTokensAnnotation));
  }
  const bool name_ok =
      !pool->empty() && pool->size() <= kMaxPoolNameLength &&
      std::all_of(pool->begin(), pool->end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
      });
  if (!name_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("annotation ", kPoolAnnotation, "=\"", pool->substr(0, 64),
                     "\" must be 1 to ", kMaxPoolNameLength,
                     " characters of [A-Za-z0-9._-]"));
  }
  KvRequest request;
  request.pool = *pool;
  if (blocks != nullptr) {
    absl::StatusOr<int64_t> n =
        ParseCount(kBlocksAnnotation, *blocks, kMaxRequestBlocks);
    if (!n.ok()) return n.status();
    request.blocks = *n;
  } else {
    absl::StatusOr<int64_t> n =
        ParseCount(kTokensAnnotation, *tokens, kMaxRequestTokens);
    if (!n.ok()) return n.status();
    request.tokens = *n;
  }
  return request;
}

absl::StatusOr<PodView> ParsePod(const json& pod) {
  if (!pod.is_object()) {
    return absl::InvalidArgumentError("Pod must be a v1.Pod object");
  }
  PodView view;
  const json* metadata = FindField(pod, "metadata");
  if (metadata != nullptr && metadata->is_object()) {
    view.name = StringField(*metadata, "name");
    view.namespace_ = StringField(*metadata, "namespace");
    view.uid = StringField(*metadata, "uid");
    view.resource_version = StringField(*metadata, "resourceVersion");
    const json* annotations = FindField(*metadata, "annotations");
    if (annotations != nullptr && !annotations->is_null()) {
      if (!annotations->is_object()) {
        return absl::InvalidArgumentError(
            "Pod metadata.annotations must be an object");
      }
      for (auto it = annotations->begin(); it != annotations->end(); ++it) {
        if (!it->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("Pod annotation ", it.key(), " must be a string"));
        }
        view.annotations[it.key()] = it->get<std::string>();
      }
    }
  }
  const json* spec = FindField(pod, "spec");
  if (spec != nullptr) view.node_name = StringField(*spec, "nodeName");
  return view;
}

absl::StatusOr<ExtenderArgs> ParseExtenderArgs(absl::string_view body) {
  absl::StatusOr<json> parsed = ParseJson(body, "ExtenderArgs");
  if (!parsed.ok()) return parsed.status();
  json& doc = *parsed;
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        "ExtenderArgs: the body is not a JSON object");
  }
  ExtenderArgs args;
  // The pod and the nodes are moved out of `doc` (ours), not copied.
  json* pod = FindField(doc, "Pod");
  if (pod == nullptr || !pod->is_object()) {
    return absl::InvalidArgumentError("ExtenderArgs: Pod is missing");
  }
  args.pod = std::move(*pod);
  const json* names = FindField(doc, "NodeNames");
  json* nodes = FindField(doc, "Nodes");
  if (names != nullptr && !names->is_null()) {
    if (!names->is_array()) {
      return absl::InvalidArgumentError(
          "ExtenderArgs: NodeNames must be an array of strings");
    }
    if (names->size() > kMaxNodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExtenderArgs: more than ", kMaxNodes, " nodes"));
    }
    args.node_names_mode = true;
    for (const json& n : *names) {
      if (!n.is_string() || n.get_ref<const std::string&>().empty()) {
        return absl::InvalidArgumentError(
            "ExtenderArgs: NodeNames must be an array of non-empty strings");
      }
      args.node_names.push_back(n.get<std::string>());
    }
    return NamedOnce(std::move(args));
  }
  if (nodes == nullptr || nodes->is_null()) {
    return absl::InvalidArgumentError("ExtenderArgs: give Nodes or NodeNames");
  }
  json* items = FindField(*nodes, "items");
  if (items == nullptr || !(items->is_array() || items->is_null())) {
    return absl::InvalidArgumentError(
        "ExtenderArgs: Nodes must be a v1.NodeList with an items array");
  }
  if (items->is_null()) return args;
  if (items->size() > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExtenderArgs: more than ", kMaxNodes, " nodes"));
  }
  for (json& node : *items) {
    const json* metadata = FindField(node, "metadata");
    const std::string name =
        metadata != nullptr ? StringField(*metadata, "name") : "";
    if (name.empty()) {
      return absl::InvalidArgumentError(
          "ExtenderArgs: every node needs metadata.name");
    }
    args.node_names.push_back(name);
    args.nodes.push_back(std::move(node));
  }
  return NamedOnce(std::move(args));
}

std::string EncodeFilterResult(ExtenderArgs args,
                               const FilterVerdict& verdict) {
  json out = json::object();
  if (args.node_names_mode) {
    json names = json::array();
    for (size_t i : verdict.kept) names.push_back(args.node_names[i]);
    out["NodeNames"] = std::move(names);
  } else {
    json items = json::array();
    for (size_t i : verdict.kept) items.push_back(std::move(args.nodes[i]));
    out["Nodes"] = {{"metadata", json::object()}, {"items", std::move(items)}};
  }
  out["FailedNodes"] = verdict.failed;
  out["FailedAndUnresolvableNodes"] = verdict.unresolvable;
  out["Error"] = verdict.error;
  return Dump(out);
}

std::string EncodeHostPriorityList(
    const std::vector<std::pair<std::string, int64_t>>& scores) {
  json out = json::array();
  for (const auto& [host, score] : scores) {
    out.push_back({{"Host", host}, {"Score", score}});
  }
  return Dump(out);
}

absl::StatusOr<BindingArgs> ParseBindingArgs(absl::string_view body) {
  absl::StatusOr<json> parsed = ParseJson(body, "ExtenderBindingArgs");
  if (!parsed.ok()) return parsed.status();
  const json& doc = *parsed;
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        "ExtenderBindingArgs: the body is not a JSON object");
  }
  BindingArgs args;
  args.pod_name = StringField(doc, "PodName");
  args.pod_namespace = StringField(doc, "PodNamespace");
  args.pod_uid = StringField(doc, "PodUID");
  args.node = StringField(doc, "Node");
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"PodName", &args.pod_name},
        {"PodNamespace", &args.pod_namespace},
        {"PodUID", &args.pod_uid},
        {"Node", &args.node}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ExtenderBindingArgs: ", field, " must be a non-empty string"));
    }
  }
  return args;
}

std::string EncodeBindingResult(const std::string& error) {
  return Dump(json{{"Error", error}});
}

std::string EncodeError(const std::string& message) {
  return Dump(json{{"Error", message}});
}

}  // namespace extender
}  // namespace kvbroker
