// BrokerProcess: a real kvbrokerd (host backend) started as a child
// process on 127.0.0.1 with a free port, standing in for one node's broker
// in the extender's tests and benchmark.
//
// The binary is kvbrokerd from the runfiles (a data dependency on
// //server:kvbrokerd), or $KVBROKERD. The child dies with its parent
// (PR_SET_PDEATHSIG) and is killed when the object goes. With
// $KVB_TEST_SERVER_THREADING set (tests/server_test.bzl) it serves in that
// --server_threading unless the caller's flags say otherwise.

#ifndef KVBROKER_EXTENDER_TESTING_BROKER_PROCESS_H_
#define KVBROKER_EXTENDER_TESTING_BROKER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvbroker {
namespace extender {
namespace testing {

class BrokerProcess {
 public:
  // Starts kvbrokerd with the pools of `pools_textproto`
  // (kvbroker.v1.PoolsFile text), --backend=host, --min_idle_pages=0 and
  // `flags`, and waits until it serves. UNAVAILABLE (with its log) when it
  // does not come up within 30 s.
  static absl::StatusOr<std::unique_ptr<BrokerProcess>> Start(
      const std::string& pools_textproto,
      const std::vector<std::string>& flags = {});

  ~BrokerProcess();
  BrokerProcess(const BrokerProcess&) = delete;
  BrokerProcess& operator=(const BrokerProcess&) = delete;

  int port() const { return port_; }
  std::string target() const;
  pid_t pid() const { return pid_; }

  // SIGSTOP / SIGCONT: a broker that accepts connections and never answers.
  void Pause();
  void Resume();
  // SIGKILL and reap: the port stops answering at all.
  void Kill();

 private:
  BrokerProcess() = default;

  pid_t pid_ = -1;
  int stdout_ = -1;
  int port_ = 0;
  bool paused_ = false;
  std::string dir_;
};

}  // namespace testing
}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_TESTING_BROKER_PROCESS_H_
