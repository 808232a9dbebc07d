// Tests of the per-device physical budget (docs/design.md, "Capacity";
// scenarios P1-P3): headroom, saturation, the minimum over devices, exact
// own-use charging and the refresh of other processes' use.

#include "allocator/device_budget.h"

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

const Bytes kBundle = MiB(2 * 32 * 2);  // P = 2 MiB, L = 32, K = 2

HostBackendOptions Devices(int n, Bytes total = Bytes(80 * kGiB)) {
  HostBackendOptions o;
  o.device_count = n;
  o.device_total = total;
  return o;
}

// Leaves `free` bytes of `device` to the broker.
void LeaveFree(HostBackend& host, int device, Bytes free) {
  host.SetExternalUse(device, Bytes(80 * kGiB) - free);
}

TEST(DeviceBudgetsTest, P1_HeadroomIsFivePercentOfTotal) {
  HostBackend host(Devices(1));
  LeaveFree(host, 0, Bytes(10 * kGiB));
  DeviceBudgets budgets(&host, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, kBundle), 48);
  DeviceBudgetSnapshot s = budgets.Snapshot(0);
  EXPECT_EQ(s.device, 0);
  EXPECT_EQ(s.total, Bytes(80 * kGiB));
  EXPECT_EQ(s.driver_free, Bytes(10 * kGiB));
  EXPECT_EQ(s.headroom, Bytes(4 * kGiB));
  EXPECT_EQ(s.charged, Bytes(0));
  EXPECT_EQ(s.budget, Bytes(6 * kGiB));
  EXPECT_EQ(s.refreshes, 1);
  EXPECT_DOUBLE_EQ(budgets.gpu_memory_utilization(), 0.95);
  EXPECT_EQ(budgets.device_count(), 1);
}

TEST(DeviceBudgetsTest, P2_BudgetSaturatesAtZero) {
  HostBackend host(Devices(1));
  LeaveFree(host, 0, Bytes(3 * kGiB));
  DeviceBudgets budgets(&host, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, kBundle), 0);
  EXPECT_EQ(budgets.Snapshot(0).budget, Bytes(0));
  // Nothing can be charged, not even one byte's worth.
  EXPECT_FALSE(budgets.TryCharge({0}, Bytes(1), 1));
}

TEST(DeviceBudgetsTest, P3_MinimumOverThePoolsDevices) {
  HostBackend host(Devices(2));
  const Bytes headroom(4 * kGiB);
  // Device 0 affords 10 bundles, device 1 affords 2 (plus a partial bundle
  // that must not count).
  LeaveFree(host, 0, headroom + kBundle * 10);
  LeaveFree(host, 1, headroom + kBundle * 2 + (kBundle - Bytes(1)));
  DeviceBudgets budgets(&host, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({0, 1}, kBundle), 2);
  EXPECT_EQ(budgets.AffordableBundles({1, 0}, kBundle), 2);
  EXPECT_EQ(budgets.AffordableBundles({0}, kBundle), 10);
  EXPECT_EQ(budgets.AffordableBundles({1}, kBundle), 2);
}

TEST(DeviceBudgetsTest, NoDevicesAffordNothing) {
  HostBackend host(Devices(1));
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({}, kBundle), 0);
}

TEST(DeviceBudgetsTest, FullUtilizationHasNoHeadroom) {
  HostBackend host(Devices(1, MiB(64)));
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.Snapshot(0).headroom, Bytes(0));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 32);
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(3)), 21);  // floor
}

TEST(DeviceBudgetsTest, ChargingIsExactAndNeedsNoDriverCall) {
  HostBackend host(Devices(1, MiB(20)));
  FaultInjectingBackend counted(&host);
  DeviceBudgets budgets(&counted, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  const int64_t queries = counted.calls(BackendOp::kQueryMemory);
  EXPECT_EQ(queries, 1);

  EXPECT_TRUE(budgets.TryCharge({0}, MiB(2), 3));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 7);
  EXPECT_EQ(budgets.Snapshot(0).charged, MiB(6));
  EXPECT_EQ(budgets.Snapshot(0).budget, MiB(14));
  // Charging more than the budget charges nothing.
  EXPECT_FALSE(budgets.TryCharge({0}, MiB(2), 8));
  EXPECT_EQ(budgets.Snapshot(0).charged, MiB(6));
  EXPECT_TRUE(budgets.TryCharge({0}, MiB(2), 7));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 0);
  budgets.Uncharge({0}, MiB(2), 10);
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 10);
  EXPECT_EQ(budgets.Snapshot(0).charged, Bytes(0));
  // A zero-count charge always succeeds and changes nothing.
  EXPECT_TRUE(budgets.TryCharge({0}, MiB(2), 0));
  EXPECT_EQ(budgets.Snapshot(0).charged, Bytes(0));

  EXPECT_EQ(counted.calls(BackendOp::kQueryMemory), queries);
}

TEST(DeviceBudgetsTest, ChargeIsAllDevicesOrNone) {
  HostBackend host(Devices(2, MiB(20)));
  host.SetExternalUse(1, MiB(16));  // device 1 affords 2 bundles of 2 MiB
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_FALSE(budgets.TryCharge({0, 1}, MiB(2), 3));
  EXPECT_EQ(budgets.Snapshot(0).charged, Bytes(0));
  EXPECT_EQ(budgets.Snapshot(1).charged, Bytes(0));
  EXPECT_TRUE(budgets.TryCharge({0, 1}, MiB(2), 2));
  EXPECT_EQ(budgets.Snapshot(0).charged, MiB(4));
  EXPECT_EQ(budgets.Snapshot(1).charged, MiB(4));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 8);
  EXPECT_EQ(budgets.AffordableBundles({0, 1}, MiB(2)), 0);
}

TEST(DeviceBudgetsTest, OtherProcessesAreSeenOnRefresh) {
  HostBackend host(Devices(1, MiB(20)));
  FaultInjectingBackend counted(&host);
  DeviceBudgets budgets(&counted, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 10);

  host.SetExternalUse(0, MiB(15));
  // The cached view stands until a refresh: no driver call per query.
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 10);
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 2);
  EXPECT_EQ(budgets.Snapshot(0).refreshes, 2);

  host.SetExternalUse(0, Bytes(0));
  ASSERT_TRUE(budgets.RefreshAll().ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 10);
  EXPECT_EQ(counted.calls(BackendOp::kQueryMemory), 3);
}

TEST(DeviceBudgetsTest, OwnMemoryIsCountedOnceAcrossRefreshes) {
  // A pool charges, then creates; the driver then sees the bytes as used.
  // Before and after a refresh the budget is the same: counted once.
  HostBackend host(Devices(1, MiB(20)));
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  ASSERT_TRUE(budgets.TryCharge({0}, MiB(2), 3));
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 3; ++i) {
    budgets.CreateStarting(0, MiB(2));
    absl::StatusOr<PhysicalHandle> h = host.Create(0, MiB(2));
    ASSERT_TRUE(h.ok()) << h.status();
    budgets.CreateFinished(0, MiB(2), true);
    handles.push_back(*h);
  }
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 7);
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.Snapshot(0).driver_free, MiB(14));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 7);

  // Release, then uncharge: the budget returns, refreshed or not.
  for (PhysicalHandle h : handles) {
    const Bytes taken = budgets.ReleaseStarting(0, MiB(2));
    EXPECT_EQ(taken, MiB(2));
    ASSERT_TRUE(host.Release(0, h).ok());
    budgets.ReleaseFinished(0, taken, true);
  }
  budgets.Uncharge({0}, MiB(2), 3);
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 10);
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 10);
}

// A refresh at every step of a page's life: charged, being created,
// created, being released, released, uncharged. The budget is the same
// before and after each refresh; while a create or release is under way
// the refresh errs on the small side and the next quiet one is exact.
TEST(DeviceBudgetsTest, RefreshAtEveryStepOfAPageIsExact) {
  HostBackend host(Devices(1, MiB(20)));
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  auto affordable_across_refresh = [&] {
    const int64_t before = budgets.AffordableBundles({0}, MiB(2));
    EXPECT_TRUE(budgets.Refresh(0).ok());
    EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), before);
    return before;
  };
  EXPECT_EQ(affordable_across_refresh(), 10);
  // Charged, not created: the driver does not see it, the charge does.
  ASSERT_TRUE(budgets.TryCharge({0}, MiB(2), 1));
  EXPECT_EQ(affordable_across_refresh(), 9);
  EXPECT_EQ(budgets.Snapshot(0).external, Bytes(0));
  // The create returned but is not yet reported: the driver sees the page,
  // and the refresh cannot tell it from another process's.
  budgets.CreateStarting(0, MiB(2));
  absl::StatusOr<PhysicalHandle> h = host.Create(0, MiB(2));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 8);
  budgets.CreateFinished(0, MiB(2), true);
  EXPECT_EQ(budgets.Snapshot(0).created, MiB(2));
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(affordable_across_refresh(), 9);
  // A release under way: the charge still holds the page, and a refresh
  // that cannot tell whether the driver let it go yet counts it as gone
  // from the broker but still on the device (one bundle too strict).
  const Bytes taken = budgets.ReleaseStarting(0, MiB(2));
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 8);
  ASSERT_TRUE(host.Release(0, *h).ok());
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 9);
  budgets.ReleaseFinished(0, taken, true);
  EXPECT_EQ(affordable_across_refresh(), 9);  // still charged
  budgets.Uncharge({0}, MiB(2), 1);
  EXPECT_EQ(affordable_across_refresh(), 10);
  EXPECT_EQ(budgets.Snapshot(0).created, Bytes(0));
}

// A release the broker does not count (a handle released already, released
// again) changes nothing, whether the backend accepts it or not.
TEST(DeviceBudgetsTest, ReleaseOfAnUncountedHandleChangesNothing) {
  HostBackend host(Devices(1, MiB(20)));
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  budgets.CreateStarting(0, MiB(2));
  budgets.CreateFinished(0, MiB(2), true);
  const Bytes first = budgets.ReleaseStarting(0, MiB(2));
  budgets.ReleaseFinished(0, first, true);
  const Bytes again = budgets.ReleaseStarting(0, MiB(2));
  EXPECT_EQ(again, Bytes(0));
  budgets.ReleaseFinished(0, again, false);
  EXPECT_EQ(budgets.Snapshot(0).created, Bytes(0));
  // A failed release of a counted handle puts it back.
  budgets.CreateStarting(0, MiB(2));
  budgets.CreateFinished(0, MiB(2), true);
  const Bytes taken = budgets.ReleaseStarting(0, MiB(2));
  EXPECT_EQ(budgets.Snapshot(0).created, Bytes(0));
  budgets.ReleaseFinished(0, taken, false);
  EXPECT_EQ(budgets.Snapshot(0).created, MiB(2));
}

// Runs `during` inside the next `times` QueryMemory calls, before they read
// the device: what another thread would do while a refresh asks the driver.
// Counts the queries; forwards everything else.
class QueryHookBackend final : public Backend {
 public:
  explicit QueryHookBackend(Backend* target) : t_(target) {}
  void Hook(int times, std::function<void()> during) {
    times_ = times;
    during_ = std::move(during);
  }
  int queries() const { return queries_; }

  std::string name() const override { return t_->name(); }
  int device_count() const override { return t_->device_count(); }
  Bytes granularity(int d) const override { return t_->granularity(d); }
  absl::StatusOr<VirtualRange> ReserveRange(int d, Bytes size) override {
    return t_->ReserveRange(d, size);
  }
  absl::Status FreeRange(int d, VirtualRange r) override {
    return t_->FreeRange(d, r);
  }
  absl::StatusOr<PhysicalHandle> Create(int d, Bytes size) override {
    return t_->Create(d, size);
  }
  absl::Status Map(int d, uint64_t a, Bytes size, PhysicalHandle h) override {
    return t_->Map(d, a, size, h);
  }
  absl::Status SetAccess(int d, uint64_t a, Bytes size) override {
    return t_->SetAccess(d, a, size);
  }
  absl::Status Unmap(int d, uint64_t a, Bytes size) override {
    return t_->Unmap(d, a, size);
  }
  absl::Status Release(int d, PhysicalHandle h) override {
    return t_->Release(d, h);
  }
  absl::StatusOr<MemoryInfo> QueryMemory(int device) override {
    ++queries_;
    if (times_ > 0) {
      --times_;
      during_();
    }
    return t_->QueryMemory(device);
  }

 private:
  Backend* const t_;
  int times_ = 0;
  int queries_ = 0;
  std::function<void()> during_;
};

TEST(DeviceBudgetsTest, CreateDuringTheQueryIsRetried) {
  HostBackend host(Devices(1, MiB(20)));
  QueryHookBackend hooked(&host);
  DeviceBudgets budgets(&hooked, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  ASSERT_TRUE(budgets.TryCharge({0}, MiB(2), 1));
  hooked.Hook(1, [&] {
    budgets.CreateStarting(0, MiB(2));
    ASSERT_TRUE(host.Create(0, MiB(2)).ok());
    budgets.CreateFinished(0, MiB(2), true);
  });
  const int64_t queries = hooked.queries();
  ASSERT_TRUE(budgets.Refresh(0).ok());
  // The first answer could not be placed against `created`; the second is.
  EXPECT_EQ(hooked.queries(), queries + 2);
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 9);
  EXPECT_EQ(budgets.Snapshot(0).external, Bytes(0));
}

TEST(DeviceBudgetsTest, CreatesDuringEveryAttemptErrOnTheSmallSide) {
  HostBackend host(Devices(1, MiB(20)));
  QueryHookBackend hooked(&host);
  DeviceBudgets budgets(&hooked, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  ASSERT_TRUE(budgets.TryCharge({0}, MiB(2), 3));
  hooked.Hook(3, [&] {
    budgets.CreateStarting(0, MiB(2));
    ASSERT_TRUE(host.Create(0, MiB(2)).ok());
    budgets.CreateFinished(0, MiB(2), true);
  });
  const int64_t queries = hooked.queries();
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(hooked.queries(), queries + 3);
  // The last query saw 3 pages, of which only the 2 created before it are
  // known for sure: the third counts as another process's until the next
  // refresh. Too small by one bundle, never too large.
  EXPECT_EQ(budgets.Snapshot(0).external, MiB(2));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 6);
  ASSERT_TRUE(budgets.Refresh(0).ok());
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 7);
}

TEST(DeviceBudgetsTest, ExternalUseBeyondTotalSaturates) {
  HostBackend host(Devices(1, MiB(20)));
  host.SetExternalUse(0, MiB(30));
  DeviceBudgets budgets(&host, 1.0);
  ASSERT_TRUE(budgets.Init().ok());
  EXPECT_EQ(budgets.Snapshot(0).driver_free, Bytes(0));
  EXPECT_EQ(budgets.Snapshot(0).budget, Bytes(0));
  EXPECT_EQ(budgets.AffordableBundles({0}, MiB(2)), 0);
}

TEST(DeviceBudgetsTest, QueryErrorsAreReturned) {
  HostBackend host(Devices(2));
  FaultInjectingBackend faulty(&host);
  faulty.AddFault({BackendOp::kQueryMemory, FaultKind::kFatal, 1, 1});
  DeviceBudgets budgets(&faulty, 0.95);
  absl::Status s = budgets.Init();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  // Device 0 was still read; device 1 reads on the next refresh.
  EXPECT_EQ(budgets.Snapshot(0).refreshes, 1);
  EXPECT_EQ(budgets.Snapshot(1).refreshes, 0);
  EXPECT_TRUE(budgets.Refresh(1).ok());
  EXPECT_EQ(budgets.Snapshot(1).refreshes, 1);
}


// Readers take no lock: each read is the figures at the end of one change.
// While one thread charges and uncharges bundles on two devices in turn,
// every read of a device shows charged + budget == what the device offers
// and a charge that is a whole number of bundles, never a torn mix of two
// changes.
TEST(DeviceBudgetsTest, ReadsWithoutTheLockAreWholeChanges) {
  HostBackend host(Devices(2));
  LeaveFree(host, 0, Bytes(10 * kGiB));
  LeaveFree(host, 1, Bytes(10 * kGiB));
  DeviceBudgets budgets(&host, 0.95);
  ASSERT_TRUE(budgets.Init().ok());
  const Bytes offered = budgets.Snapshot(0).budget;  // 6 GiB, as in P1
  ASSERT_EQ(offered, Bytes(6 * kGiB));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) {
      ASSERT_TRUE(budgets.TryCharge({0, 1}, kBundle, 1 + i % 7));
      budgets.CreateStarting(i % 2, kBundle);
      budgets.CreateFinished(i % 2, kBundle, true);
      const Bytes taken = budgets.ReleaseStarting(i % 2, kBundle);
      budgets.ReleaseFinished(i % 2, taken, true);
      budgets.Uncharge({0, 1}, kBundle, 1 + i % 7);
    }
    stop = true;
  });
  bool last = false;
  do {
    last = stop.load();
    for (int d = 0; d < 2; ++d) {
      const DeviceBudgetSnapshot s = budgets.Snapshot(d);
      ASSERT_EQ(s.charged + s.budget, offered);
      ASSERT_EQ(s.charged.value() % kBundle.value(), 0);
      ASSERT_LE(s.created, kBundle);
    }
    const int64_t n = budgets.AffordableBundles({0, 1}, kBundle);
    ASSERT_GE(n, 48 - 7);
    ASSERT_LE(n, 48);
  } while (!last);
  writer.join();
  EXPECT_EQ(budgets.Snapshot(0).charged, Bytes(0));
  EXPECT_EQ(budgets.Snapshot(1).charged, Bytes(0));
  EXPECT_EQ(budgets.AffordableBundles({0, 1}, kBundle), 48);
}

}  // namespace
}  // namespace kvbroker
