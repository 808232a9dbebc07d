// Fuzz driver: the --pools file, from bytes to pools.
//
// kvbrokerd reads the file as a kvbroker.v1.PoolsFile in text format and
// hands it to Daemon::CreatePools, which validates and creates each pool in
// order, stopping at the first failure. This driver does the same two steps
// on a daemon over the host backend (created once, never serving) and then
// requires that:
//   - a failure is typed (a kvbroker reason) and names the entry;
//   - every pool created before the failure passes CheckInvariants (pools
//     of at most 65536 blocks: the walk is O(blocks)) and holds no
//     allocated or reserved block;
//   - force-deleting them returns every backend handle.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/broker.h"
#include "allocator/failure.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "fuzz/text_parse.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "server/daemon.h"

namespace kvbroker {
namespace fuzz {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pools_file_fuzzer: %s\n", what.c_str());
  std::abort();
}

struct World {
  HostBackend host{[] {
    HostBackendOptions o;
    o.device_count = 2;
    o.device_total = Bytes(256 * kMiB);
    return o;
  }()};
  std::unique_ptr<Daemon> daemon;
};

World* TheWorld() {
  static World* world = [] {
    auto* w = new World();
    BrokerOptions bo;
    bo.gpu_memory_utilization = 1.0;
    bo.min_idle_pages = 0;
    bo.start_worker = false;
    DaemonOptions dopt;
    dopt.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<Daemon>> d =
        Daemon::Create(&w->host, bo, dopt);
    if (!d.ok()) Die(d.status().ToString());
    w->daemon = *std::move(d);
    return w;
  }();
  return world;
}

}  // namespace
}  // namespace fuzz
}  // namespace kvbroker

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvbroker;  // NOLINT: a driver's entry point
  fuzz::World* w = fuzz::TheWorld();
  v1::PoolsFile file;
  if (!fuzz::ParseText(std::string(reinterpret_cast<const char*>(data), size),
                       &file)) {
    return 0;
  }
  Broker* broker = w->daemon->broker();
  const absl::Status created = w->daemon->CreatePools(file);
  if (!created.ok() && GetReason(created) == FailureReason::kUnspecified) {
    fuzz::Die("CreatePools failed untyped: " + created.ToString());
  }
  int made = 0;
  for (const v1::PoolSpec& spec : file.pools()) {
    absl::StatusOr<std::shared_ptr<PagePool>> pool =
        broker->GetPool(spec.name());
    if (!pool.ok()) break;
    ++made;
    // The invariant walk visits every block: for the largest pools it would
    // take the driver's whole time budget, so they get the counts only.
    if (absl::Status s = spec.max_blocks() <= (1 << 16)
                             ? (*pool)->CheckInvariants()
                             : absl::OkStatus();
        !s.ok()) {
      fuzz::Die(absl::StrCat("pool ", spec.name(), ": ", s.ToString()));
    }
    absl::StatusOr<CapacitySnapshot> cap = (*pool)->Capacity();
    if (!cap.ok() || cap->allocated_blocks.value() != 0 ||
        cap->reserved_blocks.value() != 0) {
      fuzz::Die("a new pool holds blocks: " + spec.name());
    }
  }
  if (created.ok() && made != file.pools_size()) {
    fuzz::Die("CreatePools succeeded without creating every pool");
  }
  for (const std::shared_ptr<PagePool>& pool : broker->ListPools()) {
    if (absl::Status s = broker->DeletePool(pool->name(), /*force=*/true);
        !s.ok()) {
      fuzz::Die("force delete: " + s.ToString());
    }
  }
  if (w->host.live_handles() != 0) {
    fuzz::Die(absl::StrCat(w->host.live_handles(),
                           " backend handles left after deleting every pool"));
  }
  return 0;
}
