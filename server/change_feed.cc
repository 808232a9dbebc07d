// ChangeFeed: pool change fan-out; see change_feed.h.

#include "server/change_feed.h"

#include <vector>

namespace kvbroker {

bool ChangeFeed::Subscribe(const std::string& pool,
                           std::weak_ptr<Subscriber> subscriber) {
  std::shared_ptr<Subscriber> s = subscriber.lock();
  if (s == nullptr) return false;
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  subscribers_[s.get()] = Entry{pool, std::move(subscriber)};
  count_.store(static_cast<int>(subscribers_.size()));
  return true;
}

void ChangeFeed::Unsubscribe(const Subscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(subscriber);
  count_.store(static_cast<int>(subscribers_.size()));
}

void ChangeFeed::Publish(const std::string& pool) {
  if (count_.load() == 0) return;
  std::vector<std::shared_ptr<Subscriber>> targets;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    for (const auto& [key, entry] : subscribers_) {
      if (!pool.empty() && entry.pool != pool) continue;
      if (std::shared_ptr<Subscriber> s = entry.subscriber.lock()) {
        targets.push_back(std::move(s));
      }
    }
  }
  for (const auto& s : targets) s->OnPoolChanged();
}

void ChangeFeed::Close() {
  std::vector<std::shared_ptr<Subscriber>> targets;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (const auto& [key, entry] : subscribers_) {
      if (std::shared_ptr<Subscriber> s = entry.subscriber.lock()) {
        targets.push_back(std::move(s));
      }
    }
  }
  for (const auto& s : targets) s->OnClose();
}

int ChangeFeed::subscribers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(subscribers_.size());
}

}  // namespace kvbroker
