// The extender protocol's JSON both ways, and the pod annotations, with
// the inputs kube-scheduler sends (Go field names) and malformed ones.

#include "extender/extender_api.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {
namespace {

using nlohmann::json;

json PodWith(const json& annotations) {
  return {{"metadata",
           {{"name", "llm-0"},
            {"namespace", "serving"},
            {"uid", "3f1c-uid"},
            {"annotations", annotations}}},
          {"spec", {{"containers", json::array()}}}};
}

TEST(ParseExtenderArgs, NodeNamesMode) {
  const std::string body = json{
      {"Pod", PodWith({{"a", "b"}})},
      {"Nodes", nullptr},
      {"NodeNames",
       {"node-a", "node-b"}}}.dump();
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(body);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->node_names_mode);
  EXPECT_EQ(args->node_names, (std::vector<std::string>{"node-a", "node-b"}));
  absl::StatusOr<PodView> pod = ParsePod(args->pod);
  ASSERT_TRUE(pod.ok());
  EXPECT_EQ(pod->name, "llm-0");
  EXPECT_EQ(pod->namespace_, "serving");
  EXPECT_EQ(pod->uid, "3f1c-uid");
  EXPECT_EQ(pod->annotations.at("a"), "b");

  FilterVerdict verdict;
  verdict.kept = {1};
  verdict.unresolvable["node-a"] = "REQUEST_TOO_LARGE: requested_blocks=4";
  const json out = json::parse(EncodeFilterResult(*args, verdict));
  EXPECT_EQ(out["NodeNames"], json({"node-b"}));
  EXPECT_FALSE(out.contains("Nodes"));
  EXPECT_EQ(out["FailedAndUnresolvableNodes"]["node-a"],
            "REQUEST_TOO_LARGE: requested_blocks=4");
  EXPECT_EQ(out["FailedNodes"], json::object());
  EXPECT_EQ(out["Error"], "");
}

TEST(ParseExtenderArgs, FullNodesModeKeepsTheNodeObjects) {
  const json node_a = {
      {"metadata", {{"name", "node-a"}, {"labels", {{"x", "1"}}}}},
      {"status", {{"capacity", {{"cpu", "8"}}}}}};
  const json node_b = {{"metadata", {{"name", "node-b"}}}};
  // Lowercase keys, as senders with JSON tags write them.
  const std::string body =
      json{{"pod", PodWith(nullptr)},
           {"nodes",
            {{"metadata", json::object()}, {"items", {node_a, node_b}}}}}
          .dump();
  absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(body);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->node_names_mode);
  EXPECT_EQ(args->node_names, (std::vector<std::string>{"node-a", "node-b"}));
  FilterVerdict verdict;
  verdict.kept = {0};
  verdict.failed["node-b"] = "broker unreachable: UNAVAILABLE";
  const json out = json::parse(EncodeFilterResult(*args, verdict));
  ASSERT_EQ(out["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(out["Nodes"]["items"][0], node_a);
  EXPECT_FALSE(out.contains("NodeNames"));
  EXPECT_EQ(out["FailedNodes"]["node-b"], "broker unreachable: UNAVAILABLE");
}

TEST(ParseExtenderArgs, RefusesMalformedBodies) {
  for (const std::string& body : {
           std::string("not json"),
           std::string("[]"),
           std::string(R"({"NodeNames": ["a"]})"),
           std::string(R"({"Pod": {}, "NodeNames": "a"})"),
           std::string(R"({"Pod": {}, "NodeNames": [1]})"),
           std::string(R"({"Pod": {}, "NodeNames": [""]})"),
           std::string(R"({"Pod": {}})"),
           std::string(
               R"({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}})"),
           std::string(R"({"Pod": {}, "Nodes": {"items": 3}})"),
           std::string(R"({"Pod": "x", "NodeNames": []})"),
       }) {
    EXPECT_EQ(ParseExtenderArgs(body).status().code(),
              absl::StatusCode::kInvalidArgument)
        << body;
  }
  EXPECT_EQ(ParsePod(PodWith({{"kvbroker.io/blocks", 4}})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseExtenderArgs, RefusesANodeNamedTwice) {
  // Each name is one broker call: 100,000 copies of one name were 100,000
  // Capacity calls on one broker.
  EXPECT_EQ(ParseExtenderArgs(
                R"({"Pod": {}, "NodeNames": ["node-a", "node-b", "node-a"]})")
                .status()
                .message(),
            "ExtenderArgs: node node-a is named twice");
  EXPECT_EQ(ParseExtenderArgs(R"({"Pod": {}, "Nodes": {"items": [
                {"metadata": {"name": "node-b"}},
                {"metadata": {"name": "node-b"}}]}})")
                .status()
                .message(),
            "ExtenderArgs: node node-b is named twice");
}

std::map<std::string, std::string> A(
    std::initializer_list<std::pair<const std::string, std::string>> l) {
  return l;
}

TEST(ParseJson, RefusesDeepNestingWithoutBuildingIt) {
  const std::string deep =
      std::string(1000000, '[') + std::string(1000000, ']');
  const std::string body =
      R"({"Pod": {"metadata": )" + deep + R"(}, "NodeNames": ["a"]})";
  EXPECT_EQ(ParseExtenderArgs(body).status().message(),
            "ExtenderArgs: the body nests deeper than 128 levels");
  EXPECT_EQ(ParseBindingArgs(deep).status().message(),
            "ExtenderBindingArgs: the body nests deeper than 128 levels");
  // At the bound it parses.
  const std::string ok = std::string(127, '[') + std::string(127, ']');
  EXPECT_TRUE(ParseJson(R"({"a": )" + ok + "}", "x").ok());
  EXPECT_EQ(ParseJson("{} x", "x").status().message(),
            "x: the body is not JSON");
}

TEST(ParseJson, RefusesMoreValuesThanTheBoundWithoutBuildingThem) {
  // 64 MiB of {"a":0} built about 1.5 GB of document (and the Pod's copy
  // as much again): far past the Deployment's 256 MiB.
  std::string many = "[";
  for (size_t i = 0; i < kMaxJsonValues; ++i) many += "0,";
  many += "0]";  // the array and its kMaxJsonValues + 1 elements
  const std::string body =
      R"({"Pod": {"metadata": {}, "x": )" + many + R"(}, "NodeNames": ["a"]})";
  EXPECT_EQ(ParseExtenderArgs(body).status().message(),
            "ExtenderArgs: the body holds more than 500000 JSON values");
  EXPECT_EQ(ParseJson(many, "x").status().message(),
            "x: the body holds more than 500000 JSON values");
  // At the bound it parses: the array and kMaxJsonValues - 1 elements.
  std::string at = "[";
  for (size_t i = 0; i + 2 < kMaxJsonValues; ++i) at += "0,";
  at += "0]";
  EXPECT_TRUE(ParseJson(at, "x").ok());
}

TEST(ParseKvRequest, ReadsBlocksOrTokens) {
  absl::StatusOr<std::optional<KvRequest>> r =
      ParseKvRequest(A({{"kvbroker.io/pool", "demo"},
                        {"kvbroker.io/blocks", "4"},
                        {"unrelated", "x"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->pool, "demo");
  EXPECT_EQ((*r)->blocks, 4);
  EXPECT_EQ((*r)->tokens, 0);

  r = ParseKvRequest(
      A({{"kvbroker.io/pool", "llama3-8b"}, {"kvbroker.io/tokens", "1000"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->tokens, 1000);
  EXPECT_EQ((*r)->blocks, 0);

  r = ParseKvRequest(A({{"app", "web"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(ParseKvRequest, RefusesAbsurdAnnotations) {
  const std::string big = std::to_string(kMaxRequestBlocks + 1);
  for (const auto& annotations :
       std::vector<std::map<std::string, std::string>>{
           A({{"kvbroker.io/pool", "demo"}}),
           A({{"kvbroker.io/blocks", "4"}}),
           A({{"kvbroker.io/tokens", "4"}}),
           A({{"kvbroker.io/pool", "demo"},
              {"kvbroker.io/blocks", "4"},
              {"kvbroker.io/tokens", "64"}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", "0"}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", "-3"}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", "+3"}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", "4.5"}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", " 4"}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", ""}}),
           A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", big}}),
           A({{"kvbroker.io/pool", "demo"},
              {"kvbroker.io/blocks", "99999999999999999999999"}}),
           A({{"kvbroker.io/pool", "demo"},
              {"kvbroker.io/tokens", "2000000000000"}}),
           A({{"kvbroker.io/pool", ""}, {"kvbroker.io/blocks", "4"}}),
           A({{"kvbroker.io/pool", "a b"}, {"kvbroker.io/blocks", "4"}}),
           A({{"kvbroker.io/pool", std::string(129, 'p')},
              {"kvbroker.io/blocks", "4"}}),
       }) {
    absl::StatusOr<std::optional<KvRequest>> r = ParseKvRequest(annotations);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << json(annotations).dump();
  }
  absl::StatusOr<std::optional<KvRequest>> r = ParseKvRequest(
      A({{"kvbroker.io/pool", "demo"}, {"kvbroker.io/blocks", big}}));
  EXPECT_EQ(r.status().message(),
            "annotation kvbroker.io/blocks=\"134217729\" must be a decimal "
            "integer in [1, 134217728]");
}

TEST(Binding, ArgsAndResult) {
  absl::StatusOr<BindingArgs> args = ParseBindingArgs(
      R"({"PodName":"llm-0","PodNamespace":"serving","PodUID":"u1","Node":"node-b"})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->pod_name, "llm-0");
  EXPECT_EQ(args->pod_namespace, "serving");
  EXPECT_EQ(args->pod_uid, "u1");
  EXPECT_EQ(args->node, "node-b");
  EXPECT_EQ(ParseBindingArgs(R"({"PodName":"x","PodNamespace":"y","Node":"z"})")
                .status()
                .message(),
            "ExtenderBindingArgs: PodUID must be a non-empty string");
  EXPECT_EQ(ParseBindingArgs("{").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(json::parse(EncodeBindingResult("")), json({{"Error", ""}}));
  EXPECT_EQ(json::parse(EncodeBindingResult("no")), json({{"Error", "no"}}));
}

TEST(HostPriorityList, GoFieldNames) {
  EXPECT_EQ(json::parse(EncodeHostPriorityList({{"a", 10}, {"b", 0}})),
            json::parse(R"([{"Host":"a","Score":10},{"Host":"b","Score":0}])"));
}

TEST(EncodeError, SurvivesInvalidUtf8) {
  EXPECT_EQ(json::parse(EncodeError("bad \xff byte"))["Error"],
            "bad \xEF\xBF\xBD byte");
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker
