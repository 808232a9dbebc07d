// ChangeFeed: one flag on the hot path, snapshots on the notifier thread;
// see change_feed.h.

#include "server/change_feed.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "common/error_keys.h"
#include "server/proto_convert.h"

namespace kvbroker {

ChangeFeed::ChangeFeed(Options options) : options_(options) {
  if (options_.start_notifier)
    notifier_ = std::thread([this] { NotifierLoop(); });
}

ChangeFeed::~ChangeFeed() {
  Close();
  if (!notifier_.joinable()) return;
  // The last owner may be a subscriber released by the notifier itself.
  if (notifier_.get_id() == std::this_thread::get_id()) {
    notifier_.detach();
  } else {
    notifier_.join();
  }
}

absl::Status ChangeFeed::Subscribe(Watch watch,
                                   std::weak_ptr<Subscriber> subscriber) {
  std::shared_ptr<Subscriber> s = subscriber.lock();
  if (s == nullptr) return InvalidField("subscriber", "already gone");
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the server is shutting down");
  int& held = callers_[watch.caller];
  if (held >= options_.max_watches_per_caller) {
    if (held == 0) callers_.erase(watch.caller);
    return MakeFailure(
        FailureReason::kInvalidArgument,
        absl::StrCat("pool: caller \"", watch.caller, "\" already holds ", held,
                     " WatchCapacity streams, the most one caller may ",
                     "hold (--max_watches_per_caller)"),
        {{std::string(error_key::kField), std::string(error_key::kPool)},
         {std::string(error_key::kCaller), watch.caller},
         {std::string(error_key::kMaxWatchesPerCaller),
          Num(options_.max_watches_per_caller)}},
        {{std::string(error_key::kPool),
          absl::StrCat("at most ", options_.max_watches_per_caller,
                       " WatchCapacity streams per caller")}});
  }
  ++held;
  const std::string name = watch.pool->name();
  names_[s.get()] = name;
  pools_[name].entries[s.get()] =
      Entry{std::move(watch), std::move(subscriber), std::nullopt};
  MarkChangedLocked();
  unoffered_ = true;
  if (notifier_pacing_) wake_.Signal();
  count_.store(static_cast<int>(names_.size()));
  return absl::OkStatus();
}

void ChangeFeed::Unsubscribe(const Subscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  auto name = names_.find(subscriber);
  if (name == names_.end()) return;
  auto pool = pools_.find(name->second);
  auto entry = pool->second.entries.find(subscriber);
  auto caller = callers_.find(entry->second.watch.caller);
  if (--caller->second == 0) callers_.erase(caller);
  pool->second.entries.erase(entry);
  if (pool->second.entries.empty()) pools_.erase(pool);
  names_.erase(name);
  count_.store(static_cast<int>(names_.size()));
}

void ChangeFeed::Publish(const std::string& pool) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  if (!pool.empty()) {
    // Between two passes only the first change takes the lock (to wake
    // the notifier); the pass finds which pools changed by their
    // generations.
    if (changed_.exchange(true, std::memory_order_acq_rel)) return;
    absl::MutexLock lock(&mu_);
    if (notifier_idle_) wake_.Signal();
    return;
  }
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  every_pool_ = true;  // a pool may be gone: read every one
  MarkChangedLocked();
}

void ChangeFeed::MarkChangedLocked() {
  const bool was_clean = !changed_.exchange(true, std::memory_order_acq_rel);
  if (was_clean && notifier_idle_) wake_.Signal();
}

ChangeFeed::PassStats ChangeFeed::NotifyPass() { return Pass(false); }

ChangeFeed::PassStats ChangeFeed::NotifyFirsts() { return Pass(true); }

ChangeFeed::PassStats ChangeFeed::Pass(bool firsts_only) {
  absl::MutexLock pass(&pass_mu_);
  struct Target {
    const Subscriber* key;
    std::shared_ptr<Subscriber> subscriber;
    std::shared_ptr<PagePool> pool;
    int64_t max_pages;
    std::optional<uint64_t> offered;
  };
  std::vector<Target> targets;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return {};
    auto add = [&](const Subscriber* key, const Entry& entry) {
      if (std::shared_ptr<Subscriber> s = entry.subscriber.lock()) {
        targets.push_back({key, std::move(s), entry.watch.pool,
                           entry.watch.max_pages, entry.offered});
      }
    };
    if (firsts_only) {
      // changed_ stays up for the next full pass.
      unoffered_ = false;
      for (const auto& [name, watched] : pools_) {
        for (const auto& [key, entry] : watched.entries) {
          if (!entry.offered.has_value()) add(key, entry);
        }
      }
    } else {
      // Taken before the pools are read: a change after this is seen by
      // the next pass.
      changed_.exchange(false, std::memory_order_acq_rel);
      const bool every = every_pool_;
      every_pool_ = false;
      for (const auto& [name, watched] : pools_) {
        std::optional<uint64_t> generation;
        for (const auto& [key, entry] : watched.entries) {
          if (!every && entry.offered.has_value()) {
            if (!generation) generation = entry.watch.pool->generation();
            if (*entry.offered == *generation) continue;
          }
          add(key, entry);
        }
      }
      unoffered_ = false;  // every new subscription is taken
    }
  }
  // One snapshot per (pool incarnation, length) in this pass.
  std::map<std::pair<const PagePool*, int64_t>, absl::StatusOr<Snapshot>> built;
  int offered = 0, first_offered = 0;
  for (Target& t : targets) {
    auto [it, fresh] = built.try_emplace({t.pool.get(), t.max_pages},
                                         absl::UnknownError("unbuilt"));
    if (fresh) {
      absl::StatusOr<CapacitySnapshot> capacity =
          t.pool->Capacity(CapacityQuery{t.max_pages});
      if (capacity.ok()) {
        auto message = std::make_shared<v1::WatchCapacityResponse>();
        ToProto(*capacity, message->mutable_capacity());
        it->second = Snapshot(std::move(message));
      } else {
        it->second = capacity.status();
      }
    }
    const absl::StatusOr<Snapshot>& snapshot = it->second;
    if (!snapshot.ok()) {
      t.subscriber->OnEnd(snapshot.status());
      continue;
    }
    const uint64_t generation = (*snapshot)->capacity().generation();
    if (t.offered == generation) continue;
    if (!t.offered.has_value()) ++first_offered;
    t.offered = generation;
    t.subscriber->OnSnapshot(*snapshot);
    ++offered;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const Target& t : targets) {
      auto name = names_.find(t.key);
      if (name == names_.end()) continue;
      auto& entries = pools_.at(name->second).entries;
      auto entry = entries.find(t.key);
      // The same subscriber still (not a new one at a reused address).
      if (entry->second.subscriber.lock() == t.subscriber) {
        entry->second.offered = t.offered;
      }
    }
  }
  return {static_cast<int>(built.size()), offered, first_offered};
}

void ChangeFeed::NotifierLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      notifier_idle_ = true;
      while (!closed_ && !changed_.load(std::memory_order_acquire)) {
        wake_.Wait(&mu_);
      }
      notifier_idle_ = false;
      if (closed_) return;
    }
    const absl::Time start = absl::Now();
    const PassStats pass = NotifyPass();
    absl::Duration pause = options_.min_interval;
    if (options_.max_offers_per_second > 0) {
      // A subscription's first snapshot is not paced (see the file
      // comment).
      pause =
          std::max(pause, absl::Seconds((pass.offered - pass.first_offered) /
                                        options_.max_offers_per_second));
    }
    // Changes that arrive meanwhile wait for the next pass: coalesced. A
    // new subscription is served its first snapshot at once, in a pass of
    // first snapshots only; Close ends the wait.
    for (;;) {
      bool firsts = false;
      {
        absl::MutexLock lock(&mu_);
        notifier_pacing_ = true;
        while (!closed_ && !unoffered_) {
          if (wake_.WaitWithDeadline(&mu_, start + pause)) break;
        }
        notifier_pacing_ = false;
        if (closed_) return;
        firsts = unoffered_;
      }
      if (!firsts) break;  // the pause is over
      Pass(true);
    }
  }
}

void ChangeFeed::Close() {
  std::vector<std::shared_ptr<Subscriber>> targets;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    wake_.SignalAll();
    for (const auto& [name, watched] : pools_) {
      for (const auto& [key, entry] : watched.entries) {
        if (std::shared_ptr<Subscriber> s = entry.subscriber.lock()) {
          targets.push_back(std::move(s));
        }
      }
    }
  }
  for (const auto& s : targets) s->OnClose();
  // A pass already under way may still be reading pools; once it is over, no
  // pass touches a pool again, so the owner may tear the broker down.
  if (std::this_thread::get_id() != notifier_.get_id()) {
    absl::MutexLock wait_for_pass(&pass_mu_);
  }
}

int ChangeFeed::subscribers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(names_.size());
}

int ChangeFeed::subscribers_of(const std::string& caller) const {
  absl::MutexLock lock(&mu_);
  auto it = callers_.find(caller);
  return it == callers_.end() ? 0 : it->second;
}

}  // namespace kvbroker
