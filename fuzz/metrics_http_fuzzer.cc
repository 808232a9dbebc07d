// Fuzz driver: raw bytes against kvbrokerd's metrics listener.
//
// The driver starts one real kvbrokerd (the host backend, a pool from
// examples/pools.textproto, --metrics_listen=127.0.0.1:0), reads the metrics
// port from its start-up line, and sends each input as raw bytes on a new
// loopback connection, then half-closes it and reads whatever comes back.
// It requires that:
//   - the daemon is still running after every input;
//   - anything the listener answers starts like an HTTP response;
//   - every 64 inputs (and after the last), a well-formed
//     "GET /metrics HTTP/1.0" still gets "200" with kvbroker's metrics.
// The daemon runs in its own process, so the fuzzer learns nothing from its
// coverage: this is mutation from the seeds (request lines, headers,
// methods, chunked bodies), not coverage-guided search of the server.
//
// KVBROKERD names the binary; by default the one in the runfiles.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "metrics_http_fuzzer: %s\n", what.c_str());
  std::abort();
}

struct Daemon {
  pid_t pid = -1;
  int port = 0;
};

std::string Binary() {
  if (const char* path = std::getenv("KVBROKERD")) return path;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    return absl::StrCat(srcdir, "/kvbroker/server/kvbrokerd");
  }
  return "server/kvbrokerd";
}

void StopDaemon(Daemon* d) {
  if (d->pid > 0) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, nullptr, 0);
  }
}

void CheckAlive(Daemon* d);
void CheckServes(Daemon* d);

Daemon* TheDaemon() {
  static Daemon* daemon = [] {
    auto* d = new Daemon();
    int out[2];
    if (pipe(out) != 0) Die("pipe");
    const std::string binary = Binary();
    std::string pools = "examples/pools.textproto";
    if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
      pools = absl::StrCat(srcdir, "/kvbroker/", pools);
    }
    d->pid = fork();
    if (d->pid == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      const std::string pools_flag = "--pools=" + pools;
      execl(binary.c_str(), binary.c_str(), "--backend=host",
            "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
            "--min_idle_pages=0", "--host_device_memory=64GiB",
            pools_flag.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    std::string line;
    char ch;
    while (read(out[0], &ch, 1) == 1 && ch != '\n') line.push_back(ch);
    // The read end stays open: the daemon may print again.
    // "...; metrics on http://127.0.0.1:PORT/metrics"
    const size_t at = line.find("metrics on http://");
    const size_t colon =
        line.find(':', line.find("//", at == std::string::npos ? 0 : at));
    const size_t slash = line.find('/', colon + 1);
    if (at == std::string::npos || colon == std::string::npos ||
        slash == std::string::npos ||
        !absl::SimpleAtoi(line.substr(colon + 1, slash - colon - 1),
                          &d->port)) {
      StopDaemon(d);
      Die("no metrics port in kvbrokerd's start-up line: \"" + line + "\"");
    }
    std::atexit([] {
      Daemon* self = TheDaemon();
      CheckAlive(self);
      CheckServes(self);
      StopDaemon(self);
    });
    return d;
  }();
  return daemon;
}

// Sends `bytes` on a new connection, half-closes, and returns what came back
// until the server closed or `silence_ms` passed without a byte.
std::string Exchange(int port, const std::string& bytes,
                     int silence_ms = 2000) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Die("socket");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n =
          send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    char buf[4096];
    for (;;) {
      pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, silence_ms) <= 0) break;
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return reply;
}

void CheckAlive(Daemon* d) {
  int status = 0;
  if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
    d->pid = -1;
    Die(absl::StrCat("kvbrokerd exited: status ", status));
  }
}

// A machine busy with other work may starve the daemon for seconds, so a
// silent answer is retried (a dead or wedged listener stays silent).
void CheckServes(Daemon* d) {
  std::string reply;
  for (int attempt = 0; attempt < 3; ++attempt) {
    reply = Exchange(d->port, "GET /metrics HTTP/1.0\r\n\r\n", 20000);
    if (!reply.empty()) break;
  }
  if (!absl::StartsWith(reply, "HTTP/1.") ||
      !absl::StrContains(reply.substr(0, 32), " 200") ||
      !absl::StrContains(reply, "kvbroker_")) {
    Die("GET /metrics no longer answers: \"" + reply.substr(0, 200) + "\"");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int64_t inputs = 0;
  Daemon* d = TheDaemon();
  const std::string reply =
      Exchange(d->port, std::string(reinterpret_cast<const char*>(data), size));
  // (An HTTP/1 server may echo the request's version in a refusal, as in
  // "HTTP/2.0 400 Bad Request" to an HTTP/2 preface.)
  if (!reply.empty() && !absl::StartsWith(reply, "HTTP/")) {
    Die("not an HTTP response: \"" + reply.substr(0, 200) + "\"");
  }
  CheckAlive(d);
  if (++inputs % 64 == 0) CheckServes(d);
  return 0;
}
