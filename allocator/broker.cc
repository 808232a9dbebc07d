// Broker: the pool map and the background maintenance thread.

#include "allocator/broker.h"

#include <sys/random.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/failure.h"
#include "common/error_keys.h"

namespace kvbroker {
namespace {

// 128 random bits as 32 hex digits.
std::string NewPoolUid() {
  unsigned char bits[16];
  size_t got = 0;
  while (got < sizeof(bits)) {
    const ssize_t n = getrandom(bits + got, sizeof(bits) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof(bits)) {  // no getrandom(2): the C++ library's source
    std::random_device device;
    for (unsigned char& b : bits) b = static_cast<unsigned char>(device());
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bits), sizeof(bits)));
}

}  // namespace

Broker::Broker(Backend* backend, BrokerOptions options)
    : backend_(backend),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      budgets_(backend, options_.gpu_memory_utilization) {}

absl::StatusOr<std::unique_ptr<Broker>> Broker::Create(Backend* backend,
                                                       BrokerOptions options) {
  if (!(options.gpu_memory_utilization > 0 &&
        options.gpu_memory_utilization <= 1)) {
    return InvalidField("gpu_memory_utilization", "must be in (0, 1]");
  }
  if (options.min_idle_pages < 0 || options.max_idle_pages < 0) {
    return InvalidField("min_idle_pages", "must not be negative");
  }
  std::unique_ptr<Broker> broker(new Broker(backend, std::move(options)));
  KVB_RETURN_IF_ERROR(broker->budgets_.Init());
  if (broker->options_.start_worker) {
    broker->worker_ = std::thread([b = broker.get()] { b->WorkerLoop(); });
  }
  return broker;
}

Broker::~Broker() {
  StopWorker();
  std::map<std::string, std::shared_ptr<PagePool>> pools;
  {
    absl::MutexLock lock(&mu_);
    pools.swap(pools_);
  }
  for (auto& [name, pool] : pools) Retire(pool);
  std::vector<std::shared_ptr<PagePool>> orphans;
  {
    absl::MutexLock lock(&mu_);
    orphans.swap(orphans_);
  }
  // One last attempt; what still fails is logged as the pools go.
  for (auto& pool : orphans) (void)pool->ReleaseLeftovers();
}

bool Broker::Retire(const std::shared_ptr<PagePool>& pool) {
  if (pool->Shutdown(/*force=*/true).ok()) return true;
  std::fprintf(stderr,
               "kvbroker: pool %s: %lld backend handle(s) could not be "
               "released; retrying in the background\n",
               pool->name().c_str(),
               static_cast<long long>(pool->backend_handles()));
  absl::MutexLock lock(&mu_);
  orphans_.push_back(pool);
  return false;
}

int64_t Broker::orphaned_handles() {
  int64_t n = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& pool : orphans_) n += pool->backend_handles();
  return n;
}

void Broker::Notify(const std::string& pool) const {
  if (options_.on_change) options_.on_change(pool);
}

absl::StatusOr<std::shared_ptr<PagePool>> Broker::CreatePool(
    const PoolConfig& config, CapacitySnapshot* created_capacity) {
  {
    absl::MutexLock lock(&mu_);
    if (pools_.count(config.name) > 0) {
      return MakeFailure(FailureReason::kPoolAlreadyExists,
                         absl::StrCat("pool ", config.name, " already exists"),
                         {{std::string(error_key::kPool), config.name}});
    }
  }
  PoolOptions po;
  po.uid = NewPoolUid();
  {
    absl::MutexLock lock(&mu_);
    po.initial_generation =
        std::max(generation_floor_,
                 static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  }
  po.min_idle_pages = options_.min_idle_pages;
  po.max_idle_pages = options_.max_idle_pages;
  po.idempotency_window = options_.idempotency_window;
  po.revoke_timeout = options_.revoke_timeout;
  po.between_steps = options_.between_steps;
  po.free_one_step_blocks = options_.free_one_step_blocks;
  po.on_change = [this](const std::string& pool) { Notify(pool); };
  po.on_prealloc_needed = [this] { Kick(); };
  absl::StatusOr<std::unique_ptr<PagePool>> created =
      PagePool::Create(config, backend_, &budgets_, clock_, std::move(po));
  if (!created.ok()) return created.status();
  std::shared_ptr<PagePool> pool(std::move(*created));
  if (created_capacity != nullptr) {
    absl::StatusOr<CapacitySnapshot> capacity = pool->Capacity();
    if (!capacity.ok()) {
      Retire(pool);
      return capacity.status();
    }
    *created_capacity = *std::move(capacity);
  }
  bool inserted;
  {
    absl::MutexLock lock(&mu_);
    // A concurrent CreatePool of the same name may have won the race.
    inserted = pools_.emplace(config.name, pool).second;
  }
  if (!inserted) {
    Retire(pool);
    return MakeFailure(FailureReason::kPoolAlreadyExists,
                       absl::StrCat("pool ", config.name, " already exists"),
                       {{std::string(error_key::kPool), config.name}});
  }
  std::fprintf(stderr,
               "kvbroker: created pool %s: page %lld B, block %lld B, %lld "
               "blocks, %lld pages, %zu device(s)\n",
               config.name.c_str(),
               static_cast<long long>(config.page_size.value()),
               static_cast<long long>(config.block_bytes.value()),
               static_cast<long long>(config.max_blocks),
               static_cast<long long>(pool->geometry().page_count().value()),
               config.devices.size());
  Notify("");
  Kick();
  return pool;
}

absl::StatusOr<std::shared_ptr<PagePool>> Broker::GetPool(
    const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(name);
  if (it == pools_.end()) {
    return MakeFailure(FailureReason::kPoolNotFound,
                       absl::StrCat("no pool named ", name),
                       {{std::string(error_key::kPool), name}});
  }
  return it->second;
}

std::vector<std::shared_ptr<PagePool>> Broker::ListPools() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<PagePool>> out;
  for (auto& [name, pool] : pools_) out.push_back(pool);
  return out;
}

absl::Status Broker::DeletePool(const std::string& name, bool force) {
  absl::StatusOr<std::shared_ptr<PagePool>> pool = GetPool(name);
  if (!pool.ok()) return pool.status();
  absl::Status s = (*pool)->Shutdown(force);
  if (GetReason(s) == FailureReason::kPoolNotEmpty) return s;
  const uint64_t final_generation = (*pool)->generation();
  {
    absl::MutexLock lock(&mu_);
    auto it = pools_.find(name);
    if (it != pools_.end() && it->second == *pool) pools_.erase(it);
    generation_floor_ = std::max(generation_floor_, final_generation + 1);
    if (!s.ok()) orphans_.push_back(*pool);
  }
  if (s.ok()) {
    std::fprintf(stderr, "kvbroker: deleted pool %s\n", name.c_str());
  } else {
    std::fprintf(stderr,
                 "kvbroker: deleted pool %s; %lld backend handle(s) could not "
                 "be released, retrying in the background\n",
                 name.c_str(),
                 static_cast<long long>((*pool)->backend_handles()));
  }
  Notify("");
  return absl::OkStatus();
}

bool Broker::healthy() {
  for (const auto& pool : ListPools()) {
    if (pool->device_lost()) return false;
  }
  return true;
}

void Broker::Kick() {
  absl::MutexLock lock(&worker_mu_);
  kicked_ = true;
}

void Broker::StopWorker() {
  {
    absl::MutexLock lock(&worker_mu_);
    stop_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

void Broker::RunMaintenance() {
  std::vector<std::shared_ptr<PagePool>> orphans;
  {
    absl::MutexLock lock(&mu_);
    orphans = orphans_;
  }
  for (const auto& pool : orphans) {
    if (pool->ReleaseLeftovers() > 0) continue;
    std::fprintf(stderr,
                 "kvbroker: released the last handles of deleted pool %s\n",
                 pool->name().c_str());
    absl::MutexLock lock(&mu_);
    orphans_.erase(std::remove(orphans_.begin(), orphans_.end(), pool),
                   orphans_.end());
  }
  for (const auto& pool : ListPools()) {
    pool->ExpireReservations();
    while (pool->PreallocStep()) {
    }
  }
}

void Broker::WorkerLoop() {
  for (;;) {
    bool refresh = false;
    {
      absl::MutexLock lock(&worker_mu_);
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(worker_mu_) {
        return stop_ || kicked_;
      };
      worker_mu_.AwaitWithTimeout(absl::Condition(&wake),
                                  options_.worker_interval);
      if (stop_) return;
      kicked_ = false;
      const absl::Time now = absl::Now();
      if (now - last_refresh_ >= options_.budget_refresh_interval) {
        last_refresh_ = now;
        refresh = true;
      }
    }
    if (refresh) (void)budgets_.RefreshAll();
    RunMaintenance();
  }
}

}  // namespace kvbroker
