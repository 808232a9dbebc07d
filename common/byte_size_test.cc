#include "common/byte_size.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

int64_t Parse(const char* text) {
  absl::StatusOr<int64_t> v = ParseSize(text);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.value_or(-1);
}

TEST(ParseSizeTest, PlainBytes) {
  EXPECT_EQ(Parse("0"), 0);
  EXPECT_EQ(Parse("4096"), 4096);
  EXPECT_EQ(Parse("4096B"), 4096);
  EXPECT_EQ(Parse(" 17 b "), 17);
}

TEST(ParseSizeTest, BinaryUnits) {
  EXPECT_EQ(Parse("14MiB"), 14 * kMiB);
  EXPECT_EQ(Parse("6MiB"), 6 * kMiB);
  EXPECT_EQ(Parse("512KiB"), 512 * kKiB);
  EXPECT_EQ(Parse("2GiB"), 2 * kGiB);
  EXPECT_EQ(Parse("2G"), 2 * kGiB);
  EXPECT_EQ(Parse("2g"), 2 * kGiB);
  EXPECT_EQ(Parse("2Gi"), 2 * kGiB);
  EXPECT_EQ(Parse("768K"), 768 * kKiB);
  EXPECT_EQ(Parse("1TiB"), 1024 * kGiB);
  EXPECT_EQ(Parse("14 MiB"), 14 * kMiB);
  EXPECT_EQ(Parse("14mib"), 14 * kMiB);
}

TEST(ParseSizeTest, TwoLetterUnitsAreBinaryToo) {
  EXPECT_EQ(Parse("1KB"), kKiB);
  EXPECT_EQ(Parse("3MB"), 3 * kMiB);
  EXPECT_EQ(Parse("2GB"), 2 * kGiB);
  EXPECT_EQ(Parse("1TB"), 1024 * kGiB);
}

TEST(ParseSizeTest, Fractions) {
  EXPECT_EQ(Parse("1.5MiB"), 3 * kMiB / 2);
  EXPECT_EQ(Parse("0.75MiB"), 768 * kKiB);
  EXPECT_EQ(Parse("1.5KB"), 1536);
  EXPECT_EQ(Parse("2.0"), 2);
  EXPECT_EQ(Parse(".5KiB"), 512);
}

TEST(ParseSizeTest, Errors) {
  for (const char* bad :
       {"", "MiB", "-1", "1.5", "0.3B", "1.0001KiB", "14 MiBs", "1X", "1e9",
        "1,000", "9223372036854775808", "9999999999T", "1..5M", "2 2"}) {
    absl::StatusOr<int64_t> v = ParseSize(bad);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument)
        << "\"" << bad << "\" -> " << (v.ok() ? *v : -1);
  }
}

TEST(ParseSizeTest, Limits) {
  EXPECT_EQ(Parse("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Parse("8191PiB"), 8191 * kGiB * 1024 * 1024);
  EXPECT_FALSE(ParseSize("8192PiB").ok());
}

TEST(FormatBytesTest, Exact) {
  EXPECT_EQ(FormatBytes(0), "0B");
  EXPECT_EQ(FormatBytes(512), "512B");
  EXPECT_EQ(FormatBytes(14 * kMiB), "14MiB");
  EXPECT_EQ(FormatBytes(3 * kMiB / 2), "1536KiB");
  EXPECT_EQ(FormatBytes(2 * kGiB), "2GiB");
  EXPECT_EQ(FormatBytes(-6 * kMiB), "-6MiB");
}

TEST(FormatBytesTest, Approximate) {
  EXPECT_EQ(FormatBytes(4097), "4.00KiB");
  EXPECT_EQ(FormatBytes(kGiB + 20 * kMiB + 1), "1.02GiB");
}

TEST(FormatBytesTest, RoundTrip) {
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{1023}, kKiB, 14 * kMiB,
                    3 * kMiB / 2, 80 * kGiB}) {
    EXPECT_EQ(Parse(FormatBytes(v).c_str()), v);
  }
}

}  // namespace
}  // namespace kvbroker
