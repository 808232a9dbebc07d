// Tests for CudaBackend. Without a GPU (or driver) the device tests skip with
// the reason Create() gave; the factory and error-mapping tests run anywhere.
// On a GPU machine the same binary exercises the VMM calls for real.

#include "allocator/cuda_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using ::testing::HasSubstr;

// --- Anywhere -------------------------------------------------------------

TEST(CudaBackendFactoryTest, MissingDriverLibraryIsUnavailable) {
  CudaBackendOptions options;
  options.driver_library = "libkvbroker-no-such-driver.so.1";
  auto backend = CudaBackend::Create(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
#ifdef KVB_HAVE_CUDA_H
  EXPECT_NE(backend.status().message().find(
                "libkvbroker-no-such-driver.so.1 not found"),
            std::string::npos)
      << backend.status();
#else
  EXPECT_NE(backend.status().message().find("built without CUDA headers"),
            std::string::npos)
      << backend.status();
#endif
}

TEST(CudaBackendFactoryTest, DefaultCreateSucceedsOrSaysWhy) {
  auto backend = CudaBackend::Create();
  if (backend.ok()) {
    EXPECT_GE((*backend)->device_count(), 1);
    EXPECT_EQ((*backend)->name(), "cuda");
  } else {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(backend.status().message().empty());
    std::cout << "CudaBackend::Create(): " << backend.status() << "\n";
  }
}

#ifdef KVB_HAVE_CUDA_H
// CUresult values from cuda.h (this file must not include it).
constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kOutOfMemory = 2;
constexpr int kInvalidContext = 201;
constexpr int kAlreadyMapped = 208;
constexpr int kEccUncorrectable = 214;
constexpr int kInvalidHandle = 400;
constexpr int kIllegalAddress = 700;
constexpr int kContextIsDestroyed = 709;
constexpr int kLaunchFailed = 719;
constexpr int kNotPermitted = 800;
constexpr int kNotSupported = 801;
constexpr int kUnknown = 999;

absl::StatusCode CodeOf(int result) {
  return internal::CudaResultToStatus(result, "NAME", "text", "cuCall", 3)
      .code();
}

TEST(CudaResultToStatusTest, FollowsBackendConvention) {
  EXPECT_EQ(CodeOf(kSuccess), absl::StatusCode::kOk);
  EXPECT_EQ(CodeOf(kOutOfMemory), absl::StatusCode::kResourceExhausted);
  for (int fatal : {kIllegalAddress, kLaunchFailed, kEccUncorrectable,
                    kContextIsDestroyed, kInvalidContext, kUnknown}) {
    EXPECT_EQ(CodeOf(fatal), absl::StatusCode::kInternal) << fatal;
  }
  for (int bug : {kInvalidValue, kInvalidHandle, kAlreadyMapped}) {
    EXPECT_EQ(CodeOf(bug), absl::StatusCode::kInvalidArgument) << bug;
  }
  for (int other : {kNotSupported, kNotPermitted, 12345}) {
    EXPECT_EQ(CodeOf(other), absl::StatusCode::kUnavailable) << other;
  }
}

TEST(CudaResultToStatusTest, MessageNamesCallErrorAndDevice) {
  absl::Status s = internal::CudaResultToStatus(
      kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory",
      "cuMemCreate(2097152 bytes)", 1);
  EXPECT_EQ(s.message(),
            "cuMemCreate(2097152 bytes) on device 1: CUDA_ERROR_OUT_OF_MEMORY "
            "(out of memory)");
  // Without a name from the driver the number is shown.
  s = internal::CudaResultToStatus(kIllegalAddress, "", "", "cuMemMap", 0);
  EXPECT_EQ(s.message(), "cuMemMap on device 0: CUresult 700");
}
#endif  // KVB_HAVE_CUDA_H

// --- On a GPU ---------------------------------------------------------------

// One backend for the whole suite: retaining and releasing the primary
// context per test would create and destroy it each time (slow).
class CudaBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto backend = CudaBackend::Create();
    if (backend.ok()) {
      backend_ = backend->release();
      std::cout << "CUDA driver " << backend_->driver_version() << ", "
                << backend_->device_count() << " device(s)";
      for (int d = 0; d < backend_->device_count(); ++d) {
        std::cout << "; " << d << ": " << backend_->device_name(d) << ", "
                  << backend_->device_total_memory(d).value() / kMiB
                  << " MiB, granularity "
                  << backend_->granularity(d).value() / kKiB << " KiB, "
                  << (backend_->exportable(d) ? "POSIX fd export"
                                              : "no export");
      }
      std::cout << "\n";
    } else {
      skip_reason_ = new std::string(backend.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
    delete skip_reason_;
    skip_reason_ = nullptr;
  }
  void SetUp() override {
    if (backend_ == nullptr) {
      GTEST_SKIP() << "no usable CUDA device: " << *skip_reason_;
    }
  }

  CudaBackend& b() { return *backend_; }
  Bytes gran(int device = 0) { return backend_->granularity(device); }

  static CudaBackend* backend_;
  static std::string* skip_reason_;
};

CudaBackend* CudaBackendTest::backend_ = nullptr;
std::string* CudaBackendTest::skip_reason_ = nullptr;

TEST_F(CudaBackendTest, DevicesReportGranularityAndMemory) {
  ASSERT_GE(b().device_count(), 1);
  EXPECT_EQ(b().name(), "cuda");
  EXPECT_GT(b().driver_version(), 0);
  for (int d = 0; d < b().device_count(); ++d) {
    EXPECT_EQ(b().granularity(d), MiB(2)) << "device " << d;
    auto info = b().QueryMemory(d);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_GT(info->total.value(), 0);
    EXPECT_LE(info->free, info->total);
    EXPECT_EQ(info->total, b().device_total_memory(d));
  }
}

TEST_F(CudaBackendTest, RefusesBadArgumentsBeforeTheDriver) {
  const int n = b().device_count();
  EXPECT_EQ(b().QueryMemory(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().QueryMemory(n).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().Create(n, gran()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().Create(0, Bytes(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().Create(0, gran() + Bytes(4096)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().ReserveRange(0, Bytes(4096)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().Map(0, 4096, gran(), PhysicalHandle{1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b().SetAccess(0, 0, gran()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, FullCycleWritesAndReadsBack) {
  for (int d = 0; d < b().device_count(); ++d) {
    SCOPED_TRACE(d);
    const Bytes g = gran(d);
    auto range = b().ReserveRange(d, g * 4);
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_EQ(range->base % g.value(), 0u);
    EXPECT_EQ(range->size, g * 4);

    auto handle = b().Create(d, g * 2);
    ASSERT_TRUE(handle.ok()) << handle.status();
    const uint64_t at = range->base + g.value();
    ASSERT_TRUE(b().Map(d, at, g * 2, *handle).ok());
    ASSERT_TRUE(b().SetAccess(d, at, g * 2).ok());

    std::vector<uint32_t> out(g.value() * 2 / sizeof(uint32_t));
    for (size_t i = 0; i < out.size(); ++i) out[i] = 0x9e3779b9u * (i + d);
    ASSERT_TRUE(b().CopyToDevice(d, at, out.data(), g.value() * 2).ok());
    std::vector<uint32_t> in(out.size(), 0);
    ASSERT_TRUE(b().CopyFromDevice(d, in.data(), at, g.value() * 2).ok());
    EXPECT_TRUE(in == out);

    EXPECT_TRUE(b().Unmap(d, at, g * 2).ok());
    EXPECT_TRUE(b().Release(d, *handle).ok());
    EXPECT_TRUE(b().FreeRange(d, *range).ok());
  }
}

// Export returns a POSIX fd per call (the driver's own check that it names
// a shareable handle happens in the importing process, in the engine tests);
// the handle's memory stays usable by the exporter afterwards.
TEST_F(CudaBackendTest, ExportsHandlesAsPosixFds) {
  for (int d = 0; d < b().device_count(); ++d) {
    SCOPED_TRACE(d);
    EXPECT_EQ(b().device_uuid(d).rfind("GPU-", 0), 0u) << b().device_uuid(d);
    EXPECT_EQ(b().device_uuid(d).size(), 40u);
    auto handle = b().Create(d, gran(d));
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<int> fd = b().ExportHandle(d, *handle);
    if (!b().exportable(d)) {
      EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
    } else {
      ASSERT_TRUE(fd.ok()) << fd.status();
      EXPECT_GE(*fd, 0);
      EXPECT_EQ(fcntl(*fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
      close(*fd);
    }
    EXPECT_TRUE(b().Release(d, *handle).ok());
  }
}

// The pool's situation: pages of a range are remapped while their neighbours
// keep data.
TEST_F(CudaBackendTest, DataSurvivesRemappingNeighbours) {
  const Bytes g = gran();
  constexpr int kPages = 4;
  auto range = b().ReserveRange(0, g * kPages);
  ASSERT_TRUE(range.ok()) << range.status();
  std::vector<PhysicalHandle> handles;
  auto page = [&](int p) { return range->base + p * g.value(); };
  auto fill = [&](int p, uint8_t byte) {
    std::vector<uint8_t> data(g.value(), byte);
    return b().CopyToDevice(0, page(p), data.data(), data.size());
  };
  auto holds = [&](int p, uint8_t byte) {
    std::vector<uint8_t> data(g.value(), 0);
    if (!b().CopyFromDevice(0, data.data(), page(p), data.size()).ok()) {
      return false;
    }
    return std::all_of(data.begin(), data.end(),
                       [byte](uint8_t v) { return v == byte; });
  };
  for (int p = 0; p < kPages; ++p) {
    auto h = b().Create(0, g);
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
    ASSERT_TRUE(b().Map(0, page(p), g, *h).ok());
    // Access exactly on this page's range.
    ASSERT_TRUE(b().SetAccess(0, page(p), g).ok());
    ASSERT_TRUE(fill(p, static_cast<uint8_t>(0x10 + p)).ok());
  }
  // Replace page 1's memory.
  ASSERT_TRUE(b().Unmap(0, page(1), g).ok());
  ASSERT_TRUE(b().Release(0, handles[1]).ok());
  auto h = b().Create(0, g);
  ASSERT_TRUE(h.ok()) << h.status();
  handles[1] = *h;
  ASSERT_TRUE(b().Map(0, page(1), g, *h).ok());
  ASSERT_TRUE(b().SetAccess(0, page(1), g).ok());
  ASSERT_TRUE(fill(1, 0xab).ok());

  EXPECT_TRUE(holds(0, 0x10));
  EXPECT_TRUE(holds(1, 0xab));
  EXPECT_TRUE(holds(2, 0x12));
  EXPECT_TRUE(holds(3, 0x13));

  for (int p = 0; p < kPages; ++p) {
    EXPECT_TRUE(b().Unmap(0, page(p), g).ok());
    EXPECT_TRUE(b().Release(0, handles[p]).ok());
  }
  EXPECT_TRUE(b().FreeRange(0, *range).ok());
}

TEST_F(CudaBackendTest, DriverErrorsAreMapped) {
  const Bytes g = gran();
  auto range = b().ReserveRange(0, g * 2);
  ASSERT_TRUE(range.ok()) << range.status();
  auto handle = b().Create(0, g);
  ASSERT_TRUE(handle.ok()) << handle.status();
  // Mapping more than the handle holds. Driver 580 on an H200 answers
  // CUDA_ERROR_NOT_SUPPORTED (measured 2026-11-29), which the mapping treats
  // as a recoverable failure of this call.
  absl::Status s = b().Map(0, range->base, g * 2, *handle);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA_ERROR_NOT_SUPPORTED"))
      << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cuMemMap")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("on device 0")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA_ERROR_")) << s;
  // The failed map left nothing behind: the proper one succeeds.
  ASSERT_TRUE(b().Map(0, range->base, g, *handle).ok());
  // Mapping over a mapped range is a caller bug.
  auto other = b().Create(0, g);
  ASSERT_TRUE(other.ok()) << other.status();
  s = b().Map(0, range->base, g, *other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(b().Release(0, *other).ok());
  EXPECT_TRUE(b().Unmap(0, range->base, g).ok());
  EXPECT_TRUE(b().Release(0, *handle).ok());
  EXPECT_TRUE(b().FreeRange(0, *range).ok());
}

TEST_F(CudaBackendTest, QueryMemorySeesCreatedMemory) {
  const Bytes size = MiB(512);
  auto before = b().QueryMemory(0);
  ASSERT_TRUE(before.ok()) << before.status();
  auto handle = b().Create(0, size);
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto during = b().QueryMemory(0);
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_TRUE(b().Release(0, *handle).ok());
  auto after = b().QueryMemory(0);
  ASSERT_TRUE(after.ok()) << after.status();
  // Other processes may move the numbers a little; the broker's own use shows.
  EXPECT_GE(before->free.value() - during->free.value(),
            size.value() - 64 * kMiB);
  EXPECT_GE(after->free.value() - during->free.value(),
            size.value() - 64 * kMiB);
}

// Creating more than the device holds fails with RESOURCE_EXHAUSTED. Only
// handles are created (never mapped), in large pieces, and all are released.
TEST_F(CudaBackendTest, OutOfMemoryIsResourceExhausted) {
  for (int d = 0; d < b().device_count(); ++d) {
    SCOPED_TRACE(d);
    const Bytes g = gran(d);
    const int64_t total = b().device_total_memory(d).value();
    // About 1/16 of the device per handle (8.75 GiB on a 140 GiB H200).
    const Bytes piece(
        std::max<int64_t>(g.value(), total / 16 / g.value() * g.value()));
    std::vector<PhysicalHandle> handles;
    absl::Status failure;
    for (int64_t i = 0; i < total / piece.value() + 4; ++i) {
      auto h = b().Create(d, piece);
      if (!h.ok()) {
        failure = h.status();
        break;
      }
      handles.push_back(*h);
    }
    for (PhysicalHandle h : handles) EXPECT_TRUE(b().Release(d, h).ok());
    EXPECT_EQ(failure.code(), absl::StatusCode::kResourceExhausted) << failure;
    EXPECT_THAT(std::string(failure.message()),
                HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));
    EXPECT_GE(static_cast<int64_t>(handles.size()) * piece.value(), total / 2);
    // Released memory is usable again.
    auto again = b().Create(d, piece);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(b().Release(d, *again).ok());
  }
}

// Driver calls come from arbitrary threads with no current context.
TEST_F(CudaBackendTest, WorksFromFreshThreads) {
  const Bytes g = gran();
  constexpr int kThreads = 4;
  constexpr int kRounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto fail = [&](const absl::Status& s) {
        if (!s.ok()) {
          ++failures;
          std::cerr << "thread " << t << ": " << s << "\n";
        }
      };
      auto range = b().ReserveRange(0, g);
      if (!range.ok()) return fail(range.status());
      for (int i = 0; i < kRounds; ++i) {
        auto h = b().Create(0, g);
        if (!h.ok()) return fail(h.status());
        fail(b().Map(0, range->base, g, *h));
        fail(b().SetAccess(0, range->base, g));
        uint64_t value = (uint64_t{static_cast<uint32_t>(t)} << 32) | i;
        uint64_t back = 0;
        fail(b().CopyToDevice(0, range->base, &value, sizeof(value)));
        fail(b().CopyFromDevice(0, &back, range->base, sizeof(back)));
        if (back != value) ++failures;
        fail(b().Unmap(0, range->base, g));
        fail(b().Release(0, *h));
        fail(b().QueryMemory(0).status());
      }
      fail(b().FreeRange(0, *range));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace kvbroker
