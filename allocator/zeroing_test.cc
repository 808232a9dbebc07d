// Blocks passing from one holder to another are zeroed through the pool's
// own mapping, on every device, and only those (holder_tags.h); a zeroing
// that fails leaves the pool and a redeemed reservation as they were. Runs
// on host memory, and on the GPU with KVB_TEST_BACKEND=cuda (the same
// binary).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/device_budget.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
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
    faults_ = std::make_unique<FaultInjectingBackend>(tb_->backend());
    budgets_ = std::make_unique<DeviceBudgets>(faults_.get(), 0.9);
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
    auto pool = PagePool::Create(c, faults_.get(), budgets_.get(), &clock_, o);
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

  // Every figure of a capacity snapshot, pages included.
  static std::string Figures(const CapacitySnapshot& c) {
    std::string out = absl::StrCat(
        "gen=", c.generation, " avail=", c.available_blocks.value(),
        " res=", c.reserved_blocks.value(),
        " alloc=", c.allocated_blocks.value(), " free=", c.pages_free.value(),
        " mapping=", c.pages_mapping.value(), " idle=", c.pages_idle.value(),
        " open=", c.pages_open.value(), " full=", c.pages_full.value(),
        " revoking=", c.pages_revoking.value(),
        " quarantined=", c.pages_quarantined.value(),
        " mapped=", c.mapped_bytes.value(), " healthy=", c.healthy);
    for (const PageInfo& p : c.pages) {
      absl::StrAppend(&out, " [", p.page_id, " ", static_cast<int>(p.state),
                      " ", p.free_blocks.value(), "/",
                      p.allocated_blocks.value(), "/",
                      p.reserved_blocks.value(), "]");
    }
    return out;
  }

  std::unique_ptr<TestBackend> tb_;
  std::unique_ptr<FaultInjectingBackend> faults_;
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

// While its blocks are zeroed (without the pool lock), an Alloc is shown
// done: its blocks allocated, none reserved, although the pool holds them
// as reserved meanwhile so that no Free can take them.
TEST_P(ZeroingTest, CapacityShowsTheAllocDoneWhileItsBlocksAreZeroed) {
  const std::vector<BlockId> a = Alloc(4, "engine-a");  // page 0
  Free(a);                                              // IDLE, a's data
  std::vector<std::string> during;
  std::vector<absl::Status> frees;
  faults_->SetHook(BackendOp::kZero, [&] {
    during.push_back(Figures(*pool_->Capacity()));
    frees.push_back(pool_->Free({{0}, ""}).status());
  });
  const std::vector<BlockId> b = Alloc(3, "engine-b");
  faults_->SetHook(BackendOp::kZero, nullptr);
  ASSERT_EQ(b, (std::vector<BlockId>{0, 1, 2}));
  // The generation moves when the Alloc returns; every other figure is the
  // same during the zeroing as after it.
  auto figures = [](const std::string& f) { return f.substr(f.find(' ')); };
  const std::string after = Figures(*pool_->Capacity());
  ASSERT_EQ(during.size(), static_cast<size_t>(GetParam()));  // per device
  for (const std::string& d : during) EXPECT_EQ(figures(d), figures(after));
  EXPECT_NE(after.find("res=0 alloc=3"), std::string::npos) << after;
  for (const absl::Status& s : frees) {
    EXPECT_EQ(GetReason(s), FailureReason::kBlockInReservation) << s;
  }
  EXPECT_TRUE(pool_->CheckInvariants().ok());
}

TEST_P(ZeroingTest, FailedZeroingLeavesTheRedeemedReservationAsItWas) {
  const std::vector<BlockId> a = Alloc(4, "engine-a");  // page 0
  for (BlockId b : a) Fill(b, 'a');
  Free(a);
  // A scheduler reserves page 0's blocks for engine B; they still hold A's
  // bytes, so redeeming them for B zeroes them.
  ReserveRequest r;
  r.num_blocks = 3;
  absl::StatusOr<ReservationInfo> res = pool_->Reserve(r);
  ASSERT_TRUE(res.ok()) << res.status();
  CapacityQuery every_page;
  every_page.max_pages = 8;
  const std::string before = Figures(*pool_->Capacity(every_page));
  ASSERT_EQ(pool_->Capacity()->reserved_blocks.value(), 3);

  // The zeroing fails on the last device, after the others were zeroed.
  faults_->AddFault({BackendOp::kZero, FaultKind::kError, 1,
                     pool_->geometry().devices().back()});
  AllocRequest redeem;
  redeem.num_blocks = 3;
  redeem.reservation_id = res->reservation_id;
  redeem.holder = "engine-b";
  absl::StatusOr<AllocResult> failed = pool_->Alloc(redeem);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(GetReason(failed.status()), FailureReason::kMappingFailed)
      << failed.status();
  EXPECT_EQ(faults_->injected(BackendOp::kZero), 1);
  // Nothing changed: the reservation holds its blocks, no block was
  // allocated or returned, the pool is healthy.
  EXPECT_EQ(Figures(*pool_->Capacity(every_page)), before);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 0);
  EXPECT_TRUE(pool_->CheckInvariants().ok());

  // The same redemption, retried, gets exactly the reservation's blocks,
  // zeroed (the ones the failed call did zero, and the others).
  absl::StatusOr<AllocResult> got = pool_->Alloc(redeem);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(AllBlockIds(*got), res->pages.front().block_ids);
  for (BlockId b : AllBlockIds(*got)) EXPECT_EQ(Differing(b, 0), 0);
  EXPECT_EQ(pool_->Capacity()->reserved_blocks.value(), 0);
  EXPECT_EQ(pool_->Capacity()->allocated_blocks.value(), 3);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 3);
  EXPECT_TRUE(pool_->CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Devices, ZeroingTest, ::testing::Values(1, 2),
                         [](const auto& info) {
                           return absl::StrCat(info.param, "Devices");
                         });

}  // namespace
}  // namespace kvbroker
