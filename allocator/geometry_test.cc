// Tests of the exact page/block arithmetic and of pool-config validation
// (docs/design.md, "Geometry").

#include "allocator/geometry.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

const Bytes kGranularity = MiB(2);

PoolConfig Config(Bytes page, Bytes block, int64_t max_blocks) {
  PoolConfig c;
  c.name = "pool";
  c.page_size = page;
  c.block_bytes = block;
  c.max_blocks = max_blocks;
  return c;
}

Geometry MustCreate(const PoolConfig& config, int device_count = 1) {
  absl::StatusOr<Geometry> g =
      Geometry::Create(config, kGranularity, device_count);
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

std::vector<BlockRange> Ranges(const Geometry& g) {
  std::vector<BlockRange> out;
  for (PageId p = 0; p < g.page_count().value(); ++p) out.push_back(g.range(p));
  return out;
}

// The field names of the BadRequest violations carried by `s`.
std::vector<std::string> ViolatedFields(const absl::Status& s) {
  std::vector<std::string> fields;
  std::optional<Failure> f = GetFailure(s);
  if (!f.has_value()) return fields;
  for (const FieldViolation& v : f->violations) fields.push_back(v.field);
  return fields;
}

// --- ranges -----------------------------------------------------------------

TEST(GeometryRangeTest, FourteenMiBPagesSixMiBBlocks) {
  Geometry g = MustCreate(Config(MiB(14), MiB(6), 15));
  EXPECT_EQ(g.page_count(), PageCount(7));  // ceil(90 / 14)
  EXPECT_EQ(Ranges(g),
            (std::vector<BlockRange>{
                {0, 2}, {3, 4}, {5, 7}, {7, 9}, {10, 11}, {12, 14}, {14, 15}}));
  EXPECT_EQ(g.total_usable(), BlockCount(11));
  for (BlockId b : {2, 4, 9, 11}) EXPECT_FALSE(g.is_usable_block(b)) << b;
  for (BlockId b : {0, 1, 3, 5, 6, 7, 8, 10, 12, 13, 14}) {
    EXPECT_TRUE(g.is_usable_block(b)) << b;
  }
}

TEST(GeometryRangeTest, EmptyPagesHaveEmptyRanges) {
  // 1.5 MiB blocks: pages 1 and 4 hold no whole block.
  Geometry g = MustCreate(Config(MiB(2), KiB(1536), 8));
  EXPECT_EQ(Ranges(g), (std::vector<BlockRange>{
                           {0, 1}, {2, 2}, {3, 4}, {4, 5}, {6, 6}, {7, 8}}));
  EXPECT_EQ(g.usable(1), BlockCount(0));
  EXPECT_EQ(g.usable(4), BlockCount(0));
  EXPECT_EQ(g.range(1).size(), 0);
  EXPECT_EQ(g.total_usable(), BlockCount(4));
}

TEST(GeometryRangeTest, LastPageClippedToMaxBlocks) {
  Geometry g = MustCreate(Config(MiB(2), MiB(1), 5));
  EXPECT_EQ(g.page_count(), PageCount(3));
  EXPECT_EQ(g.range(2), (BlockRange{4, 5}));
  EXPECT_TRUE(g.is_usable_block(4));
  EXPECT_FALSE(g.is_usable_block(5));
  EXPECT_EQ(g.total_usable(), BlockCount(5));
}

TEST(GeometryRangeTest, LastPageClippedToNothing) {
  // T = 3 but page 2 would start at block 5 = N.
  Geometry g = MustCreate(Config(MiB(14), MiB(6), 5));
  EXPECT_EQ(g.page_count(), PageCount(3));
  EXPECT_EQ(g.range(2).size(), 0);
  EXPECT_EQ(g.usable(2), BlockCount(0));
  EXPECT_EQ(g.total_usable(), BlockCount(3));
}

TEST(GeometryRangeTest, BlockEqualToPage) {
  Geometry g = MustCreate(Config(MiB(4), MiB(4), 3));
  EXPECT_EQ(Ranges(g), (std::vector<BlockRange>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(g.page_of(2), 2);
}

TEST(GeometryRangeTest, BlockDividesPage) {
  Geometry g = MustCreate(Config(MiB(2), KiB(16), 65536));
  EXPECT_EQ(g.page_count(), PageCount(512));
  EXPECT_EQ(g.range(0), (BlockRange{0, 128}));
  EXPECT_EQ(g.range(511), (BlockRange{65408, 65536}));
  EXPECT_EQ(g.total_usable(), BlockCount(65536));
  EXPECT_EQ(g.page_of(127), 0);
  EXPECT_EQ(g.page_of(128), 1);
  EXPECT_EQ(g.page_of(65535), 511);
}

TEST(GeometryRangeTest, OneByteBlocksAreExact) {
  // B = 1 byte, P = 2 MiB: every block is usable.
  Geometry g = MustCreate(Config(MiB(2), Bytes(1), 3 * kMiB));
  EXPECT_EQ(g.page_count(), PageCount(2));
  EXPECT_EQ(g.range(1), (BlockRange{2 * kMiB, 3 * kMiB}));
  EXPECT_EQ(g.total_usable(), BlockCount(3 * kMiB));
}

TEST(GeometryRangeTest, PageOfStraddlingBlockIsItsFirstByte) {
  Geometry g = MustCreate(Config(MiB(14), MiB(6), 15));
  EXPECT_EQ(g.page_of(0), 0);
  EXPECT_EQ(g.page_of(2), 0);  // bytes [12, 18) MiB: starts on page 0
  EXPECT_EQ(g.page_of(3), 1);
  EXPECT_EQ(g.page_of(4), 1);  // [24, 30): starts on page 1
  EXPECT_EQ(g.page_of(9), 3);  // [54, 60)
  EXPECT_EQ(g.page_of(14), 6);
}

TEST(GeometryRangeTest, IsUsableBlockRejectsOutOfRangeIds) {
  Geometry g = MustCreate(Config(MiB(2), MiB(1), 5));
  EXPECT_FALSE(g.is_usable_block(-1));
  EXPECT_FALSE(g.is_usable_block(5));
  EXPECT_FALSE(g.is_usable_block(INT64_MAX));
  EXPECT_FALSE(g.is_usable_block(INT64_MIN));
}

// Brute force: a block is usable iff its first and last byte are on the same
// page, and range(p) is exactly the usable blocks whose first byte is on p.
TEST(GeometryRangeTest, MatchesBruteForceOverManyGeometries) {
  const std::vector<int64_t> pages_mib = {2, 4, 6, 8, 14};
  const std::vector<int64_t> blocks_kib = {1,    3,    16,   500,  768,
                                           1000, 1024, 1536, 2047, 2048,
                                           3000, 6144, 7000, 8192, 14336};
  int checked = 0;
  for (int64_t pm : pages_mib) {
    for (int64_t bk : blocks_kib) {
      const int64_t P = pm * kMiB, B = bk * kKiB;
      if (B > P) continue;
      for (int64_t n : {1, 2, 7, 37, 100}) {
        SCOPED_TRACE(testing::Message()
                     << "P=" << pm << "MiB B=" << bk << "KiB N=" << n);
        Geometry g = MustCreate(Config(Bytes(P), Bytes(B), n));
        const int64_t T = (n * B + P - 1) / P;
        ASSERT_EQ(g.page_count(), PageCount(T));
        std::vector<std::vector<BlockId>> expected(T);
        int64_t usable = 0;
        for (BlockId b = 0; b < n; ++b) {
          const int64_t first = b * B / P, last = ((b + 1) * B - 1) / P;
          ASSERT_EQ(g.page_of(b), first) << b;
          ASSERT_EQ(g.is_usable_block(b), first == last) << b;
          if (first == last) {
            expected[first].push_back(b);
            ++usable;
          }
        }
        for (PageId p = 0; p < T; ++p) {
          BlockRange r = g.range(p);
          std::vector<BlockId> got;
          for (BlockId b = r.begin; b < r.end; ++b) got.push_back(b);
          ASSERT_EQ(got, expected[p]) << "page " << p;
          ASSERT_EQ(g.usable(p), BlockCount(got.size()));
        }
        ASSERT_EQ(g.total_usable(), BlockCount(usable));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 62 * 5);  // every pair with B <= P, five N each
}

// --- derived sizes ----------------------------------------------------------

TEST(GeometrySizesTest, BundleStrideAndVirtualBytes) {
  PoolConfig c = Config(MiB(2), KiB(768), 16);
  c.num_layers = 32;
  c.num_kv_buffers = 2;
  c.devices = {0, 1};
  Geometry g = MustCreate(c, /*device_count=*/2);
  EXPECT_EQ(g.page_count(), PageCount(6));  // ceil(16 * 0.75 / 2)
  EXPECT_EQ(g.bundle_bytes(), MiB(128));
  EXPECT_EQ(g.block_stride(), KiB(768 * 64));
  EXPECT_EQ(g.virtual_bytes_per_device(), MiB(6 * 128));
  EXPECT_EQ(g.page_offset(0), Bytes(0));
  EXPECT_EQ(g.page_offset(5), MiB(5 * 128));
  EXPECT_EQ(g.device_count(), 2);
  EXPECT_EQ(g.devices(), (std::vector<int>{0, 1}));
  EXPECT_EQ(g.max_blocks(), 16);
  EXPECT_EQ(g.page_size(), MiB(2));
  EXPECT_EQ(g.block_bytes(), KiB(768));
}

TEST(GeometrySizesTest, SmallestValidPageSize) {
  EXPECT_EQ(Geometry::SmallestValidPageSize(MiB(3), MiB(2)), MiB(4));
  EXPECT_EQ(Geometry::SmallestValidPageSize(MiB(2), MiB(2)), MiB(2));
  EXPECT_EQ(Geometry::SmallestValidPageSize(Bytes(1), MiB(2)), MiB(2));
  EXPECT_EQ(Geometry::SmallestValidPageSize(MiB(2) + Bytes(1), MiB(2)), MiB(4));
  EXPECT_EQ(Geometry::SmallestValidPageSize(MiB(15), MiB(2)), MiB(16));
}

TEST(GeometrySizesTest, VirtualRangeAtTheLimitIsAccepted) {
  // bundle = 2 MiB * 2^20 layers * 64 buffers = 2^47 bytes, one page.
  PoolConfig c = Config(MiB(2), MiB(2), 1);
  c.num_layers = int64_t{1} << 20;
  c.num_kv_buffers = 64;
  Geometry g = MustCreate(c);
  EXPECT_EQ(g.virtual_bytes_per_device(), Bytes(kMaxVirtualBytesPerDevice));

  c.max_blocks = 2;  // two pages: twice the limit
  absl::Status s = Geometry::Create(c, kGranularity, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetReason(s), FailureReason::kInvalidArgument);
  EXPECT_EQ(ViolatedFields(s), (std::vector<std::string>{"max_blocks"}));
}

TEST(GeometrySizesTest, HugeMaxBlocksDoesNotOverflow) {
  absl::Status s =
      Geometry::Create(Config(MiB(2), MiB(2), INT64_MAX), kGranularity, 1)
          .status();
  EXPECT_EQ(GetReason(s), FailureReason::kInvalidArgument);
  EXPECT_EQ(ViolatedFields(s), (std::vector<std::string>{"max_blocks"}));
}

TEST(GeometrySizesTest, HugeBlockAndPageSizesDoNotOverflow) {
  // The least multiple of 2 MiB >= INT64_MAX is 2^63: not an int64.
  EXPECT_EQ(Geometry::SmallestValidPageSize(Bytes(INT64_MAX), kGranularity),
            Bytes(0));
  absl::Status s =
      Geometry::Create(Config(MiB(2), Bytes(INT64_MAX), 1), kGranularity, 1)
          .status();
  EXPECT_EQ(GetReason(s), FailureReason::kInvalidGeometry);
  EXPECT_TRUE(absl::StrContains(s.message(), "every valid page size"))
      << s.message();
  EXPECT_EQ(GetFailure(s)->metadata.count("min_page_size_bytes"), 0u);

  // INT64_MAX is not a multiple of 2 MiB, and no multiple lies above it.
  s = Geometry::Create(Config(Bytes(INT64_MAX), MiB(2), 1), kGranularity, 1)
          .status();
  EXPECT_EQ(GetReason(s), FailureReason::kInvalidGeometry);
  EXPECT_FALSE(absl::StrContains(s.message(), "-")) << s.message();
  EXPECT_EQ(GetFailure(s)->metadata.at("min_page_size_bytes"),
            absl::StrCat(2 * kMiB));
}

TEST(GeometrySizesTest, BookkeepingIsBounded) {
  // At the bounds: accepted.
  MustCreate(Config(MiB(2), KiB(16), kMaxBlocks));
  MustCreate(Config(MiB(2), MiB(2), kMaxPages));
  // One block or one page more: refused before anything is allocated.
  for (const PoolConfig& c : {Config(MiB(2), KiB(16), kMaxBlocks + 1),
                              Config(MiB(2), MiB(2), kMaxPages + 1)}) {
    absl::Status s = Geometry::Create(c, kGranularity, 1).status();
    EXPECT_EQ(GetReason(s), FailureReason::kInvalidArgument) << s;
    EXPECT_EQ(ViolatedFields(s), (std::vector<std::string>{"max_blocks"}));
  }
  PoolConfig tokens = Config(MiB(2), MiB(2), 1);
  tokens.tokens_per_block = kMaxTokensPerBlock + 1;
  EXPECT_EQ(ViolatedFields(Geometry::Create(tokens, kGranularity, 1).status()),
            (std::vector<std::string>{"tokens_per_block"}));
}

// --- INVALID_GEOMETRY -------------------------------------------------------

TEST(GeometryValidationTest, BlockLargerThanPageNamesSmallestPage) {
  absl::Status s =
      Geometry::Create(Config(MiB(2), MiB(3), 10), kGranularity, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::optional<Failure> f = GetFailure(s);
  ASSERT_TRUE(f.has_value()) << s;
  EXPECT_EQ(f->reason, FailureReason::kInvalidGeometry);
  EXPECT_EQ(f->metadata.at("min_page_size_bytes"), Num(4 * kMiB));
  EXPECT_NE(s.message().find("4 MiB"), absl::string_view::npos) << s;
}

TEST(GeometryValidationTest, SmallestPageRoundsUpToGranularity) {
  absl::Status s =
      Geometry::Create(Config(MiB(4), MiB(4) + Bytes(1), 10), kGranularity, 1)
          .status();
  std::optional<Failure> f = GetFailure(s);
  ASSERT_TRUE(f.has_value()) << s;
  EXPECT_EQ(f->reason, FailureReason::kInvalidGeometry);
  EXPECT_EQ(f->metadata.at("min_page_size_bytes"), Num(6 * kMiB));
  EXPECT_NE(s.message().find("6 MiB"), absl::string_view::npos) << s;
}

TEST(GeometryValidationTest, PageNotMultipleOfGranularity) {
  for (Bytes page : {MiB(3), MiB(1), MiB(2) + Bytes(4096), KiB(5120)}) {
    SCOPED_TRACE(page.value());
    absl::Status s =
        Geometry::Create(Config(page, KiB(512), 10), kGranularity, 1).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(GetReason(s), FailureReason::kInvalidGeometry) << s;
  }
  // The same page size is valid on a backend with a finer granularity.
  EXPECT_TRUE(Geometry::Create(Config(MiB(3), KiB(512), 10), MiB(1), 1).ok());
}

// --- INVALID_ARGUMENT with field violations ---------------------------------

struct BadConfigCase {
  const char* label;
  void (*mutate)(PoolConfig&);
  const char* field;
};

TEST(GeometryValidationTest, MalformedFieldsNameTheField) {
  const std::vector<BadConfigCase> cases = {
      {"zero page", [](PoolConfig& c) { c.page_size = Bytes(0); }, "page_size"},
      {"negative page", [](PoolConfig& c) { c.page_size = MiB(-2); },
       "page_size"},
      {"zero block", [](PoolConfig& c) { c.block_bytes = Bytes(0); },
       "block_bytes"},
      {"negative block", [](PoolConfig& c) { c.block_bytes = KiB(-1); },
       "block_bytes"},
      {"zero max_blocks", [](PoolConfig& c) { c.max_blocks = 0; },
       "max_blocks"},
      {"negative max_blocks", [](PoolConfig& c) { c.max_blocks = -5; },
       "max_blocks"},
      {"zero tokens", [](PoolConfig& c) { c.tokens_per_block = 0; },
       "tokens_per_block"},
      {"zero layers", [](PoolConfig& c) { c.num_layers = 0; }, "num_layers"},
      {"too many layers",
       [](PoolConfig& c) { c.num_layers = (int64_t{1} << 20) + 1; },
       "num_layers"},
      {"zero buffers", [](PoolConfig& c) { c.num_kv_buffers = 0; },
       "num_kv_buffers"},
      {"65 buffers", [](PoolConfig& c) { c.num_kv_buffers = 65; },
       "num_kv_buffers"},
      {"no devices", [](PoolConfig& c) { c.devices.clear(); }, "devices"},
      {"duplicate device",
       [](PoolConfig& c) {
         c.devices = {0, 1, 0};
       },
       "devices"},
      {"unknown device",
       [](PoolConfig& c) {
         c.devices = {0, 2};
       },
       "devices"},
      {"negative device", [](PoolConfig& c) { c.devices = {-1}; }, "devices"},
      {"empty name", [](PoolConfig& c) { c.name = ""; }, "name"},
      {"space in name", [](PoolConfig& c) { c.name = "my pool"; }, "name"},
      {"slash in name", [](PoolConfig& c) { c.name = "a/b"; }, "name"},
      {"newline in name", [](PoolConfig& c) { c.name = "a\nb"; }, "name"},
      {"long name", [](PoolConfig& c) { c.name = std::string(129, 'a'); },
       "name"},
  };
  for (const BadConfigCase& bad : cases) {
    SCOPED_TRACE(bad.label);
    PoolConfig c = Config(MiB(2), MiB(1), 10);
    bad.mutate(c);
    absl::Status s =
        Geometry::Create(c, kGranularity, /*device_count=*/2).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(GetReason(s), FailureReason::kInvalidArgument) << s;
    EXPECT_EQ(ViolatedFields(s), (std::vector<std::string>{bad.field})) << s;
    EXPECT_NE(s.message().find(bad.field), absl::string_view::npos) << s;
  }
}

TEST(GeometryValidationTest, ValidNamesAndBoundsAreAccepted) {
  PoolConfig c = Config(MiB(2), MiB(1), 10);
  c.name = std::string(128, 'z');
  EXPECT_TRUE(Geometry::Create(c, kGranularity, 1).ok());
  c.name = "llama-70b_tp2.v1";
  EXPECT_TRUE(Geometry::Create(c, kGranularity, 1).ok());
  // The largest L and K, on one page so that the range stays addressable.
  c.num_layers = int64_t{1} << 20;
  c.num_kv_buffers = 64;
  c.max_blocks = 2;
  EXPECT_TRUE(Geometry::Create(c, kGranularity, 1).ok());
  c.devices = {1, 0};  // any order, both known
  EXPECT_TRUE(Geometry::Create(c, kGranularity, 2).ok());
}

TEST(GeometryValidationTest, EveryMalformedFieldIsReported) {
  PoolConfig c = Config(Bytes(0), Bytes(-1), 0);
  c.name = "";
  c.devices = {};
  absl::Status s = Geometry::Create(c, kGranularity, 1).status();
  EXPECT_EQ(GetReason(s), FailureReason::kInvalidArgument);
  std::vector<std::string> fields = ViolatedFields(s);
  std::sort(fields.begin(), fields.end());
  EXPECT_EQ(fields,
            (std::vector<std::string>{"block_bytes", "devices", "max_blocks",
                                      "name", "page_size"}));
}

TEST(GeometryValidationTest, ConfigIsKept) {
  PoolConfig c = Config(MiB(14), MiB(6), 15);
  c.name = "kept";
  c.tokens_per_block = 16;
  c.reserve_null_block = true;
  Geometry g = MustCreate(c);
  EXPECT_EQ(g.config().name, "kept");
  EXPECT_EQ(g.config().tokens_per_block, 16);
  EXPECT_TRUE(g.config().reserve_null_block);
}

}  // namespace
}  // namespace kvbroker
