// Fuzz driver: sequences of KvBroker RPCs into the daemon's own wiring
// (server/daemon.h: KvBrokerService over a Broker) on the host backend,
// through gRPC's in-process channel.
//
// An input is a program: each step reads an opcode and its operands from the
// input (fuzz/byte_reader.h) and makes one call on one of three pool names:
// CreatePool with geometries both valid and not, Alloc (optionally from a
// reservation, with request ids and expected generations, its blocks as ids
// or as runs), Free of blocks the program holds mixed with ids it does not
// (listed, as block runs, or both; now and then a malformed run), Reserve,
// ReleaseReservation, SetMemoryLimit, Trim, Capacity, GetPageOccupancy, GetPool, ListPools,
// DeletePool, a short WatchCapacity, a backend fault armed for the next
// create/map/set-access/unmap/release call (out of memory or a recoverable
// error), and a pass of the broker's maintenance.
//
// The driver keeps its own ledger of what it holds per pool (allocated ids,
// reservations and their ids) and aborts, which libFuzzer reports as a
// crash, when after any step:
//   - PagePool::CheckInvariants fails on any pool;
//   - a block is handed out twice (an Alloc or Reserve returns an id the
//     driver already holds or another reservation holds), or a Free
//     succeeds on an id the driver does not hold;
//   - the pool's allocated or reserved count differs from the ledger
//     (a failed call changed something, or a successful one did more);
//   - a refusal is not typed (no kvbroker ErrorInfo with a known reason);
//   - a successful reply contradicts its request (count, id range, order);
//   - the backend holds a handle that neither a pool nor the broker's
//     orphans account for (exactly; FAILED pools included), or, while every
//     pool is healthy, other than the pools' mapped pages;
//   - a delete leaves handles that are not the broker's orphans.
// Every pool is force-deleted, every fault cleared and the orphans released
// after each input (the backend must then hold nothing), so inputs are
// independent. Strings are valid UTF-8: a proto3 string that is
// not does not parse as a request, so it tests gRPC's framing, not the
// service (raw bytes on the wire are the metrics driver's job).

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "allocator/broker.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "common/block_runs.h"
#include "fuzz/byte_reader.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/daemon.h"
#include "server/status_convert.h"

namespace kvbroker {
namespace fuzz {
namespace {

constexpr int kPools = 3;
constexpr int64_t kDeviceBytes = 96 * kMiB;  // 48 pages of 2 MiB per device

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "service_fuzzer: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// What the driver holds in one pool it created.
struct Ledger {
  int64_t max_blocks = 0;
  uint64_t generation = 0;
  std::set<int64_t> owned;
  std::map<std::string, std::set<int64_t>> reservations;

  int64_t reserved() const {
    int64_t n = 0;
    for (const auto& [id, blocks] : reservations) n += blocks.size();
    return n;
  }
  bool Held(int64_t id) const {
    if (owned.count(id)) return true;
    for (const auto& [rid, blocks] : reservations) {
      if (blocks.count(id)) return true;
    }
    return false;
  }
};

struct World {
  HostBackend host{[] {
    HostBackendOptions o;
    o.device_count = 2;
    o.device_total = Bytes(kDeviceBytes);
    return o;
  }()};
  FaultInjectingBackend backend{&host};
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<v1::KvBroker::Stub> stub;
};

World* TheWorld() {
  static World* world = [] {
    grpc_init();
    auto* w = new World();
    BrokerOptions bo;
    bo.gpu_memory_utilization = 1.0;
    bo.min_idle_pages = 0;
    bo.max_idle_pages = 2;
    bo.start_worker = false;
    DaemonOptions dopt;
    dopt.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<Daemon>> d =
        Daemon::Create(&w->backend, bo, dopt);
    if (!d.ok()) Die(d.status().ToString());
    if (absl::Status s = (*d)->Start(); !s.ok()) Die(s.ToString());
    w->daemon = *std::move(d);
    w->stub = v1::KvBroker::NewStub(w->daemon->InProcessChannel());
    return w;
  }();
  return world;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(30));
  return ctx;
}

// KVB_FUZZ_TRACE=1: one line per call on stderr, to read a failing input.
const bool kTrace = std::getenv("KVB_FUZZ_TRACE") != nullptr;

// Calls made and refused, per RPC, over the process; printed at exit so
// that a campaign can say how many requests each RPC received.
struct RpcCounts {
  std::map<std::string, std::pair<int64_t, int64_t>> calls;
  // Deletes that left handles to the broker's orphans, and inputs after
  // which a maintenance pass released them.
  int64_t orphaning_deletes = 0;
  ~RpcCounts() {
    std::fprintf(stderr, "orphaning_deletes: %lld\n",
                 static_cast<long long>(orphaning_deletes));
    for (const auto& [rpc, n] : calls) {
      std::fprintf(stderr, "rpc_count: %s %lld calls, %lld refused\n",
                   rpc.c_str(), static_cast<long long>(n.first),
                   static_cast<long long>(n.second));
    }
  }
};
RpcCounts rpc_counts;

// A refusal must be typed (SPEC 6).
FailureReason CheckTyped(const char* rpc, const grpc::Status& status) {
  auto& count = rpc_counts.calls[rpc];
  ++count.first;
  count.second += !status.ok();
  if (kTrace) {
    std::fprintf(stderr, "trace: %s -> %s\n", rpc,
                 status.ok() ? "OK" : status.error_message().c_str());
  }
  if (status.ok()) return FailureReason::kUnspecified;
  const FailureReason reason = GetReason(FromGrpcStatus(status));
  if (reason == FailureReason::kUnspecified) {
    Die(absl::StrCat(rpc, " refused without a kvbroker reason: code ",
                     status.error_code(), ": ", status.error_message()));
  }
  return reason;
}

// Flattens a reply's blocks, checking ranges and order.
std::vector<int64_t> Flatten(
    const char* rpc,
    const google::protobuf::RepeatedPtrField<v1::PageBlocks>& pages,
    int64_t max_blocks) {
  std::vector<int64_t> ids;
  int64_t last_page = -1;
  for (const v1::PageBlocks& pb : pages) {
    if (pb.page_id() <= last_page) Die(absl::StrCat(rpc, ": pages unordered"));
    last_page = pb.page_id();
    int64_t last = -1;
    for (int64_t b : pb.block_ids()) {
      if (b <= last || b < 0 || b >= max_blocks) {
        Die(absl::StrCat(rpc, ": block id ", b, " out of order or range"));
      }
      last = b;
      ids.push_back(b);
    }
  }
  return ids;
}

// The same for an Alloc answered with block runs: pairs, counts of at
// least one, ascending and apart (a run that continued the one before
// would have been merged into it), within the pool.
std::vector<int64_t> FlattenRuns(const v1::AllocResponse& resp,
                                 int64_t max_blocks) {
  if (resp.pages_size() != 0) Die("Alloc: pages beside block runs");
  const auto& runs = resp.block_runs();
  if (runs.size() % 2 != 0) Die("Alloc: an odd number of run values");
  std::vector<int64_t> ids;
  int64_t end = -1;
  for (int i = 0; i < runs.size(); i += 2) {
    const int64_t first = runs[i], count = runs[i + 1];
    if (first <= end || count < 1 || first < 0 || count > max_blocks ||
        first > max_blocks - count) {
      Die(absl::StrCat("Alloc: run (", first, ", ", count,
                       ") out of order or range"));
    }
    for (int64_t k = 0; k < count; ++k) ids.push_back(first + k);
    end = first + count;
  }
  return ids;
}

class Program {
 public:
  Program(World* world, ByteReader* in) : w_(world), in_(in) {}

  void Run() {
    for (int step = 0; step < 64 && !in_->empty(); ++step) {
      Step();
      CheckAll();
    }
  }

  // Deletes every pool, clears the faults and releases the orphans,
  // whatever the program did; the backend must then hold nothing.
  void Cleanup() {
    w_->backend.ClearFaults();
    Broker* broker = w_->daemon->broker();
    for (const std::shared_ptr<PagePool>& pool : broker->ListPools()) {
      (void)broker->DeletePool(pool->name(), /*force=*/true);
    }
    broker->RunMaintenance();
    if (w_->host.live_handles() != 0 || broker->orphaned_handles() != 0) {
      Die(absl::StrCat("backend holds ", w_->host.live_handles(), " handles (",
                       broker->orphaned_handles(),
                       " orphaned) after every pool was deleted"));
    }
  }

 private:
  std::string PoolName() {
    const uint8_t b = in_->Byte();
    if (b < 240) return absl::StrCat("p", b % kPools);
    static const std::string kOdd[] = {"",   "p0\n", std::string("p0\0", 3),
                                       "P0", "*",    "p0 "};
    if (b < 246) return kOdd[b - 240];
    return in_->Utf8(40);
  }

  std::string RequestId() {
    static const char* kIds[] = {"", "", "r1", "r2", "r3"};
    const uint8_t b = in_->Byte();
    if (b < 250) return kIds[b % 5];
    return in_->Utf8(300);
  }

  Ledger* Find(const std::string& name) {
    auto it = ledgers_.find(name);
    return it == ledgers_.end() ? nullptr : &it->second;
  }

  void Step() {
    switch (in_->Range(0, 15)) {
      case 0:
      case 1: return CreatePool();
      case 2:
      case 3:
      case 4: return Alloc();
      case 5:
      case 6: return Free();
      case 7: return Reserve();
      case 8: return Release();
      case 9: return SetLimit();
      case 10: return Trim();
      case 11: return Capacity();
      case 12: return Occupancy();
      case 13: return Lookup();
      case 14: return DeletePool();
      case 15: return Other();
    }
  }

  void CreatePool() {
    static const int64_t kPage[] = {
        2 * kMiB, 4 * kMiB,  6 * kMiB, 2 * kMiB,
        0,        -2 * kMiB, 3 * kMiB, int64_t{1} << 62};
    static const int64_t kBlock[] = {kMiB,     512 * kKiB, 3 * kMiB, 700 * kKiB,
                                     2 * kMiB, 1,          0,        -1};
    v1::CreatePoolRequest r;
    v1::PoolSpec* spec = r.mutable_pool();
    spec->set_name(PoolName());
    spec->set_page_size(in_->Pick(kPage));
    spec->set_block_bytes(in_->Bool() ? in_->Pick(kBlock)
                                      : in_->Range(1, 6 * kMiB));
    spec->set_tokens_per_block(in_->Range(0, 3) == 0 ? 0 : 16);
    spec->set_num_layers(in_->Range(0, 4) == 0 ? in_->Range(-1, 3) : 1);
    spec->set_num_kv_buffers(in_->Range(0, 4) == 0 ? in_->Range(-1, 3) : 1);
    switch (in_->Range(0, 7)) {
      case 0:
      case 1:
      case 2: break;
      case 3: spec->add_devices(1); break;
      case 4:
        spec->add_devices(0);
        spec->add_devices(1);
        break;
      case 5:
        spec->add_devices(0);
        spec->add_devices(0);
        break;
      case 6: spec->add_devices(2); break;
      case 7: spec->add_devices(-1); break;
    }
    switch (in_->Range(0, 9)) {
      case 0: spec->set_max_blocks(0); break;
      case 1: spec->set_max_blocks(-1); break;
      case 2: spec->set_max_blocks(int64_t{1} << 40); break;
      default: spec->set_max_blocks(in_->Range(1, 200)); break;
    }
    spec->set_reserve_null_block(in_->Range(0, 3) == 0);
    if (in_->Bool()) spec->set_min_idle_pages(in_->Range(-1, 2));
    if (in_->Bool()) spec->set_max_idle_pages(in_->Range(-1, 3));
    v1::CreatePoolResponse resp;
    grpc::Status s = w_->stub->CreatePool(Context().get(), r, &resp);
    CheckTyped("CreatePool", s);
    if (s.ok()) {
      if (Find(spec->name()) != nullptr) {
        Die("CreatePool succeeded on a name that exists: " + spec->name());
      }
      Ledger& l = ledgers_[spec->name()];
      l.max_blocks = spec->max_blocks();
    }
  }

  void Alloc() {
    v1::AllocRequest r;
    r.set_pool(PoolName());
    Ledger* l = Find(r.pool());
    const uint8_t mode = in_->Byte();
    r.set_num_blocks(mode < 230   ? in_->Range(0, 24)
                     : mode < 250 ? in_->Range(25, 400)
                                  : static_cast<int64_t>(in_->U64()));
    r.set_request_id(RequestId());
    if (in_->Range(0, 3) == 0) {
      if (l != nullptr && !l->reservations.empty() && in_->Bool()) {
        auto it = l->reservations.begin();
        std::advance(it, in_->Range(0, l->reservations.size() - 1));
        r.set_reservation_id(it->first);
      } else {
        r.set_reservation_id(in_->Utf8(12));
      }
    }
    if (in_->Range(0, 5) == 0) {
      r.set_expected_generation(l != nullptr && in_->Bool() ? l->generation
                                                            : in_->U64(2));
    }
    r.set_block_runs(in_->Range(0, 3) == 0);
    v1::AllocResponse resp;
    grpc::Status s = w_->stub->Alloc(Context().get(), r, &resp);
    CheckTyped("Alloc", s);
    if (!s.ok() || l == nullptr) {
      if (s.ok()) Die("Alloc succeeded on a pool the driver did not create");
      return;
    }
    l->generation = resp.generation();
    if (resp.replayed()) return;
    const std::vector<int64_t> ids =
        r.block_runs() ? FlattenRuns(resp, l->max_blocks)
                       : Flatten("Alloc", resp.pages(), l->max_blocks);
    if (static_cast<int64_t>(ids.size()) != r.num_blocks() ||
        resp.num_blocks() != r.num_blocks()) {
      Die(absl::StrCat("Alloc(", r.num_blocks(), ") returned ", ids.size()));
    }
    std::set<int64_t>* from = nullptr;
    if (!r.reservation_id().empty()) {
      auto it = l->reservations.find(r.reservation_id());
      if (it == l->reservations.end()) {
        Die("Alloc from a reservation the driver does not hold succeeded");
      }
      from = &it->second;
    }
    for (int64_t id : ids) {
      if (from != nullptr && from->erase(id) == 1) {
        l->owned.insert(id);
        continue;
      }
      if (l->Held(id)) Die(absl::StrCat("Alloc handed out held block ", id));
      l->owned.insert(id);
    }
  }

  void Free() {
    v1::FreeRequest r;
    r.set_pool(PoolName());
    Ledger* l = Find(r.pool());
    if (l != nullptr && !l->owned.empty()) {
      const int64_t k = in_->Range(0, l->owned.size());
      auto it = l->owned.begin();
      std::advance(it, in_->Range(0, l->owned.size() - k));
      for (int64_t i = 0; i < k; ++i, ++it) r.add_block_ids(*it);
    }
    const int64_t extra = in_->Range(0, 7) < 6 ? 0 : in_->Range(1, 3);
    for (int64_t i = 0; i < extra; ++i) {
      const uint8_t m = in_->Byte();
      if (m < 128 && r.block_ids_size() > 0) {
        r.add_block_ids(r.block_ids(m % r.block_ids_size()));  // repeated
      } else if (m < 240) {
        r.add_block_ids(in_->Range(-1, 220));
      } else {
        r.add_block_ids(static_cast<int64_t>(in_->U64()));
      }
    }
    // The same blocks, some or all of them as runs; now and then a run
    // that is malformed (an odd value, a count below 1), which must be
    // refused.
    const std::vector<int64_t> named(r.block_ids().begin(),
                                     r.block_ids().end());
    bool malformed = false;
    if (const uint8_t form = in_->Byte(); form >= 160) {
      const size_t listed = form < 208 ? 0 : in_->Range(0, named.size());
      r.mutable_block_ids()->Truncate(static_cast<int>(listed));
      AppendBlockRuns(absl::MakeConstSpan(named).subspan(listed),
                      r.mutable_block_runs());
      if (form >= 248) {
        malformed = true;
        r.add_block_runs(in_->Range(-1, 40));
        if (in_->Bool()) r.add_block_runs(in_->Range(-3, 0));
      }
    }
    r.set_request_id(RequestId());
    v1::FreeResponse resp;
    grpc::Status s = w_->stub->Free(Context().get(), r, &resp);
    CheckTyped("Free", s);
    if (!s.ok()) return;
    if (malformed) Die("Free with malformed block runs succeeded");
    if (l == nullptr) Die("Free succeeded on a pool the driver did not create");
    l->generation = resp.generation();
    if (resp.replayed()) return;
    if (resp.freed_blocks() != static_cast<int64_t>(named.size())) {
      Die(absl::StrCat("Free of ", named.size(), " ids freed ",
                       resp.freed_blocks()));
    }
    for (int64_t id : named) {
      if (l->owned.erase(id) != 1) {
        Die(absl::StrCat("Free succeeded on block ", id,
                         " which the driver does not hold"));
      }
    }
  }

  void Reserve() {
    v1::ReserveRequest r;
    r.set_pool(PoolName());
    Ledger* l = Find(r.pool());
    r.set_num_blocks(in_->Range(0, 7) == 0 ? in_->Range(-2, 0)
                                           : in_->Range(1, 30));
    switch (in_->Range(0, 7)) {
      case 0: break;  // no ttl
      case 1: r.mutable_ttl()->set_seconds(-1); break;
      case 2: r.mutable_ttl()->set_nanos(-5); break;
      case 3: r.mutable_ttl()->set_seconds(INT64_MAX); break;
      case 4:
        r.mutable_ttl()->set_seconds(1);
        r.mutable_ttl()->set_nanos(2000000000);
        break;
      default: r.mutable_ttl()->set_seconds(3600 + in_->Range(0, 1000)); break;
    }
    r.set_request_id(RequestId());
    v1::ReserveResponse resp;
    grpc::Status s = w_->stub->Reserve(Context().get(), r, &resp);
    CheckTyped("Reserve", s);
    if (!s.ok()) return;
    if (l == nullptr)
      Die("Reserve succeeded on a pool the driver did not create");
    l->generation = resp.generation();
    if (resp.replayed()) return;
    // Reservations with a TTL shorter than any input are released at once:
    // their blocks would otherwise return while the ledger holds them.
    if (!r.has_ttl() || r.ttl().seconds() < 3600) {
      ReleaseNow(r.pool(), resp.reservation_id());
      return;
    }
    const std::vector<int64_t> ids =
        Flatten("Reserve", resp.pages(), l->max_blocks);
    if (static_cast<int64_t>(ids.size()) != r.num_blocks()) {
      Die(absl::StrCat("Reserve(", r.num_blocks(), ") returned ", ids.size()));
    }
    if (l->reservations.count(resp.reservation_id())) {
      Die("Reserve returned a reservation id in use: " + resp.reservation_id());
    }
    std::set<int64_t>& held = l->reservations[resp.reservation_id()];
    for (int64_t id : ids) {
      if (l->Held(id)) Die(absl::StrCat("Reserve handed out held block ", id));
      held.insert(id);
    }
  }

  void ReleaseNow(const std::string& pool, const std::string& id) {
    v1::ReleaseReservationRequest r;
    r.set_pool(pool);
    r.set_reservation_id(id);
    v1::ReleaseReservationResponse resp;
    grpc::Status s = w_->stub->ReleaseReservation(Context().get(), r, &resp);
    if (!s.ok() && CheckTyped("ReleaseReservation", s) !=
                       FailureReason::kReservationExpired) {
      Die("releasing a fresh reservation: " + s.error_message());
    }
  }

  void Release() {
    v1::ReleaseReservationRequest r;
    r.set_pool(PoolName());
    Ledger* l = Find(r.pool());
    if (l != nullptr && !l->reservations.empty() && in_->Range(0, 3) != 0) {
      auto it = l->reservations.begin();
      std::advance(it, in_->Range(0, l->reservations.size() - 1));
      r.set_reservation_id(it->first);
    } else {
      r.set_reservation_id(in_->Utf8(12));
    }
    v1::ReleaseReservationResponse resp;
    grpc::Status s = w_->stub->ReleaseReservation(Context().get(), r, &resp);
    CheckTyped("ReleaseReservation", s);
    if (!s.ok()) return;
    if (l == nullptr)
      Die("Release succeeded on a pool the driver did not create");
    auto it = l->reservations.find(r.reservation_id());
    if (it == l->reservations.end()) {
      Die("ReleaseReservation succeeded on an id the driver does not hold");
    }
    if (resp.released_blocks() != static_cast<int64_t>(it->second.size())) {
      Die(absl::StrCat("ReleaseReservation released ", resp.released_blocks(),
                       " of ", it->second.size()));
    }
    l->reservations.erase(it);
    l->generation = resp.generation();
  }

  void SetLimit() {
    v1::SetMemoryLimitRequest r;
    r.set_pool(PoolName());
    const uint8_t m = in_->Byte();
    r.set_limit_bytes(m < 200   ? in_->Range(0, 12) * 2 * kMiB
                      : m < 240 ? in_->Range(0, 40 * kMiB)
                                : static_cast<int64_t>(in_->U64()));
    r.set_revision(in_->Range(0, 9) == 0 ? in_->Range(-2, -1)
                                         : revision_ + in_->Range(-1, 2));
    revision_ = std::max(revision_, r.revision());
    v1::SetMemoryLimitResponse resp;
    CheckTyped("SetMemoryLimit",
               w_->stub->SetMemoryLimit(Context().get(), r, &resp));
  }

  void Trim() {
    v1::TrimRequest r;
    r.set_pool(PoolName());
    r.set_max_pages(in_->Range(-1, 5));
    v1::TrimResponse resp;
    CheckTyped("Trim", w_->stub->Trim(Context().get(), r, &resp));
  }

  void Capacity() {
    v1::CapacityRequest r;
    r.set_pool(PoolName());
    r.set_max_pages(in_->Range(0, 3) == 0 ? static_cast<int64_t>(in_->U64())
                                          : in_->Range(0, 64));
    v1::CapacityResponse resp;
    grpc::Status s = w_->stub->Capacity(Context().get(), r, &resp);
    CheckTyped("Capacity", s);
    Ledger* l = Find(r.pool());
    if (s.ok() && l != nullptr &&
        resp.capacity().allocated_blocks() !=
            static_cast<int64_t>(l->owned.size())) {
      Die(absl::StrCat("Capacity says ", resp.capacity().allocated_blocks(),
                       " allocated; the driver holds ", l->owned.size()));
    }
  }

  void Occupancy() {
    v1::GetPageOccupancyRequest r;
    r.set_pool(PoolName());
    const int64_t n = in_->Range(0, 6);
    for (int64_t i = 0; i < n; ++i) {
      r.add_page_ids(in_->Range(0, 15) == 0 ? static_cast<int64_t>(in_->U64())
                                            : in_->Range(-1, 40));
    }
    v1::GetPageOccupancyResponse resp;
    CheckTyped("GetPageOccupancy",
               w_->stub->GetPageOccupancy(Context().get(), r, &resp));
  }

  void Lookup() {
    if (in_->Bool()) {
      v1::GetPoolRequest r;
      r.set_pool(PoolName());
      v1::GetPoolResponse resp;
      grpc::Status s = w_->stub->GetPool(Context().get(), r, &resp);
      CheckTyped("GetPool", s);
      if (s.ok() != (Find(r.pool()) != nullptr)) {
        Die("GetPool disagrees with the pools created: " + r.pool());
      }
      return;
    }
    v1::ListPoolsResponse resp;
    grpc::Status s =
        w_->stub->ListPools(Context().get(), v1::ListPoolsRequest(), &resp);
    CheckTyped("ListPools", s);
    if (s.ok() && resp.pools_size() != static_cast<int>(ledgers_.size())) {
      Die(absl::StrCat("ListPools lists ", resp.pools_size(), " pools, not ",
                       ledgers_.size()));
    }
  }

  void DeletePool() {
    v1::DeletePoolRequest r;
    r.set_pool(PoolName());
    r.set_force(in_->Range(0, 2) == 0);
    // The handles the pool holds, to see what deleting it returns.
    Broker* broker = w_->daemon->broker();
    const int64_t live_before = w_->host.live_handles();
    const int64_t orphaned_before = broker->orphaned_handles();
    int64_t pool_handles = 0;
    if (auto pool = broker->GetPool(r.pool()); pool.ok()) {
      pool_handles = (*pool)->backend_handles();
    }
    v1::DeletePoolResponse resp;
    grpc::Status s = w_->stub->DeletePool(Context().get(), r, &resp);
    CheckTyped("DeletePool", s);
    Ledger* l = Find(r.pool());
    if (!s.ok()) return;
    // What the delete could not release is now the orphans'.
    const int64_t left = w_->host.live_handles() - (live_before - pool_handles);
    const int64_t orphaned = broker->orphaned_handles() - orphaned_before;
    if (left != orphaned || left < 0) {
      Die(absl::StrCat("DeletePool left ", left, " handles behind; ", orphaned,
                       " became orphans"));
    }
    rpc_counts.orphaning_deletes += left > 0;
    if (l == nullptr) Die("DeletePool succeeded on a pool never created");
    if (!r.force() && (!l->owned.empty() || l->reserved() > 0)) {
      Die("DeletePool without force deleted a pool with blocks held");
    }
    ledgers_.erase(r.pool());
  }

  void Other() {
    switch (in_->Range(0, 3)) {
      case 0: {  // arm a backend fault
        static const BackendOp kOps[] = {
            BackendOp::kCreate, BackendOp::kMap,     BackendOp::kSetAccess,
            BackendOp::kUnmap,  BackendOp::kRelease, BackendOp::kReserveRange};
        FaultRule rule;
        rule.op = in_->Pick(kOps);
        rule.kind = in_->Bool() ? FaultKind::kOutOfMemory : FaultKind::kError;
        rule.nth = in_->Range(1, 4);
        w_->backend.AddFault(rule);
        if (kTrace) {
          std::fprintf(stderr, "trace: fault on backend op %d, call %lld, %s\n",
                       static_cast<int>(rule.op),
                       static_cast<long long>(rule.nth),
                       rule.kind == FaultKind::kOutOfMemory ? "OOM" : "error");
        }
        return;
      }
      case 1: w_->daemon->broker()->RunMaintenance(); return;
      case 2: {  // a short watch: its first snapshot agrees with the ledger
        v1::WatchCapacityRequest r;
        r.set_pool(PoolName());
        auto ctx = Context();
        auto reader = w_->stub->WatchCapacity(ctx.get(), r);
        v1::WatchCapacityResponse first;
        const bool got = reader->Read(&first);
        if (got) {
          ctx->TryCancel();
          v1::WatchCapacityResponse rest;
          while (reader->Read(&rest)) {
          }
        }
        grpc::Status s = reader->Finish();
        Ledger* l = Find(r.pool());
        if (got != (l != nullptr)) {
          Die("WatchCapacity's first snapshot disagrees with the pools "
              "created");
        }
        if (got) {
          ++rpc_counts.calls["WatchCapacity"].first;
        } else {
          CheckTyped("WatchCapacity", s);
        }
        return;
      }
      case 3: {  // Alloc a few blocks from a reservation and check the rest
        Alloc();
        return;
      }
    }
  }

  // Backend handles a pool accounts for: its mapped pages on each device.
  static int64_t MappedHandles(PagePool& pool) {
    absl::StatusOr<CapacitySnapshot> cap = pool.Capacity();
    if (!cap.ok()) return 0;
    return (cap->pages_idle.value() + cap->pages_open.value() +
            cap->pages_full.value() + cap->pages_mapping.value()) *
           static_cast<int64_t>(pool.geometry().config().devices.size());
  }

  // After every step: invariants and the ledger, on every pool.
  void CheckAll() {
    const int64_t orphaned = w_->daemon->broker()->orphaned_handles();
    int64_t handles = orphaned;  // by the ledgers' mapped pages
    int64_t held = orphaned;     // by what each pool holds
    bool all_healthy = true;
    for (const std::shared_ptr<PagePool>& pool :
         w_->daemon->broker()->ListPools()) {
      if (absl::Status s = pool->CheckInvariants(); !s.ok()) {
        Die(absl::StrCat("pool ", pool->name(), ": ", s.ToString()));
      }
      Ledger* l = Find(pool->name());
      if (l == nullptr)
        Die("a pool the driver did not create: " + pool->name());
      absl::StatusOr<CapacitySnapshot> cap = pool->Capacity();
      if (!cap.ok()) Die("Capacity: " + cap.status().ToString());
      if (cap->allocated_blocks.value() !=
              static_cast<int64_t>(l->owned.size()) ||
          cap->reserved_blocks.value() != l->reserved()) {
        Die(absl::StrCat("pool ", pool->name(), " has ",
                         cap->allocated_blocks.value(), " allocated and ",
                         cap->reserved_blocks.value(),
                         " reserved; the driver holds ", l->owned.size(),
                         " and ", l->reserved()));
      }
      handles += MappedHandles(*pool);
      held += pool->backend_handles();
      all_healthy &= pool->healthy();
    }
    if (w_->host.live_handles() != held) {
      Die(absl::StrCat("backend holds ", w_->host.live_handles(),
                       " handles; the pools and orphans hold ", held));
    }
    // A FAILED pool may hold handles of a rollback or unmap it could not
    // finish beyond (or within) its mapped page counts.
    if (all_healthy && held != handles) {
      Die(absl::StrCat("backend holds ", w_->host.live_handles(),
                       " handles; the pools' mapped pages account for ",
                       handles));
    }
  }

  World* const w_;
  ByteReader* const in_;
  std::map<std::string, Ledger> ledgers_;
  int64_t revision_ = 0;
};

}  // namespace
}  // namespace fuzz
}  // namespace kvbroker

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvbroker::fuzz::World* world = kvbroker::fuzz::TheWorld();
  kvbroker::fuzz::ByteReader in(data, size);
  kvbroker::fuzz::Program program(world, &in);
  program.Run();
  program.Cleanup();
  return 0;
}
