// ReservationTable: ids, blocks and expiry. Contract in reservation_table.h.

#include "allocator/reservation_table.h"

#include "absl/base/macros.h"
#include "absl/strings/str_cat.h"

namespace kvbroker {

ReservationTable::ReservationTable(int64_t expired_remembered)
    : expired_remembered_(expired_remembered) {}

const Reservation& ReservationTable::Add(std::vector<BlockId> blocks,
                                         absl::Time expires) {
  Reservation r;
  r.id = absl::StrCat("res-", next_id_++);
  r.blocks = std::move(blocks);
  r.expires = expires;
  expiry_.insert({expires, r.id});
  auto [it, inserted] = live_.emplace(r.id, std::move(r));
  ABSL_ASSERT(inserted);
  return it->second;
}

Reservation* ReservationTable::Find(const std::string& id) {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : &it->second;
}

Reservation ReservationTable::Remove(const std::string& id) {
  auto it = live_.find(id);
  ABSL_ASSERT(it != live_.end());
  Reservation r = std::move(it->second);
  live_.erase(it);
  expiry_.erase({r.expires, r.id});
  return r;
}

std::optional<absl::Time> ReservationTable::next_expiry() const {
  if (expiry_.empty()) return std::nullopt;
  return expiry_.begin()->first;
}

std::vector<Reservation> ReservationTable::TakeExpired(absl::Time now) {
  std::vector<Reservation> out;
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    const std::string id = expiry_.begin()->second;
    out.push_back(Remove(id));
    expired_.insert(id);
    expired_order_.push_back(id);
    while (static_cast<int64_t>(expired_order_.size()) > expired_remembered_) {
      expired_.erase(expired_order_.front());
      expired_order_.pop_front();
    }
  }
  return out;
}

std::vector<BlockId> ReservationTable::TakeFront(Reservation& r, int64_t n) {
  ABSL_ASSERT(n <= static_cast<int64_t>(r.blocks.size()));
  std::vector<BlockId> out(r.blocks.begin(), r.blocks.begin() + n);
  r.blocks.erase(r.blocks.begin(), r.blocks.begin() + n);
  return out;
}

void ReservationTable::PutFront(Reservation& r,
                                absl::Span<const BlockId> ascending) {
  r.blocks.insert(r.blocks.begin(), ascending.begin(), ascending.end());
}

int64_t ReservationTable::total_blocks() const {
  int64_t n = 0;
  for (const auto& [id, r] : live_) n += static_cast<int64_t>(r.blocks.size());
  return n;
}

}  // namespace kvbroker
