// BundleMapper: the per-page transaction over real host memory, its unwind
// in reverse on each kind of failure, and concurrent use for distinct pages.

#include "allocator/bundle_mapper.h"

#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "allocator/fault_injecting_backend.h"
#include "allocator/geometry.h"
#include "allocator/host_backend.h"
#include "attach/testing/fd_count.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

Geometry MakeGeometry(std::vector<int> devices, int64_t pages,
                      bool export_at_map = false) {
  PoolConfig c;
  c.export_at_map = export_at_map;
  c.name = "m";
  c.page_size = MiB(2);
  c.block_bytes = MiB(2);
  c.max_blocks = pages;
  c.devices = std::move(devices);
  absl::StatusOr<Geometry> g = Geometry::Create(c, MiB(2), 2);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

struct Rig {
  Rig() : host(HostBackendOptions{2, Bytes(kGiB), MiB(2)}), backend(&host) {}
  HostBackend host;
  FaultInjectingBackend backend;
};

TEST(BundleMapperTest, MapsEveryDeviceAndUnmapsLastDeviceFirst) {
  Rig rig;
  const Geometry g = MakeGeometry({0, 1}, 4);
  BundleMapper mapper(&g, &rig.backend);
  int failed = -1;
  ASSERT_TRUE(mapper.ReserveRanges(&failed).ok());
  EXPECT_EQ(rig.backend.calls(BackendOp::kReserveRange), 2);

  BundleMapper::MapOutcome m = mapper.Map(2);
  ASSERT_TRUE(m.status.ok()) << m.status;
  EXPECT_EQ(rig.host.live_handles(), 2);
  EXPECT_EQ(rig.backend.calls(BackendOp::kSetAccess), 2);
  // The page is real memory at page_offset(2) of each device's range.
  for (int i = 0; i < 2; ++i) {
    char* at = reinterpret_cast<char*>(mapper.range_base(i) +
                                       g.page_offset(2).value());
    std::memset(at, 'a' + i, g.bundle_bytes().value());
    EXPECT_EQ(at[g.bundle_bytes().value() - 1], 'a' + i);
  }
  absl::Duration took;
  ASSERT_TRUE(mapper.Unmap(2, &took).ok());
  EXPECT_EQ(rig.host.live_handles(), 0);
  EXPECT_EQ(rig.backend.calls(BackendOp::kUnmap), 2);
  EXPECT_EQ(rig.backend.calls(BackendOp::kRelease), 2);
  mapper.FreeRanges();
  EXPECT_EQ(rig.backend.calls(BackendOp::kFreeRange), 2);
}

TEST(BundleMapperTest, FailureOnSecondDeviceUnwindsTheFirst) {
  Rig rig;
  const Geometry g = MakeGeometry({0, 1}, 4);
  BundleMapper mapper(&g, &rig.backend);
  int failed = -1;
  ASSERT_TRUE(mapper.ReserveRanges(&failed).ok());
  rig.backend.AddFault(FaultRule{BackendOp::kSetAccess, FaultKind::kError, 1,
                                 /*device=*/1});
  BundleMapper::MapOutcome m = mapper.Map(0);
  EXPECT_EQ(m.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(m.unwound);
  // Device 1: created and mapped, so unmapped and released; device 0 too.
  EXPECT_EQ(rig.backend.calls(BackendOp::kUnmap), 2);
  EXPECT_EQ(rig.backend.calls(BackendOp::kRelease), 2);
  EXPECT_EQ(rig.host.live_handles(), 0);

  // A failed unwind is reported, and the mapped handle is not released.
  rig.backend.AddFault(FaultRule{BackendOp::kMap, FaultKind::kError, 1, 1});
  rig.backend.AddFault(FaultRule{BackendOp::kUnmap, FaultKind::kError, 1, 0});
  m = mapper.Map(1);
  EXPECT_FALSE(m.status.ok());
  EXPECT_FALSE(m.unwound);
  EXPECT_EQ(rig.host.live_handles(), 1);  // device 0's, still mapped
  EXPECT_TRUE(mapper.holds(1));
  EXPECT_EQ(mapper.held_handles(), 1);
}

TEST(BundleMapperTest, HandlesOfFailedStepsAreKeptAndRetried) {
  Rig rig;
  const Geometry g = MakeGeometry({0, 1}, 4);
  BundleMapper mapper(&g, &rig.backend);
  int failed = -1;
  ASSERT_TRUE(mapper.ReserveRanges(&failed).ok());
  // A map whose unwind fails: device 0 stays mapped.
  rig.backend.AddFault(FaultRule{BackendOp::kMap, FaultKind::kError, 1, 1});
  rig.backend.AddFault(FaultRule{BackendOp::kUnmap, FaultKind::kError, 1, 0});
  EXPECT_FALSE(mapper.Map(1).unwound);
  // An unmap whose release fails on device 1: that handle stays, unmapped.
  ASSERT_TRUE(mapper.Map(2).status.ok());
  rig.backend.AddFault(FaultRule{BackendOp::kRelease, FaultKind::kError, 1, 1});
  absl::Duration took;
  EXPECT_FALSE(mapper.Unmap(2, &took).ok());
  EXPECT_TRUE(mapper.holds(2));
  EXPECT_EQ(mapper.held_handles(), 2);
  EXPECT_EQ(rig.host.live_handles(), 2);
  EXPECT_FALSE(mapper.holds(0));
  EXPECT_FALSE(mapper.holds(3));

  // A retry does only what is owed: page 1 unmaps and releases device 0's
  // handle, page 2 releases device 1's (no second unmap, no double release).
  const int64_t unmaps = rig.backend.calls(BackendOp::kUnmap);
  const int64_t releases = rig.backend.calls(BackendOp::kRelease);
  EXPECT_EQ(mapper.ReleaseHeld(), 0);
  EXPECT_EQ(rig.backend.calls(BackendOp::kUnmap), unmaps + 1);
  EXPECT_EQ(rig.backend.calls(BackendOp::kRelease), releases + 2);
  EXPECT_EQ(mapper.held_handles(), 0);
  EXPECT_EQ(rig.host.live_handles(), 0);
  EXPECT_FALSE(mapper.holds(1));
  EXPECT_FALSE(mapper.holds(2));
  mapper.FreeRanges();
}

int OpenFds() { return testing::CountOpenFds().value_or(-1); }

TEST(BundleMapperTest, ExportAtMapExportsEachHandleOnceAndKeepsItsFd) {
  Rig rig;
  const int before = OpenFds();
  // Each live host handle is a memfd of the backend's; the rest are the
  // mapper's exported fds.
  auto exported_open = [&] {
    return OpenFds() - before - static_cast<int>(rig.host.live_handles());
  };
  {
    const Geometry g = MakeGeometry({0, 1}, 4, /*export_at_map=*/true);
    BundleMapper mapper(&g, &rig.backend);
    int failed = -1;
    ASSERT_TRUE(mapper.ReserveRanges(&failed).ok());
    ASSERT_TRUE(mapper.Map(2).status.ok());
    EXPECT_EQ(rig.backend.calls(BackendOp::kExportHandle), 2);
    EXPECT_EQ(mapper.exported_fds(), 2);
    EXPECT_EQ(exported_open(), 2);
    // Later Exports lend the same fds; nothing is exported again.
    absl::StatusOr<int> fd0 = mapper.Export(2, 0);
    absl::StatusOr<int> fd1 = mapper.Export(2, 1);
    ASSERT_TRUE(fd0.ok() && fd1.ok());
    EXPECT_NE(*fd0, *fd1);
    EXPECT_EQ(*mapper.Export(2, 0), *fd0);
    EXPECT_EQ(rig.backend.calls(BackendOp::kExportHandle), 2);
    // The fd is the page's memory.
    char* at = reinterpret_cast<char*>(mapper.range_base(1) +
                                       g.page_offset(2).value());
    at[7] = 'x';
    char c = 0;
    ASSERT_EQ(pread(*fd1, &c, 1, 7), 1);
    EXPECT_EQ(c, 'x');
    // Unmapping releases the handles and closes their fds.
    absl::Duration took;
    ASSERT_TRUE(mapper.Unmap(2, &took).ok());
    EXPECT_EQ(mapper.exported_fds(), 0);
    EXPECT_EQ(exported_open(), 0);

    // A failed export unwinds the page like any other step, fds included.
    ASSERT_TRUE(mapper.Map(1).status.ok());
    rig.backend.AddFault(
        FaultRule{BackendOp::kExportHandle, FaultKind::kError, 1, 1});
    BundleMapper::MapOutcome m = mapper.Map(3);
    EXPECT_EQ(m.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(m.unwound);
    EXPECT_FALSE(mapper.holds(3));
    EXPECT_EQ(mapper.exported_fds(), 2);  // page 1's
    EXPECT_EQ(exported_open(), 2);
    // ReleaseHeld closes the fds of what it releases; a kept page keeps
    // its fds until the mapper is destroyed.
    EXPECT_EQ(mapper.ReleaseHeld(), 0);
    EXPECT_EQ(exported_open(), 0);
    ASSERT_TRUE(mapper.Map(0).status.ok());
    EXPECT_EQ(mapper.ReleaseHeld({true}), 0);
    EXPECT_EQ(mapper.exported_fds(), 2);
    EXPECT_EQ(exported_open(), 2);
  }
  // The mapper is gone: page 0's handles are still the backend's, their
  // exported fds are closed.
  EXPECT_EQ(rig.host.live_handles(), 2);
  EXPECT_EQ(exported_open(), 0);
}

TEST(BundleMapperTest, WithoutExportAtMapNothingIsExportedUntilAsked) {
  Rig rig;
  const Geometry g = MakeGeometry({0}, 2);
  BundleMapper mapper(&g, &rig.backend);
  int failed = -1;
  ASSERT_TRUE(mapper.ReserveRanges(&failed).ok());
  ASSERT_TRUE(mapper.Map(0).status.ok());
  EXPECT_EQ(rig.backend.calls(BackendOp::kExportHandle), 0);
  EXPECT_EQ(mapper.exported_fds(), 0);
  ASSERT_TRUE(mapper.Export(0, 0).ok());
  ASSERT_TRUE(mapper.Export(0, 0).ok());
  EXPECT_EQ(rig.backend.calls(BackendOp::kExportHandle), 1);
  EXPECT_EQ(mapper.ReleaseHeld(), 0);
  EXPECT_EQ(mapper.exported_fds(), 0);
  mapper.FreeRanges();
}

TEST(BundleMapperTest, RangeReservationIsAllOrNothing) {
  Rig rig;
  const Geometry g = MakeGeometry({0, 1}, 4);
  BundleMapper mapper(&g, &rig.backend);
  rig.backend.AddFault(
      FaultRule{BackendOp::kReserveRange, FaultKind::kOutOfMemory, 1, 1});
  int failed = -1;
  absl::Status s = mapper.ReserveRanges(&failed);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed, 1);
  EXPECT_FALSE(mapper.has_ranges());
  EXPECT_EQ(rig.backend.calls(BackendOp::kFreeRange), 1);  // device 0's
}

TEST(BundleMapperTest, DistinctPagesMapConcurrently) {
  Rig rig;
  const Geometry g = MakeGeometry({0}, 64);
  BundleMapper mapper(&g, &rig.backend);
  int failed = -1;
  ASSERT_TRUE(mapper.ReserveRanges(&failed).ok());
  std::vector<std::thread> threads;
  std::vector<int> errors(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (PageId p = t; p < 64; p += 4) {
          if (!mapper.Map(p).status.ok()) ++errors[t];
        }
        for (PageId p = t; p < 64; p += 4) {
          absl::Duration took;
          if (!mapper.Unmap(p, &took).ok()) ++errors[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors, std::vector<int>(4, 0));
  EXPECT_EQ(rig.host.live_handles(), 0);
  EXPECT_EQ(rig.backend.calls(BackendOp::kCreate), 64 * 20);
  mapper.FreeRanges();
}

}  // namespace
}  // namespace kvbroker
