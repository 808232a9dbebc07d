// DaemonProcess: fork/exec of kvbrokerd with piped stdout and stderr.

#include "tests/daemon_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvbroker {
namespace testing {
namespace {

std::string Binary() {
  if (const char* path = std::getenv("KVBROKERD")) return path;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    return absl::StrCat(srcdir, "/kvbroker/server/kvbrokerd");
  }
  return "server/kvbrokerd";
}

}  // namespace

DaemonProcess::DaemonProcess(const std::vector<std::string>& args) {
  int out[2], err[2];
  if (pipe(out) != 0) return;
  if (pipe(err) != 0) {
    close(out[0]);
    close(out[1]);
    return;
  }
  std::string binary = Binary();
  // tests/server_test.bzl: the mode of the test's daemons, first, so that
  // a flag the test passes itself wins.
  std::vector<std::string> copy;
  if (const char* threading = std::getenv("KVB_TEST_SERVER_THREADING")) {
    copy.push_back(absl::StrCat("--server_threading=", threading));
  }
  copy.insert(copy.end(), args.begin(), args.end());
  std::vector<char*> argv = {binary.data()};
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  stdout_ = out[0];
  const int err_fd = err[0];
  stderr_reader_ = std::thread([this, err_fd] {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(err_fd, buf, sizeof(buf));
      if (n <= 0) break;
      absl::MutexLock lock(&mu_);
      stderr_.append(buf, static_cast<size_t>(n));
    }
    close(err_fd);
  });
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stderr_reader_.joinable()) stderr_reader_.join();
  if (stdout_ >= 0) close(stdout_);
}

std::string DaemonProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string line;
  while (absl::Now() < deadline) {
    pollfd p = {stdout_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char ch;
    if (read(stdout_, &ch, 1) != 1) break;
    if (ch == '\n') return line;
    line.push_back(ch);
  }
  return "";
}

std::string DaemonProcess::WaitServing(absl::Duration timeout) {
  const std::string line = ReadLine(timeout);
  return absl::StrContains(line, "serving kvbroker.v1.KvBroker") ? line : "";
}

int DaemonProcess::PortOf(const std::string& line) {
  const size_t at = line.find("127.0.0.1:");
  if (at == std::string::npos) return 0;
  const size_t begin = at + 10;
  size_t end = begin;
  while (end < line.size() && line[end] >= '0' && line[end] <= '9') ++end;
  int port = 0;
  return absl::SimpleAtoi(line.substr(begin, end - begin), &port) ? port : 0;
}

int DaemonProcess::WaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (stderr_reader_.joinable()) stderr_reader_.join();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

std::string DaemonProcess::Stderr() const {
  absl::MutexLock lock(&mu_);
  return stderr_;
}

}  // namespace testing
}  // namespace kvbroker
