// The extender's end-to-end test rig (extender_test.cc, extender_bind_test.cc):
// the pool files of the nodes, real kvbrokerd processes, an HTTP client,
// and Rig, the extender in process serving HTTP against a FakeKubeApi.

#ifndef KVBROKER_EXTENDER_TESTING_EXTENDER_RIG_H_
#define KVBROKER_EXTENDER_TESTING_EXTENDER_RIG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvbroker_client.h"
#include "extender/broker_directory.h"
#include "extender/extender.h"
#include "extender/http_server.h"
#include "extender/kube_client.h"
#include "extender/testing/broker_process.h"
#include "extender/testing/fake_kube_api.h"
#include "nlohmann/json.hpp"

namespace kvbroker {
namespace extender {
namespace testing {

inline constexpr int64_t kMiB = 1 << 20;

// The seed case of the spec: 14 MiB pages, 6 MiB blocks, 5 block ids of
// which 3 are usable (block 2 straddles the page boundary).
inline constexpr char kSeedPools[] = R"pb(
  pools { name: "kv" page_size: 14680064 block_bytes: 6291456 max_blocks: 5 }
)pb";
// Room: 12 MiB pages of two 6 MiB blocks, 16 blocks, 16 tokens per block.
inline constexpr char kRoomyPools[] = R"pb(
  pools {
    name: "kv"
    page_size: 12582912
    block_bytes: 6291456
    tokens_per_block: 16
    max_blocks: 16
  }
)pb";
// One pool per capacity reason, on a node with 64 MiB of device memory.
inline constexpr char kReasonPools[] = R"pb(
  pools { name: "full" page_size: 2097152 block_bytes: 1048576 max_blocks: 8 }
  pools { name: "shrink" page_size: 2097152 block_bytes: 1048576 max_blocks: 8 }
  pools { name: "big" page_size: 16777216 block_bytes: 8388608 max_blocks: 16 }
)pb";

struct HttpResult {
  long code = 0;  // 0: no answer
  std::string body;
  nlohmann::json doc;  // discarded when the body is not JSON
};

// `ca_file` non-empty: an https URL's server must chain to it.
HttpResult Http(const std::string& method, const std::string& url,
                const std::string& body, const std::string& ca_file = "");

// A data dependency's path under the test's runfiles.
std::string Runfile(const std::string& path);

// A kvbrokerd serving `pools` (a pools file); null (the test failed) when
// it would not start.
std::unique_ptr<BrokerProcess> StartBroker(
    const std::string& pools, const std::vector<std::string>& flags = {});

std::unique_ptr<KvBrokerClient> ClientOf(const BrokerProcess& broker,
                                         ClientOptions options = {});

// The pool's capacity on `broker` (empty, the test failed, when refused).
v1::CapacitySnapshot Cap(const BrokerProcess& broker, const std::string& pool,
                         ClientOptions options = {});

// Releases `reservation` of pool "kv" on `broker`: the blocks it held, or
// -1 (with the broker's refusal reported) when it is not live there.
int64_t Release(const BrokerProcess& broker, const std::string& reservation);

// A pod's kvbroker annotations: the pool and one ask.
std::map<std::string, std::string> Asks(const std::string& pool,
                                        const std::string& key,
                                        const std::string& value);

// The extender, in process, against a FakeKubeApi; its destructor fails the
// test if the fake API saw a malformed request.
class Rig {
 public:
  explicit Rig(ExtenderOptions options = {},
               BrokerDirectoryOptions directory_options = {});
  ~Rig();

  FakeKubeApi& api() { return api_; }
  Extender& extender() { return *extender_; }
  // A second extender over the same API and brokers, sharing no memory
  // with the first: another replica, or the first after a restart.
  std::unique_ptr<Extender> Replica(ExtenderOptions options = {}) {
    return std::make_unique<Extender>(directory_.get(), kube_.get(), options);
  }

  HttpResult Post(const std::string& verb, const std::string& body) {
    return Http("POST",
                absl::StrCat("http://127.0.0.1:", server_->port(), "/", verb),
                body);
  }
  HttpResult Get(const std::string& path) {
    return Http("GET", absl::StrCat("http://127.0.0.1:", server_->port(), path),
                "");
  }

  // ExtenderArgs for the stored pod and these candidates.
  static std::string Args(const nlohmann::json& pod,
                          const std::vector<std::string>& nodes,
                          bool node_names_mode = true);

  HttpResult Filter(const std::string& pod,
                    const std::vector<std::string>& nodes) {
    return Post("filter", Args(api_.Pod("serving", pod), nodes));
  }

  static std::string BindingArgs(const nlohmann::json& pod,
                                 const std::string& node);

  HttpResult Bind(const std::string& pod, const std::string& node) {
    return Post("bind", BindingArgs(api_.Pod("serving", pod), node));
  }

  // Another replica's bind of `pod` to `node`, run at the first request of
  // method `step` the API receives, before that request is handled: a bind
  // landing between the steps of this rig's. `then`, if any, runs after the
  // racing bind, before this rig's request is handled. Clear the API's hook
  // (OnRequest(nullptr)) before the race goes.
  struct RacingBind {
    std::unique_ptr<Extender> replica;
    bool ran = false;
    HttpResponse answer;
  };
  std::unique_ptr<RacingBind> RaceABind(const std::string& step,
                                        const std::string& pod,
                                        const std::string& node,
                                        std::function<void()> then = nullptr);

 private:
  FakeKubeApi api_;
  std::string token_file_;
  std::unique_ptr<KubeClient> kube_;
  std::unique_ptr<BrokerDirectory> directory_;
  std::unique_ptr<Extender> extender_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace testing
}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_TESTING_EXTENDER_RIG_H_
