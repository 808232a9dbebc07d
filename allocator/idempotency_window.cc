// IdempotencyWindow: remembered outcomes. Contract in idempotency_window.h.

#include "allocator/idempotency_window.h"

namespace kvbroker {

IdempotencyWindow::IdempotencyWindow(absl::Duration window, int64_t capacity)
    : window_(window), capacity_(capacity) {}

const IdempotencyWindow::Entry* IdempotencyWindow::Recall(
    const std::string& request_id, absl::Time now) {
  while (!order_.empty() && (order_.front().first + window_ < now ||
                             static_cast<int64_t>(order_.size()) > capacity_)) {
    entries_.erase(order_.front().second);
    order_.pop_front();
  }
  auto it = entries_.find(request_id);
  return it == entries_.end() ? nullptr : &it->second;
}

void IdempotencyWindow::Remember(const std::string& request_id,
                                 std::string fingerprint, Outcome outcome,
                                 absl::Time now) {
  entries_[request_id] = Entry{std::move(fingerprint), std::move(outcome), now};
  order_.push_back({now, request_id});
}

}  // namespace kvbroker
