// Tests of claiming a Unix socket path: free, live, stale, foreign and
// too-long paths; publishing by a link; removing only what is still ours.

#include "common/unix_socket.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using ::testing::HasSubstr;

constexpr UnixSocketRole kStream = {SOCK_STREAM, "--unix_socket"};
constexpr UnixSocketRole kPacket = {SOCK_SEQPACKET, "--attach_socket"};

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// A socket of `type` bound at `path`, listening when `listening`.
// -1 on failure (the test then fails on the assertion that uses it).
int BindAt(const std::string& path, int type, bool listening) {
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listening && listen(fd, 4) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

bool Connects(const std::string& path, int type) {
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // sun_path holds 108 bytes: Bazel's TMPDIR may not fit.
    char dir[] = "/tmp/kvb-sock-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/kv.sock";
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    unlink(path_.c_str());
    unlink(StagingPath(path_).c_str());
    rmdir(dir_.c_str());
  }
  int Keep(int fd) {
    fds_.push_back(fd);
    return fd;
  }

  std::string dir_;
  std::string path_;
  std::vector<int> fds_;
};

TEST_F(UnixSocketTest, AFreePathIsFine) {
  EXPECT_TRUE(CheckUnixSocketPath(path_, kStream).ok());
  EXPECT_FALSE(Exists(path_));
}

TEST_F(UnixSocketTest, ALiveSocketIsRefusedNamingItsProcess) {
  ASSERT_GE(Keep(BindAt(path_, SOCK_STREAM, true)), 0);
  const absl::Status s = CheckUnixSocketPath(path_, kStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--unix_socket: "));
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("is served by pid ", getpid())));
  EXPECT_TRUE(Connects(path_, SOCK_STREAM));
}

TEST_F(UnixSocketTest, APacketListenerIsProbedWithItsOwnType) {
  ASSERT_GE(Keep(BindAt(path_, SOCK_SEQPACKET, true)), 0);
  const absl::Status live = CheckUnixSocketPath(path_, kPacket);
  EXPECT_EQ(live.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(live.message(), HasSubstr("--attach_socket: "));
  EXPECT_THAT(live.message(), HasSubstr("is served by"));
  // Probed as a stream socket it cannot be told live or stale: left alone.
  const absl::Status other = CheckUnixSocketPath(path_, kStream);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("not replacing it"));
  EXPECT_TRUE(Connects(path_, SOCK_SEQPACKET));
}

TEST_F(UnixSocketTest, AStaleSocketIsRemoved) {
  const int fd = BindAt(path_, SOCK_SEQPACKET, false);
  ASSERT_GE(fd, 0);
  close(fd);  // the file stays; nobody listens on it
  ASSERT_TRUE(Exists(path_));
  EXPECT_TRUE(CheckUnixSocketPath(path_, kPacket).ok());
  EXPECT_FALSE(Exists(path_));
}

TEST_F(UnixSocketTest, SomethingElseIsRefusedAndKept) {
  { std::ofstream(path_) << "data\n"; }
  const absl::Status s = CheckUnixSocketPath(path_, kStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not a socket"));
  std::string kept;
  std::getline(std::ifstream(path_), kept);
  EXPECT_EQ(kept, "data");
}

TEST_F(UnixSocketTest, APathTooLongForItsStagingNameIsInvalid) {
  // The path itself fits a socket address; its staging name does not.
  const size_t longest = sizeof(sockaddr_un{}.sun_path) - 1;
  const std::string path = "/tmp/" + std::string(longest - 5, 'x');
  ASSERT_EQ(path.size(), longest);
  ASSERT_GT(StagingPath(path).size(), longest);
  const absl::Status s = CheckUnixSocketPath(path, kStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("not ", longest)));
  // One that fits with its staging name is looked at (and is free).
  const std::string fits = dir_ + "/" + std::string(8, 'y');
  ASSERT_LE(StagingPath(fits).size(), longest);
  EXPECT_TRUE(CheckUnixSocketPath(fits, kStream).ok());
  EXPECT_EQ(CheckUnixSocketPath("", kStream).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(UnixSocketTest, PublishLinksTheStagedListenerAndRemovesTheStagingName) {
  const std::string staging = StagingPath(path_);
  EXPECT_EQ(staging.rfind(dir_ + "/.", 0), 0u) << staging;
  ASSERT_GE(Keep(BindAt(staging, SOCK_SEQPACKET, true)), 0);
  absl::StatusOr<UnixSocketFile> file =
      UnixSocketFile::Publish(staging, path_, kPacket);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(Exists(staging));
  EXPECT_TRUE(Connects(path_, SOCK_SEQPACKET));
  EXPECT_TRUE(file->Remove());
  EXPECT_FALSE(Exists(path_));
  EXPECT_FALSE(file->Remove());
}

TEST_F(UnixSocketTest, PublishNeverReplacesAPathThatExists) {
  // Another server won the path after this one's check.
  ASSERT_GE(Keep(BindAt(path_, SOCK_SEQPACKET, true)), 0);
  const std::string staging = StagingPath(path_);
  ASSERT_GE(Keep(BindAt(staging, SOCK_SEQPACKET, true)), 0);
  absl::StatusOr<UnixSocketFile> file =
      UnixSocketFile::Publish(staging, path_, kPacket);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(file.status().message(), HasSubstr("is served by"));
  EXPECT_FALSE(Exists(staging));
  EXPECT_TRUE(Connects(path_, SOCK_SEQPACKET));  // the winner is untouched
}

TEST_F(UnixSocketTest, RemoveLeavesASocketAnotherServerBoundLater) {
  const std::string staging = StagingPath(path_);
  ASSERT_GE(Keep(BindAt(staging, SOCK_STREAM, true)), 0);
  absl::StatusOr<UnixSocketFile> file =
      UnixSocketFile::Publish(staging, path_, kStream);
  ASSERT_TRUE(file.ok()) << file.status();
  // The path is taken over (this server was thought gone) by another one.
  ASSERT_EQ(unlink(path_.c_str()), 0);
  ASSERT_GE(Keep(BindAt(path_, SOCK_STREAM, true)), 0);
  EXPECT_FALSE(file->Remove());
  EXPECT_TRUE(Exists(path_));
  EXPECT_TRUE(Connects(path_, SOCK_STREAM));
}

}  // namespace
}  // namespace kvbroker
