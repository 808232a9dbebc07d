// Fanout's queue: one deque of (batch, index) items; a batch counts its
// unfinished items and wakes its caller at zero.

#include "extender/fanout.h"

namespace kvbroker {
namespace extender {

struct Fanout::Batch {
  const std::function<void(size_t)>* fn;
  absl::Mutex mu;
  size_t remaining ABSL_GUARDED_BY(mu);
};

Fanout::Fanout(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

Fanout::~Fanout() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void Fanout::Execute(const Item& item) {
  (*item.batch->fn)(item.index);
  absl::MutexLock lock(&item.batch->mu);
  --item.batch->remaining;
}

void Fanout::Work() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &Fanout::HasWork));
      if (queue_.empty()) return;  // stopping
      item = queue_.front();
      queue_.pop_front();
    }
    Execute(item);
  }
}

void Fanout::Run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  Batch batch;
  batch.fn = &fn;
  {
    absl::MutexLock lock(&batch.mu);
    batch.remaining = n;
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 1; i < n; ++i) queue_.push_back({&batch, i});
  }
  Execute({&batch, 0});
  // Help with this batch's items still queued, then wait for the rest.
  while (true) {
    Item item{nullptr, 0};
    {
      absl::MutexLock lock(&mu_);
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (it->batch == &batch) {
          item = *it;
          queue_.erase(it);
          break;
        }
      }
    }
    if (item.batch == nullptr) break;
    Execute(item);
  }
  absl::MutexLock lock(
      &batch.mu, absl::Condition(
                     +[](size_t* r) { return *r == 0; }, &batch.remaining));
}

}  // namespace extender
}  // namespace kvbroker
