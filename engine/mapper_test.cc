// DeviceMapper on the host: bundles received as memfds land at their
// offsets, share memory with the fd's other mappings, and unmap cleanly; the
// CUDA mapper refuses what it cannot do with a reason.

#include "engine/mapper.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

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
