// DeviceMapper on the host: bundles received as memfds land at their
// offsets, share memory with the fd's other mappings, and unmap cleanly;
// batches (MapMany) enable each run of adjacent bundles with one call and
// are all or nothing; the CUDA mapper refuses what it cannot do with a
// reason.

#include "engine/mapper.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include "attach/testing/fd_count.h"
#include "gtest/gtest.h"

namespace kvbroker::engine {
namespace {

constexpr int64_t kBundle = 2 << 20;

UniqueFd Bundle(char fill) {
  UniqueFd fd(memfd_create("mapper_test", MFD_CLOEXEC));
  EXPECT_EQ(ftruncate(fd.get(), kBundle), 0);
  void* p =
      mmap(nullptr, kBundle, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  memset(p, fill, kBundle);
  munmap(p, kBundle);
  return fd;
}

int OpenFds() { return testing::CountOpenFds().value_or(-1); }

TEST(HostMapperTest, MapsBundlesAtTheirOffsetsAndSharesTheirMemory) {
  const int before = OpenFds();
  {
    absl::StatusOr<std::unique_ptr<DeviceMapper>> m =
        CreateMapper("host", "host-0", 4 * kBundle);
    ASSERT_TRUE(m.ok()) << m.status();
    DeviceMapper& mapper = **m;
    EXPECT_EQ(mapper.size(), 4 * kBundle);
    UniqueFd a = Bundle('a');
    UniqueFd keep(dup(a.get()));
    ASSERT_TRUE(mapper.Map(2 * kBundle, kBundle, std::move(a)).ok());
    ASSERT_TRUE(mapper.Map(0, kBundle, Bundle('z')).ok());
    EXPECT_EQ(mapper.mapped(), 2);
    char* base = reinterpret_cast<char*>(mapper.base());
    EXPECT_EQ(base[2 * kBundle], 'a');
    EXPECT_EQ(base[3 * kBundle - 1], 'a');
    EXPECT_EQ(base[0], 'z');
    // A write through the mapping is visible through the fd.
    base[2 * kBundle + 100] = 'Q';
    char c = 0;
    ASSERT_EQ(pread(keep.get(), &c, 1, 100), 1);
    EXPECT_EQ(c, 'Q');

    EXPECT_EQ(mapper.Map(2 * kBundle, kBundle, Bundle('b')).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(mapper.Map(4 * kBundle, kBundle, Bundle('b')).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(mapper.Map(-kBundle, kBundle, Bundle('b')).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(mapper.Unmap(2 * kBundle).ok());
    EXPECT_EQ(mapper.Unmap(2 * kBundle).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(mapper.mapped(), 1);
    // Mapped again, the same memory comes back.
    ASSERT_TRUE(
        mapper.Map(2 * kBundle, kBundle, UniqueFd(dup(keep.get()))).ok());
    EXPECT_EQ(base[2 * kBundle + 100], 'Q');
  }
  // Every fd given to Map was closed; the mapper left none behind.
  EXPECT_EQ(OpenFds(), before);
}

TEST(AdjacentRunsTest, SplitsWhereBundlesAreNotBackToBack) {
  using Runs = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(AdjacentRuns({}, 2), Runs{});
  EXPECT_EQ(AdjacentRuns({6}, 2), (Runs{{0, 1}}));
  EXPECT_EQ(AdjacentRuns({0, 2, 4, 8, 10, 14}, 2),
            (Runs{{0, 3}, {3, 5}, {5, 6}}));
  // A gap smaller than a bundle (not back to back) splits too.
  EXPECT_EQ(AdjacentRuns({0, 3, 5}, 2), (Runs{{0, 1}, {1, 3}}));
}

std::vector<BundleFd> Batch(std::vector<std::pair<int64_t, char>> bundles) {
  std::vector<BundleFd> out;
  for (auto [index, fill] : bundles)
    out.push_back({index * kBundle, Bundle(fill)});
  return out;
}

TEST(HostMapperTest, MapManyEnablesEachRunOfAdjacentBundlesInOneCall) {
  const int before = OpenFds();
  {
    absl::StatusOr<std::unique_ptr<DeviceMapper>> m =
        CreateMapper("host", "host-0", 8 * kBundle);
    ASSERT_TRUE(m.ok()) << m.status();
    DeviceMapper& mapper = **m;
    // Out of order, two runs: {0, 1, 2} and {5, 6}.
    std::vector<BundleFd> batch =
        Batch({{5, 'f'}, {0, 'a'}, {2, 'c'}, {6, 'g'}, {1, 'b'}});
    UniqueFd keep(dup(batch[0].fd.get()));  // bundle 5
    ASSERT_TRUE(mapper.MapMany(kBundle, absl::MakeSpan(batch)).ok());
    EXPECT_EQ(mapper.mapped(), 5);
    EXPECT_EQ(mapper.stats().bundles, 5);
    EXPECT_EQ(mapper.stats().access_calls, 2);
    EXPECT_EQ(mapper.stats().import, absl::ZeroDuration());
    char* base = reinterpret_cast<char*>(mapper.base());
    for (auto [index, fill] : std::vector<std::pair<int64_t, char>>{
             {0, 'a'}, {1, 'b'}, {2, 'c'}, {5, 'f'}, {6, 'g'}}) {
      EXPECT_EQ(base[index * kBundle], fill) << index;
      EXPECT_EQ(base[(index + 1) * kBundle - 1], fill) << index;
    }
    base[5 * kBundle + 9] = 'Q';
    char c = 0;
    ASSERT_EQ(pread(keep.get(), &c, 1, 9), 1);
    EXPECT_EQ(c, 'Q');
    // Map is a batch of one: one more call.
    ASSERT_TRUE(mapper.Map(3 * kBundle, kBundle, Bundle('d')).ok());
    EXPECT_EQ(mapper.stats().access_calls, 3);
    EXPECT_EQ(base[3 * kBundle], 'd');
    EXPECT_TRUE(mapper.Unmap(3 * kBundle).ok());
    // An empty batch does nothing.
    EXPECT_TRUE(mapper.MapMany(kBundle, {}).ok());
    EXPECT_EQ(mapper.stats().access_calls, 3);
  }
  EXPECT_EQ(OpenFds(), before);
}

TEST(HostMapperTest, MapManyIsAllOrNothing) {
  const int before = OpenFds();
  {
    absl::StatusOr<std::unique_ptr<DeviceMapper>> m =
        CreateMapper("host", "host-0", 8 * kBundle);
    ASSERT_TRUE(m.ok()) << m.status();
    DeviceMapper& mapper = **m;
    ASSERT_TRUE(mapper.Map(4 * kBundle, kBundle, Bundle('e')).ok());
    const MapperStats stats = mapper.stats();

    // Refused before anything is mapped; every fd is closed all the same.
    std::vector<BundleFd> batch = Batch({{3, 'x'}, {4, 'x'}});
    EXPECT_EQ(mapper.MapMany(kBundle, absl::MakeSpan(batch)).code(),
              absl::StatusCode::kFailedPrecondition);
    batch = Batch({{0, 'x'}, {8, 'x'}});
    EXPECT_EQ(mapper.MapMany(kBundle, absl::MakeSpan(batch)).code(),
              absl::StatusCode::kInvalidArgument);
    batch = Batch({{1, 'x'}, {1, 'y'}});
    EXPECT_EQ(mapper.MapMany(kBundle, absl::MakeSpan(batch)).code(),
              absl::StatusCode::kInvalidArgument);
    batch = Batch({{1, 'x'}});
    batch.push_back({kBundle + kBundle / 2, Bundle('y')});  // overlaps
    EXPECT_EQ(mapper.MapMany(kBundle, absl::MakeSpan(batch)).code(),
              absl::StatusCode::kInvalidArgument);
    // A memfd shorter than the bundle (it would fault past its end).
    UniqueFd short_fd(memfd_create("short", MFD_CLOEXEC));
    ASSERT_EQ(ftruncate(short_fd.get(), kBundle / 2), 0);
    batch = Batch({{1, 'x'}});
    batch.push_back({2 * kBundle, std::move(short_fd)});
    EXPECT_EQ(mapper.MapMany(kBundle, absl::MakeSpan(batch)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(mapper.mapped(), 1);
    EXPECT_EQ(mapper.stats().access_calls, stats.access_calls);

    // A bundle that cannot be mapped (a pipe is no memory) after two that
    // were: those two are unmapped again.
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    close(pipe_fds[1]);
    batch = Batch({{0, 'a'}, {1, 'b'}});
    batch.push_back({2 * kBundle, UniqueFd(pipe_fds[0])});
    EXPECT_EQ(mapper.MapMany(kBundle, absl::MakeSpan(batch)).code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(mapper.mapped(), 1);
    EXPECT_EQ(mapper.stats().bundles, stats.bundles);
    EXPECT_EQ(mapper.Unmap(0).code(), absl::StatusCode::kNotFound);
    // The same offsets map afterwards.
    batch = Batch({{0, 'a'}, {1, 'b'}, {2, 'c'}});
    ASSERT_TRUE(mapper.MapMany(kBundle, absl::MakeSpan(batch)).ok());
    char* base = reinterpret_cast<char*>(mapper.base());
    EXPECT_EQ(base[2 * kBundle], 'c');
    EXPECT_EQ(mapper.mapped(), 4);
  }
  EXPECT_EQ(OpenFds(), before);
}

TEST(MapperTest, RefusesUnknownBackendsAndDevices) {
  EXPECT_EQ(CreateMapper("tpu", "x", kBundle).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(CreateMapper("host", "host-0", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Without a driver, or with one but no such device: UNAVAILABLE.
  absl::StatusOr<std::unique_ptr<DeviceMapper>> cuda =
      CreateMapper("cuda", "GPU-00000000-0000-0000-0000-000000000000", kBundle);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable)
      << cuda.status();
}

}  // namespace
}  // namespace kvbroker::engine
