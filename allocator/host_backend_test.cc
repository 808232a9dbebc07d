// Tests of HostBackend against the Backend contract (backend.h): reserve,
// create, map, set access, unmap, release; memory that survives neighbouring
// pages being mapped and unmapped; the physical budget and external use.

#include "allocator/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

const Bytes kPage = MiB(2);

HostBackendOptions Options(int devices, Bytes total) {
  HostBackendOptions o;
  o.device_count = devices;
  o.device_total = total;
  return o;
}

PhysicalHandle MustCreate(HostBackend& b, int device, Bytes size) {
  absl::StatusOr<PhysicalHandle> h = b.Create(device, size);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : PhysicalHandle{};
}

char* At(uint64_t address) { return reinterpret_cast<char*>(address); }

// Maps `h` at `address` and makes it accessible.
void MapRW(HostBackend& b, int device, uint64_t address, Bytes size,
           PhysicalHandle h) {
  ASSERT_TRUE(b.Map(device, address, size, h).ok());
  ASSERT_TRUE(b.SetAccess(device, address, size).ok());
}

// Fills [p, p + size) with a pattern derived from `seed`.
void Fill(char* p, Bytes size, uint8_t seed) {
  for (int64_t i = 0; i < size.value(); i += 4096) {
    p[i] = static_cast<char>(seed + i / 4096);
  }
  p[size.value() - 1] = static_cast<char>(seed ^ 0x5a);
}

bool HasPattern(const char* p, Bytes size, uint8_t seed) {
  for (int64_t i = 0; i < size.value(); i += 4096) {
    if (p[i] != static_cast<char>(seed + i / 4096)) return false;
  }
  return p[size.value() - 1] == static_cast<char>(seed ^ 0x5a);
}

TEST(HostBackendTest, Describes) {
  HostBackend b(Options(3, MiB(64)));
  EXPECT_EQ(b.name(), "host");
  EXPECT_EQ(b.device_count(), 3);
  EXPECT_EQ(b.granularity(0), MiB(2));
  EXPECT_EQ(b.live_handles(), 0);
  EXPECT_EQ(b.created_bytes(2), Bytes(0));
}

TEST(HostBackendTest, ReservedRangeIsAlignedToGranularity) {
  HostBackend b(Options(1, MiB(64)));
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<VirtualRange> r = b.ReserveRange(0, MiB(6));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->base % kPage.value(), 0u);
    EXPECT_NE(r->base, 0u);
    EXPECT_EQ(r->size, MiB(6));
    EXPECT_TRUE(b.FreeRange(0, *r).ok());
  }
  // Reserving address space costs no physical budget.
  EXPECT_EQ(b.created_bytes(0), Bytes(0));
}

TEST(HostBackendTest, FullLifecycle) {
  HostBackend b(Options(1, MiB(64)));
  absl::StatusOr<VirtualRange> r = b.ReserveRange(0, MiB(4));
  ASSERT_TRUE(r.ok());
  PhysicalHandle h = MustCreate(b, 0, kPage);
  EXPECT_EQ(b.created_bytes(0), kPage);
  EXPECT_EQ(b.live_handles(), 1);
  MapRW(b, 0, r->base, kPage, h);
  Fill(At(r->base), kPage, 7);
  EXPECT_TRUE(HasPattern(At(r->base), kPage, 7));
  ASSERT_TRUE(b.Unmap(0, r->base, kPage).ok());
  // Unmapping keeps the handle (and its bytes) until release.
  EXPECT_EQ(b.created_bytes(0), kPage);
  EXPECT_EQ(b.live_handles(), 1);
  ASSERT_TRUE(b.Release(0, h).ok());
  EXPECT_EQ(b.created_bytes(0), Bytes(0));
  EXPECT_EQ(b.live_handles(), 0);
  EXPECT_TRUE(b.FreeRange(0, *r).ok());
}

TEST(HostBackendTest, MemorySurvivesNeighboursBeingMappedAndUnmapped) {
  HostBackend b(Options(1, MiB(64)));
  absl::StatusOr<VirtualRange> r = b.ReserveRange(0, MiB(8));
  ASSERT_TRUE(r.ok());
  const uint64_t page[4] = {r->base, r->base + kPage.value(),
                            r->base + 2 * kPage.value(),
                            r->base + 3 * kPage.value()};
  PhysicalHandle mid = MustCreate(b, 0, kPage);
  MapRW(b, 0, page[1], kPage, mid);
  Fill(At(page[1]), kPage, 42);

  // Map both neighbours, write them, unmap and release them, twice over.
  for (int round = 0; round < 2; ++round) {
    PhysicalHandle left = MustCreate(b, 0, kPage);
    PhysicalHandle right = MustCreate(b, 0, kPage);
    MapRW(b, 0, page[0], kPage, left);
    MapRW(b, 0, page[2], kPage, right);
    Fill(At(page[0]), kPage, 1);
    Fill(At(page[2]), kPage, 2);
    std::memset(At(page[0]), 0xff, 1024);
    ASSERT_TRUE(b.Unmap(0, page[0], kPage).ok());
    ASSERT_TRUE(b.Unmap(0, page[2], kPage).ok());
    ASSERT_TRUE(b.Release(0, left).ok());
    ASSERT_TRUE(b.Release(0, right).ok());
    EXPECT_TRUE(HasPattern(At(page[1]), kPage, 42)) << "round " << round;
  }
  EXPECT_EQ(b.live_handles(), 1);

  // The physical page keeps its contents while unmapped, and shows them
  // again wherever it is mapped next.
  ASSERT_TRUE(b.Unmap(0, page[1], kPage).ok());
  MapRW(b, 0, page[3], kPage, mid);
  EXPECT_TRUE(HasPattern(At(page[3]), kPage, 42));
  // A fresh page mapped where it was reads zero, not the old contents.
  PhysicalHandle fresh = MustCreate(b, 0, kPage);
  MapRW(b, 0, page[1], kPage, fresh);
  EXPECT_EQ(At(page[1])[0], 0);
  EXPECT_EQ(At(page[1])[kPage.value() - 1], 0);
  ASSERT_TRUE(b.Unmap(0, page[1], kPage).ok());
  ASSERT_TRUE(b.Unmap(0, page[3], kPage).ok());
  ASSERT_TRUE(b.Release(0, mid).ok());
  ASSERT_TRUE(b.Release(0, fresh).ok());
  EXPECT_TRUE(b.FreeRange(0, *r).ok());
}

TEST(HostBackendTest, MultiPageHandle) {
  // One compound allocation per page id (P*L*K bytes), as pools create.
  HostBackend b(Options(1, MiB(64)));
  absl::StatusOr<VirtualRange> r = b.ReserveRange(0, MiB(16));
  ASSERT_TRUE(r.ok());
  PhysicalHandle h = MustCreate(b, 0, MiB(8));
  EXPECT_EQ(b.created_bytes(0), MiB(8));
  MapRW(b, 0, r->base + MiB(8).value(), MiB(8), h);
  Fill(At(r->base + MiB(8).value()), MiB(8), 9);
  EXPECT_TRUE(HasPattern(At(r->base + MiB(8).value()), MiB(8), 9));
  ASSERT_TRUE(b.Unmap(0, r->base + MiB(8).value(), MiB(8)).ok());
  ASSERT_TRUE(b.Release(0, h).ok());
  EXPECT_TRUE(b.FreeRange(0, *r).ok());
}

TEST(HostBackendDeathTest, UnmappedAndNotYetAccessiblePagesFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  HostBackend b(Options(1, MiB(64)));
  absl::StatusOr<VirtualRange> r = b.ReserveRange(0, MiB(2));
  ASSERT_TRUE(r.ok());
  volatile char* p = At(r->base);
  // Reserved only.
  EXPECT_DEATH(p[0] = 1, "");
  PhysicalHandle h = MustCreate(b, 0, kPage);
  ASSERT_TRUE(b.Map(0, r->base, kPage, h).ok());
  // Mapped, but access not yet granted.
  EXPECT_DEATH(p[0] = 1, "");
  ASSERT_TRUE(b.SetAccess(0, r->base, kPage).ok());
  p[0] = 1;
  EXPECT_EQ(p[0], 1);
  ASSERT_TRUE(b.Unmap(0, r->base, kPage).ok());
  // Unmapped: the range is still reserved but no longer backed.
  EXPECT_DEATH(p[0] = 1, "");
  ASSERT_TRUE(b.Release(0, h).ok());
}

TEST(HostBackendTest, BudgetExhaustionIsResourceExhausted) {
  HostBackend b(Options(1, MiB(8)));
  std::vector<PhysicalHandle> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(MustCreate(b, 0, kPage));
  absl::StatusOr<PhysicalHandle> over = b.Create(0, kPage);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  // A failed Create created nothing.
  EXPECT_EQ(b.live_handles(), 4);
  EXPECT_EQ(b.created_bytes(0), MiB(8));
  absl::StatusOr<MemoryInfo> info = b.QueryMemory(0);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->free, Bytes(0));
  EXPECT_EQ(info->total, MiB(8));
  // Releasing one makes room for exactly one.
  ASSERT_TRUE(b.Release(0, hs.back()).ok());
  hs.pop_back();
  hs.push_back(MustCreate(b, 0, kPage));
  EXPECT_EQ(b.Create(0, kPage).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A larger allocation than what is left fails even if some is left.
  ASSERT_TRUE(b.Release(0, hs.back()).ok());
  hs.pop_back();
  EXPECT_EQ(b.Create(0, MiB(4)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.created_bytes(0), MiB(6));
  for (PhysicalHandle h : hs) ASSERT_TRUE(b.Release(0, h).ok());
  EXPECT_EQ(b.created_bytes(0), Bytes(0));
}

TEST(HostBackendTest, ExternalUseShrinksTheBudget) {
  HostBackend b(Options(1, MiB(8)));
  b.SetExternalUse(0, MiB(5));
  absl::StatusOr<MemoryInfo> info = b.QueryMemory(0);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->free, MiB(3));
  PhysicalHandle h = MustCreate(b, 0, kPage);
  EXPECT_EQ(b.QueryMemory(0)->free, MiB(1));
  EXPECT_EQ(b.Create(0, kPage).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Other processes leaving frees memory.
  b.SetExternalUse(0, Bytes(0));
  EXPECT_EQ(b.QueryMemory(0)->free, MiB(6));
  PhysicalHandle h2 = MustCreate(b, 0, kPage);
  // External use beyond what is left: free saturates at zero.
  b.SetExternalUse(0, MiB(100));
  EXPECT_EQ(b.QueryMemory(0)->free, Bytes(0));
  EXPECT_EQ(b.QueryMemory(0)->total, MiB(8));
  ASSERT_TRUE(b.Release(0, h).ok());
  ASSERT_TRUE(b.Release(0, h2).ok());
}

TEST(HostBackendTest, SetDeviceTotal) {
  HostBackend b(Options(1, MiB(8)));
  b.SetDeviceTotal(0, MiB(2));
  PhysicalHandle h = MustCreate(b, 0, kPage);
  EXPECT_EQ(b.Create(0, kPage).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.QueryMemory(0)->total, MiB(2));
  ASSERT_TRUE(b.Release(0, h).ok());
}

TEST(HostBackendTest, DevicesHaveIndependentBudgets) {
  HostBackend b(Options(2, MiB(4)));
  PhysicalHandle a0 = MustCreate(b, 0, kPage);
  PhysicalHandle a1 = MustCreate(b, 0, kPage);
  EXPECT_EQ(b.Create(0, kPage).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.QueryMemory(1)->free, MiB(4));
  PhysicalHandle c0 = MustCreate(b, 1, kPage);
  EXPECT_EQ(b.created_bytes(0), MiB(4));
  EXPECT_EQ(b.created_bytes(1), MiB(2));
  EXPECT_EQ(b.live_handles(), 3);
  // A handle belongs to its device.
  EXPECT_EQ(b.Release(1, a0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.Release(0, a0).ok());
  ASSERT_TRUE(b.Release(0, a1).ok());
  ASSERT_TRUE(b.Release(1, c0).ok());
  EXPECT_EQ(b.live_handles(), 0);
}

TEST(HostBackendTest, HandleIdsAreNeverReused) {
  HostBackend b(Options(1, MiB(8)));
  std::set<uint64_t> seen;
  for (int i = 0; i < 16; ++i) {
    PhysicalHandle h = MustCreate(b, 0, kPage);
    EXPECT_NE(h.value, 0u);
    EXPECT_TRUE(seen.insert(h.value).second) << h.value;
    ASSERT_TRUE(b.Release(0, h).ok());
  }
}

TEST(HostBackendTest, PreconditionViolationsAreInvalidArgument) {
  HostBackend b(Options(2, MiB(8)));
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  for (int bad : {-1, 2}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(b.ReserveRange(bad, kPage).status().code(), kInvalid);
    EXPECT_EQ(b.Create(bad, kPage).status().code(), kInvalid);
    EXPECT_EQ(b.QueryMemory(bad).status().code(), kInvalid);
    EXPECT_EQ(b.Release(bad, PhysicalHandle{1}).code(), kInvalid);
  }
  absl::StatusOr<VirtualRange> r = b.ReserveRange(0, MiB(4));
  ASSERT_TRUE(r.ok());
  PhysicalHandle h = MustCreate(b, 0, kPage);
  // Unknown handle, wrong size, wrong device.
  EXPECT_EQ(b.Map(0, r->base, kPage, PhysicalHandle{h.value + 100}).code(),
            kInvalid);
  EXPECT_EQ(b.Map(0, r->base, MiB(4), h).code(), kInvalid);
  EXPECT_EQ(b.Map(1, r->base, kPage, h).code(), kInvalid);
  EXPECT_EQ(b.Map(5, r->base, kPage, h).code(), kInvalid);
  EXPECT_EQ(b.SetAccess(5, r->base, kPage).code(), kInvalid);
  EXPECT_EQ(b.Unmap(5, r->base, kPage).code(), kInvalid);
  EXPECT_EQ(b.FreeRange(5, *r).code(), kInvalid);
  // Failed calls changed nothing.
  EXPECT_EQ(b.live_handles(), 1);
  EXPECT_EQ(b.created_bytes(0), kPage);
  ASSERT_TRUE(b.Release(0, h).ok());
  // Double release.
  EXPECT_EQ(b.Release(0, h).code(), kInvalid);
  EXPECT_EQ(b.created_bytes(0), Bytes(0));
  EXPECT_TRUE(b.FreeRange(0, *r).ok());
}

// An exported fd is a second view of the same memory: what is written
// through the pool's mapping reads back through an independent mmap of the
// fd, and the reverse, even after the handle is unmapped and released.
TEST(HostBackendTest, ExportedFdMapsTheSameMemory) {
  HostBackend b(Options(2, MiB(64)));
  EXPECT_EQ(b.device_uuid(0), "host-0");
  EXPECT_EQ(b.device_uuid(1), "host-1");
  auto r = b.ReserveRange(1, kPage * 2);
  ASSERT_TRUE(r.ok());
  PhysicalHandle h = MustCreate(b, 1, kPage);
  MapRW(b, 1, r->base + kPage.value(), kPage, h);
  Fill(At(r->base + kPage.value()), kPage, 0x31);

  absl::StatusOr<int> fd = b.ExportHandle(1, h);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(fcntl(*fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  void* view =
      mmap(nullptr, kPage.value(), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_TRUE(HasPattern(static_cast<char*>(view), kPage, 0x31));
  Fill(static_cast<char*>(view), kPage, 0x77);
  EXPECT_TRUE(HasPattern(At(r->base + kPage.value()), kPage, 0x77));

  // A second export is another fd of the same memory.
  absl::StatusOr<int> fd2 = b.ExportHandle(1, h);
  ASSERT_TRUE(fd2.ok());
  EXPECT_NE(*fd2, *fd);
  close(*fd2);

  ASSERT_TRUE(b.Unmap(1, r->base + kPage.value(), kPage).ok());
  ASSERT_TRUE(b.Release(1, h).ok());
  EXPECT_TRUE(HasPattern(static_cast<char*>(view), kPage, 0x77));
  munmap(view, kPage.value());
  close(*fd);
  EXPECT_TRUE(b.FreeRange(1, *r).ok());
}

TEST(HostBackendTest, ExportRefusesUnknownHandlesAndDevices) {
  HostBackend b(Options(2, MiB(64)));
  PhysicalHandle h = MustCreate(b, 0, kPage);
  EXPECT_EQ(b.ExportHandle(1, h).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.ExportHandle(0, PhysicalHandle{h.value + 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.ExportHandle(7, h).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.Release(0, h).ok());
  EXPECT_EQ(b.ExportHandle(0, h).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostBackendTest, FaultInjectingWrapperForwardsAndFailsExport) {
  HostBackend host(Options(1, MiB(64)));
  FaultInjectingBackend b(&host);
  EXPECT_EQ(b.device_uuid(0), "host-0");
  absl::StatusOr<PhysicalHandle> h = b.Create(0, kPage);
  ASSERT_TRUE(h.ok());
  b.AddFault({BackendOp::kExportHandle, FaultKind::kError, 2, 0});
  absl::StatusOr<int> first = b.ExportHandle(0, *h);
  ASSERT_TRUE(first.ok()) << first.status();
  close(*first);
  EXPECT_EQ(b.ExportHandle(0, *h).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(b.calls(BackendOp::kExportHandle), 2);
  EXPECT_EQ(b.injected(BackendOp::kExportHandle), 1);
  ASSERT_TRUE(b.Release(0, *h).ok());
}

}  // namespace
}  // namespace kvbroker
