// attach_bench: Alloc(n) + Free on an attach session (Session::AllocInto a
// buffer the bench keeps, as the C ABI's callers do, then Session::Free of
// those ids) against the two baselines the target is stated in, in one run:
//   - two bare SOCK_SEQPACKET round trips between two processes carrying
//     packets of exactly the session's frame sizes (the bench exec's itself
//     as the echo peer);
//   - the same Alloc(n) + Free pair over gRPC on kvbrokerd's Unix socket.
// The daemon is a real kvbrokerd process (host backend) serving both the
// attach socket and the gRPC Unix socket; its pool keeps pages mapped, so no
// call maps or unmaps. Each round runs the session and the bare pair
// alternating every --chunk pairs (which of the two goes first alternates
// too), so that both meet the same state of the host, then the gRPC pair;
// the table reports the median over rounds of each one's mean and the
// ratios. --chunk=0 runs the whole session phase, then the whole bare one,
// the method of bench/RESULTS.md's attach figures before 2026-12-06T13Z.
// Targets: session <= 1.3 x bare, session <= 0.25 x gRPC. --pin puts the
// bench on one CPU and the daemon and the echo peer on another, so that
// where the scheduler places the peer is the same for the session and for
// the bare baseline.
//
// On a loaded machine the wall-clock ratios say little; the work per pair
// does not depend on load: `perf stat -e instructions:u -- attach_bench
// --phases=session --calls=N` for two values of N, the difference divided
// by the extra pairs, counts the user-space instructions of one session
// pair, engine and daemon together.

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attach/frame.h"
#include "attach/testing/child_process.h"
#include "bench/cpus.h"
#include "bench/stats.h"
#include "common/block_runs.h"
#include "engine/session.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"

ABSL_FLAG(int, calls, 2000, "pairs per phase per round");
ABSL_FLAG(int, rounds, 7, "rounds");
ABSL_FLAG(std::string, kvbrokerd, "server/kvbrokerd", "the daemon binary");
ABSL_FLAG(int, echo_fd, -1, "internal: serve as the echo peer on this fd");
ABSL_FLAG(std::vector<std::string>, blocks,
          std::vector<std::string>({"16", "256"}),
          "Alloc sizes, each its own row");
ABSL_FLAG(bool, pin, false,
          "run the bench on the first CPU it may use and the daemon and the "
          "echo peer (every thread of each) on the second, so both "
          "baselines and the session cross the same pair of CPUs");
ABSL_FLAG(int, bare_touch_kib, 0,
          "each end of the bare pair reads this many KiB of its own memory "
          "(one load per cache line) after every packet it receives, standing "
          "in for a peer's working set: what refetching it after each wake "
          "costs, against the same with cores kept awake");
ABSL_FLAG(int, spin_us, 0,
          "the bench's end polls its socket this long for each reply before "
          "it sleeps, on the session (ConnectOptions::reply_spin) and on the "
          "bare pair alike; the daemon and the echo peer still sleep");
ABSL_FLAG(int, protocol, kvbroker::attach::kProtocolVersion,
          "the attach protocol version the session offers: 2 carries an "
          "Alloc's and a Free's blocks as runs, 1 lists every id (the frames "
          "of the bare pair follow)");
ABSL_FLAG(int, chunk, 10,
          "session and bare pairs alternate every this many pairs within a "
          "round; 0 runs the whole session phase, then the whole bare one");
ABSL_FLAG(std::string, phases, "session,bare,grpc",
          "phases to run; a CPU profile of one phase (perf stat over two "
          "--calls counts) takes it alone");

extern char** environ;

namespace kvbroker {
namespace {

namespace av1 = attach::v1;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "attach_bench: %s\n", what.c_str());
  std::exit(1);
}

// --bare_touch_kib: a load per cache line of `kib` KiB of memory that
// nothing else touches.
class WorkingSet {
 public:
  explicit WorkingSet(int kib) : bytes_(static_cast<size_t>(kib) << 10, 1) {}
  void Touch() {
    unsigned sum = 0;
    for (size_t i = 0; i < bytes_.size(); i += 64) sum += bytes_[i];
    sink_ = sum;
  }

 private:
  std::vector<unsigned char> bytes_;
  volatile unsigned sink_ = 0;
};

// The echo peer: each packet's first 4 bytes say how long the answer is.
int Echo(int fd) {
  std::string in(1 << 17, '\0'), out(1 << 17, 'r');
  WorkingSet touched(absl::GetFlag(FLAGS_bare_touch_kib));
  while (true) {
    const ssize_t n = recv(fd, in.data(), in.size(), 0);
    if (n <= 0) return 0;
    touched.Touch();
    uint32_t reply = 0;
    memcpy(&reply, in.data(), sizeof(reply));
    if (send(fd, out.data(), reply, MSG_NOSIGNAL) < 0) return 1;
  }
}

// Pins the whole process to `cpu`; processes it starts afterwards inherit it.
void PinProcess(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) Die("sched_setaffinity");
}

struct Sizes {
  size_t alloc_request, alloc_reply, free_request, free_reply;
};

// Frame sizes of one real Alloc(n) + Free pair, header included.
// The frames are built as Session::Alloc(n) and Session::Free(ids) build
// them on the protocol version the daemon chose.
Sizes FrameSizes(engine::Session& s, int64_t n) {
  const bool runs = s.hello().protocol_version() >= 2;
  v1::AllocRequest request;
  request.set_num_blocks(n);
  request.set_block_runs(runs);
  absl::StatusOr<v1::AllocResponse> alloc = s.Alloc(request);
  if (!alloc.ok()) Die(alloc.status().ToString());
  av1::Frame f;
  f.set_seq(1000);
  *f.mutable_alloc() = request;
  Sizes z;
  z.alloc_request = attach::kHeaderBytes + f.ByteSizeLong();
  av1::Frame r;
  r.set_seq(1000);
  *r.mutable_alloc_reply() = *alloc;
  z.alloc_reply = attach::kHeaderBytes + r.ByteSizeLong();
  av1::Frame fr;
  fr.set_seq(1000);
  std::vector<int64_t> ids;
  for (const auto& p : alloc->pages()) {
    ids.insert(ids.end(), p.block_ids().begin(), p.block_ids().end());
  }
  if (!ExpandBlockRuns(alloc->block_runs(), n, &ids).ok() ||
      static_cast<int64_t>(ids.size()) != n) {
    Die("FrameSizes: wrong count");
  }
  if (!runs ||
      !BlockRunsIfShorter(ids, fr.mutable_free()->mutable_block_runs())) {
    fr.mutable_free()->mutable_block_ids()->Add(ids.begin(), ids.end());
  }
  z.free_request = attach::kHeaderBytes + fr.ByteSizeLong();
  absl::StatusOr<v1::FreeResponse> freed = s.Free(fr.free());
  if (!freed.ok()) Die(freed.status().ToString());
  av1::Frame frr;
  frr.set_seq(1000);
  *frr.mutable_free_reply() = *freed;
  z.free_reply = attach::kHeaderBytes + frr.ByteSizeLong();
  return z;
}

void RoundTrip(int fd, size_t request, size_t reply, std::string& buf,
               WorkingSet& touched, int64_t spin_ns) {
  uint32_t want = static_cast<uint32_t>(reply);
  memcpy(buf.data(), &want, sizeof(want));
  if (send(fd, buf.data(), request, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request)) {
    Die("echo send");
  }
  attach::SpinUntilReadable(fd, spin_ns);  // --spin_us, as the session
  if (recv(fd, buf.data(), buf.size(), 0) != static_cast<ssize_t>(reply)) {
    Die("echo recv");
  }
  touched.Touch();
}

int Run() {
  char dir[] = "/tmp/kvb-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) Die("mkdtemp");
  const std::string attach_sock = absl::StrCat(dir, "/attach.sock");
  const std::string grpc_sock = absl::StrCat(dir, "/grpc.sock");
  const std::string pools = absl::StrCat(dir, "/pools.textproto");
  std::ofstream(pools) << "pools { name: \"bench\" page_size: 2097152 "
                          "block_bytes: 65536 max_blocks: 65536 }\n";
  const std::pair<int, int> cpus = absl::GetFlag(FLAGS_pin)
                                       ? bench::FirstTwoCpus()
                                       : std::pair<int, int>{-1, -1};
  if (absl::GetFlag(FLAGS_pin) && cpus.first < 0)
    Die("--pin: fewer than 2 CPUs");
  if (cpus.second >= 0) PinProcess(cpus.second);  // the daemon and the echo
  testing::ChildProcess daemon(
      absl::GetFlag(FLAGS_kvbrokerd),
      {"--backend=host", "--listen=", absl::StrCat("--unix_socket=", grpc_sock),
       absl::StrCat("--attach_socket=", attach_sock),
       absl::StrCat("--pools=", pools), "--min_idle_pages=16",
       "--max_idle_pages=64", "--host_device_memory=8GiB"});
  const std::string line = daemon.ReadUntil("kvbrokerd:");
  if (!absl::StrContains(line, "engines attach")) Die("daemon: " + line);

  // The echo peer: this binary again, on one end of a socketpair.
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    Die("socketpair");
  }
  // Only the peer's end survives the exec.
  fcntl(pair[1], F_SETFD, 0);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) Die("readlink");
  self[len] = '\0';
  std::string echo_flag = absl::StrCat("--echo_fd=", pair[1]);
  std::string touch_flag =
      absl::StrCat("--bare_touch_kib=", absl::GetFlag(FLAGS_bare_touch_kib));
  char* argv[] = {self, echo_flag.data(), touch_flag.data(), nullptr};
  pid_t echo_pid;
  if (posix_spawn(&echo_pid, self, nullptr, nullptr, argv, environ) != 0) {
    Die("spawn echo");
  }
  close(pair[1]);
  if (cpus.first >= 0) {
    PinProcess(cpus.first);
    std::printf("pinned: bench on CPU %d, daemon and echo peer on CPU %d\n",
                cpus.first, cpus.second);
  }

  engine::ConnectOptions c;
  c.socket_path = attach_sock;
  c.holder = "bench";
  const int64_t spin_ns = int64_t{1000} * absl::GetFlag(FLAGS_spin_us);
  c.reply_spin = absl::Nanoseconds(spin_ns);
  c.protocol_version = static_cast<uint32_t>(absl::GetFlag(FLAGS_protocol));
  auto session = engine::Session::Connect(c);
  if (!session.ok()) Die(session.status().ToString());
  std::printf("attach protocol version %u\n",
              (*session)->hello().protocol_version());
  engine::AttachOptions a;
  a.pool = "bench";
  if (!(*session)->Attach(a).ok()) Die("attach");

  auto channel = grpc::CreateChannel(absl::StrCat("unix:", grpc_sock),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::KvBroker::NewStub(channel);

  const int calls = absl::GetFlag(FLAGS_calls);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::string buf(1 << 17, 'q');
  WorkingSet touched(absl::GetFlag(FLAGS_bare_touch_kib));
  std::printf("%-22s %12s %12s %12s %10s %10s\n", "pair", "session us",
              "2 bare rt us", "gRPC us", "vs bare", "vs gRPC");
  const std::string phases = absl::GetFlag(FLAGS_phases);
  const bool run_session = absl::StrContains(phases, "session");
  const bool run_bare = absl::StrContains(phases, "bare");
  const bool run_grpc = absl::StrContains(phases, "grpc");
  for (const std::string& size : absl::GetFlag(FLAGS_blocks)) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(size, &n) || n <= 0) Die("--blocks: " + size);
    const Sizes z = FrameSizes(**session, n);
    std::vector<double> ses, bare, rpc;
    // The engine's own buffer, as the C ABI's callers keep one.
    std::vector<int64_t> ids(static_cast<size_t>(n));
    auto session_pairs = [&](int k) {
      for (int i = 0; run_session && i < k; ++i) {
        absl::StatusOr<int64_t> got =
            (*session)->AllocInto(n, "", absl::MakeSpan(ids));
        if (!got.ok()) Die(got.status().ToString());
        if (*got != n) Die("session alloc: short");
        if (!(*session)->Free(ids).ok()) Die("session free");
      }
    };
    auto bare_pairs = [&](int k) {
      for (int i = 0; run_bare && i < k; ++i) {
        RoundTrip(pair[0], z.alloc_request, z.alloc_reply, buf, touched,
                  spin_ns);
        RoundTrip(pair[0], z.free_request, z.free_reply, buf, touched, spin_ns);
      }
    };
    auto timed = [](auto&& pairs, int k) {
      const absl::Time t0 = absl::Now();
      pairs(k);
      return absl::Now() - t0;
    };
    const int chunk = absl::GetFlag(FLAGS_chunk) > 0
                          ? std::min(absl::GetFlag(FLAGS_chunk), calls)
                          : calls;
    for (int r = 0; r < rounds; ++r) {
      absl::Duration in_session, in_bare;
      for (int done = 0, turn = 0; done < calls; done += chunk, ++turn) {
        const int k = std::min(chunk, calls - done);
        if (turn % 2 == 0) {
          in_session += timed(session_pairs, k);
          in_bare += timed(bare_pairs, k);
        } else {
          in_bare += timed(bare_pairs, k);
          in_session += timed(session_pairs, k);
        }
      }
      ses.push_back(absl::ToDoubleMicroseconds(in_session) / calls);
      bare.push_back(absl::ToDoubleMicroseconds(in_bare) / calls);
      const absl::Time t0 = absl::Now();
      const int rpc_calls = run_grpc ? std::max(1, calls / 4) : 0;
      for (int i = 0; i < rpc_calls; ++i) {
        grpc::ClientContext ac;
        v1::AllocRequest areq;
        areq.set_pool("bench");
        areq.set_num_blocks(n);
        v1::AllocResponse arep;
        if (!stub->Alloc(&ac, areq, &arep).ok()) Die("grpc alloc");
        grpc::ClientContext fc;
        v1::FreeRequest freq;
        freq.set_pool("bench");
        for (const auto& p : arep.pages()) {
          freq.mutable_block_ids()->Add(p.block_ids().begin(),
                                        p.block_ids().end());
        }
        v1::FreeResponse frep;
        if (!stub->Free(&fc, freq, &frep).ok()) Die("grpc free");
      }
      rpc.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0) /
                    std::max(1, rpc_calls));
    }
    const double s = Median(ses), b = Median(bare), g = Median(rpc);
    std::printf("%-22s %12.2f %12.2f %12.2f %9.2fx %9.2fx\n",
                absl::StrCat("Alloc(", n, ")+Free").c_str(), s, b, g, s / b,
                s / g);
    std::printf("  frames: alloc %zu/%zu B, free %zu/%zu B\n", z.alloc_request,
                z.alloc_reply, z.free_request, z.free_reply);
    std::fflush(stdout);
  }
  close(pair[0]);
  waitpid(echo_pid, nullptr, 0);
  (*session)->Close().IgnoreError();
  daemon.Kill(SIGTERM);
  unlink(pools.c_str());
  rmdir(dir);
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const int fd = absl::GetFlag(FLAGS_echo_fd); fd >= 0) {
    return kvbroker::Echo(fd);
  }
  return kvbroker::Run();
}
