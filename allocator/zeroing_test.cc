// Blocks passing from one holder to another are zeroed through the pool's
// own mapping, on every device, and only those (holder_tags.h). Runs on host
// memory, and on the GPU with KVB_TEST_BACKEND=cuda (the same binary).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/device_budget.h"
#include "allocator/page_pool.h"
#include "allocator/testing/test_backend.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using testing_support::TestBackend;

class ZeroingTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    std::string why;
    tb_ = TestBackend::Make(GetParam(), &why);
    if (tb_ == nullptr) GTEST_SKIP() << why;
    budgets_ = std::make_unique<DeviceBudgets>(tb_->backend(), 0.9);
    ASSERT_TRUE(budgets_->Init().ok());
    // P = 2 MiB, B = 512 KiB, L = K = 1: 4 blocks per page, 8 pages.
    PoolConfig c;
    c.name = "z";
    c.page_size = MiB(2);
    c.block_bytes = KiB(512);
    c.max_blocks = 32;
    c.devices.clear();
    for (int d = 0; d < GetParam(); ++d) c.devices.push_back(d);
    PoolOptions o;
    o.min_idle_pages = 0;
    o.max_idle_pages = 4;  // emptied pages stay mapped: blocks are reused
    auto pool = PagePool::Create(c, tb_->backend(), budgets_.get(), &clock_, o);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  std::vector<BlockId> Alloc(int64_t n, const std::string& holder) {
    AllocRequest a;
    a.num_blocks = n;
    a.holder = holder;
    auto r = pool_->Alloc(a);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<BlockId> out;
    if (!r.ok()) return out;
    for (const auto& pb : r->pages) {
      out.insert(out.end(), pb.block_ids.begin(), pb.block_ids.end());
    }
    return out;
  }

  void Free(const std::vector<BlockId>& ids) {
    FreeRequest f;
    f.block_ids = ids;
    EXPECT_TRUE(pool_->Free(f).ok());
  }

  int64_t stride() const { return pool_->geometry().block_stride().value(); }

  // Fills block b on every device with `byte`.
  void Fill(BlockId b, char byte) {
    const std::string bytes(stride(), byte);
    for (int i = 0; i < pool_->geometry().device_count(); ++i) {
      ASSERT_TRUE(tb_->Write(pool_->geometry().devices()[i],
                             pool_->range_base(i) + b * stride(), bytes.data(),
                             bytes.size())
                      .ok());
    }
  }
  // Bytes of block b, over every device, that are not `byte`.
  int64_t Differing(BlockId b, char byte) {
    std::string got(stride(), '?');
    int64_t n = 0;
    for (int i = 0; i < pool_->geometry().device_count(); ++i) {
      EXPECT_TRUE(tb_->Read(pool_->geometry().devices()[i], got.data(),
                            pool_->range_base(i) + b * stride(), got.size())
                      .ok());
      for (char c : got) n += c != byte;
    }
    return n;
  }

  std::unique_ptr<TestBackend> tb_;
  std::unique_ptr<DeviceBudgets> budgets_;
  ManualClock clock_;
  std::unique_ptr<PagePool> pool_;
};

TEST_P(ZeroingTest, BlocksPassingToAnotherHolderAreZeroedOnlyThen) {
  const std::vector<BlockId> a = Alloc(4, "engine-a");  // page 0
  for (BlockId b : a) Fill(b, 'a');
  Free(a);  // page 0 IDLE, still holding a's bytes

  // The same holder gets its own data back untouched.
  EXPECT_EQ(Alloc(4, "engine-a"), a);
  for (BlockId b : a) EXPECT_EQ(Differing(b, 'a'), 0);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 0);
  Free(a);

  // A caller without a holder (gRPC) neither zeroes nor clears the tag.
  EXPECT_EQ(Alloc(2, ""), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(Differing(0, 'a'), 0);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 0);
  Free({0, 1});

  // Another holder gets zeros: every byte of every device.
  EXPECT_EQ(Alloc(3, "engine-b"), (std::vector<BlockId>{0, 1, 2}));
  for (BlockId b : {0, 1, 2}) EXPECT_EQ(Differing(b, 0), 0);
  EXPECT_EQ(Differing(3, 'a'), 0);  // not handed out: untouched
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 3);
  EXPECT_EQ(pool_->Capacity()->allocated_blocks.value(), 3);
  EXPECT_EQ(pool_->Capacity()->reserved_blocks.value(), 0);

  // Block 3 still holds a's data and is zeroed for b; the fresh page's
  // blocks need nothing.
  for (BlockId b : {0, 1, 2}) Fill(b, 'b');
  EXPECT_EQ(Alloc(5, "engine-b"), (std::vector<BlockId>{3, 4, 5, 6, 7}));
  EXPECT_EQ(Differing(3, 0), 0);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 4);

  // Back to a: b's blocks are zeroed for it.
  Free({0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(Alloc(1, "engine-a"), (std::vector<BlockId>{0}));
  EXPECT_EQ(Differing(0, 0), 0);
  EXPECT_EQ(Differing(1, 'b'), 0);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 5);
  EXPECT_TRUE(pool_->CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Devices, ZeroingTest, ::testing::Values(1, 2),
                         [](const auto& info) {
                           return absl::StrCat(info.param, "Devices");
                         });

}  // namespace
}  // namespace kvbroker
