// Data integrity through the pool's virtual range: every allocated block gets
// a distinct pattern over all its layers and buffers; neighbouring pages are
// mapped and unmapped around it, blocks are freed and reallocated, and every
// live block must still hold its pattern. Runs on host memory, and on the GPU
// with KVB_TEST_BACKEND=cuda (the same binary).

#include <map>
#include <random>
#include <vector>

#include "allocator/device_budget.h"
#include "allocator/page_pool.h"
#include "allocator/testing/test_backend.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using testing_support::TestBackend;

std::vector<uint64_t> Pattern(BlockId b, uint64_t epoch, size_t words) {
  std::vector<uint64_t> v(words);
  for (size_t i = 0; i < words; ++i) {
    v[i] = (static_cast<uint64_t>(b) << 40) ^ (epoch << 20) ^ i;
  }
  return v;
}

void RunChurn(int devices) {
  std::string why;
  std::unique_ptr<TestBackend> tb = TestBackend::Make(devices, &why);
  if (tb == nullptr) GTEST_SKIP() << why;
  DeviceBudgets budgets(tb->backend(), 0.9);
  ASSERT_TRUE(budgets.Init().ok());
  ManualClock clock;
  PoolConfig c;
  c.name = "data";
  c.page_size = MiB(2);
  c.block_bytes = KiB(96);  // 21.3 blocks per page: straddlers exist
  c.num_layers = 2;
  c.num_kv_buffers = 2;
  c.max_blocks = 400;
  c.devices.clear();
  for (int d = 0; d < devices; ++d) c.devices.push_back(d);
  PoolOptions o;
  o.min_idle_pages = 0;
  o.max_idle_pages = 0;  // emptied pages are unmapped at once
  auto pool = PagePool::Create(c, tb->backend(), &budgets, &clock, o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  PagePool& p = **pool;
  const size_t stride =
      static_cast<size_t>(p.geometry().block_stride().value());
  const size_t words = stride / sizeof(uint64_t);

  std::map<BlockId, uint64_t> live;  // block -> epoch of its pattern
  std::mt19937_64 rng(42);
  uint64_t epoch = 0;
  auto write = [&](BlockId b) {
    ++epoch;
    std::vector<uint64_t> pat = Pattern(b, epoch, words);
    for (int i = 0; i < p.geometry().device_count(); ++i) {
      ASSERT_TRUE(tb->Write(p.geometry().devices()[i],
                            p.range_base(i) + b * stride, pat.data(), stride)
                      .ok());
    }
    live[b] = epoch;
  };
  auto verify = [&]() {
    std::vector<uint64_t> got(words);
    for (const auto& [b, e] : live) {
      std::vector<uint64_t> want = Pattern(b, e, words);
      for (int i = 0; i < p.geometry().device_count(); ++i) {
        ASSERT_TRUE(tb->Read(p.geometry().devices()[i], got.data(),
                             p.range_base(i) + b * stride, stride)
                        .ok());
        ASSERT_EQ(got, want) << "block " << b << " device index " << i;
      }
    }
  };

  int64_t pages_churned = 0;
  for (int round = 0; round < 30; ++round) {
    const int64_t avail = p.Capacity()->available_blocks.value();
    const int64_t n = avail == 0 ? 0 : 1 + rng() % std::min<int64_t>(avail, 60);
    auto r = p.Alloc({n, "", "", {}});
    ASSERT_TRUE(r.ok()) << r.status();
    pages_churned += r->pages_mapped;
    for (const auto& pb : r->pages) {
      for (BlockId b : pb.block_ids) {
        ASSERT_EQ(live.count(b), 0u) << "block handed out twice: " << b;
        write(b);
      }
    }
    verify();
    // Free a random subset, which empties and unmaps some pages.
    std::vector<BlockId> to_free;
    const uint64_t keep_one_in = round % 4 == 3 ? 10 : 2;
    for (const auto& [b, e] : live) {
      if (rng() % keep_one_in != 0) to_free.push_back(b);
    }
    auto f = p.Free({to_free, ""});
    ASSERT_TRUE(f.ok()) << f.status();
    pages_churned += f->pages_unmapped;
    for (BlockId b : to_free) live.erase(b);
    ASSERT_TRUE(p.CheckInvariants().ok());
    verify();
  }
  EXPECT_GT(pages_churned, 10);
  std::vector<BlockId> all;
  for (const auto& [b, e] : live) all.push_back(b);
  ASSERT_TRUE(p.Free({all, ""}).ok());
  EXPECT_EQ(p.Capacity()->mapped_bytes.value(), 0);
}

TEST(DataIntegrity, PatternsSurviveMappingChurn) { RunChurn(1); }

TEST(DataIntegrity, PatternsSurviveMappingChurnOnTwoDevices) { RunChurn(2); }

}  // namespace
}  // namespace kvbroker
