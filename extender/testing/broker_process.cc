// fork/exec of kvbrokerd and the parse of its "serving ... on
// 127.0.0.1:PORT" line.

#include "extender/testing/broker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvbroker {
namespace extender {
namespace testing {

namespace {

std::string Binary() {
  if (const char* path = std::getenv("KVBROKERD")) return path;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    return absl::StrCat(srcdir, "/kvbroker/server/kvbrokerd");
  }
  return "server/kvbrokerd";
}

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kvbrokerd-XXXXXX");
  char* made = mkdtemp(pattern.data());
  return made != nullptr ? made : "/tmp";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BrokerProcess>> BrokerProcess::Start(
    const std::string& pools_textproto, const std::vector<std::string>& flags) {
  std::unique_ptr<BrokerProcess> p(new BrokerProcess);
  p->dir_ = TempDir();
  const std::string pools = p->dir_ + "/pools.textproto";
  const std::string log = p->dir_ + "/kvbrokerd.log";
  std::ofstream(pools) << pools_textproto;
  std::vector<std::string> args = {Binary(),
                                   "--backend=host",
                                   "--listen=127.0.0.1:0",
                                   "--min_idle_pages=0",
                                   "--drain_timeout=1s",
                                   "--pools=" + pools};
  // tests/server_test.bzl: the mode of the test's brokers, before the
  // caller's flags so that theirs win.
  if (const char* threading = std::getenv("KVB_TEST_SERVER_THREADING")) {
    args.push_back(std::string("--server_threading=") + threading);
  }
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  p->pid_ = fork();
  if (p->pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out[1], STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  p->stdout_ = out[0];
  // "kvbrokerd: host backend ...; serving kvbroker.v1.KvBroker on
  // 127.0.0.1:PORT ..."
  std::string line;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    pollfd fd = {p->stdout_, POLLIN, 0};
    if (poll(&fd, 1, 100) <= 0) continue;
    char ch;
    if (read(p->stdout_, &ch, 1) != 1) break;
    if (ch != '\n') {
      line.push_back(ch);
      continue;
    }
    const size_t at = line.find("127.0.0.1:");
    if (at != std::string::npos) {
      size_t end = at + 10;
      while (end < line.size() && absl::ascii_isdigit(line[end])) ++end;
      if (absl::SimpleAtoi(line.substr(at + 10, end - at - 10), &p->port_)) {
        return p;
      }
    }
    line.clear();
  }
  return absl::UnavailableError(
      absl::StrCat("kvbrokerd did not come up: ", ReadAll(log)));
}

BrokerProcess::~BrokerProcess() {
  Kill();
  if (stdout_ >= 0) close(stdout_);
}

std::string BrokerProcess::target() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void BrokerProcess::Pause() {
  if (pid_ > 0 && kill(pid_, SIGSTOP) == 0) paused_ = true;
}

void BrokerProcess::Resume() {
  if (pid_ > 0 && kill(pid_, SIGCONT) == 0) paused_ = false;
}

void BrokerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  if (paused_) kill(pid_, SIGCONT);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace testing
}  // namespace extender
}  // namespace kvbroker
