// Broker: every pool of one daemon, the device budgets they share, and the
// background worker that keeps them tidy.
//
// The broker owns the DeviceBudgets of its backend and a map of pools by
// name. Its background thread (when started):
//   - runs each pool's prealloc step until it has min_idle_pages IDLE pages
//     or the budget runs out (mapping never happens on a caller's thread for
//     prealloc, and never with the pool lock held);
//   - expires reservations;
//   - refreshes the driver's view of device memory every
//     `budget_refresh_interval`.
// It wakes on a Kick() (a pool kicks it when a call left it below
// min_idle_pages with pages to map) or on its interval.
//
// Incarnations (SPEC 5): every CreatePool gives the pool a new `uid`, 128
// random bits in hex, so a caller holding blocks of an earlier pool of the
// same name (deleted and re-created, or from before a daemon restart) can be
// told apart. Generations never repeat across incarnations of a name: a new
// pool starts at max(realtime clock in nanoseconds, 1 + the last generation
// of every pool this broker deleted). Within a process the second term
// guarantees it; across restarts the first does, because a pool's
// generation advances by one per state change, and no state change takes
// less than a nanosecond, so an incarnation created at time t has a
// generation at most the time now (a realtime clock stepped backwards
// across a restart by more than the pools' lifetime is the one exception).
//
// Orphans: a pool whose shutdown could not unmap or release every page
// (the backend failed) is deleted all the same, by name, but its handles
// are not forgotten: the pool object, shut down and holding them, moves to
// the broker's orphans. Each maintenance pass retries their release; their
// pages stay charged to the device budgets until it succeeds, and
// orphaned_handles() (the metric kvbroker_orphaned_handles) counts what is
// still held. The destructor tries once more and logs what remains.
//
// Thread safety: thread-safe. The broker's lock guards only the pool map and
// is never held while calling into a pool.

#ifndef KVBROKER_ALLOCATOR_BROKER_H_
#define KVBROKER_ALLOCATOR_BROKER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/backend.h"
#include "allocator/clock.h"
#include "allocator/device_budget.h"
#include "allocator/page_pool.h"

namespace kvbroker {

struct BrokerOptions {
  double gpu_memory_utilization = 0.95;
  int64_t min_idle_pages = 5;
  int64_t max_idle_pages = 10;
  absl::Duration budget_refresh_interval = absl::Seconds(1);
  absl::Duration worker_interval = absl::Milliseconds(100);
  // Tests that drive prealloc by hand leave the worker off.
  bool start_worker = true;
  Clock* clock = nullptr;  // nullptr: Clock::Real()
  absl::Duration idempotency_window = absl::Minutes(10);
  // PoolOptions::revoke_timeout of every pool.
  absl::Duration revoke_timeout = absl::Seconds(10);
  // For tests: PoolOptions::between_steps and ::free_one_step_blocks of
  // every pool.
  std::function<void()> between_steps;
  int64_t free_one_step_blocks = PoolOptions{}.free_one_step_blocks;
  // Called (no lock held) whenever a pool's generation changes, and with ""
  // when the set of pools changes.
  std::function<void(const std::string& pool)> on_change;
};

class Broker {
 public:
  // `backend` must outlive the broker.
  // Errors: the first device memory query's error.
  static absl::StatusOr<std::unique_ptr<Broker>> Create(Backend* backend,
                                                        BrokerOptions options);
  // Stops the worker and releases every pool.
  ~Broker();

  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // Errors: those of PagePool::Create; POOL_ALREADY_EXISTS. With
  // `created`, fills it with the new pool's capacity as of its creation,
  // taken before any other caller can see the pool: a DeletePool that wins
  // the race to the reply cannot turn a successful creation into
  // POOL_NOT_FOUND.
  absl::StatusOr<std::shared_ptr<PagePool>> CreatePool(
      const PoolConfig& config, CapacitySnapshot* created = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: POOL_NOT_FOUND.
  absl::StatusOr<std::shared_ptr<PagePool>> GetPool(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<PagePool>> ListPools() ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: POOL_NOT_FOUND; POOL_NOT_EMPTY unless `force`. A forced delete
  // whose unmaps or releases fail succeeds; the pool becomes an orphan.
  absl::Status DeletePool(const std::string& name, bool force)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Backend handles held by deleted pools, waiting to be released.
  int64_t orphaned_handles() ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes the background worker.
  void Kick() ABSL_LOCKS_EXCLUDED(worker_mu_);
  // One pass of the worker's job over every pool (tests call it directly).
  void RunMaintenance() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the worker thread (idempotent).
  void StopWorker() ABSL_LOCKS_EXCLUDED(worker_mu_);

  Backend* backend() const { return backend_; }
  DeviceBudgets* budgets() { return &budgets_; }
  const BrokerOptions& options() const { return options_; }
  Clock* clock() const { return clock_; }
  // False once the backend reported a fatal device error to any pool. A
  // pool that failed for its own reasons (a rollback that could not finish)
  // is FAILED alone: the daemon keeps serving the others.
  bool healthy() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Broker(Backend* backend, BrokerOptions options);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(worker_mu_);
  void Notify(const std::string& pool) const;
  // Shuts `pool` down (force); an orphan when handles remain. True when
  // everything was released.
  bool Retire(const std::shared_ptr<PagePool>& pool) ABSL_LOCKS_EXCLUDED(mu_);

  Backend* const backend_;
  const BrokerOptions options_;
  Clock* const clock_;
  DeviceBudgets budgets_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<PagePool>> pools_ ABSL_GUARDED_BY(mu_);
  // 1 + the highest final generation of a pool deleted so far: the least
  // generation a new pool may start at.
  uint64_t generation_floor_ ABSL_GUARDED_BY(mu_) = 1;
  // Deleted pools still holding backend handles (see "Orphans" above).
  std::vector<std::shared_ptr<PagePool>> orphans_ ABSL_GUARDED_BY(mu_);

  absl::Mutex worker_mu_;
  bool stop_ ABSL_GUARDED_BY(worker_mu_) = false;
  bool kicked_ ABSL_GUARDED_BY(worker_mu_) = false;
  absl::Time last_refresh_ ABSL_GUARDED_BY(worker_mu_);
  std::thread worker_;
};

}  // namespace kvbroker

#endif  // KVBROKER_ALLOCATOR_BROKER_H_
