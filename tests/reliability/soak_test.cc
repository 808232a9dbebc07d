// Soak: real kvbrokerd processes under load, watchers, pool churn and
// restarts, with the daemon's memory and open files sampled throughout.
//
// Each round starts kvbrokerd (host backend, TCP and a Unix socket, the
// pools of examples/pools.textproto plus two created over gRPC) and runs,
// at once:
//   - four load clients (two per transport) doing Alloc / Free / Reserve /
//     ReleaseReservation / Capacity on the two pools, recording every block
//     they hold in one shared ledger: no block may be handed out twice;
//   - two watchers that open WatchCapacity streams, read a few snapshots
//     and cancel, over and over;
//   - a churn client that creates a pool, allocates and reserves in it and
//     force-deletes it, over and over;
// while a sampler reads VmRSS and the number of open descriptors of the
// daemon from /proc. The load runs in two phases of the same size; after
// the first (the warm-up) the daemon's RSS is the baseline. Then the
// daemon gets SIGTERM and must exit 0, and the next round restarts it.
//
// Bounds (docs/reliability.md), per round:
//   - RSS after the second phase <= baseline + kRssGrowthBound: a second
//     phase like the first allocates nothing that stays;
//   - peak RSS <= kRssPeakBound;
//   - open descriptors beyond the pools' backend handles (the host backend
//     holds one memfd per mapped page per device) <= kFdOverheadBound at
//     every sample, and back to within kFdSlack of the idle daemon's once
//     the load's clients are gone;
//   - the test process's own descriptors stay within kClientFdSlack of
//     their first round's count, restart after restart.
// KVB_SOAK_ROUNDS (default 2) and KVB_SOAK_OPS (calls per load client per
// phase, default 300) size the run.

#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/status_convert.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace {

using ::kvbroker::testing::Client;
using ::kvbroker::testing::ConnectedChannel;
using ::kvbroker::testing::Ids;

#if defined(__SANITIZE_ADDRESS__)
#define KVB_SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVB_SOAK_ASAN 1
#endif
#endif

#ifdef KVB_SOAK_ASAN
// ASan's shadow memory and allocator metadata roughly double the heap.
constexpr int64_t kRssPeakBound = 512 * kMiB;
#else
constexpr int64_t kRssPeakBound = 96 * kMiB;
#endif
constexpr int64_t kRssGrowthBound = 24 * kMiB;
// The host backend holds one descriptor (a memfd) per mapped page per
// device, so the daemon's descriptors are bounded net of those: what it
// holds beyond its pools' backend handles (listeners, one per client
// connection, its own pipes and eventfds) stays under kFdOverheadBound.
// The sample reads the descriptors and the pools' mapped bytes one after
// the other while the load runs, so a few pages may come or go between.
constexpr size_t kMaxHeldBlocks = 48;
constexpr int64_t kFdOverheadBound = 40;
constexpr int64_t kFdSlack = 4;
// The test process's own descriptors after a round, over its first
// round's: channels and streams are closed, the daemon's pipe too.
constexpr int64_t kClientFdSlack = 8;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? absl::StrCat(srcdir, "/kvbroker/", path) : path;
}

// One kvbrokerd child process; its first stdout line is read at start.
class Daemon {
 public:
  explicit Daemon(const std::string& socket) {
    int out[2];
    if (pipe(out) != 0) {
      start_line_ = absl::StrCat("pipe: ", std::strerror(errno));
      return;
    }
    std::vector<std::string> args = {
        std::getenv("KVBROKERD") != nullptr ? std::getenv("KVBROKERD")
                                            : Runfile("server/kvbrokerd"),
        "--backend=host",
        "--listen=127.0.0.1:0",
        "--unix_socket=" + socket,
        "--pools=" + Runfile("examples/pools.textproto"),
        "--host_device_memory=8GiB",
        "--min_idle_pages=1",
        "--max_idle_pages=2",
        "--drain_timeout=5s"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // A small quarantine keeps an ASan-built daemon's RSS about its heap.
    // The environment is built before fork: the child only execs.
    std::string asan = "ASAN_OPTIONS=quarantine_size_mb=16";
    if (const char* o = std::getenv("ASAN_OPTIONS")) {
      absl::StrAppend(&asan, ":", o);
    }
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "ASAN_OPTIONS=", 13) != 0) envp.push_back(*e);
    }
    envp.push_back(asan.data());
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      execve(argv[0], argv.data(), envp.data());
      static const char kFailed[] = "soak_test: cannot exec kvbrokerd\n";
      (void)!write(STDERR_FILENO, kFailed, sizeof(kFailed) - 1);
      _exit(127);
    }
    close(out[1]);
    stdout_ = out[0];
    std::string line;
    char ch;
    for (;;) {
      const ssize_t n = read(stdout_, &ch, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || ch == '\n') break;
      line.push_back(ch);
    }
    if (line.empty() && pid_ > 0) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, 0);
      line = absl::StrCat("no start-up line; kvbrokerd ",
                          done == pid_ && WIFEXITED(status)
                              ? absl::StrCat("exited ", WEXITSTATUS(status))
                              : absl::StrCat("ended with status ", status));
      if (done == pid_) pid_ = -1;
    }
    // "... serving kvbroker.v1.KvBroker on 127.0.0.1:PORT and unix:..."
    const size_t at = line.find(" on 127.0.0.1:");
    if (at != std::string::npos) {
      const size_t begin = at + 4;
      const size_t end = line.find_first_of(" ;", begin);
      address_ = line.substr(begin, end - begin);
    }
    unix_ = "unix:" + socket;
    start_line_ = line;
  }

  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_ >= 0) close(stdout_);
  }

  // SIGTERM, then the exit status (-1 if it did not exit in 30 s).
  int Stop() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 1500; ++i) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

  int64_t Rss() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string key;
    while (in >> key) {
      if (key == "VmRSS:") {
        int64_t kib = 0;
        in >> kib;
        return kib * kKiB;
      }
      in.ignore(1 << 20, '\n');
    }
    return -1;
  }

  int64_t OpenFds() const { return CountFds(pid_); }

  static int64_t CountFds(pid_t pid) {
    DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
    if (dir == nullptr) return -1;
    int64_t n = 0;
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
    return n;
  }

  const std::string& tcp() const { return address_; }
  const std::string& unix_address() const { return unix_; }
  const std::string& start_line() const { return start_line_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_ = -1;
  std::string address_;
  std::string unix_;
  std::string start_line_;
};

// Blocks held by every client, per pool: a block handed out twice shows up
// as an insert that finds it present.
class Ledger {
 public:
  bool Take(const std::string& pool, const std::vector<int64_t>& ids) {
    absl::MutexLock lock(&mu_);
    for (int64_t id : ids) {
      if (!held_[pool].insert(id).second) return false;
    }
    return true;
  }
  void Give(const std::string& pool, const std::vector<int64_t>& ids) {
    absl::MutexLock lock(&mu_);
    for (int64_t id : ids) held_[pool].erase(id);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::set<int64_t>> held_ ABSL_GUARDED_BY(mu_);
};

struct Counters {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> refusals{0};
  std::atomic<int64_t> snapshots{0};
  std::atomic<int64_t> churned{0};
  std::atomic<int64_t> untyped{0};
};

void Count(Counters* c, const grpc::Status& s) {
  ++c->calls;
  if (s.ok()) return;
  ++c->refusals;
  if (GetReason(FromGrpcStatus(s)) == FailureReason::kUnspecified) {
    ++c->untyped;
    ADD_FAILURE() << "untyped failure: " << s.error_code() << " "
                  << s.error_message();
  }
}

void Load(Client* client, const std::string& pool, int64_t calls, uint64_t seed,
          Ledger* ledger, Counters* counters) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> held;
  std::vector<std::string> reservations;
  for (int64_t i = 0; i < calls; ++i) {
    const int choice = static_cast<int>(rng() % 10);
    if (choice < 4 && held.size() < kMaxHeldBlocks) {
      auto r = client->Alloc(pool, 1 + rng() % 8);
      Count(counters, r.status);
      if (r.ok()) {
        const std::vector<int64_t> ids = Ids(r->pages());
        EXPECT_TRUE(ledger->Take(pool, ids)) << "a block handed out twice";
        held.insert(held.end(), ids.begin(), ids.end());
      }
    } else if (choice < 7 && !held.empty()) {
      const size_t k = 1 + rng() % held.size();
      std::vector<int64_t> ids(held.end() - k, held.end());
      held.resize(held.size() - k);
      ledger->Give(pool, ids);
      auto r = client->Free(pool, ids);
      Count(counters, r.status);
      EXPECT_TRUE(r.ok()) << r.status.error_message();
    } else if (choice < 8) {
      auto r = client->Reserve(pool, 1 + rng() % 4, absl::Hours(1));
      Count(counters, r.status);
      if (r.ok()) reservations.push_back(r->reservation_id());
    } else if (choice < 9 && !reservations.empty()) {
      auto r = client->Release(pool, reservations.back());
      reservations.pop_back();
      Count(counters, r.status);
      EXPECT_TRUE(r.ok()) << r.status.error_message();
    } else {
      Count(counters, client->Capacity(pool).status);
    }
  }
  ledger->Give(pool, held);
  if (!held.empty()) {
    EXPECT_TRUE(client->Free(pool, held).ok());
  }
  for (const std::string& id : reservations) {
    EXPECT_TRUE(client->Release(pool, id).ok());
  }
}

void Watch(Client* client, const std::string& pool,
           const absl::Notification* stop, Counters* counters) {
  while (!stop->HasBeenNotified()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
    v1::WatchCapacityRequest r;
    r.set_pool(pool);
    auto reader = client->stub()->WatchCapacity(&ctx, r);
    v1::WatchCapacityResponse snapshot;
    for (int i = 0; i < 5 && reader->Read(&snapshot); ++i)
      ++counters->snapshots;
    ctx.TryCancel();
    while (reader->Read(&snapshot)) {
    }
    reader->Finish();
  }
}

void Churn(Client* client, const absl::Notification* stop, Counters* counters) {
  for (int i = 0; !stop->HasBeenNotified(); ++i) {
    const std::string name = absl::StrCat("churn", i % 3);
    v1::PoolSpec spec =
        ::kvbroker::testing::Spec(name, Bytes(2 * kMiB), Bytes(kMiB), 64);
    auto created = client->CreatePool(spec);
    Count(counters, created.status);
    if (!created.ok()) continue;
    Count(counters, client->Alloc(name, 5).status);
    Count(counters, client->Reserve(name, 3, absl::Hours(1)).status);
    auto deleted = client->DeletePool(name, /*force=*/true);
    Count(counters, deleted.status);
    EXPECT_TRUE(deleted.ok()) << deleted.status.error_message();
    ++counters->churned;
  }
}

struct Samples {
  int64_t rss_peak = 0;
  int64_t fd_peak = 0;
  // Descriptors beyond the pools' backend handles, at its highest.
  int64_t fd_overhead_peak = 0;
  int64_t count = 0;
};

// Backend handles the daemon's pools hold: mapped bytes / bundle bytes.
int64_t MappedHandles(Client* client) {
  auto pools = client->ListPools();
  if (!pools.ok()) return 0;
  int64_t n = 0;
  for (const v1::PoolInfo& p : pools->pools()) {
    if (p.bundle_bytes() > 0)
      n += p.capacity().mapped_bytes() / p.bundle_bytes();
  }
  return n;
}

void Sample(Daemon& daemon, Client* client, Samples* s) {
  const int64_t fds = daemon.OpenFds();
  const int64_t handles = MappedHandles(client);
  s->rss_peak = std::max(s->rss_peak, daemon.Rss());
  s->fd_peak = std::max(s->fd_peak, fds);
  s->fd_overhead_peak = std::max(s->fd_overhead_peak, fds - handles);
  ++s->count;
}

// Runs one load phase (every load client `calls` calls) with watchers,
// churn and the sampler alongside.
Samples Phase(Daemon& daemon, int64_t calls, uint64_t seed, Ledger* ledger,
              Counters* counters) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<Client>(
        ConnectedChannel(i % 2 == 0 ? daemon.tcp() : daemon.unix_address())));
  }
  absl::Notification stop;
  Samples samples;
  std::thread sampler([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      Sample(daemon, clients[7].get(), &samples);
    }
  });
  std::vector<std::thread> background;
  background.emplace_back(Watch, clients[4].get(), "soak0", &stop, counters);
  background.emplace_back(Watch, clients[5].get(), "demo", &stop, counters);
  background.emplace_back(Churn, clients[6].get(), &stop, counters);
  std::vector<std::thread> load;
  for (int i = 0; i < 4; ++i) {
    load.emplace_back(Load, clients[i].get(), i % 2 == 0 ? "soak0" : "soak1",
                      calls, seed * 13 + i, ledger, counters);
  }
  for (std::thread& t : load) t.join();
  stop.Notify();
  for (std::thread& t : background) t.join();
  sampler.join();
  Sample(daemon, clients[7].get(), &samples);
  return samples;
}

TEST(Soak, LoadWatchersChurnAndRestarts) {
  const int64_t rounds = EnvInt("KVB_SOAK_ROUNDS", 2);
  const int64_t calls = EnvInt("KVB_SOAK_OPS", 300);
  const std::string socket = ::kvbroker::testing::NewSocketPath();
  Counters counters;
  int64_t own_fds_first = -1;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t own_fds = Daemon::CountFds(getpid());
    if (own_fds_first < 0) own_fds_first = own_fds;
    std::printf("round %lld: the test process has %lld descriptors open\n",
                static_cast<long long>(round), static_cast<long long>(own_fds));
    EXPECT_LE(own_fds, own_fds_first + kClientFdSlack);
    Daemon daemon(socket);
    ASSERT_FALSE(daemon.tcp().empty()) << daemon.start_line();
    {
      Client admin(ConnectedChannel(daemon.tcp()));
      // The pools file came back with the restart; the gRPC-made ones did not.
      ASSERT_TRUE(admin.GetPool("demo").ok());
      for (const char* name : {"soak0", "soak1"}) {
        ASSERT_FALSE(admin.GetPool(name).ok());
        ASSERT_TRUE(admin
                        .CreatePool(::kvbroker::testing::Spec(
                            name, Bytes(2 * kMiB), Bytes(256 * kKiB), 4096))
                        .ok());
      }
    }
    std::unique_ptr<Client> probe =
        std::make_unique<Client>(ConnectedChannel(daemon.tcp()));
    // Descriptors beyond the pools' handles, with one client connected.
    auto overhead = [&] {
      return daemon.OpenFds() - MappedHandles(probe.get());
    };
    const int64_t idle_overhead = overhead();
    Ledger ledger;
    const Samples warm = Phase(daemon, calls, round * 2, &ledger, &counters);
    const int64_t baseline = daemon.Rss();
    const Samples run = Phase(daemon, calls, round * 2 + 1, &ledger, &counters);
    const int64_t end_rss = daemon.Rss();
    std::printf(
        "round %lld: idle fd overhead %lld; warm-up peak RSS %.1f MiB, fds "
        "%lld (overhead %lld); baseline RSS %.1f MiB; second phase peak RSS "
        "%.1f MiB, fds %lld (overhead %lld); %lld samples; end RSS %.1f MiB\n",
        static_cast<long long>(round), static_cast<long long>(idle_overhead),
        warm.rss_peak / double(kMiB), static_cast<long long>(warm.fd_peak),
        static_cast<long long>(warm.fd_overhead_peak), baseline / double(kMiB),
        run.rss_peak / double(kMiB), static_cast<long long>(run.fd_peak),
        static_cast<long long>(run.fd_overhead_peak),
        static_cast<long long>(warm.count + run.count), end_rss / double(kMiB));
    EXPECT_LE(end_rss, baseline + kRssGrowthBound);
    EXPECT_LE(std::max(warm.rss_peak, run.rss_peak), kRssPeakBound);
    EXPECT_LE(std::max(warm.fd_overhead_peak, run.fd_overhead_peak),
              kFdOverheadBound);
    // The load clients' connections close asynchronously: wait for the
    // count to settle (not a timing assertion; the bound is on the count).
    int64_t settled = overhead();
    for (int i = 0; i < 100 && settled > idle_overhead + kFdSlack; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      settled = overhead();
    }
    EXPECT_LE(settled, idle_overhead + kFdSlack);
    probe.reset();
    ASSERT_EQ(daemon.Stop(), 0);
  }
  ::kvbroker::testing::RemoveSocketPath(socket);
  std::printf(
      "%lld rounds: %lld calls (%lld refused, %lld untyped), %lld "
      "snapshots watched, %lld pools churned\n",
      static_cast<long long>(rounds),
      static_cast<long long>(counters.calls.load()),
      static_cast<long long>(counters.refusals.load()),
      static_cast<long long>(counters.untyped.load()),
      static_cast<long long>(counters.snapshots.load()),
      static_cast<long long>(counters.churned.load()));
  EXPECT_EQ(counters.untyped.load(), 0);
  EXPECT_GT(counters.snapshots.load(), 0);
  EXPECT_GT(counters.churned.load(), 0);
}

}  // namespace
}  // namespace kvbroker
