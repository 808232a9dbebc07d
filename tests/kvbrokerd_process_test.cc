// kvbrokerd as a process: what it refuses at start-up and what it leaves
// behind. A second daemon never takes over a live Unix socket; flags and
// files are validated before anything is served; errors name the cause
// without internal formats or secrets; caller strings reach the log escaped,
// truncated and rate-limited.

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

std::vector<std::string> HostFlags(const std::string& socket) {
  return {"--backend=host",
          "--listen=",
          absl::StrCat("--unix_socket=", socket),
          "--min_idle_pages=0",
          "--host_device_memory=1GiB",
          "--drain_timeout=5s"};
}

bool Reachable(const std::string& socket) {
  Client c(grpc::CreateChannel(absl::StrCat("unix:", socket),
                               grpc::InsecureChannelCredentials()));
  return c.ListPools().ok();
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// ===========================================================================
// The Unix socket (SPEC 9)

TEST(UnixSocket, ASecondDaemonRefusesALiveSocketAndNamesItsHolder) {
  const std::string socket = NewSocketPath();
  DaemonProcess first(HostFlags(socket));
  ASSERT_NE(first.WaitServing(), "") << first.Stderr();
  ASSERT_TRUE(Reachable(socket));

  DaemonProcess second(HostFlags(socket));
  EXPECT_EQ(second.WaitExit(absl::Seconds(20)), 1);
  const std::string why = second.Stderr();
  EXPECT_TRUE(absl::StrContains(why, absl::StrCat("pid ", first.pid()))) << why;
  EXPECT_TRUE(absl::StrContains(why, socket)) << why;

  // The first daemon still owns the path and answers on it.
  EXPECT_TRUE(IsSocket(socket));
  EXPECT_TRUE(Reachable(socket));
  ASSERT_EQ(kill(first.pid(), SIGTERM), 0);
  EXPECT_EQ(first.WaitExit(absl::Seconds(20)), 0);
  EXPECT_FALSE(IsSocket(socket)) << "its own socket is removed at exit";
  RemoveSocketPath(socket);
}

TEST(UnixSocket, AStaleSocketFileIsReplaced) {
  const std::string socket = NewSocketPath();
  {  // Bound and closed without unlink: what a killed daemon leaves.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  ASSERT_TRUE(IsSocket(socket));
  DaemonProcess daemon(HostFlags(socket));
  ASSERT_NE(daemon.WaitServing(), "") << daemon.Stderr();
  EXPECT_TRUE(Reachable(socket));
  RemoveSocketPath(socket);
}

TEST(UnixSocket, SomethingElseAtThePathIsLeftAlone) {
  const std::string socket = NewSocketPath();
  { std::ofstream(socket) << "not a socket\n"; }
  DaemonProcess daemon(HostFlags(socket));
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(20)), 1);
  EXPECT_TRUE(absl::StrContains(daemon.Stderr(), "is not a socket"))
      << daemon.Stderr();
  std::ifstream in(socket);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "not a socket");
  RemoveSocketPath(socket);
}

TEST(UnixSocket, AnExitingDaemonDoesNotUnlinkASocketItDoesNotOwn) {
  const std::string socket = NewSocketPath();
  DaemonProcess first(HostFlags(socket));
  ASSERT_NE(first.WaitServing(), "") << first.Stderr();
  // An operator removes the path and another daemon binds it.
  ASSERT_EQ(unlink(socket.c_str()), 0);
  DaemonProcess second(HostFlags(socket));
  ASSERT_NE(second.WaitServing(), "") << second.Stderr();

  ASSERT_EQ(kill(first.pid(), SIGTERM), 0);
  EXPECT_EQ(first.WaitExit(absl::Seconds(20)), 0);
  EXPECT_TRUE(IsSocket(socket)) << first.Stderr();
  EXPECT_TRUE(Reachable(socket)) << second.Stderr();
  RemoveSocketPath(socket);
}

// The attach socket is claimed the same way, and before the gRPC listener
// serves: a daemon refused it never says SERVING.
TEST(UnixSocket, ASecondDaemonRefusesALiveAttachSocketBeforeServing) {
  const std::string socket = NewSocketPath();
  const std::string attach = socket + ".attach";
  std::vector<std::string> flags = HostFlags(socket);
  flags.push_back(absl::StrCat("--attach_socket=", attach));
  DaemonProcess first(flags);
  ASSERT_NE(first.WaitServing(), "") << first.Stderr();
  ASSERT_TRUE(IsSocket(attach));

  const std::string other = NewSocketPath();
  std::vector<std::string> second_flags = HostFlags(other);
  second_flags.push_back(absl::StrCat("--attach_socket=", attach));
  DaemonProcess second(second_flags);
  EXPECT_EQ(second.WaitExit(absl::Seconds(20)), 1);
  const std::string why = second.Stderr();
  EXPECT_TRUE(absl::StrContains(why, "--attach_socket")) << why;
  EXPECT_TRUE(absl::StrContains(why, absl::StrCat("pid ", first.pid()))) << why;
  EXPECT_FALSE(absl::StrContains(why, "health SERVING")) << why;
  EXPECT_FALSE(IsSocket(other)) << "it left no gRPC socket behind";
  RemoveSocketPath(other);

  // An operator removes the attach path and a third daemon binds it: the
  // first, exiting, leaves that socket alone.
  ASSERT_EQ(unlink(attach.c_str()), 0);
  const std::string third_socket = NewSocketPath();
  std::vector<std::string> third_flags = HostFlags(third_socket);
  third_flags.push_back(absl::StrCat("--attach_socket=", attach));
  DaemonProcess third(third_flags);
  ASSERT_NE(third.WaitServing(), "") << third.Stderr();
  ASSERT_EQ(kill(first.pid(), SIGTERM), 0);
  EXPECT_EQ(first.WaitExit(absl::Seconds(20)), 0);
  EXPECT_TRUE(IsSocket(attach)) << first.Stderr();
  ASSERT_EQ(kill(third.pid(), SIGTERM), 0);
  EXPECT_EQ(third.WaitExit(absl::Seconds(20)), 0);
  EXPECT_FALSE(IsSocket(attach)) << "its own attach socket is removed at exit";
  RemoveSocketPath(third_socket);
  RemoveSocketPath(socket);
}

// ===========================================================================
// Start-up checks: every flag and file before anything is served

// A fresh directory for the files of one test.
std::string TempDir() {
  char dir[] = "/tmp/kvbf-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

std::string WriteFile(const std::string& dir, const std::string& name,
                      const std::string& text) {
  const std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path) << text;
  return path;
}

// Runs kvbrokerd with `flags` (plus the host backend, no TCP listener
// unless `flags` names one), expects exit status 1 before it serves, and
// returns its stderr.
std::string StartupRefusal(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--backend=host", "--min_idle_pages=0",
                               "--host_device_memory=1GiB"});
  bool listen = false;
  for (const std::string& f : flags) listen |= absl::StartsWith(f, "--listen");
  if (!listen) flags.push_back("--listen=127.0.0.1:0");
  DaemonProcess daemon(flags);
  const std::string serving = daemon.ReadLine(absl::Seconds(20));
  EXPECT_EQ(serving, "") << "it served: " << serving;
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(20)), 1);
  const std::string err = daemon.Stderr();
  EXPECT_FALSE(absl::StrContains(err, "health SERVING")) << err;
  EXPECT_FALSE(absl::StrContains(err, "type.kvbroker.dev")) << err;
  return err;
}

TEST(Startup, ADirectoryIsNotAConfigFile) {
  const std::string dir = TempDir();
  std::string err = StartupRefusal({absl::StrCat("--pools=", dir)});
  EXPECT_TRUE(absl::StrContains(err, "--pools: " + dir + " is a directory"))
      << err;
  err = StartupRefusal({absl::StrCat("--auth_tokens=", dir)});
  EXPECT_TRUE(absl::StrContains(err, "is a directory")) << err;
  err = StartupRefusal({"--tls_cert=client/testdata/server.pem",
                        "--tls_key=client/testdata/server.key",
                        absl::StrCat("--tls_client_ca=", dir)});
  EXPECT_TRUE(
      absl::StrContains(err, "--tls_client_ca: " + dir + " is a directory"))
      << err;
  rmdir(dir.c_str());
}

// The soft limit on open files of /proc/PID/limits, or -1.
int64_t SoftOpenFiles(pid_t pid) {
  std::ifstream limits(absl::StrCat("/proc/", pid, "/limits"));
  std::string line;
  while (std::getline(limits, line)) {
    if (!absl::StartsWith(line, "Max open files")) continue;
    std::vector<std::string> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t soft;
    if (words.size() >= 4 && absl::SimpleAtoi(words[3], &soft)) return soft;
  }
  return -1;
}

// The daemon's fds grow with what it maps and exports: it raises its soft
// limit on open files to the hard one. Started here with a soft limit of
// 256 (which it inherits), it serves with the hard limit.
TEST(Startup, RaisesItsOpenFileLimitToTheHardOne) {
  rlimit mine;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max <= 256) GTEST_SKIP() << "hard limit " << mine.rlim_max;
  rlimit low = mine;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const std::string socket = NewSocketPath();
  DaemonProcess daemon(HostFlags(socket));
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &mine), 0);
  ASSERT_NE(daemon.WaitServing(), "") << daemon.Stderr();
  EXPECT_EQ(SoftOpenFiles(daemon.pid()), static_cast<int64_t>(mine.rlim_max))
      << daemon.Stderr();
  EXPECT_TRUE(absl::StrContains(daemon.Stderr(), "the soft limit was 256"))
      << daemon.Stderr();
  RemoveSocketPath(socket);
}

TEST(Startup, PortsOutOfRangeAreRefused) {
  std::string err = StartupRefusal({"--listen=127.0.0.1:99999"});
  EXPECT_TRUE(absl::StrContains(err, "--listen: \"127.0.0.1:99999\"")) << err;
  err = StartupRefusal({"--listen=127.0.0.1:-1"});
  EXPECT_TRUE(absl::StrContains(err, "--listen")) << err;
  err = StartupRefusal({"--listen=127.0.0.1:http"});
  EXPECT_TRUE(absl::StrContains(err, "--listen")) << err;
  err = StartupRefusal({"--metrics_listen=127.0.0.1:65536"});
  EXPECT_TRUE(absl::StrContains(err, "--metrics_listen")) << err;
}

TEST(Startup, AMetricsListenerThatCannotBindStopsTheDaemonBeforeServing) {
  // TEST-NET-1: no local interface has it, so bind() fails.
  const std::string err = StartupRefusal({"--metrics_listen=192.0.2.1:9400"});
  EXPECT_TRUE(absl::StrContains(err, "192.0.2.1")) << err;
}

TEST(Startup, AKeyThatDoesNotMatchItsCertificateIsNamed) {
  const std::string err =
      StartupRefusal({"--tls_cert=client/testdata/server.pem",
                      "--tls_key=client/testdata/client.key"});
  EXPECT_TRUE(absl::StrContains(
      err, "--tls_key does not match the certificate of --tls_cert"))
      << err;
  EXPECT_FALSE(absl::StrContains(err, "cannot listen")) << err;
}

TEST(Startup, AnUnreadableFileSaysWhy) {
  const std::string err =
      StartupRefusal({"--auth_tokens=/nonexistent/kvbroker/tokens.textproto"});
  EXPECT_TRUE(absl::StrContains(
      err,
      "--auth_tokens: cannot open /nonexistent/kvbroker/tokens.textproto: No "
      "such file or directory"))
      << err;
}

TEST(Startup, ErrorsShowTheReasonNotTheInternalPayload) {
  const std::string dir = TempDir();
  const std::string pools =
      WriteFile(dir, "pools.textproto",
                "pools { name: \"big\" page_size: 2097152 block_bytes: 4194304 "
                "max_blocks: 4 }\n");
  const std::string err = StartupRefusal({absl::StrCat("--pools=", pools)});
  EXPECT_TRUE(absl::StrContains(err,
                                "kvbrokerd: INVALID_GEOMETRY: pools "
                                "entry 0 (\"big\"): block_bytes"))
      << err;
  unlink(pools.c_str());
  rmdir(dir.c_str());
}

TEST(Startup, ATokensFileParseErrorDoesNotEchoTheSecret) {
  const std::string dir = TempDir();
  const std::string tokens =
      WriteFile(dir, "tokens.textproto",
                "tokens { name: \"ops\" pools: \"*\"\n"
                "  token: hunter2-unquoted-secret-value }\n");
  const std::string err =
      StartupRefusal({absl::StrCat("--auth_tokens=", tokens)});
  EXPECT_FALSE(absl::StrContains(err, "hunter2")) << err;
  EXPECT_TRUE(absl::StrContains(err, "line 2 column")) << err;
  unlink(tokens.c_str());
  rmdir(dir.c_str());
}

// ===========================================================================
// Channelz: off unless asked for

grpc::Status CallChannelz(int port) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  static const grpc::internal::RpcMethod kGetTopChannels(
      "/grpc.channelz.v1.Channelz/GetTopChannels",
      grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;  // GetTopChannelsRequest{}
  grpc::ClientContext ctx;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), kGetTopChannels, &ctx, request, &response);
}

TEST(Channelz, IsServedOnlyWithTheFlag) {
  for (bool on : {false, true}) {
    std::vector<std::string> flags = {"--backend=host", "--listen=127.0.0.1:0",
                                      "--min_idle_pages=0",
                                      "--host_device_memory=1GiB"};
    if (on) flags.push_back("--channelz");
    DaemonProcess daemon(flags);
    const std::string line = daemon.WaitServing();
    ASSERT_NE(line, "") << daemon.Stderr();
    const grpc::Status s = CallChannelz(DaemonProcess::PortOf(line));
    if (on) {
      EXPECT_TRUE(s.ok()) << s.error_message();
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED)
          << s.error_message();
    }
  }
}

// ===========================================================================
// The log: caller strings escaped, floods bounded

TEST(Log, RefusedCallsCannotForgeOrFloodTheLog) {
  const std::string dir = TempDir();
  const std::string tokens =
      WriteFile(dir, "tokens.textproto",
                "tokens { name: \"ops\" token: \"ops-token-0123456789\" pools: "
                "\"*\" }\n");
  const std::string socket = NewSocketPath();
  std::vector<std::string> flags = HostFlags(socket);
  flags.push_back(absl::StrCat("--auth_tokens=", tokens));
  DaemonProcess daemon(flags);
  ASSERT_NE(daemon.WaitServing(), "") << daemon.Stderr();
  const size_t before = daemon.Stderr().size();

  constexpr char kForged[] =
      "evil\nkvbrokerd 2099-01-01T00:00:00.000Z FORGED\0tail";
  const std::string pool(kForged, sizeof(kForged) - 1);
  Client c(ConnectedChannel(absl::StrCat("unix:", socket)));
  for (int i = 0; i < 1000; ++i) {  // no token: refused before anything
    EXPECT_TRUE(
        IsRefusal(c.Capacity(pool).status, FailureReason::kUnauthenticated));
  }
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  ASSERT_EQ(daemon.WaitExit(absl::Seconds(20)), 0);
  const std::string log = daemon.Stderr().substr(before);
  EXPECT_FALSE(absl::StrContains(log, "\nkvbrokerd 2099")) << log;
  EXPECT_EQ(log.find('\0'), std::string::npos);
  EXPECT_TRUE(absl::StrContains(
      log,
      "pool=\"evil\\nkvbrokerd 2099-01-01T00:00:00.000Z FORGED\\x00tail\""))
      << log;
  // At most 20 lines per second for one method and reason: the 1000 calls
  // take well under 50 s, so fewer than 1000 lines.
  size_t lines = 0;
  for (size_t at = log.find("failed: UNAUTHENTICATED"); at != std::string::npos;
       at = log.find("failed: UNAUTHENTICATED", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u);
  EXPECT_LT(lines, 1000u) << log.substr(0, 2000);
  unlink(tokens.c_str());
  rmdir(dir.c_str());
  RemoveSocketPath(socket);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
