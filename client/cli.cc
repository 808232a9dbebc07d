// kvbrokerctl: the operator's command line over the client library.
//
//   kvbrokerctl [--server=ADDR] [--json] [--timeout=10s] COMMAND [ARGS] [FLAGS]
//
// Commands (a small dispatch table, Commands() below); flags may come before
// or after the command. Human-readable output by default; --json prints the
// reply message in protobuf's JSON mapping (proto field names, every field).
// Errors go to stderr (the google.rpc.Status as JSON with --json) and the exit
// code names the failure class; see client/README.md for the table.
//
// Flags are absl flags, parsed here through absl's registry (so that bad
// usage exits 2 and `--pages` may stand without a value). `top` lives in
// top.cc, the exit codes and shared text forms in cli_text.cc.

#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli_text.h"
#include "client/kvbroker_client.h"
#include "client/top.h"
#include "common/byte_size.h"

// Global flags.
ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "kvbrokerd address: host:port, or unix:/path/to.sock for the Unix "
          "socket (kvbrokerd --unix_socket).");
ABSL_FLAG(bool, json, false,
          "Print replies as JSON (protobuf's JSON mapping, proto field names, "
          "int64 values as strings); errors as a google.rpc.Status on stderr.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "Deadline of each command's RPC, retries included (e.g. 500ms, 5s).");
ABSL_FLAG(absl::Duration, wait, absl::ZeroDuration(),
          "Before the command, wait up to this long for a connection to "
          "kvbrokerd (a daemon still starting: scripts, init containers); "
          "none in time exits as UNAVAILABLE does. 0: do not wait.");
ABSL_FLAG(std::string, token, "",
          "Bearer token sent as 'authorization: Bearer TOKEN'. Empty: the "
          "KVBROKER_TOKEN environment variable, which keeps the secret out of "
          "the process list.");
ABSL_FLAG(bool, tls, false, "Connect with TLS (implied by --tls_ca etc.).");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of the root CA (TLS).");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS).");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key (mutual TLS).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the server certificate against (TLS).");

// Command flags.
ABSL_FLAG(std::string, page_size, "",
          "create-pool: page size P, e.g. 2MiB or 14MiB (required).");
ABSL_FLAG(std::string, block_bytes, "",
          "create-pool: bytes of one block per layer and KV buffer, e.g. "
          "6MiB or 32KiB (required).");
ABSL_FLAG(int64_t, max_blocks, 0,
          "create-pool: number of block ids N (required).");
ABSL_FLAG(int64_t, tokens_per_block, 1, "create-pool: tokens one block holds.");
ABSL_FLAG(int64_t, layers, 1, "create-pool: layers L.");
ABSL_FLAG(int64_t, kv_buffers, 1,
          "create-pool: KV buffers K (2: separate K and V; 1: MLA).");
ABSL_FLAG(std::string, devices, "",
          "create-pool: device ordinals, comma-separated (empty: 0).");
ABSL_FLAG(bool, reserve_null_block, false,
          "create-pool: allocate block 0 at creation and never hand it out.");
ABSL_FLAG(int64_t, min_idle_pages, -1,
          "create-pool: IDLE pages to keep mapped (-1: the daemon's default).");
ABSL_FLAG(int64_t, max_idle_pages, -1,
          "create-pool: IDLE pages kept after frees (-1: the daemon's "
          "default).");
ABSL_FLAG(bool, export_at_map, false,
          "create-pool: export each page's handles to fds when the page is "
          "mapped, so engines attach without waiting for exports.");
ABSL_FLAG(bool, force, false,
          "delete-pool: delete even with allocated or reserved blocks.");
ABSL_FLAG(std::string, pages, "",
          "capacity, watch: also list pages in consumption order; --pages "
          "alone lists as many as kvbrokerd returns by default (4096, its "
          "--max_page_list), --pages=N at most N.");
ABSL_FLAG(std::string, request_id, "",
          "alloc, free, reserve: idempotency key (default: a random one, "
          "reused across retries).");
ABSL_FLAG(std::string, reservation, "",
          "alloc: take blocks from this reservation first.");
ABSL_FLAG(std::string, pool_uid, "",
          "alloc, free, release: refuse (POOL_NOT_FOUND) unless the pool is "
          "this incarnation (the pool_uid shown by alloc, reserve and "
          "capacity), so blocks of a pool deleted and created again under "
          "the same name are never touched.");
ABSL_FLAG(int64_t, expected_generation, -1,
          "alloc: refuse (GENERATION_MISMATCH) unless the pool is at this "
          "generation (-1: don't check).");
ABSL_FLAG(absl::Duration, ttl, absl::ZeroDuration(),
          "reserve: lifetime of the reservation (0: the daemon's 30s).");
ABSL_FLAG(int64_t, revision, -1,
          "limit: revision of this limit (-1: the pool's current revision + "
          "1).");
ABSL_FLAG(int64_t, max_pages, 0, "trim: unmap at most this many (0: all).");
ABSL_FLAG(int64_t, count, 0,
          "watch: exit after this many snapshots (0: until interrupted).");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(2),
          "top: how often to look for new pools, and to refresh the pools "
          "without a stream (at least 100ms).");
ABSL_FLAG(int, streams, 64,
          "top: pools followed by a WatchCapacity stream, 0 to 1024 (the "
          "daemon's bound per caller); the others are refreshed every "
          "--interval.");

namespace kvbroker {
namespace cli {
namespace {

// ---------------------------------------------------------------------------
// Output.

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options)
           .ok()) {
    return "{}";
  }
  return out;
}

void PrintJson(const google::protobuf::Message& message) {
  std::cout << ToJson(message) << std::endl;
}

// Prints a failed call (reason, code, message, metadata) and returns its
// exit code.
int Fail(const absl::Status& status, bool json) {
  const KvbError e = GetKvbError(status).value();
  if (json) {
    google::rpc::Status rpc = e.details;
    if (rpc.code() == 0) {
      rpc.set_code(static_cast<int>(e.code));
      rpc.set_message(e.message);
    }
    std::cerr << ToJson(rpc) << std::endl;
    return ExitCodeFor(status);
  }
  // Everything here came from the daemon (or echoes our arguments):
  // printed with control bytes escaped.
  std::cerr << "error: ";
  if (e.reason_name != v1::Reason_Name(v1::REASON_UNSPECIFIED)) {
    std::cerr << Printable(e.reason_name) << " ";
  }
  std::cerr << "(" << absl::StatusCodeToString(status.code())
            << "): " << Printable(e.message) << "\n";
  for (const auto& [key, value] : e.metadata) {
    std::cerr << "  " << Printable(key) << ": " << Printable(value) << "\n";
  }
  for (const auto& v : e.field_violations) {
    std::cerr << "  field " << Printable(v.field()) << ": "
              << Printable(v.description()) << "\n";
  }
  if (e.retry_delay.has_value()) {
    std::cerr << "  retry after " << absl::FormatDuration(*e.retry_delay)
              << "\n";
  }
  return ExitCodeFor(status);
}

int Usage(absl::string_view message) {
  std::cerr << "kvbrokerctl: " << Printable(message)
            << "\n(kvbrokerctl --help lists commands and flags)\n";
  return kExitUsage;
}

void PrintPageList(const v1::CapacitySnapshot& c) {
  if (c.page_list().empty()) return;
  std::cout << absl::StrFormat("  %8s  %-9s %7s %7s %7s %7s  %s\n", "PAGE",
                               "STATE", "USABLE", "FREE", "ALLOC", "RESV",
                               "COUNTED");
  for (const v1::PageInfo& p : c.page_list()) {
    std::cout << absl::StrFormat(
        "  %8d  %-9s %7d %7d %7d %7d  %s\n", p.page_id(), StateName(p.state()),
        p.usable_blocks(), p.free_blocks(), p.allocated_blocks(),
        p.reserved_blocks(),
        p.state() == v1::PAGE_STATE_FREE ? (p.counted() ? "yes" : "no") : "");
  }
}

void PrintCapacity(const v1::CapacitySnapshot& c) {
  std::cout << "pool " << Printable(c.pool()) << "  generation "
            << c.generation() << "  " << HealthText(c) << "\n";
  if (!c.pool_uid().empty()) {
    std::cout << "  uid      " << Printable(c.pool_uid()) << "\n";
  }
  std::cout << "  blocks   available " << c.available_blocks() << " ("
            << c.available_tokens() << " tokens)  allocated "
            << c.allocated_blocks() << "  reserved " << c.reserved_blocks()
            << "  total " << c.total_blocks() << "\n";
  std::cout << "  pages    " << PageCountsText(c.pages()) << "\n";
  std::cout << "  memory   mapped " << FormatBytes(c.mapped_bytes())
            << "  virtual " << FormatBytes(c.virtual_bytes())
            << "  affordable bundles " << c.affordable_bundles() << "\n";
  std::cout << "  limit    " << LimitText(c.limit()) << "\n";
  for (const v1::DeviceBudget& d : c.devices()) {
    std::cout << "  device " << d.device() << "  budget "
              << FormatBytes(d.budget_bytes()) << "  total "
              << FormatBytes(d.total_bytes()) << "  driver free "
              << FormatBytes(d.driver_free_bytes()) << "  headroom "
              << FormatBytes(d.headroom_bytes()) << "  charged "
              << FormatBytes(d.charged_bytes()) << "\n";
  }
  PrintPageList(c);
}

void PrintBlocks(
    const google::protobuf::RepeatedPtrField<v1::PageBlocks>& pages,
    const std::vector<int64_t>& ids) {
  std::cout << "blocks: " << absl::StrJoin(ids, " ") << "\n";
  for (const v1::PageBlocks& p : pages) {
    std::cout << "  page " << p.page_id() << ": "
              << absl::StrJoin(p.block_ids(), " ") << "\n";
  }
}

// ---------------------------------------------------------------------------
// Commands.

struct Context {
  KvBrokerClient* client;
  bool json;
  std::vector<std::string> args;
};

absl::StatusOr<int64_t> IntArg(const std::string& text,
                               absl::string_view what) {
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected an integer, got \"", text, "\""));
  }
  return v;
}

absl::StatusOr<int64_t> SizeArg(const std::string& text,
                                absl::string_view what) {
  absl::StatusOr<int64_t> v = ParseSize(text);
  if (!v.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", v.status().message()));
  return v;
}

// The default of kvbrokerd --max_page_list: the longest page list a daemon
// with default flags returns.
constexpr int64_t kDefaultMaxPageList = 4096;

// --pages: "" none, "all" as many as the daemon's default bound, N at most N.
absl::StatusOr<int64_t> PagesFlag() {
  const std::string pages = absl::GetFlag(FLAGS_pages);
  if (pages.empty()) return 0;
  if (pages == "all") return kDefaultMaxPageList;
  absl::StatusOr<int64_t> n = IntArg(pages, "--pages");
  if (n.ok() && *n <= 0)
    return absl::InvalidArgumentError("--pages: must be > 0");
  return n;
}

int CmdPools(Context& ctx) {
  absl::StatusOr<std::vector<v1::PoolInfo>> pools = ctx.client->ListPools();
  if (!pools.ok()) return Fail(pools.status(), ctx.json);
  if (ctx.json) {
    v1::ListPoolsResponse r;
    for (v1::PoolInfo& p : *pools) *r.add_pools() = std::move(p);
    PrintJson(r);
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-20s %9s %9s %8s %7s %10s %10s %9s %10s  %s\n",
                               "POOL", "PAGE", "BLOCK", "BLOCKS", "PAGES",
                               "AVAILABLE", "ALLOCATED", "RESERVED", "MAPPED",
                               "HEALTH");
  for (const v1::PoolInfo& p : *pools) {
    const v1::CapacitySnapshot& c = p.capacity();
    std::cout << absl::StrFormat(
        "%-20s %9s %9s %8d %7d %10d %10d %9d %10s  %s\n",
        Printable(p.spec().name()), FormatBytes(p.spec().page_size()),
        FormatBytes(p.spec().block_bytes()), p.spec().max_blocks(),
        p.page_count(), c.available_blocks(), c.allocated_blocks(),
        c.reserved_blocks(), FormatBytes(c.mapped_bytes()),
        c.healthy() ? "ok" : "FAILED");
  }
  return kExitOk;
}

int CmdCreatePool(Context& ctx) {
  v1::PoolSpec spec;
  spec.set_name(ctx.args[0]);
  if (absl::GetFlag(FLAGS_page_size).empty() ||
      absl::GetFlag(FLAGS_block_bytes).empty() ||
      absl::GetFlag(FLAGS_max_blocks) == 0) {
    return Usage(
        "create-pool needs --page_size, --block_bytes and --max_blocks");
  }
  absl::StatusOr<int64_t> page =
      SizeArg(absl::GetFlag(FLAGS_page_size), "--page_size");
  if (!page.ok()) return Usage(page.status().message());
  absl::StatusOr<int64_t> block =
      SizeArg(absl::GetFlag(FLAGS_block_bytes), "--block_bytes");
  if (!block.ok()) return Usage(block.status().message());
  spec.set_page_size(*page);
  spec.set_block_bytes(*block);
  spec.set_max_blocks(absl::GetFlag(FLAGS_max_blocks));
  spec.set_tokens_per_block(absl::GetFlag(FLAGS_tokens_per_block));
  spec.set_num_layers(absl::GetFlag(FLAGS_layers));
  spec.set_num_kv_buffers(absl::GetFlag(FLAGS_kv_buffers));
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',',
                                            absl::SkipWhitespace())) {
    int32_t device;
    if (!absl::SimpleAtoi(d, &device)) {
      return Usage(absl::StrCat("--devices: bad device \"", d, "\""));
    }
    spec.add_devices(device);
  }
  spec.set_reserve_null_block(absl::GetFlag(FLAGS_reserve_null_block));
  // -1 stands for "the daemon's default"; any other negative is a mistake.
  if (absl::GetFlag(FLAGS_min_idle_pages) < -1) {
    return Usage("--min_idle_pages: must be >= 0, or -1 for the default");
  }
  if (absl::GetFlag(FLAGS_max_idle_pages) < -1) {
    return Usage("--max_idle_pages: must be >= 0, or -1 for the default");
  }
  if (absl::GetFlag(FLAGS_min_idle_pages) >= 0) {
    spec.set_min_idle_pages(absl::GetFlag(FLAGS_min_idle_pages));
  }
  if (absl::GetFlag(FLAGS_max_idle_pages) >= 0) {
    spec.set_max_idle_pages(absl::GetFlag(FLAGS_max_idle_pages));
  }
  spec.set_export_at_map(absl::GetFlag(FLAGS_export_at_map));
  absl::StatusOr<v1::PoolInfo> info = ctx.client->CreatePool(spec);
  if (!info.ok()) return Fail(info.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*info);
    return kExitOk;
  }
  std::cout << "created pool " << Printable(info->spec().name()) << ": page "
            << FormatBytes(info->spec().page_size()) << ", block "
            << FormatBytes(info->spec().block_bytes()) << ", "
            << info->spec().max_blocks() << " block ids on "
            << info->page_count() << " pages, " << info->total_usable_blocks()
            << " usable; bundle " << FormatBytes(info->bundle_bytes())
            << " per page per device; devices " << DevicesText(info->spec())
            << "\n";
  std::cout << "available " << info->capacity().available_blocks()
            << " blocks\n";
  return kExitOk;
}

int CmdDeletePool(Context& ctx) {
  absl::Status s =
      ctx.client->DeletePool(ctx.args[0], absl::GetFlag(FLAGS_force));
  if (!s.ok()) return Fail(s, ctx.json);
  if (ctx.json) {
    PrintJson(v1::DeletePoolResponse());
  } else {
    std::cout << "deleted pool " << Printable(ctx.args[0]) << "\n";
  }
  return kExitOk;
}

int CmdCapacity(Context& ctx) {
  absl::StatusOr<int64_t> pages = PagesFlag();
  if (!pages.ok()) return Usage(pages.status().message());
  absl::StatusOr<v1::CapacitySnapshot> c =
      ctx.client->Capacity(ctx.args[0], *pages);
  if (!c.ok()) return Fail(c.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*c);
  } else {
    PrintCapacity(*c);
  }
  return kExitOk;
}

int CmdAlloc(Context& ctx) {
  absl::StatusOr<int64_t> n = IntArg(ctx.args[1], "N");
  if (!n.ok()) return Usage(n.status().message());
  AllocOptions options;
  options.request_id = absl::GetFlag(FLAGS_request_id);
  options.reservation_id = absl::GetFlag(FLAGS_reservation);
  if (absl::GetFlag(FLAGS_expected_generation) >= 0) {
    options.expected_generation = absl::GetFlag(FLAGS_expected_generation);
  }
  options.pool_uid = absl::GetFlag(FLAGS_pool_uid);
  absl::StatusOr<v1::AllocResponse> r =
      ctx.client->Alloc(ctx.args[0], *n, options);
  if (!r.ok()) return Fail(r.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*r);
    return kExitOk;
  }
  std::cout << "allocated " << r->num_blocks() << " blocks from "
            << Printable(ctx.args[0]) << " (" << r->pages_mapped()
            << " pages mapped, generation " << r->generation()
            << (r->replayed() ? ", replayed" : "") << ")\n";
  std::cout << "pool_uid: " << Printable(r->pool_uid()) << "\n";
  PrintBlocks(r->pages(), BlockIds(*r));
  return kExitOk;
}

int CmdFree(Context& ctx) {
  std::vector<int64_t> ids;
  for (size_t i = 1; i < ctx.args.size(); ++i) {
    for (absl::string_view part :
         absl::StrSplit(ctx.args[i], ',', absl::SkipWhitespace())) {
      absl::StatusOr<int64_t> id = IntArg(std::string(part), "block id");
      if (!id.ok()) return Usage(id.status().message());
      ids.push_back(*id);
    }
  }
  if (ids.empty()) return Usage("free: no block id given");
  FreeOptions options;
  options.request_id = absl::GetFlag(FLAGS_request_id);
  options.pool_uid = absl::GetFlag(FLAGS_pool_uid);
  absl::StatusOr<v1::FreeResponse> r =
      ctx.client->Free(ctx.args[0], ids, options);
  if (!r.ok()) return Fail(r.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*r);
    return kExitOk;
  }
  std::cout << "freed " << r->freed_blocks() << " blocks in "
            << Printable(ctx.args[0]) << " (" << r->pages_unmapped()
            << " pages unmapped, generation " << r->generation()
            << (r->replayed() ? ", replayed" : "") << ")\n";
  return kExitOk;
}

int CmdReserve(Context& ctx) {
  absl::StatusOr<int64_t> n = IntArg(ctx.args[1], "N");
  if (!n.ok()) return Usage(n.status().message());
  ReserveOptions options;
  options.request_id = absl::GetFlag(FLAGS_request_id);
  options.ttl = absl::GetFlag(FLAGS_ttl);
  absl::StatusOr<v1::ReserveResponse> r =
      ctx.client->Reserve(ctx.args[0], *n, options);
  if (!r.ok()) return Fail(r.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*r);
    return kExitOk;
  }
  const absl::Time expiry = absl::FromUnixSeconds(r->expire_time().seconds()) +
                            absl::Nanoseconds(r->expire_time().nanos());
  std::cout << "reservation " << Printable(r->reservation_id()) << ": "
            << r->num_blocks() << " blocks in " << Printable(ctx.args[0])
            << ", expires "
            << absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", expiry,
                                absl::LocalTimeZone())
            << " (generation " << r->generation()
            << (r->replayed() ? ", replayed" : "") << ")\n";
  std::cout << "pool_uid: " << Printable(r->pool_uid()) << "\n";
  PrintBlocks(r->pages(), BlockIds(*r));
  return kExitOk;
}

int CmdRelease(Context& ctx) {
  ReleaseOptions options;
  options.pool_uid = absl::GetFlag(FLAGS_pool_uid);
  absl::StatusOr<v1::ReleaseReservationResponse> r =
      ctx.client->ReleaseReservation(ctx.args[0], ctx.args[1], options);
  if (!r.ok()) return Fail(r.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*r);
    return kExitOk;
  }
  std::cout << "released " << r->released_blocks() << " blocks of "
            << Printable(ctx.args[1]) << " (generation " << r->generation()
            << ")\n";
  return kExitOk;
}

int CmdLimit(Context& ctx) {
  absl::StatusOr<int64_t> bytes = SizeArg(ctx.args[1], "BYTES");
  if (!bytes.ok()) return Usage(bytes.status().message());
  int64_t revision = absl::GetFlag(FLAGS_revision);
  if (revision < 0) {
    absl::StatusOr<v1::CapacitySnapshot> c = ctx.client->Capacity(ctx.args[0]);
    if (!c.ok()) return Fail(c.status(), ctx.json);
    if (c->limit().revision() == std::numeric_limits<int64_t>::max()) {
      return Usage(
          "the pool's limit revision is the largest there is; give "
          "--revision");
    }
    revision = std::max<int64_t>(c->limit().revision(), -1) + 1;
  }
  absl::StatusOr<v1::SetMemoryLimitResponse> r =
      ctx.client->SetMemoryLimit(ctx.args[0], *bytes, revision);
  if (!r.ok()) return Fail(r.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*r);
    return kExitOk;
  }
  std::string outcome = v1::LimitOutcome_Name(r->outcome());
  std::cout << outcome << " (revision " << revision << "): limit "
            << LimitText(r->limit()) << "; mapped "
            << FormatBytes(r->mapped_bytes()) << " (generation "
            << r->generation() << ")\n";
  return kExitOk;
}

int CmdTrim(Context& ctx) {
  absl::StatusOr<v1::TrimResponse> r =
      ctx.client->Trim(ctx.args[0], absl::GetFlag(FLAGS_max_pages));
  if (!r.ok()) return Fail(r.status(), ctx.json);
  if (ctx.json) {
    PrintJson(*r);
    return kExitOk;
  }
  std::cout << "unmapped " << r->pages_unmapped() << " idle pages of "
            << Printable(ctx.args[0]) << " (generation " << r->generation()
            << ")\n";
  return kExitOk;
}

// Ends `watch` on SIGINT / SIGTERM so that the command exits cleanly.
std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted = true; }

int CmdWatch(Context& ctx) {
  absl::StatusOr<int64_t> pages = PagesFlag();
  if (!pages.ok()) return Usage(pages.status().message());
  const int64_t count = absl::GetFlag(FLAGS_count);
  if (count < 0) return Usage("--count: must be >= 0 (0: until interrupted)");
  std::unique_ptr<CapacityWatch> watch =
      ctx.client->WatchCapacity(ctx.args[0], *pages);
  // A helper thread turns a signal into Cancel(); it polls the flag so that
  // no gRPC call happens inside the handler.
  absl::Notification done;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::thread canceller([&] {
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      if (g_interrupted) {
        watch->Cancel();
        return;
      }
    }
  });
  int64_t seen = 0;
  v1::CapacitySnapshot c;
  while ((count <= 0 || seen < count) && watch->Next(&c)) {
    ++seen;
    if (ctx.json) {
      PrintJson(c);
      continue;
    }
    std::cout << absl::FormatTime("%H:%M:%S", absl::Now(),
                                  absl::LocalTimeZone())
              << "  " << Printable(c.pool()) << "  gen " << c.generation()
              << "  available " << c.available_blocks() << "  allocated "
              << c.allocated_blocks() << "  reserved " << c.reserved_blocks()
              << "  pages[" << PageCountsText(c.pages()) << "]  mapped "
              << FormatBytes(c.mapped_bytes()) << "  limit "
              << LimitText(c.limit()) << "  " << HealthText(c) << std::endl;
    PrintPageList(c);
  }
  done.Notify();
  canceller.join();
  if (count > 0 && seen >= count) return kExitOk;
  absl::Status end = watch->Finish();
  if (g_interrupted || end.ok()) return kExitOk;
  return Fail(end, ctx.json);
}

// Exit 0 only when SERVING, so that it serves as an exec probe.
int CmdHealth(Context& ctx) {
  const std::string service = ctx.args.empty() ? "" : ctx.args[0];
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> status =
      ctx.client->Health(service);
  if (!status.ok()) return Fail(status.status(), ctx.json);
  if (ctx.json) {
    grpc::health::v1::HealthCheckResponse r;
    r.set_status(*status);
    PrintJson(r);
  } else {
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                     *status)
              << "\n";
  }
  return *status == grpc::health::v1::HealthCheckResponse::SERVING
             ? kExitOk
             : kExitUnavailable;
}

// A duration for a table: whole seconds, e.g. "1h2m3s", "0s".
std::string Seconds(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

int CmdSessions(Context& ctx) {
  absl::StatusOr<std::vector<v1::EngineSession>> sessions =
      ctx.client->ListSessions(ctx.args.empty() ? "" : ctx.args[0]);
  if (!sessions.ok()) return Fail(sessions.status(), ctx.json);
  if (ctx.json) {
    v1::ListSessionsResponse r;
    for (v1::EngineSession& s : *sessions) *r.add_sessions() = std::move(s);
    PrintJson(r);
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "%-8s %-24s %8s %-16s %6s %7s %8s %11s %9s  %s\n", "SESSION", "HOLDER",
      "PID", "POOL", "PAGES", "BLOCKS", "REVOKING", "QUARANTINED", "SINCE",
      "GRACE");
  const absl::Time now = absl::Now();
  for (const v1::EngineSession& s : *sessions) {
    const absl::Time since =
        absl::FromUnixSeconds(s.attached_since().seconds());
    const absl::Duration grace = absl::Seconds(s.reattach_grace().seconds());
    std::string grace_text = Seconds(grace);
    if (s.in_grace()) {
      grace_text = absl::StrCat(
          "in grace, ",
          Seconds(absl::FromUnixSeconds(s.grace_ends().seconds()) - now),
          " left");
    }
    std::cout << absl::StrFormat(
        "%-8s %-24s %8d %-16s %6d %7d %8d %11d %9s  %s\n",
        s.session_id() == 0 ? "-" : absl::StrCat(s.session_id()),
        Printable(s.holder()), s.pid(),
        s.pool().empty() ? "-" : Printable(s.pool()), s.mapped_pages(),
        s.blocks(), s.pending_revocations(), s.quarantined_pages(),
        Seconds(now - since), grace_text);
  }
  return kExitOk;
}

int CmdTop(Context& ctx) {
  // A zero or negative interval would ask the daemon for its pools in a
  // busy loop.
  if (absl::GetFlag(FLAGS_interval) < absl::Milliseconds(100)) {
    return Usage("--interval: must be at least 100ms");
  }
  if (absl::GetFlag(FLAGS_streams) < 0 || absl::GetFlag(FLAGS_streams) > 1024) {
    return Usage("--streams: must be in [0, 1024]");
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGHUP, OnSignal);
  return cli::RunTop(*ctx.client, absl::GetFlag(FLAGS_interval),
                     absl::GetFlag(FLAGS_streams), g_interrupted);
}

// ---------------------------------------------------------------------------
// Dispatch.

struct Command {
  const char* name;
  const char* args;
  const char* help;
  int min_args;
  int max_args;  // -1: any
  std::vector<const char*> flags;
  int (*run)(Context&);
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"pools", "", "list pools with their capacity", 0, 0, {}, CmdPools},
      {"create-pool",
       "NAME",
       "create a pool, e.g. create-pool demo --page_size=14MiB "
       "--block_bytes=6MiB --max_blocks=5",
       1,
       1,
       {"page_size", "block_bytes", "max_blocks", "tokens_per_block", "layers",
        "kv_buffers", "devices", "reserve_null_block", "min_idle_pages",
        "max_idle_pages", "export_at_map"},
       CmdCreatePool},
      {"delete-pool", "NAME", "delete a pool", 1, 1, {"force"}, CmdDeletePool},
      {"capacity",
       "POOL",
       "exact capacity; --pages[=N] lists pages",
       1,
       1,
       {"pages"},
       CmdCapacity},
      {"alloc",
       "POOL N",
       "allocate N blocks, all or nothing",
       2,
       2,
       {"request_id", "reservation", "expected_generation", "pool_uid"},
       CmdAlloc},
      {"free",
       "POOL ID...",
       "free blocks (ids separated by spaces or commas)",
       2,
       -1,
       {"request_id", "pool_uid"},
       CmdFree},
      {"reserve",
       "POOL N",
       "set N blocks aside for a later alloc",
       2,
       2,
       {"ttl", "request_id"},
       CmdReserve},
      {"release",
       "POOL RESERVATION",
       "return a reservation's blocks",
       2,
       2,
       {"pool_uid"},
       CmdRelease},
      {"limit",
       "POOL BYTES",
       "set the pool's memory limit, e.g. 28MiB",
       2,
       2,
       {"revision"},
       CmdLimit},
      {"trim", "POOL", "unmap IDLE pages", 1, 1, {"max_pages"}, CmdTrim},
      {"watch",
       "POOL",
       "print capacity whenever it changes",
       1,
       1,
       {"pages", "count"},
       CmdWatch},
      {"health",
       "[SERVICE]",
       "serving status (grpc.health.v1); exit 0 only when SERVING",
       0,
       1,
       {},
       CmdHealth},
      {"sessions",
       "[POOL]",
       "engines attached on the attach socket",
       0,
       1,
       {},
       CmdSessions},
      {"top",
       "",
       "live view of every pool (q quits)",
       0,
       0,
       {"interval", "streams"},
       CmdTop},
  };
  return *commands;
}

constexpr const char* kGlobalFlags[] = {
    "server", "json",   "timeout",  "wait",    "token",
    "tls",    "tls_ca", "tls_cert", "tls_key", "tls_server_name",
};

void PrintHelp() {
  std::cout << "usage: kvbrokerctl [--server=ADDR] [--json] [--timeout=10s] "
               "[--wait=30s] COMMAND [ARGS] [FLAGS]\n\ncommands:\n";
  for (const Command& c : Commands()) {
    std::cout << absl::StrFormat("  %-12s %-18s %s\n", c.name, c.args, c.help);
  }
  std::map<std::string, absl::CommandLineFlag*> mine;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "client/cli.cc")) {
      mine[std::string(name)] = flag;
    }
  }
  auto print = [&](const std::string& name) {
    const absl::CommandLineFlag* flag = mine[name];
    std::cout << "  --" << name << " (default \"" << flag->DefaultValue()
              << "\")\n      " << flag->Help() << "\n";
  };
  std::cout << "\nglobal flags:\n";
  for (const char* name : kGlobalFlags) print(name);
  std::cout << "\ncommand flags:\n";
  for (const auto& [name, flag] : mine) {
    if (std::find(std::begin(kGlobalFlags), std::end(kGlobalFlags), name) ==
        std::end(kGlobalFlags)) {
      print(name);
    }
  }
  std::cout << "\nSizes take units: 4096, 512KiB, 14MiB, 2G, 2GiB (all "
               "binary).\nExit codes: 0 ok, 1 other, 2 usage, 3 not found, 4 "
               "capacity refusal,\n5 precondition, 6 unavailable, 7 invalid "
               "argument, 8 unauthenticated/denied.\n";
}

// Parses argv into absl flags and positional arguments. Accepts --name=value,
// --name value, -name, --name-with-dashes, --bool / --nobool, and --pages
// without a value. Returns the flags set, or a usage error.
absl::StatusOr<std::set<std::string>> ParseArgs(
    int argc, char** argv, std::vector<std::string>* positional, bool* help) {
  std::set<std::string> set;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional->push_back(argv[i]);
      break;
    }
    // "-5" (a negative count) and "-" are positional.
    if (arg.size() < 2 || arg[0] != '-' || absl::ascii_isdigit(arg[1])) {
      positional->push_back(arg);
      continue;
    }
    absl::string_view body = arg;
    absl::ConsumePrefix(&body, "-");
    absl::ConsumePrefix(&body, "-");
    std::string name(body.substr(0, body.find('=')));
    std::optional<std::string> value;
    if (body.find('=') != absl::string_view::npos) {
      value = std::string(body.substr(body.find('=') + 1));
    }
    std::replace(name.begin(), name.end(), '-', '_');
    if (name == "help" || name == "h") {
      *help = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if ((flag == nullptr || !absl::StrContains(flag->Filename(), "cli.cc")) &&
        absl::StartsWith(name, "no") && !value.has_value()) {
      absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
        value = "false";
      }
    }
    if (flag == nullptr || !absl::StrContains(flag->Filename(), "cli.cc")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value.has_value()) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (name == "pages") {
        value = "all";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", error));
    }
    set.insert(name);
  }
  return set;
}

absl::StatusOr<ClientOptions> MakeClientOptions() {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.bearer_token = absl::GetFlag(FLAGS_token);
  if (const char* env = std::getenv("KVBROKER_TOKEN");
      options.bearer_token.empty() && env != nullptr) {
    options.bearer_token = env;
  }
  // A token read from a file or a Kubernetes secret keeps its final line
  // break; no token has whitespace at its ends (kvbrokerd trims it too).
  // What is still not printable ASCII is refused by Connect (exit 2).
  options.bearer_token =
      std::string(absl::StripAsciiWhitespace(options.bearer_token));
  if (absl::GetFlag(FLAGS_tls) || !absl::GetFlag(FLAGS_tls_ca).empty() ||
      !absl::GetFlag(FLAGS_tls_cert).empty() ||
      !absl::GetFlag(FLAGS_tls_key).empty()) {
    absl::StatusOr<TlsOptions> tls = TlsOptions::FromFiles(
        absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
        absl::GetFlag(FLAGS_tls_key));
    if (!tls.ok()) return tls.status();
    tls->target_name_override = absl::GetFlag(FLAGS_tls_server_name);
    options.tls = *std::move(tls);
  }
  return options;
}

int Main(int argc, char** argv) {
  std::vector<std::string> positional;
  bool help = false;
  absl::StatusOr<std::set<std::string>> set =
      ParseArgs(argc, argv, &positional, &help);
  if (!set.ok()) return Usage(set.status().message());
  if (help || (!positional.empty() && positional[0] == "help")) {
    PrintHelp();
    return kExitOk;
  }
  if (positional.empty()) return Usage("no command given");
  const std::string name = positional[0];
  const auto& commands = Commands();
  auto it = std::find_if(commands.begin(), commands.end(),
                         [&](const Command& c) { return name == c.name; });
  if (it == commands.end()) {
    return Usage(absl::StrCat("unknown command \"", name, "\""));
  }
  const Command& command = *it;
  for (const std::string& flag : *set) {
    const bool global =
        std::find(std::begin(kGlobalFlags), std::end(kGlobalFlags), flag) !=
        std::end(kGlobalFlags);
    const bool own = std::find(command.flags.begin(), command.flags.end(),
                               flag) != command.flags.end();
    if (!global && !own) {
      return Usage(absl::StrCat("--", flag, " does not apply to ", name));
    }
  }
  Context ctx;
  ctx.args.assign(positional.begin() + 1, positional.end());
  const int nargs = static_cast<int>(ctx.args.size());
  if (nargs < command.min_args ||
      (command.max_args >= 0 && nargs > command.max_args)) {
    return Usage(absl::StrCat("usage: kvbrokerctl ", name, " ", command.args));
  }
  ctx.json = absl::GetFlag(FLAGS_json);
  absl::StatusOr<ClientOptions> options = MakeClientOptions();
  if (!options.ok()) return Usage(options.status().message());
  absl::StatusOr<std::unique_ptr<KvBrokerClient>> client =
      KvBrokerClient::Connect(*std::move(options));
  if (!client.ok()) return Usage(client.status().message());
  ctx.client = client->get();
  if (const absl::Duration wait = absl::GetFlag(FLAGS_wait);
      wait > absl::ZeroDuration()) {
    if (absl::Status ready = ctx.client->WaitReady(wait); !ready.ok()) {
      return Fail(ready, ctx.json);
    }
  }
  return command.run(ctx);
}

}  // namespace
}  // namespace cli
}  // namespace kvbroker

int main(int argc, char** argv) { return kvbroker::cli::Main(argc, argv); }
