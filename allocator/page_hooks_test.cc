// PagePool's hooks for engines, through the host backend: listeners hear of
// every mapped page (with exported fds) before its blocks are handed out and
// get a snapshot consistent with that; exported fds close with their
// handles on every path (zeroing between holders: zeroing_test.cc).

#include <fcntl.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

int OpenFds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// Records what it hears, checking each fd is a live memfd of a page size.
class RecordingListener : public PageListener {
 public:
  explicit RecordingListener(PagePool* pool) : pool_(pool) {}
  void OnPagesMapped(absl::Span<const MappedPage> pages) override {
    for (const MappedPage& m : pages) {
      heard.push_back(m.page);
      fds_per_page.push_back(static_cast<int>(m.fds.size()));
      for (int fd : m.fds) {
        struct stat st;
        if (fstat(fd, &st) != 0 ||
            st.st_size != pool_->geometry().bundle_bytes().value()) {
          ++bad_fds;
        }
      }
      // No block of the page has been handed out yet.
      occupancy_at_news.push_back(static_cast<size_t>(
          (*pool_->GetPageOccupancy({m.page}))[0].allocated_blocks.value()));
    }
  }
  void OnPagesRevoked(uint64_t id, absl::Span<const PageId> pages,
                      absl::Time deadline) override {
    revocations.push_back(id);
    revoked.insert(revoked.end(), pages.begin(), pages.end());
    deadlines.push_back(deadline);
    events.push_back("revoked");
  }
  void OnPagesNotPassed(absl::Span<const PageId> pages) override {
    not_passed.insert(not_passed.end(), pages.begin(), pages.end());
  }
  void OnPoolClosed() override { events.push_back("closed"); }
  std::vector<std::string> events;
  std::vector<PageId> not_passed;
  PagePool* pool_;
  std::vector<uint64_t> revocations;
  std::vector<PageId> revoked;
  std::vector<absl::Time> deadlines;
  std::vector<PageId> heard;
  std::vector<int> fds_per_page;
  std::vector<size_t> occupancy_at_news;
  int bad_fds = 0;
};

class PageHooksTest : public ::testing::Test {
 protected:
  PageHooksTest()
      : host_(HostBackendOptions{2, Bytes(64 * kGiB), MiB(2)}),
        backend_(&host_),
        budgets_(&backend_, 1.0) {
    EXPECT_TRUE(budgets_.Init().ok());
  }

  // P = 2 MiB, B = 512 KiB: 4 blocks per page, 8 pages, devices {0, 1}.
  std::unique_ptr<PagePool> MakePool(
      int64_t max_idle, bool export_at_map = false,
      int64_t max_revocation_pages = kMaxRevocationPages) {
    PoolConfig c;
    c.name = "p";
    c.export_at_map = export_at_map;
    c.page_size = MiB(2);
    c.block_bytes = KiB(512);
    c.max_blocks = 32;
    c.devices = {0, 1};
    PoolOptions o;
    o.min_idle_pages = 0;
    o.max_idle_pages = max_idle;
    o.revoke_timeout = absl::Seconds(5);
    o.max_revocation_pages = max_revocation_pages;
    auto pool = PagePool::Create(c, &backend_, &budgets_, &clock_, o);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *std::move(pool) : nullptr;
  }

  std::vector<BlockId> Alloc(PagePool& pool, int64_t n,
                             const std::string& holder) {
    AllocRequest a;
    a.num_blocks = n;
    a.holder = holder;
    auto r = pool.Alloc(a);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? AllBlockIds(*r) : std::vector<BlockId>{};
  }

  void Free(PagePool& pool, const std::vector<BlockId>& ids) {
    FreeRequest f;
    f.block_ids = ids;
    auto r = pool.Free(f);
    EXPECT_TRUE(r.ok()) << r.status();
  }

  HostBackend host_;
  FaultInjectingBackend backend_;
  DeviceBudgets budgets_;
  ManualClock clock_;
};

TEST_F(PageHooksTest, ListenersHearOfPagesBeforeTheirBlocksAndSnapshotsAgree) {
  auto pool = MakePool(/*max_idle=*/0);
  RecordingListener early(pool.get());
  std::vector<PageId> snapshot;
  ASSERT_TRUE(pool->AddPageListener(&early,
                                    [&](auto pages) {
                                      for (const MappedPage& m : pages)
                                        snapshot.push_back(m.page);
                                    })
                  .ok());
  EXPECT_TRUE(snapshot.empty());
  // No listener, no export: nothing was exported before it registered.
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 0);

  const std::vector<BlockId> six = Alloc(*pool, 6, "");  // pages 0 and 1
  EXPECT_EQ(early.heard, (std::vector<PageId>{0, 1}));
  EXPECT_EQ(early.fds_per_page, (std::vector<int>{2, 2}));
  EXPECT_EQ(early.occupancy_at_news, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(early.bad_fds, 0);
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 4);

  RecordingListener late(pool.get());
  ASSERT_TRUE(pool->AddPageListener(&late,
                                    [&](auto pages) {
                                      snapshot.clear();
                                      for (const MappedPage& m : pages)
                                        snapshot.push_back(m.page);
                                    })
                  .ok());
  EXPECT_EQ(snapshot, (std::vector<PageId>{0, 1}));
  // Already exported: the snapshot reuses the fds.
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 4);

  // Freeing page 0 would unmap it (max_idle 0), but both listeners map it:
  // it is revoked, and out of use until both let go. 32 blocks, 2
  // allocated on page 1, page 0 neither available nor FREE.
  Free(*pool, {six.begin(), six.begin() + 4});
  EXPECT_EQ(early.revoked, (std::vector<PageId>{0}));
  EXPECT_EQ(late.revocations, early.revocations);
  CapacitySnapshot c = *pool->Capacity();
  EXPECT_EQ(c.pages_revoking.value(), 1);
  EXPECT_EQ(c.pages_quarantined.value(), 0);
  EXPECT_EQ(c.pages_mapping.value(), 0);
  EXPECT_EQ(c.available_blocks.value(), 26);
  EXPECT_EQ(pool->pending_revocations(&early), 1);
  EXPECT_TRUE(pool->CheckInvariants().ok());
  // Leaving counts as letting go; the page still waits for `early`.
  pool->RemovePageListener(&late);
  EXPECT_EQ(pool->Capacity()->pages_revoking.value(), 1);
  EXPECT_TRUE(
      absl::IsNotFound(pool->AckRevocation(&late, late.revocations.front())));
  ASSERT_TRUE(pool->AckRevocation(&early, early.revocations.front()).ok());
  c = *pool->Capacity();
  EXPECT_EQ(c.pages_revoking.value(), 0);
  EXPECT_EQ(c.available_blocks.value(), 30);
  EXPECT_EQ(pool->pending_revocations(&early), 0);
  EXPECT_TRUE(
      absl::IsNotFound(pool->AckRevocation(&early, early.revocations.front())));
  // A new snapshot omits it.
  ASSERT_TRUE(pool->AddPageListener(&late,
                                    [&](auto pages) {
                                      snapshot.clear();
                                      for (const MappedPage& m : pages)
                                        snapshot.push_back(m.page);
                                    })
                  .ok());
  EXPECT_EQ(snapshot, (std::vector<PageId>{1}));
  EXPECT_EQ(pool->announced_pages(), 1);

  // A new page (page 0 went to the back of the FREE list): both hear of it.
  Alloc(*pool, 4, "");
  EXPECT_EQ(early.heard, (std::vector<PageId>{0, 1, 2}));
  EXPECT_EQ(late.heard, (std::vector<PageId>{2}));
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 6);
  pool->RemovePageListener(&early);
  pool->RemovePageListener(&late);
  Alloc(*pool, 4, "");  // page 3: nobody listens, nothing is exported
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 6);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST_F(PageHooksTest, APageThatCannotBeExportedIsNamedToEveryListener) {
  auto pool = MakePool(/*max_idle=*/0);
  RecordingListener a(pool.get()), b(pool.get());
  ASSERT_TRUE(pool->AddPageListener(&a, [](auto) {}).ok());
  ASSERT_TRUE(pool->AddPageListener(&b, [](auto) {}).ok());
  // Pages 0 and 1 are exported in order, device 0 then 1: the third export
  // is page 1's on device 0.
  backend_.AddFault(
      FaultRule{BackendOp::kExportHandle, FaultKind::kError, /*nth=*/3});
  const std::vector<BlockId> six = Alloc(*pool, 6, "");
  // The pool's own mapping stands: the caller holds its blocks.
  EXPECT_EQ(six.size(), 6u);
  for (RecordingListener* l : {&a, &b}) {
    EXPECT_EQ(l->heard, (std::vector<PageId>{0}));
    EXPECT_EQ(l->not_passed, (std::vector<PageId>{1}));
  }
  EXPECT_TRUE(pool->CheckInvariants().ok());
  pool->RemovePageListener(&a);
  pool->RemovePageListener(&b);
}

TEST_F(PageHooksTest, AnUnmapOfManyPagesIsRevokedInBoundedParts) {
  auto pool = MakePool(/*max_idle=*/0, /*export_at_map=*/false,
                       /*max_revocation_pages=*/2);
  RecordingListener l(pool.get());
  ASSERT_TRUE(pool->AddPageListener(&l, [](auto) {}).ok());
  const std::vector<BlockId> blocks = Alloc(*pool, 20, "");  // pages 0-4
  ASSERT_EQ(l.heard, (std::vector<PageId>{0, 1, 2, 3, 4}));
  Free(*pool, blocks);
  // Five pages, at most two a revocation.
  ASSERT_EQ(l.revocations.size(), 3u);
  EXPECT_EQ(l.revoked, (std::vector<PageId>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool->pending_revocations(&l), 3);
  EXPECT_EQ(pool->Capacity()->pages_revoking.value(), 5);
  // Each acknowledgement lands its own part.
  ASSERT_TRUE(pool->AckRevocation(&l, l.revocations[0]).ok());
  EXPECT_EQ(pool->Capacity()->pages_revoking.value(), 3);
  ASSERT_TRUE(pool->AckRevocation(&l, l.revocations[2]).ok());
  EXPECT_EQ(pool->Capacity()->pages_revoking.value(), 2);
  ASSERT_TRUE(pool->AckRevocation(&l, l.revocations[1]).ok());
  CapacitySnapshot c = *pool->Capacity();
  EXPECT_EQ(c.pages_revoking.value(), 0);
  EXPECT_EQ(c.available_blocks.value(), 32);
  EXPECT_EQ(pool->pending_revocations(&l), 0);
  EXPECT_TRUE(pool->CheckInvariants().ok());
  pool->RemovePageListener(&l);
}

TEST_F(PageHooksTest, ExportedFdsCloseWithTheirHandles) {
  auto pool = MakePool(/*max_idle=*/1);
  const int baseline = OpenFds();
  RecordingListener l(pool.get());
  ASSERT_TRUE(pool->AddPageListener(&l, [](auto) {}).ok());
  const std::vector<BlockId> twelve = Alloc(*pool, 12, "");  // pages 0-2
  // A memfd per handle (host backend) and its export.
  EXPECT_EQ(OpenFds(), baseline + 6 + 6);
  Free(*pool, twelve);  // one page stays IDLE, two are revoked
  EXPECT_EQ(OpenFds(), baseline + 6 + 6);
  ASSERT_EQ(l.revocations.size(), 1u);
  ASSERT_TRUE(pool->AckRevocation(&l, l.revocations[0]).ok());
  EXPECT_EQ(OpenFds(), baseline + 2 + 2);

  // A failed mapping rolls back: the pages it mapped never announced,
  // nothing exported survives.
  backend_.AddFault({BackendOp::kCreate, FaultKind::kOutOfMemory, /*nth=*/3,
                     /*device=*/1});
  AllocRequest a;
  a.num_blocks = 16;  // the IDLE page and 3 new ones; the third fails
  EXPECT_FALSE(pool->Alloc(a).ok());
  EXPECT_EQ(l.heard.size(), 3u);
  EXPECT_EQ(OpenFds(), baseline + 2 + 2);

  // Forced shutdown with blocks allocated and a page still revoking: the
  // listener is asked to let go of the mapped pages; everything it knows
  // stays until it leaves, then every fd closes.
  backend_.ClearFaults();
  const std::vector<BlockId> nine = Alloc(*pool, 9, "");  // IDLE + 2 new
  EXPECT_EQ(l.heard.size(), 5u);
  EXPECT_EQ(OpenFds(), baseline + 6 + 6);
  Free(*pool, {nine.begin(), nine.begin() + 4});  // kept IDLE
  Free(*pool, {nine.back()});                     // alone on its page: revoked
  EXPECT_EQ(pool->Capacity()->pages_revoking.value(), 1);
  EXPECT_EQ(OpenFds(), baseline + 6 + 6);
  EXPECT_TRUE(pool->Shutdown(/*force=*/true).ok());
  EXPECT_EQ(OpenFds(), baseline + 6 + 6);
  pool->RemovePageListener(&l);
  EXPECT_EQ(OpenFds(), baseline);
  EXPECT_EQ(backend_.live_handles(), 0);
}

TEST_F(PageHooksTest, ExportAtMapExportsWhenMappedAndNeverAgain) {
  auto pool = MakePool(/*max_idle=*/0, /*export_at_map=*/true);
  const int baseline = OpenFds();
  // Nobody listens, yet each handle is exported as its page maps.
  const std::vector<BlockId> six = Alloc(*pool, 6, "");  // pages 0 and 1
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 4);
  EXPECT_EQ(OpenFds(), baseline + 4 + 4);  // memfds and their exports
  // A listener's snapshot and later announcements lend those fds.
  RecordingListener l(pool.get());
  std::vector<PageId> snapshot;
  ASSERT_TRUE(pool->AddPageListener(&l,
                                    [&](auto pages) {
                                      for (const MappedPage& m : pages)
                                        snapshot.push_back(m.page);
                                    })
                  .ok());
  EXPECT_EQ(snapshot, (std::vector<PageId>{0, 1}));
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 4);
  const std::vector<BlockId> four = Alloc(*pool, 4, "");  // page 2
  EXPECT_EQ(l.heard, (std::vector<PageId>{2}));
  EXPECT_EQ(l.bad_fds, 0);
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 6);
  pool->RemovePageListener(&l);
  // Unmapped pages close their exports with their handles.
  Free(*pool, six);
  Free(*pool, four);
  EXPECT_EQ(pool->Capacity()->pages_free.value(), 8);
  EXPECT_EQ(OpenFds(), baseline);
  EXPECT_EQ(backend_.calls(BackendOp::kExportHandle), 6);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST_F(PageHooksTest, ShutdownRevokesWhatListenersMapAndReleasesAsTheyLetGo) {
  auto pool = MakePool(/*max_idle=*/0);
  RecordingListener a(pool.get()), b(pool.get());
  ASSERT_TRUE(pool->AddPageListener(&a, [](auto) {}).ok());
  ASSERT_TRUE(pool->AddPageListener(&b, [](auto) {}).ok());
  Alloc(*pool, 8, "");                                     // pages 0 and 1
  const std::vector<BlockId> third = Alloc(*pool, 4, "");  // page 2
  Free(*pool, third);  // page 2 revoking: its own revocation
  ASSERT_EQ(a.revocations.size(), 1u);
  const Bytes charged = budgets_.Snapshot(0).charged;
  ASSERT_EQ(backend_.live_handles(), 6);
  const int64_t ranges_freed = backend_.calls(BackendOp::kFreeRange);

  // A forced shutdown revokes pages 0 and 1 (one revocation, the usual
  // deadline), then tells each listener the pool is closed.
  EXPECT_TRUE(pool->Shutdown(/*force=*/true).ok());
  ASSERT_EQ(a.revocations.size(), 2u);
  EXPECT_EQ(a.revoked, (std::vector<PageId>{2, 0, 1}));
  EXPECT_EQ(a.deadlines[1], clock_.Now() + absl::Seconds(5));
  EXPECT_EQ(a.events,
            (std::vector<std::string>{"revoked", "revoked", "closed"}));
  EXPECT_EQ(b.events, a.events);
  EXPECT_EQ(GetReason(pool->Capacity().status()), FailureReason::kPoolNotFound);
  // Nobody joins a closed pool.
  RecordingListener late(pool.get());
  EXPECT_EQ(GetReason(pool->AddPageListener(&late, [](auto) {})),
            FailureReason::kPoolNotFound);

  // Nothing an engine may still map is unmapped: every handle is held and
  // charged, and the ranges stay reserved.
  EXPECT_EQ(backend_.live_handles(), 6);
  EXPECT_EQ(budgets_.Snapshot(0).charged, charged);
  EXPECT_EQ(pool->quarantined_pages(&a), 0);
  // Past the deadline they are quarantined, still held.
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(pool->quarantined_pages(&a), 3);
  EXPECT_EQ(pool->revocations_in_time(&a), 0);
  EXPECT_EQ(backend_.live_handles(), 6);

  // A acknowledges both; B still maps them.
  ASSERT_TRUE(pool->AckRevocation(&a, a.revocations[0]).ok());
  ASSERT_TRUE(pool->AckRevocation(&a, a.revocations[1]).ok());
  EXPECT_EQ(backend_.live_handles(), 6);
  // B acknowledges page 2's revocation: that page goes.
  ASSERT_TRUE(pool->AckRevocation(&b, b.revocations[0]).ok());
  EXPECT_EQ(backend_.live_handles(), 4);
  EXPECT_EQ(budgets_.Snapshot(0).charged, charged - MiB(2));
  EXPECT_EQ(backend_.calls(BackendOp::kFreeRange), ranges_freed);
  // B leaves: the rest goes, then the ranges.
  pool->RemovePageListener(&b);
  pool->RemovePageListener(&a);
  EXPECT_EQ(backend_.live_handles(), 0);
  EXPECT_EQ(budgets_.Snapshot(0).charged, charged - MiB(2) * 3);
  EXPECT_EQ(backend_.calls(BackendOp::kFreeRange), ranges_freed + 2);
  EXPECT_EQ(pool->backend_handles(), 0);
}

TEST_F(PageHooksTest, UnacknowledgedRevocationQuarantinesUntilTheListenerGoes) {
  auto pool = MakePool(/*max_idle=*/0);
  RecordingListener l(pool.get());
  ASSERT_TRUE(pool->AddPageListener(&l, [](auto) {}).ok());
  const std::vector<BlockId> four = Alloc(*pool, 4, "");  // page 0
  const Bytes charged = budgets_.Snapshot(0).charged;
  Free(*pool, four);
  ASSERT_EQ(l.deadlines.size(), 1u);
  EXPECT_EQ(l.deadlines[0], clock_.Now() + absl::Seconds(5));
  EXPECT_EQ(pool->quarantined_pages(&l), 0);

  clock_.Advance(absl::Seconds(6));
  CapacitySnapshot c = *pool->Capacity();
  EXPECT_EQ(c.pages_revoking.value(), 0);
  EXPECT_EQ(c.pages_quarantined.value(), 1);
  EXPECT_EQ(c.pages_free.value(), 7);
  EXPECT_EQ(c.available_blocks.value(), 28);
  EXPECT_EQ(pool->quarantined_pages(&l), 1);
  // Still charged: its memory has not gone back to the device.
  EXPECT_EQ(budgets_.Snapshot(0).charged, charged);
  // Not reused: the whole pool cannot be had, the rest can.
  AllocRequest all;
  all.num_blocks = 32;
  EXPECT_FALSE(pool->Alloc(all).ok());
  EXPECT_EQ(Alloc(*pool, 28, "").size(), 28u);
  EXPECT_EQ(pool->Capacity()->available_blocks.value(), 0);
  EXPECT_TRUE(pool->CheckInvariants().ok());

  // The listener leaves: the page is unmapped and FREE again.
  pool->RemovePageListener(&l);
  c = *pool->Capacity();
  EXPECT_EQ(c.pages_quarantined.value(), 0);
  EXPECT_EQ(c.pages_free.value(), 1);
  EXPECT_EQ(c.available_blocks.value(), 4);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvbroker
