// Allocator value types <-> kvbroker.v1 messages.

#include "server/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"

namespace kvbroker {

PoolConfig FromProto(const v1::PoolSpec& spec) {
  PoolConfig c;
  c.name = spec.name();
  c.page_size = Bytes(spec.page_size());
  c.block_bytes = Bytes(spec.block_bytes());
  c.tokens_per_block =
      spec.tokens_per_block() == 0 ? 1 : spec.tokens_per_block();
  c.num_layers = spec.num_layers() == 0 ? 1 : spec.num_layers();
  c.num_kv_buffers = spec.num_kv_buffers() == 0 ? 1 : spec.num_kv_buffers();
  if (spec.devices_size() > 0) {
    c.devices.assign(spec.devices().begin(), spec.devices().end());
  }
  c.max_blocks = spec.max_blocks();
  c.reserve_null_block = spec.reserve_null_block();
  c.min_idle_pages = spec.has_min_idle_pages() ? spec.min_idle_pages() : -1;
  c.max_idle_pages = spec.has_max_idle_pages() ? spec.max_idle_pages() : -1;
  c.export_at_map = spec.export_at_map();
  return c;
}

v1::PoolSpec ToProto(const PoolConfig& c) {
  v1::PoolSpec spec;
  spec.set_name(c.name);
  spec.set_page_size(c.page_size.value());
  spec.set_block_bytes(c.block_bytes.value());
  spec.set_tokens_per_block(c.tokens_per_block);
  spec.set_num_layers(c.num_layers);
  spec.set_num_kv_buffers(c.num_kv_buffers);
  for (int d : c.devices) spec.add_devices(d);
  spec.set_max_blocks(c.max_blocks);
  spec.set_reserve_null_block(c.reserve_null_block);
  if (c.min_idle_pages >= 0) spec.set_min_idle_pages(c.min_idle_pages);
  if (c.max_idle_pages >= 0) spec.set_max_idle_pages(c.max_idle_pages);
  spec.set_export_at_map(c.export_at_map);
  return spec;
}

v1::PageState ToProto(PageState state) {
  switch (state) {
    case PageState::kFree: return v1::PAGE_STATE_FREE;
    case PageState::kMapping: return v1::PAGE_STATE_MAPPING;
    case PageState::kIdle: return v1::PAGE_STATE_IDLE;
    case PageState::kOpen: return v1::PAGE_STATE_OPEN;
    case PageState::kFull: return v1::PAGE_STATE_FULL;
    case PageState::kReclaimed: return v1::PAGE_STATE_RECLAIMED;
    case PageState::kEmpty: return v1::PAGE_STATE_EMPTY;
  }
  return v1::PAGE_STATE_UNSPECIFIED;
}

v1::LimitState ToProto(LimitState state) {
  switch (state) {
    case LimitState::kNone: return v1::LIMIT_STATE_NONE;
    case LimitState::kApplied: return v1::LIMIT_STATE_APPLIED;
    case LimitState::kDeferred: return v1::LIMIT_STATE_DEFERRED;
  }
  return v1::LIMIT_STATE_UNSPECIFIED;
}

v1::LimitOutcome ToProto(LimitOutcome outcome) {
  switch (outcome) {
    case LimitOutcome::kApplied: return v1::APPLIED;
    case LimitOutcome::kDeferred: return v1::DEFERRED;
    case LimitOutcome::kStale: return v1::STALE;
    case LimitOutcome::kConflict: return v1::CONFLICT;
  }
  return v1::LIMIT_OUTCOME_UNSPECIFIED;
}

void ToProto(const LimitInfo& limit, v1::MemoryLimit* out) {
  out->set_state(ToProto(limit.state));
  out->set_limit_bytes(limit.limit_bytes.value());
  out->set_revision(limit.revision);
  out->set_target_pages(limit.target_pages.value());
  out->set_effective_bytes(limit.effective_bytes.value());
  out->set_overage_bytes(limit.overage_bytes.value());
}

void ToProto(const CapacitySnapshot& s, v1::CapacitySnapshot* out) {
  out->set_pool_uid(s.pool_uid);
  out->set_pool(s.pool);
  out->set_generation(s.generation);
  out->set_available_blocks(s.available_blocks.value());
  out->set_available_tokens(s.available_tokens);
  out->set_reserved_blocks(s.reserved_blocks.value());
  out->set_allocated_blocks(s.allocated_blocks.value());
  out->set_total_blocks(s.total_blocks.value());
  v1::PageCounts* pages = out->mutable_pages();
  pages->set_free_pages(s.pages_free.value());
  pages->set_mapping_pages(s.pages_mapping.value());
  pages->set_idle_pages(s.pages_idle.value());
  pages->set_open_pages(s.pages_open.value());
  pages->set_full_pages(s.pages_full.value());
  pages->set_reclaimed_pages(s.pages_reclaimed.value());
  pages->set_empty_pages(s.pages_empty.value());
  pages->set_revoking_pages(s.pages_revoking.value());
  pages->set_quarantined_pages(s.pages_quarantined.value());
  out->set_affordable_bundles(s.affordable_bundles);
  out->set_mapped_bytes(s.mapped_bytes.value());
  out->set_virtual_bytes(s.virtual_bytes.value());
  for (const DeviceBudgetSnapshot& d : s.devices) {
    v1::DeviceBudget* db = out->add_devices();
    db->set_device(d.device);
    db->set_total_bytes(d.total.value());
    db->set_driver_free_bytes(d.driver_free.value());
    db->set_headroom_bytes(d.headroom.value());
    db->set_charged_bytes(d.charged.value());
    db->set_budget_bytes(d.budget.value());
    db->set_refreshes(d.refreshes);
  }
  ToProto(s.limit, out->mutable_limit());
  out->set_healthy(s.healthy);
  out->set_failure(s.failure);
  for (const PageInfo& p : s.pages) {
    v1::PageInfo* pi = out->add_page_list();
    pi->set_page_id(p.page_id);
    pi->set_usable_blocks(p.usable_blocks.value());
    pi->set_free_blocks(p.free_blocks.value());
    pi->set_allocated_blocks(p.allocated_blocks.value());
    pi->set_reserved_blocks(p.reserved_blocks.value());
    pi->set_state(ToProto(p.state));
    pi->set_counted(p.counted);
  }
}

void ToProto(const std::vector<PageBlocks>& pages,
             google::protobuf::RepeatedPtrField<v1::PageBlocks>* out) {
  for (const PageBlocks& p : pages) {
    v1::PageBlocks* pb = out->Add();
    pb->set_page_id(p.page_id);
    pb->mutable_block_ids()->Add(p.block_ids.begin(), p.block_ids.end());
  }
}

void ToProto(const PageOccupancy& o, v1::PageOccupancy* out) {
  out->set_page_id(o.page_id);
  out->set_usable_blocks(o.usable_blocks.value());
  out->set_allocated_blocks(o.allocated_blocks.value());
  out->set_reserved_blocks(o.reserved_blocks.value());
  out->set_state(ToProto(o.state));
}

void ToProto(const Geometry& g, const CapacitySnapshot& capacity,
             v1::PoolInfo* out) {
  *out->mutable_spec() = ToProto(g.config());
  out->set_page_count(g.page_count().value());
  out->set_bundle_bytes(g.bundle_bytes().value());
  out->set_block_stride_bytes(g.block_stride().value());
  out->set_virtual_bytes_per_device(g.virtual_bytes_per_device().value());
  out->set_total_usable_blocks(g.total_usable().value());
  ToProto(capacity, out->mutable_capacity());
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t seconds = absl::ToUnixSeconds(t);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(seconds))));
}

AllocRequest FromProto(const v1::AllocRequest& request) {
  AllocRequest alloc;
  alloc.num_blocks = request.num_blocks();
  alloc.request_id = request.request_id();
  alloc.reservation_id = request.reservation_id();
  if (request.has_expected_generation()) {
    alloc.expected_generation = request.expected_generation();
  }
  alloc.as_runs = request.block_runs();
  return alloc;
}

FreeRequest FromProto(const v1::FreeRequest& request) {
  FreeRequest free;
  free.block_ids = request.block_ids();
  free.request_id = request.request_id();
  return free;
}

absl::StatusOr<FreeRequest> FromProto(const v1::FreeRequest& request,
                                      int64_t max_ids,
                                      std::vector<int64_t>* storage) {
  FreeRequest free = FromProto(request);
  if (request.block_runs().empty()) return free;
  absl::Status s;
  if (request.block_ids().empty()) {
    int64_t named = 0;
    s = CheckBlockRuns(request.block_runs(), max_ids, 0, &named);
    if (s.ok()) free.block_runs = request.block_runs();
  } else {
    storage->assign(request.block_ids().begin(), request.block_ids().end());
    s = ExpandBlockRuns(request.block_runs(), max_ids, storage);
    if (s.ok()) free.block_ids = *storage;
  }
  if (!s.ok()) {
    const std::string why(s.message());
    return MakeFailure(FailureReason::kInvalidArgument,
                       absl::StrCat("block_runs: ", why, "; nothing was freed"),
                       {{"field", "block_runs"}}, {{"block_runs", why}});
  }
  return free;
}

ReserveRequest FromProto(const v1::ReserveRequest& request) {
  ReserveRequest reserve;
  reserve.num_blocks = request.num_blocks();
  if (request.has_ttl()) reserve.ttl = FromProto(request.ttl());
  reserve.request_id = request.request_id();
  return reserve;
}

void ToProto(const AllocResult& result, v1::AllocResponse* out) {
  out->mutable_block_runs()->Assign(result.block_runs.begin(),
                                    result.block_runs.end());
  ToProto(result.pages, out->mutable_pages());
  out->set_num_blocks(result.num_blocks);
  out->set_generation(result.generation);
  out->set_replayed(result.replayed);
  out->set_pages_mapped(result.pages_mapped);
}

void ToProto(const FreeResult& result, v1::FreeResponse* out) {
  out->set_freed_blocks(result.freed_blocks);
  out->set_pages_unmapped(result.pages_unmapped);
  out->set_generation(result.generation);
  out->set_replayed(result.replayed);
}

void ToProto(const ReservationInfo& result, v1::ReserveResponse* out) {
  out->set_reservation_id(result.reservation_id);
  ToProto(result.pages, out->mutable_pages());
  out->set_num_blocks(result.num_blocks);
  ToProto(result.expires, out->mutable_expire_time());
  out->set_generation(result.generation);
  out->set_replayed(result.replayed);
}

void ToProto(const ReleaseResult& result, v1::ReleaseReservationResponse* out) {
  out->set_released_blocks(result.released_blocks);
  out->set_generation(result.generation);
}

void ToProto(const LimitResult& result, v1::SetMemoryLimitResponse* out) {
  out->set_outcome(ToProto(result.outcome));
  ToProto(result.limit, out->mutable_limit());
  out->set_mapped_bytes(result.mapped_bytes.value());
  out->set_generation(result.generation);
}

void ToProto(const TrimResult& result, v1::TrimResponse* out) {
  out->set_pages_unmapped(result.pages_unmapped);
  out->set_generation(result.generation);
}

}  // namespace kvbroker
