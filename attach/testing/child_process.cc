// ChildProcess of child_process.h.

#include "attach/testing/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace kvbroker::testing {

ChildProcess::ChildProcess(const std::string& binary,
                           const std::vector<std::string>& args) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return;
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::vector<std::string> copy = args;
  std::string bin = binary;
  std::vector<char*> argv = {bin.data()};
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, bin.c_str(), &actions, nullptr, argv.data(), environ) ==
      0) {
    pid_ = pid;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  stdin_ = in[1];
  stdout_ = out[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Kill(SIGKILL);
  if (stdin_ >= 0) close(stdin_);
  if (stdout_ >= 0) close(stdout_);
}

std::string ChildProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return "";
    pollfd p = {stdout_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <=
        0) {
      continue;
    }
    char buf[4096];
    const ssize_t n = read(stdout_, buf, sizeof(buf));
    if (n <= 0) return "";
    buffered_.append(buf, n);
  }
}

std::string ChildProcess::ReadUntil(const std::string& prefix,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string line = ReadLine(deadline - absl::Now());
    if (absl::StartsWith(line, prefix)) return line;
    if (line.empty() && buffered_.empty()) {
      pollfd p = {stdout_, POLLIN, 0};
      if (poll(&p, 1, 0) == 1 && (p.revents & POLLHUP)) return "";
    }
  }
  return "";
}

bool ChildProcess::WriteLine(const std::string& line) {
  const std::string data = line + "\n";
  return write(stdin_, data.data(), data.size()) ==
         static_cast<ssize_t>(data.size());
}

int ChildProcess::Kill(int signal) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

int ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (pid_ > 0 && absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

std::string Runfile(const std::string& path) {
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    return absl::StrCat(srcdir, "/kvbroker/", path);
  }
  return path;
}

}  // namespace kvbroker::testing
