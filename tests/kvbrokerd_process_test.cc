// kvbrokerd as a process: what it refuses at start-up and what it leaves
// behind. A second daemon never takes over a live Unix socket; flags and
// files are validated before anything is served; errors name the cause
// without internal formats or secrets; caller strings reach the log escaped,
// truncated and rate-limited.

#include <signal.h>
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
#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace testing
}  // namespace kvbroker
