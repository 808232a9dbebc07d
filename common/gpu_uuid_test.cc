#include "common/gpu_uuid.h"

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

TEST(GpuUuidTest, GroupsTheBytesAsNvidiaSmiDoes) {
  char bytes[kGpuUuidBytes];
  for (int i = 0; i < kGpuUuidBytes; ++i) bytes[i] = static_cast<char>(i);
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
}

TEST(GpuUuidTest, HighBytesAreNotSignExtended) {
  char bytes[kGpuUuidBytes];
  for (int i = 0; i < kGpuUuidBytes; ++i) {
    bytes[i] = static_cast<char>(0xf0 | i);
  }
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff");
}

}  // namespace
}  // namespace kvbroker
