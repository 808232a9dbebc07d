// kvbrokerctl end to end: a real kvbrokerd process (host backend) on a
// temporary Unix socket, driven through the CLI binary as an operator would,
// including `top` in a detached tmux session.

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/session.h"
#include "gtest/gtest.h"
#include "proto/google/rpc/error_details.pb.h"
#include "proto/google/rpc/status.pb.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {
namespace {

struct Result {
  int rc = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Absolute(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  std::string out = real == nullptr ? path : real;
  free(real);
  return out;
}

// Starts `args` with stdout and stderr redirected to files.
pid_t Spawn(const std::vector<std::string>& args, const std::string& out,
            const std::string& err) {
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive a crashed test
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = open("/dev/null", O_RDONLY);
    dup2(o, 1);
    dup2(e, 2);
    dup2(in, 0);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `done` every 50 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& done,
                absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Short: Unix socket paths are limited to 107 bytes.
    char dir[] = "/tmp/kvbctl-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    prefix_ = absl::StrCat(dir, "/");
    socket_ = prefix_ + "kvbrokerd.sock";
    attach_socket_ = prefix_ + "attach.sock";
    unlink(socket_.c_str());
    const std::string tmp = TmpDir();
    daemon_ = Spawn({"server/kvbrokerd", "--backend=host",
                     "--listen=", "--unix_socket=" + socket_,
                     "--attach_socket=" + attach_socket_, "--min_idle_pages=0",
                     "--max_idle_pages=0"},
                    tmp + "/kvbrokerd.out", tmp + "/kvbrokerd.log");
  }
  static void TearDownTestSuite() {
    kill(daemon_, SIGTERM);
    Wait(daemon_);
    std::filesystem::remove_all(prefix_);
  }

  void SetUp() override {
    ASSERT_TRUE(Eventually([] { return Ctl({"pools"}).rc == 0; }))
        << "kvbrokerd did not come up: "
        << ReadAll(TmpDir() + "/kvbrokerd.log");
  }

  static std::string TmpDir() {
    const char* dir = std::getenv("TEST_TMPDIR");
    return dir != nullptr ? dir : "/tmp";
  }

  // Runs kvbrokerctl against the daemon.
  static Result Ctl(std::vector<std::string> args) {
    args.insert(args.begin(),
                {"client/kvbrokerctl", "--server=unix:" + socket_});
    return RunCommand(args);
  }

  static Result RunCommand(const std::vector<std::string>& args) {
    static int n = 0;
    const std::string base = absl::StrCat(TmpDir(), "/run", n++);
    Result r;
    r.rc = Wait(Spawn(args, base + ".out", base + ".err"));
    r.out = ReadAll(base + ".out");
    r.err = ReadAll(base + ".err");
    return r;
  }

  template <typename Message>
  static Message FromJson(const std::string& json) {
    Message m;
    auto status = google::protobuf::util::JsonStringToMessage(json, &m);
    EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
    return m;
  }

  static std::string ReasonOf(const std::string& json_error) {
    google::rpc::Status rpc = FromJson<google::rpc::Status>(json_error);
    for (const auto& any : rpc.details()) {
      google::rpc::ErrorInfo info;
      if (any.UnpackTo(&info)) return info.reason();
    }
    return "";
  }

  static std::string prefix_;
  static std::string socket_;
  static std::string attach_socket_;
  static pid_t daemon_;
};

std::string CliTest::prefix_;
std::string CliTest::socket_;
std::string CliTest::attach_socket_;
pid_t CliTest::daemon_ = -1;

TEST_F(CliTest, SeedCase) {
  Result r = Ctl({"create-pool", "seed", "--page_size=14MiB",
                  "--block_bytes=6MiB", "--max_blocks=5"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "created pool seed")) << r.out;

  r = Ctl({"capacity", "seed"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "available 3 (3 tokens)")) << r.out;

  r = Ctl({"alloc", "seed", "4"});
  EXPECT_EQ(r.rc, 4) << "capacity refusal";
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(absl::StrContains(r.err, "REQUEST_TOO_LARGE")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "requested_blocks: 4")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "pool_total_blocks: 3")) << r.err;

  r = Ctl({"alloc", "seed", "3"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "blocks: 0 1 3\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "page 0: 0 1\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "page 1: 3\n")) << r.out;

  r = Ctl({"--json", "capacity", "seed", "--pages"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::CapacitySnapshot c = FromJson<v1::CapacitySnapshot>(r.out);
  EXPECT_EQ(c.pool(), "seed");
  EXPECT_EQ(c.available_blocks(), 0);
  EXPECT_EQ(c.allocated_blocks(), 3);
  EXPECT_EQ(c.pages().full_pages(), 2);
  EXPECT_EQ(c.pages().empty_pages(), 1);
  EXPECT_TRUE(c.healthy());

  r = Ctl({"free", "seed", "0,1", "3"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "freed 3 blocks")) << r.out;
}

TEST_F(CliTest, HealthIsServingAndNamesUnknownServices) {
  Result r = Ctl({"health"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");

  r = Ctl({"health", "kvbroker.v1.KvBroker"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");

  r = Ctl({"--json", "health"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "{\"status\":\"SERVING\"}\n");

  r = Ctl({"health", "no.such.Service"});
  EXPECT_EQ(r.rc, 3) << "NOT_FOUND";
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(absl::StrContains(r.err, "NOT_FOUND")) << r.err;
}

// --wait: a script that starts kvbrokerd and creates a pool at once.
// create-pool is sent once, so without the wait it fails when the daemon
// is not listening yet.
TEST_F(CliTest, WaitConnectsToADaemonStillStarting) {
  const std::string socket = prefix_ + "late.sock";
  const std::string server = "--server=unix:" + socket;
  const std::vector<std::string> create = {
      "client/kvbrokerctl", server,
      "create-pool",        "late",
      "--page_size=14MiB",  "--block_bytes=6MiB",
      "--max_blocks=5"};

  Result r = RunCommand(create);
  EXPECT_EQ(r.rc, 6) << "UNAVAILABLE: nothing listens yet";

  std::vector<std::string> waiting = create;
  waiting.insert(waiting.begin() + 2, "--wait=300ms");
  const absl::Time start = absl::Now();
  r = RunCommand(waiting);
  EXPECT_EQ(r.rc, 6) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "no connection to unix:" + socket))
      << r.err;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));

  waiting[2] = "--wait=30s";
  const std::string out = TmpDir() + "/late_ctl.out";
  const std::string err = TmpDir() + "/late_ctl.err";
  const pid_t ctl = Spawn(waiting, out, err);
  absl::SleepFor(absl::Milliseconds(300));
  const pid_t late = Spawn({"server/kvbrokerd", "--backend=host",
                            "--listen=", "--unix_socket=" + socket,
                            "--min_idle_pages=0", "--max_idle_pages=0"},
                           TmpDir() + "/late.out", TmpDir() + "/late.log");
  EXPECT_EQ(Wait(ctl), 0) << ReadAll(err);
  r = RunCommand({"client/kvbrokerctl", server, "--json", "capacity", "late"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(FromJson<v1::CapacitySnapshot>(r.out).available_blocks(), 3)
      << "the seed case: 5 ids, 3 of them usable";
  kill(late, SIGTERM);
  EXPECT_EQ(Wait(late), 0) << ReadAll(TmpDir() + "/late.log");
}

TEST_F(CliTest, PoolUidGuardsAgainstAReCreatedPool) {
  const std::vector<std::string> create = {
      "create-pool", "u", "--page_size=2MiB", "--block_bytes=512KiB",
      "--max_blocks=8"};
  ASSERT_EQ(Ctl(create).rc, 0);
  Result r = Ctl({"--json", "alloc", "u", "2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string old_uid = FromJson<v1::AllocResponse>(r.out).pool_uid();
  ASSERT_EQ(old_uid.size(), 32u) << r.out;
  ASSERT_EQ(Ctl({"delete-pool", "u", "--force"}).rc, 0);
  ASSERT_EQ(Ctl(create).rc, 0);
  r = Ctl({"alloc", "u", "2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "blocks: 0 1\n")) << r.out;
  const size_t at = r.out.find("pool_uid: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string uid = r.out.substr(at + 10, 32);
  EXPECT_NE(uid, old_uid);

  // The old holder's free is refused; the new holder's blocks stay.
  r = Ctl({"free", "u", "0", "1", "--pool_uid=" + old_uid});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "POOL_NOT_FOUND")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "expected_pool_uid: " + old_uid))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "current_pool_uid: " + uid)) << r.err;
  r = Ctl({"capacity", "u"});
  EXPECT_TRUE(absl::StrContains(r.out, "uid      " + uid)) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "allocated 2")) << r.out;
  r = Ctl({"free", "u", "0", "1", "--pool_uid=" + uid});
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(CliTest, JsonRepliesParseBackIntoTheMessages) {
  ASSERT_EQ(Ctl({"create-pool", "j", "--page-size", "2MiB", "--block-bytes",
                 "1MiB", "--max-blocks", "8"})
                .rc,
            0);
  Result r = Ctl({"alloc", "j", "3", "--json", "--request_id=abc"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::AllocResponse alloc = FromJson<v1::AllocResponse>(r.out);
  EXPECT_EQ(alloc.num_blocks(), 3);
  EXPECT_EQ(alloc.pages_size(), 2);
  EXPECT_FALSE(alloc.replayed());
  // The same request_id replays.
  r = Ctl({"--json", "alloc", "j", "3", "--request_id=abc"});
  EXPECT_TRUE(FromJson<v1::AllocResponse>(r.out).replayed());

  r = Ctl({"--json", "pools"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::ListPoolsResponse pools = FromJson<v1::ListPoolsResponse>(r.out);
  bool found = false;
  for (const auto& p : pools.pools()) {
    if (p.spec().name() != "j") continue;
    found = true;
    EXPECT_EQ(p.spec().page_size(), 2 << 20);
    EXPECT_EQ(p.capacity().allocated_blocks(), 3);
  }
  EXPECT_TRUE(found) << r.out;

  r = Ctl({"--json", "reserve", "j", "2", "--ttl=1m"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::ReserveResponse res = FromJson<v1::ReserveResponse>(r.out);
  EXPECT_EQ(res.num_blocks(), 2);
  r = Ctl({"--json", "release", "j", res.reservation_id()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(FromJson<v1::ReleaseReservationResponse>(r.out).released_blocks(),
            2);

  r = Ctl({"--json", "limit", "j", "4MiB"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::SetMemoryLimitResponse limit =
      FromJson<v1::SetMemoryLimitResponse>(r.out);
  EXPECT_EQ(limit.outcome(), v1::APPLIED);
  EXPECT_EQ(limit.limit().revision(), 0);
  r = Ctl({"--json", "limit", "j", "8MiB"});  // next revision by default
  EXPECT_EQ(FromJson<v1::SetMemoryLimitResponse>(r.out).limit().revision(), 1);

  r = Ctl({"--json", "trim", "j"});
  ASSERT_EQ(r.rc, 0) << r.err;
  FromJson<v1::TrimResponse>(r.out);

  // An error: the google.rpc.Status on stderr, nothing on stdout.
  r = Ctl({"--json", "free", "j", "7"});
  EXPECT_EQ(r.rc, 5);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(ReasonOf(r.err), "BLOCK_NOT_ALLOCATED") << r.err;

  r = Ctl({"--json", "delete-pool", "j", "--force"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "{}\n");
}

TEST_F(CliTest, CreatePoolExportAtMap) {
  Result r = Ctl({"--json", "create-pool", "eager", "--page_size=2MiB",
                  "--block_bytes=1MiB", "--max_blocks=4", "--export_at_map"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(FromJson<v1::PoolInfo>(r.out).spec().export_at_map()) << r.out;
  r = Ctl({"--json", "create-pool", "lazy", "--page_size=2MiB",
           "--block_bytes=1MiB", "--max_blocks=4"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(FromJson<v1::PoolInfo>(r.out).spec().export_at_map()) << r.out;
  // The eager pool maps (and exports) as usual.
  r = Ctl({"alloc", "eager", "3"});
  EXPECT_EQ(r.rc, 0) << r.err;
  // A bad value, or the flag on another command: usage, nothing created.
  EXPECT_EQ(Ctl({"create-pool", "bad", "--page_size=2MiB", "--block_bytes=1MiB",
                 "--max_blocks=4", "--export_at_map=maybe"})
                .rc,
            2);
  EXPECT_EQ(Ctl({"alloc", "lazy", "1", "--export_at_map"}).rc, 2);
  EXPECT_EQ(Ctl({"capacity", "bad"}).rc, 3) << "NOT_FOUND";
}

TEST_F(CliTest, ExitCodesByFailureClass) {
  ASSERT_EQ(Ctl({"create-pool", "e", "--page_size=14MiB", "--block_bytes=6MiB",
                 "--max_blocks=5"})
                .rc,
            0);
  // 2: usage.
  EXPECT_EQ(Ctl({}).rc, 2);
  EXPECT_EQ(Ctl({"frobnicate"}).rc, 2);
  EXPECT_EQ(Ctl({"alloc", "e"}).rc, 2);
  EXPECT_EQ(Ctl({"alloc", "e", "three"}).rc, 2);
  EXPECT_EQ(Ctl({"alloc", "e", "1", "--force"}).rc, 2);
  EXPECT_EQ(Ctl({"alloc", "e", "1", "--no_such_flag"}).rc, 2);
  EXPECT_EQ(Ctl({"limit", "e", "14XB"}).rc, 2);
  EXPECT_EQ(Ctl({"create-pool", "x", "--page_size=2MiB"}).rc, 2);
  EXPECT_EQ(Ctl({"--help"}).rc, 0);
  // 3: not found.
  Result r = Ctl({"capacity", "nope"});
  EXPECT_EQ(r.rc, 3);
  EXPECT_TRUE(absl::StrContains(r.err, "POOL_NOT_FOUND")) << r.err;
  EXPECT_EQ(Ctl({"release", "e", "no-such-reservation"}).rc, 3);
  // 4: capacity refusals.
  ASSERT_EQ(Ctl({"alloc", "e", "3"}).rc, 0);
  ASSERT_EQ(Ctl({"free", "e", "3"}).rc, 0);
  r = Ctl({"alloc", "e", "2"});
  EXPECT_EQ(r.rc, 4);
  EXPECT_TRUE(absl::StrContains(r.err, "POOL_EXHAUSTED")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "available_blocks: 1")) << r.err;
  // 5: preconditions.
  r = Ctl({"free", "e", "2"});
  EXPECT_EQ(r.rc, 5);
  EXPECT_TRUE(absl::StrContains(r.err, "BLOCK_NOT_ALLOCATED")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "block_id: 2")) << r.err;
  EXPECT_EQ(Ctl({"delete-pool", "e"}).rc, 5);  // POOL_NOT_EMPTY
  EXPECT_EQ(Ctl({"create-pool", "e", "--page_size=14MiB", "--block_bytes=6MiB",
                 "--max_blocks=5"})
                .rc,
            5);  // POOL_ALREADY_EXISTS
  // 6: unavailable.
  r = RunCommand({"client/kvbrokerctl",
                  "--server=unix:" + prefix_ + "none.sock", "--timeout=2s",
                  "pools"});
  EXPECT_EQ(r.rc, 6);
  EXPECT_TRUE(absl::StrContains(r.err, "UNAVAILABLE")) << r.err;
  // 7: invalid argument / geometry.
  r = Ctl({"alloc", "e", "-1"});
  EXPECT_EQ(r.rc, 7);
  EXPECT_TRUE(absl::StrContains(r.err, "field num_blocks")) << r.err;
  r = Ctl({"create-pool", "g4", "--page_size=2MiB", "--block_bytes=3MiB",
           "--max_blocks=4"});
  EXPECT_EQ(r.rc, 7);
  EXPECT_TRUE(absl::StrContains(r.err, "INVALID_GEOMETRY")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "min_page_size_bytes: 4194304"))
      << r.err;
}

// Strings from the daemon (messages, metadata, names) and arguments echoed
// back reach the terminal with control bytes escaped: an escape sequence
// or a line break in a pool name once printed raw, so a name could retitle
// the terminal or forge lines of output.
TEST_F(CliTest, ControlBytesInWhatIsPrintedAreEscaped) {
  const std::string name = "ab\x1b]0;forged\x07\n  allocated_blocks: 0";
  Result r = Ctl({"capacity", name});
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x07'), std::string::npos) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "ab\\x1b]0;forged\\x07\\n  allocated"))
      << r.err;
  // One line for the error, one for its metadata (`pool`).
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  // --json escapes them too, as JSON does.
  r = Ctl({"capacity", name, "--json"});
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_EQ(ReasonOf(r.err), "POOL_NOT_FOUND");
}

// Arguments past their bounds are usage errors (exit 2, nothing sent),
// never silently turned into something else.
TEST_F(CliTest, ArgumentsPastTheirBoundsAreUsageErrors) {
  ASSERT_EQ(Ctl({"create-pool", "bounds", "--page_size=2MiB",
                 "--block_bytes=1MiB", "--max_blocks=4"})
                .rc,
            0);
  struct Row {
    std::vector<std::string> args;
    const char* says;
  };
  const Row rows[] = {
      // A zero or negative interval polled the daemon in a busy loop.
      {{"top", "--interval=0"}, "--interval"},
      {{"top", "--streams=-1"}, "--streams"},
      {{"top", "--streams=1025"}, "--streams"},
      {{"top", "--interval=-1s"}, "--interval"},
      // A negative count watched forever.
      {{"watch", "bounds", "--count=-1"}, "--count"},
      // -1 means "the daemon's default"; other negatives were taken as it.
      {{"create-pool", "neg", "--page_size=2MiB", "--block_bytes=1MiB",
        "--max_blocks=4", "--min_idle_pages=-5"},
       "--min_idle_pages"},
      {{"create-pool", "neg", "--page_size=2MiB", "--block_bytes=1MiB",
        "--max_blocks=4", "--max_idle_pages=-2"},
       "--max_idle_pages"},
      // No block id at all: an empty Free was sent and "freed 0 blocks".
      {{"free", "bounds", ","}, "block id"},
      {{"free", "bounds", ""}, "block id"},
  };
  for (const Row& row : rows) {
    Result r = Ctl(row.args);
    EXPECT_EQ(r.rc, 2) << absl::StrJoin(row.args, " ") << ": " << r.out
                       << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, row.says))
        << absl::StrJoin(row.args, " ") << ": " << r.err;
  }
  EXPECT_EQ(Ctl({"capacity", "neg"}).rc, 3);
  // `limit` without --revision takes the pool's revision + 1, which does
  // not exist past the largest int64 (it wrapped to a negative revision).
  ASSERT_EQ(
      Ctl({"limit", "bounds", "4MiB", "--revision=9223372036854775807"}).rc, 0);
  Result r = Ctl({"limit", "bounds", "2MiB"});
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--revision")) << r.err;
  ASSERT_EQ(Ctl({"delete-pool", "bounds"}).rc, 0);
}

TEST_F(CliTest, CapacityPagesAndWatch) {
  ASSERT_EQ(Ctl({"create-pool", "w", "--page_size=14MiB", "--block_bytes=6MiB",
                 "--max_blocks=7"})
                .rc,
            0);
  Result r = Ctl({"capacity", "w", "--pages"});
  ASSERT_EQ(r.rc, 0) << r.err;
  // C6: pages 0, 1, 2 hold 2, 1, 2 blocks.
  EXPECT_TRUE(absl::StrContains(r.out, "available 5")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "PAGE  STATE")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "FREE")) << r.out;
  r = Ctl({"--json", "capacity", "w", "--pages=2"});
  v1::CapacitySnapshot c = FromJson<v1::CapacitySnapshot>(r.out);
  ASSERT_EQ(c.page_list_size(), 2);
  EXPECT_EQ(c.page_list(0).page_id(), 0);
  EXPECT_EQ(c.page_list(0).usable_blocks(), 2);
  EXPECT_EQ(c.page_list(1).usable_blocks(), 1);
  EXPECT_EQ(c.page_list(0).state(), v1::PAGE_STATE_FREE);

  // watch: one JSON snapshot per line; the second shows the allocation.
  const std::string out = TmpDir() + "/watch.out";
  const pid_t watch = Spawn({"client/kvbrokerctl", "--server=unix:" + socket_,
                             "--json", "watch", "w", "--count=2"},
                            out, TmpDir() + "/watch.err");
  ASSERT_TRUE(Eventually([&] { return !ReadAll(out).empty(); }));
  ASSERT_EQ(Ctl({"alloc", "w", "2"}).rc, 0);
  EXPECT_EQ(Wait(watch), 0);
  std::vector<std::string> lines =
      absl::StrSplit(ReadAll(out), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(FromJson<v1::CapacitySnapshot>(lines[0]).available_blocks(), 5);
  EXPECT_EQ(FromJson<v1::CapacitySnapshot>(lines[1]).available_blocks(), 3);
}

TEST_F(CliTest, TopInTmux) {
  const std::string tmux = "/usr/bin/tmux";
  ASSERT_EQ(access(tmux.c_str(), X_OK), 0) << "tmux is missing: run tools/deps";
  ASSERT_EQ(Ctl({"create-pool", "topdemo", "--page_size=14MiB",
                 "--block_bytes=6MiB", "--max_blocks=5"})
                .rc,
            0);
  ASSERT_EQ(Ctl({"alloc", "topdemo", "1"}).rc, 0);

  const std::string server = prefix_ + "tmux.sock";
  const std::string rc_file = TmpDir() + "/top.rc";
  unlink(rc_file.c_str());
  auto run_tmux = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {tmux, "-S", server, "-f", "/dev/null"});
    return RunCommand(args);
  };
  const std::string command =
      absl::StrCat(Absolute("client/kvbrokerctl"), " --server=unix:", socket_,
                   " top --interval=200ms --streams=1; echo $? > ", rc_file);
  absl::Cleanup kill_server = [&] { run_tmux({"kill-server"}); };
  Result r = run_tmux(
      {"new-session", "-d", "-s", "top", "-x", "120", "-y", "40", command});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto screen = [&] {
    return run_tmux({"capture-pane", "-p", "-t", "top"}).out;
  };

  // The pool, its numbers and its page bar.
  EXPECT_TRUE(Eventually([&] {
    const std::string s = screen();
    return absl::StrContains(s, "topdemo") &&
           absl::StrContains(s, "available 2  allocated 1");
  })) << screen();
  EXPECT_TRUE(absl::StrContains(screen(), "engines 0 sessions  0 in grace"))
      << screen();
  EXPECT_TRUE(absl::StrContains(screen(), "page 14MiB  block 6MiB"));
  EXPECT_TRUE(absl::StrContains(screen(), "open 1")) << screen();

  // Live: an allocation shows through WatchCapacity...
  ASSERT_EQ(Ctl({"alloc", "topdemo", "2"}).rc, 0);
  EXPECT_TRUE(Eventually([&] {
    return absl::StrContains(screen(), "available 0  allocated 3");
  })) << screen();
  // ...and a new pool through the periodic ListPools, which also keeps the
  // numbers of a pool past --streams current.
  ASSERT_EQ(Ctl({"create-pool", "toplate", "--page_size=2MiB",
                 "--block_bytes=1MiB", "--max_blocks=4"})
                .rc,
            0);
  EXPECT_TRUE(Eventually([&] {
    const std::string s = screen();
    return absl::StrContains(s, "toplate") &&
           absl::StrContains(s, "available 4  allocated 0");
  })) << screen();
  EXPECT_TRUE(absl::StrContains(screen(), "(polled)")) << screen();
  ASSERT_EQ(Ctl({"alloc", "toplate", "1"}).rc, 0);
  EXPECT_TRUE(Eventually([&] {
    return absl::StrContains(screen(), "available 3  allocated 1");
  })) << screen();
  // A deleted pool disappears.
  ASSERT_EQ(Ctl({"delete-pool", "toplate", "--force"}).rc, 0);
  EXPECT_TRUE(Eventually([&] {
    return !absl::StrContains(screen(), "toplate");
  })) << screen();

  r = run_tmux({"send-keys", "-t", "top", "q"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(Eventually([&] { return !ReadAll(rc_file).empty(); }))
      << "top did not exit on q: " << screen();
  EXPECT_EQ(ReadAll(rc_file), "0\n");
}

// `sessions` lists an engine attached on the daemon's attach socket with
// its exact numbers, in text and in JSON; `top` counts it under its pool.
TEST_F(CliTest, SessionsListsAttachedEngines) {
  ASSERT_EQ(Ctl({"create-pool", "enginepool", "--page_size=2MiB",
                 "--block_bytes=512KiB", "--max_blocks=16"})
                .rc,
            0);
  engine::ConnectOptions c;
  c.socket_path = attach_socket_;
  c.holder = "cli-rank0";
  c.reattach_grace = absl::Minutes(2);
  absl::StatusOr<std::unique_ptr<engine::Session>> s =
      engine::Session::Connect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  engine::AttachOptions a;
  a.pool = "enginepool";
  ASSERT_TRUE((*s)->Attach(a).ok());
  ASSERT_TRUE((*s)->Alloc(3).ok());

  Result r = Ctl({"sessions"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> lines =
      absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "SESSION ")) << lines[0];
  std::vector<std::string> f = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  ASSERT_EQ(f.size(), 10u) << lines[1];
  EXPECT_EQ(f[0], absl::StrCat((*s)->hello().session_id()));
  EXPECT_EQ(f[1], "cli-rank0");
  EXPECT_EQ(f[2], absl::StrCat(getpid()));
  EXPECT_EQ(f[3], "enginepool");
  EXPECT_EQ(f[4], absl::StrCat((*s)->mapped_pages()));  // as the engine
  EXPECT_EQ(f[5], "3");                                 // blocks
  EXPECT_EQ(f[6], "0");                                 // pending revocations
  EXPECT_EQ(f[7], "0");                                 // quarantined pages
  EXPECT_EQ(f[9], "2m");                                // the grace it chose

  r = Ctl({"--json", "sessions", "enginepool"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto json = FromJson<v1::ListSessionsResponse>(r.out);
  ASSERT_EQ(json.sessions_size(), 1) << r.out;
  EXPECT_EQ(json.sessions(0).holder(), "cli-rank0");
  EXPECT_EQ(json.sessions(0).pool(), "enginepool");
  EXPECT_EQ(json.sessions(0).blocks(), 3);
  EXPECT_EQ(json.sessions(0).pid(), getpid());
  EXPECT_EQ(json.sessions(0).mapped_pages(), (*s)->mapped_pages());
  EXPECT_EQ(json.sessions(0).reattach_grace().seconds(), 120);

  r = Ctl({"--json", "sessions", "nope"});
  EXPECT_EQ(r.rc, 3);
  EXPECT_EQ(ReasonOf(r.err), "POOL_NOT_FOUND") << r.err;
  EXPECT_EQ(Ctl({"sessions", "a", "b"}).rc, 2);

  // Ended with release: gone, and its blocks with it.
  ASSERT_TRUE((*s)->Close(/*release=*/true).ok());
  r = Ctl({"--json", "sessions"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(FromJson<v1::ListSessionsResponse>(r.out).sessions_size(), 0);
  r = Ctl({"sessions"});
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;  // header only
  ASSERT_EQ(Ctl({"delete-pool", "enginepool"}).rc, 0);
}

// kvbrokerd with mutual TLS on TCP and bearer tokens scoped to pools
// (--tls_cert, --tls_key, --tls_client_ca, --auth_tokens), driven through
// kvbrokerctl's --tls_* and --token flags. The certificates are the test
// ones of client/testdata.
TEST(CliSecureDaemon, MutualTlsAndScopedTokens) {
  const char* env = std::getenv("TEST_TMPDIR");
  const std::string tmp = env != nullptr ? env : "/tmp";
  const std::string tokens = tmp + "/tokens.textproto";
  {
    std::ofstream f(tokens);
    f << "tokens { name: \"admin\" token: \"admin-token-0123456789\" "
         "pools: \"*\" }\n"
         "tokens { name: \"engine\" token: \"engine-token-0123456789\" "
         "pools: \"mine\" }\n";
  }
  const std::string data = "client/testdata/";
  const pid_t daemon = Spawn(
      {"server/kvbrokerd", "--backend=host", "--listen=127.0.0.1:0",
       "--unix_socket=", "--min_idle_pages=0", "--max_idle_pages=0",
       "--tls_cert=" + data + "server.pem", "--tls_key=" + data + "server.key",
       "--tls_client_ca=" + data + "ca.pem", "--auth_tokens=" + tokens},
      tmp + "/secure.out", tmp + "/secure.log");
  std::string address;
  ASSERT_TRUE(Eventually([&] {
    // "kvbrokerd: ... on 127.0.0.1:PORT (mutual TLS)"
    const std::string out = ReadAll(tmp + "/secure.out");
    const size_t at = out.find(" on 127.0.0.1:");
    if (at == std::string::npos) return false;
    const size_t end = out.find(' ', at + 4);
    address = out.substr(at + 4, end - at - 4);
    return absl::StrContains(out, "(mutual TLS)");
  })) << ReadAll(tmp + "/secure.log");
  EXPECT_TRUE(
      absl::StrContains(ReadAll(tmp + "/secure.log"), "2 bearer token(s)"));

  int n = 0;
  auto ctl = [&](const std::string& token, bool client_cert,
                 std::vector<std::string> args) {
    std::vector<std::string> argv = {"client/kvbrokerctl",
                                     "--server=" + address,
                                     "--tls_ca=" + data + "ca.pem"};
    if (client_cert) {
      argv.push_back("--tls_cert=" + data + "client.pem");
      argv.push_back("--tls_key=" + data + "client.key");
    }
    if (!token.empty()) argv.push_back("--token=" + token);
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string base = absl::StrCat(tmp, "/secure-run", n++);
    Result r;
    r.rc = Wait(Spawn(argv, base + ".out", base + ".err"));
    r.out = ReadAll(base + ".out");
    r.err = ReadAll(base + ".err");
    return r;
  };
  const std::string admin = "admin-token-0123456789";
  const std::string engine = "engine-token-0123456789";
  for (const char* pool : {"mine", "theirs"}) {
    Result r = ctl(admin, true,
                   {"create-pool", pool, "--page_size=2MiB",
                    "--block_bytes=1MiB", "--max_blocks=4"});
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  Result r = ctl(engine, true, {"alloc", "mine", "2"});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = ctl(engine, true, {"alloc", "theirs", "1"});
  EXPECT_EQ(r.rc, 8) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "PERMISSION_DENIED")) << r.err;
  r = ctl("", true, {"capacity", "mine"});
  EXPECT_EQ(r.rc, 8) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "UNAUTHENTICATED")) << r.err;
  // The token from KVBROKER_TOKEN when --token is not given.
  setenv("KVBROKER_TOKEN", engine.c_str(), 1);
  r = ctl("", true, {"capacity", "mine"});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = ctl("", true, {"capacity", "theirs"});
  EXPECT_EQ(r.rc, 8) << r.err;
  // A token read from a file or a Kubernetes secret ends with a line break;
  // gRPC cannot send one and kvbrokerctl aborted. Surrounding whitespace is
  // trimmed, and a token still unsendable is a usage error that does not
  // print the token.
  setenv("KVBROKER_TOKEN", (engine + "\n").c_str(), 1);
  r = ctl("", true, {"capacity", "mine"});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = ctl(" " + engine + "\r\n", true, {"capacity", "mine"});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = ctl("engine\x1b-token-0123456789", true, {"capacity", "mine"});
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "0123456789")) << r.err;
  unsetenv("KVBROKER_TOKEN");
  r = ctl(engine, true, {"pools", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "\"mine\"")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "\"theirs\"")) << r.out;
  // Without a client certificate the handshake fails: unavailable.
  r = ctl(admin, false, {"capacity", "mine", "--timeout=5s"});
  EXPECT_EQ(r.rc, 6) << r.out << r.err;

  kill(daemon, SIGTERM);
  EXPECT_EQ(Wait(daemon), 0) << ReadAll(tmp + "/secure.log");
}

}  // namespace
}  // namespace kvbroker
