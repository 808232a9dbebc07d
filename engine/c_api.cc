// The C ABI of kvbroker_engine.h over kvbroker::engine::Session.

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "attach/frame.h"
#include "engine/kvbroker_engine.h"
#include "engine/session.h"

static_assert(KVB_MAX_ID_LENGTH == kvbroker::attach::kMaxIdLength,
              "the C ABI's id bound is the protocol's");

struct kvb_session {
  std::unique_ptr<kvbroker::engine::Session> session;
};

namespace {

using kvbroker::engine::Session;

void CopyString(absl::string_view from, char* to, size_t size) {
  if (size == 0) return;
  const size_t n = std::min(from.size(), size - 1);
  if (n > 0) memcpy(to, from.data(), n);
  to[n] = '\0';
}

int32_t Report(const absl::Status& status, kvb_error* err) {
  if (err != nullptr) {
    memset(err, 0, sizeof(*err));
    err->code = static_cast<int32_t>(status.code());
    const kvbroker::FailureReason reason = kvbroker::GetReason(status);
    const auto protocol = kvbroker::attach::ProtocolErrorOf(status);
    err->reason = static_cast<int32_t>(reason);
    err->protocol_error = static_cast<int32_t>(protocol);
    if (reason != kvbroker::FailureReason::kUnspecified) {
      CopyString(kvbroker::ReasonName(reason), err->reason_name,
                 sizeof(err->reason_name));
    } else if (protocol != kvbroker::attach::v1::PROTOCOL_ERROR_UNSPECIFIED) {
      CopyString(kvbroker::attach::v1::ProtocolError_Name(protocol),
                 err->reason_name, sizeof(err->reason_name));
    }
    CopyString(status.message(), err->message, sizeof(err->message));
  }
  return static_cast<int32_t>(status.code());
}

absl::Status NullSession() {
  return absl::InvalidArgumentError("session is NULL");
}

const char* OrEmpty(const char* s) { return s == nullptr ? "" : s; }

// kvb_alloc and kvb_alloc_reserved: the ids go straight into the caller's
// array, whose room is checked before anything is sent.
int32_t AllocInto(kvb_session* s, int64_t num_blocks,
                  const char* reservation_id, const char* request_id,
                  int64_t* block_ids, int64_t capacity, int64_t* allocated,
                  kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  if (num_blocks > capacity || (num_blocks > 0 && block_ids == nullptr)) {
    return Report(
        absl::InvalidArgumentError(absl::StrCat(
            "block_ids has room for ", capacity, " ids, not ", num_blocks)),
        err);
  }
  absl::StatusOr<int64_t> n = s->session->AllocInto(
      num_blocks, OrEmpty(request_id),
      absl::MakeSpan(block_ids, num_blocks > 0 ? num_blocks : 0),
      OrEmpty(reservation_id));
  if (!n.ok()) return Report(n.status(), err);
  if (allocated != nullptr) *allocated = *n;
  return Report(absl::OkStatus(), err);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int32_t kvb_abi_version(void) {
  return KVB_ENGINE_ABI_VERSION;
}

__attribute__((visibility("default"))) int32_t kvb_connect(
    const char* socket_path, const char* token, const char* holder,
    int64_t reattach_grace_ms, kvb_session** out, kvb_error* err) {
  if (out == nullptr) {
    return Report(absl::InvalidArgumentError("out is NULL"), err);
  }
  *out = nullptr;
  kvbroker::engine::ConnectOptions o;
  o.socket_path = OrEmpty(socket_path);
  o.token = OrEmpty(token);
  o.holder = OrEmpty(holder);
  o.reattach_grace = absl::Milliseconds(reattach_grace_ms);
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Connect(o);
  if (!s.ok()) return Report(s.status(), err);
  *out = new kvb_session{*std::move(s)};
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_set_reply_spin(
    kvb_session* s, int64_t spin_ns, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  if (spin_ns < 0) {
    return Report(kvbroker::InvalidField("spin_ns", "must not be negative"),
                  err);
  }
  s->session->set_reply_spin(absl::Nanoseconds(spin_ns));
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_set_call_timeout(
    kvb_session* s, int64_t timeout_ns, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  if (timeout_ns < 0) {
    return Report(kvbroker::InvalidField("timeout_ns", "must not be negative"),
                  err);
  }
  s->session->set_call_timeout(timeout_ns == 0 ? absl::InfiniteDuration()
                                               : absl::Nanoseconds(timeout_ns));
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_attach(
    kvb_session* s, const char* pool, const int32_t* devices,
    int32_t num_devices, const char* reservation_id, int64_t reservation_blocks,
    int64_t* held_blocks, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  kvbroker::engine::AttachOptions a;
  a.pool = OrEmpty(pool);
  for (int32_t i = 0; devices != nullptr && i < num_devices; ++i) {
    a.devices.push_back(devices[i]);
  }
  a.reservation_id = OrEmpty(reservation_id);
  a.reservation_blocks = reservation_blocks;
  absl::StatusOr<kvbroker::attach::v1::AttachReply> r = s->session->Attach(a);
  if (!r.ok()) return Report(r.status(), err);
  if (held_blocks != nullptr) {
    int64_t n = r->redeemed().num_blocks();
    for (const auto& p : r->held()) n += p.block_ids_size();
    *held_blocks = n;
  }
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_get_layout(kvb_session* s,
                                                              kvb_layout* out,
                                                              kvb_error* err) {
  if (s == nullptr || out == nullptr) return Report(NullSession(), err);
  // A copy under the session's lock: another thread may be attaching.
  const std::optional<kvbroker::attach::v1::PoolLayout> layout =
      s->session->attached_layout();
  if (!layout.has_value()) {
    return Report(absl::FailedPreconditionError("not attached"), err);
  }
  const kvbroker::attach::v1::PoolLayout& l = *layout;
  memset(out, 0, sizeof(*out));
  out->virtual_bytes_per_device = l.virtual_bytes_per_device();
  out->bundle_bytes = l.bundle_bytes();
  out->block_stride_bytes = l.block_stride_bytes();
  out->layer_offset_bytes = l.layer_offset_bytes();
  out->buffer_offset_bytes = l.buffer_offset_bytes();
  out->page_size = l.page_size();
  out->block_bytes = l.block_bytes();
  out->num_layers = l.num_layers();
  out->num_kv_buffers = l.num_kv_buffers();
  out->page_count = l.page_count();
  out->max_blocks = l.max_blocks();
  out->tokens_per_block = l.tokens_per_block();
  out->device_count = l.devices_size();
  out->is_cuda = l.backend() == "cuda" ? 1 : 0;
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_device(
    kvb_session* s, int32_t index, int32_t* ordinal, uint64_t* base, char* uuid,
    size_t uuid_size, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  const std::optional<kvbroker::attach::v1::PoolLayout> layout =
      s->session->attached_layout();
  const int count = layout.has_value() ? layout->devices_size() : 0;
  if (index < 0 || index >= count) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
                      "no session device ", index, " (", count, " devices)")),
                  err);
  }
  const auto& d = layout->devices(index);
  if (ordinal != nullptr) *ordinal = d.ordinal();
  if (base != nullptr) *base = s->session->device_base(index);
  if (uuid != nullptr) CopyString(d.uuid(), uuid, uuid_size);
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_block_address(
    kvb_session* s, int32_t device_index, int64_t block, int64_t layer,
    int64_t buffer, uint64_t* out, kvb_error* err) {
  if (s == nullptr || out == nullptr) return Report(NullSession(), err);
  absl::StatusOr<uint64_t> at =
      s->session->BlockAddress(device_index, block, layer, buffer);
  if (!at.ok()) return Report(at.status(), err);
  *out = *at;
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int64_t kvb_mapped_pages(
    kvb_session* s) {
  return s == nullptr ? 0 : s->session->mapped_pages();
}

__attribute__((visibility("default"))) int32_t kvb_get_attach_stats(
    kvb_session* s, kvb_attach_stats* out, kvb_error* err) {
  if (s == nullptr || out == nullptr) return Report(NullSession(), err);
  const kvbroker::engine::AttachStats st = s->session->attach_stats();
  memset(out, 0, sizeof(*out));
  out->pages = st.pages;
  out->frames = st.frames;
  out->set_access_calls = st.access_calls;
  out->total_ns = absl::ToInt64Nanoseconds(st.total);
  out->receive_ns = absl::ToInt64Nanoseconds(st.receive);
  out->setup_ns = absl::ToInt64Nanoseconds(st.setup);
  out->import_ns = absl::ToInt64Nanoseconds(st.import);
  out->map_ns = absl::ToInt64Nanoseconds(st.map);
  out->set_access_ns = absl::ToInt64Nanoseconds(st.access);
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_alloc(
    kvb_session* s, int64_t num_blocks, const char* request_id,
    int64_t* block_ids, int64_t capacity, int64_t* allocated, kvb_error* err) {
  return AllocInto(s, num_blocks, "", request_id, block_ids, capacity,
                   allocated, err);
}

__attribute__((visibility("default"))) int32_t kvb_alloc_reserved(
    kvb_session* s, int64_t num_blocks, const char* reservation_id,
    const char* request_id, int64_t* block_ids, int64_t capacity,
    int64_t* allocated, kvb_error* err) {
  if (reservation_id == nullptr || *reservation_id == '\0') {
    return Report(kvbroker::InvalidField("reservation_id", "is empty"), err);
  }
  return AllocInto(s, num_blocks, reservation_id, request_id, block_ids,
                   capacity, allocated, err);
}

__attribute__((visibility("default"))) int32_t kvb_reserve(
    kvb_session* s, int64_t num_blocks, int64_t ttl_ms, const char* request_id,
    char* reservation_id, size_t reservation_id_size, int64_t* reserved,
    int64_t* expire_unix_ns, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  // Checked before anything is sent: a reservation made whose id the
  // caller could not be given would hold its blocks until it expired.
  if (reservation_id == nullptr || reservation_id_size <= KVB_MAX_ID_LENGTH) {
    return Report(
        kvbroker::InvalidField(
            "reservation_id",
            absl::StrCat("has room for ",
                         reservation_id == nullptr ? 0 : reservation_id_size,
                         " bytes; it needs KVB_MAX_ID_LENGTH + 1 = ",
                         KVB_MAX_ID_LENGTH + 1)),
        err);
  }
  reservation_id[0] = '\0';
  kvbroker::v1::ReserveRequest request;
  request.set_num_blocks(num_blocks);
  if (ttl_ms != 0) {
    // Seconds and nanos carry the same sign, as Duration requires.
    request.mutable_ttl()->set_seconds(ttl_ms / 1000);
    request.mutable_ttl()->set_nanos(static_cast<int32_t>(ttl_ms % 1000) *
                                     1000000);
  }
  request.set_request_id(OrEmpty(request_id));
  absl::StatusOr<kvbroker::v1::ReserveResponse> r =
      s->session->Reserve(std::move(request));
  if (!r.ok()) return Report(r.status(), err);
  // Session::Reserve refused an id longer than attach::kMaxIdLength.
  CopyString(r->reservation_id(), reservation_id, reservation_id_size);
  if (reserved != nullptr) *reserved = r->num_blocks();
  if (expire_unix_ns != nullptr) {
    // An expiry past what int64 nanoseconds hold (after 2262) saturates: the
    // reservation is made, and its id must reach the caller.
    const int64_t seconds = r->expire_time().seconds();
    int64_t ns;
    if (__builtin_mul_overflow(seconds, int64_t{1000000000}, &ns) ||
        __builtin_add_overflow(ns, int64_t{r->expire_time().nanos()}, &ns)) {
      ns = seconds < 0 ? std::numeric_limits<int64_t>::min()
                       : std::numeric_limits<int64_t>::max();
    }
    *expire_unix_ns = ns;
  }
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_release_reservation(
    kvb_session* s, const char* reservation_id, int64_t* released,
    kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  if (reservation_id == nullptr || *reservation_id == '\0') {
    return Report(kvbroker::InvalidField("reservation_id", "is empty"), err);
  }
  kvbroker::v1::ReleaseReservationRequest request;
  request.set_reservation_id(reservation_id);
  auto r = s->session->ReleaseReservation(std::move(request));
  if (!r.ok()) return Report(r.status(), err);
  if (released != nullptr) *released = r->released_blocks();
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_free(
    kvb_session* s, const int64_t* block_ids, int64_t count,
    const char* request_id, int64_t* freed, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  if (count < 0 || (count > 0 && block_ids == nullptr)) {
    return Report(absl::InvalidArgumentError("block_ids is NULL"), err);
  }
  auto r = s->session->Free(absl::MakeConstSpan(block_ids, count),
                            OrEmpty(request_id));
  if (!r.ok()) return Report(r.status(), err);
  if (freed != nullptr) *freed = r->freed_blocks();
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_capacity(
    kvb_session* s, int64_t* available_blocks, int64_t* allocated_blocks,
    int64_t* reserved_blocks, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  auto r = s->session->Capacity();
  if (!r.ok()) return Report(r.status(), err);
  if (available_blocks) *available_blocks = r->capacity().available_blocks();
  if (allocated_blocks) *allocated_blocks = r->capacity().allocated_blocks();
  if (reserved_blocks) *reserved_blocks = r->capacity().reserved_blocks();
  return Report(absl::OkStatus(), err);
}

__attribute__((visibility("default"))) int32_t kvb_event_fd(kvb_session* s) {
  return s == nullptr ? -1 : s->session->event_fd();
}

__attribute__((visibility("default"))) int32_t kvb_process_events(
    kvb_session* s, kvb_error* err) {
  if (s == nullptr) return Report(NullSession(), err);
  return Report(s->session->ProcessEvents(), err);
}

__attribute__((visibility("default"))) void kvb_set_revoke_callback(
    kvb_session* s, kvb_revoke_callback callback, void* user) {
  if (s == nullptr) return;
  if (callback == nullptr) {
    s->session->SetRevocationCallback(nullptr);
    return;
  }
  s->session->SetRevocationCallback(
      [callback, user](absl::Span<const int64_t> pages) {
        callback(user, pages.data(), static_cast<int64_t>(pages.size()));
      });
}

__attribute__((visibility("default"))) int32_t kvb_close(kvb_session* s,
                                                         int32_t release,
                                                         kvb_error* err) {
  if (s == nullptr) return Report(absl::OkStatus(), err);
  absl::Status status = s->session->Close(release != 0);
  delete s;
  return Report(status, err);
}

}  // extern "C"
