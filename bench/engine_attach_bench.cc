// engine_attach_bench: what it costs an engine to map a whole pool into its
// own address space (Session::Attach: the daemon's PagesMapped frames, then
// import + map + set access of every page bundle), against what it cost the
// daemon to bring that pool up (one gRPC Alloc of every block, which
// creates, maps and enables every page, and exports each handle when the
// pool exports at map time), in one run against a real kvbrokerd.
//
// Modes (--modes, each its own row; rounds alternate them):
//   cold   pool exporting lazily; the engine attaches right after bring-up,
//          so the daemon exports every handle while the engine waits; the
//          engine maps bundle by bundle (one set access each).
//   base   the same pool with its handles already exported (an untimed
//          attach did it), bundle by bundle: the engine's own cost.
//   run    as base, but each PagesMapped frame is one batch per device
//          (DeviceMapper::MapMany: one set access per run of adjacent
//          bundles).
//   eager  a pool with export_at_map: bring-up includes the exports; the
//          engine attaches right after it and maps in batches.
// After every timed attach a second engine attaches to the same pool and
// reads, through its own mapping, the tag the first wrote into every page
// (block p's last layer's V): a mismatch stops the bench. The bench process
// holds each device's primary CUDA context throughout, as an engine process
// does (its framework made it); creating it is not part of an attach.
//
// Default geometry, the 100 GiB pool of a 70B-class model on one GPU:
// 2 MiB pages, 32 layers, K and V, one block per page, 800 pages of 128 MiB
// bundles. Each round and mode: Alloc(all) over gRPC (bring-up), attach,
// the byte check, close, then Free(all) and Trim unmap the pool. The table
// reports medians over rounds, where the attach time goes (the engine's
// Session::attach_stats) and the ratio per mode; the last line is the eager
// mode's ratio. Target: attach <= 1.5 x bring-up on the H200.
//
//   bazel run -c opt //bench:engine_attach_bench -- --backend=cuda
//   engine_attach_bench --backend=host --pages=64 --layers=2   (here)

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "attach/testing/child_process.h"
#include "bench/stats.h"
#include "engine/session.h"
#include "engine/testing/device_copy.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"

ABSL_FLAG(std::string, kvbrokerd, "server/kvbrokerd", "the daemon binary");
ABSL_FLAG(std::string, backend, "host", "host or cuda");
ABSL_FLAG(int64_t, pages, 800, "pages of the pool (one block each)");
ABSL_FLAG(int64_t, layers, 32, "layers");
ABSL_FLAG(int64_t, page_mib, 2, "page size, MiB");
ABSL_FLAG(int, rounds, 5, "rounds (each runs every mode)");
ABSL_FLAG(std::string, modes, "eager,base,run,cold",
          "modes to run, comma-separated (file comment)");
ABSL_FLAG(bool, check_bytes, true,
          "a second engine reads what the first wrote into every page");
ABSL_FLAG(std::string, host_device_memory, "16GiB",
          "kvbrokerd --host_device_memory (host backend)");

namespace kvbroker {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "engine_attach_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Samples {
  std::vector<double> bring_up, attach, close, receive, setup, import, map,
      access, access_calls;
};

class Bench {
 public:
  Bench(std::string attach_sock, v1::KvBroker::Stub* stub, int64_t pages,
        int64_t layers)
      : attach_sock_(std::move(attach_sock)),
        stub_(stub),
        pages_(pages),
        layers_(layers) {}

  void Round(const std::string& mode, int round, Samples* out) {
    const std::string pool = mode == "eager" ? "eager" : "lazy";
    grpc::ClientContext ac;
    v1::AllocRequest alloc;
    alloc.set_pool(pool);
    alloc.set_num_blocks(pages_);
    v1::AllocResponse allocated;
    absl::Time t0 = absl::Now();
    grpc::Status s = stub_->Alloc(&ac, alloc, &allocated);
    out->bring_up.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (!s.ok()) Die(absl::StrCat("Alloc: ", s.error_message()));

    if (mode == "base" || mode == "run") {
      // The daemon exports every handle for this engine, untimed.
      auto warm = Connect(absl::StrCat("warm-", mode, "-", round));
      engine::AttachOptions a;
      a.pool = pool;
      if (auto r = warm->Attach(a); !r.ok()) Die(r.status().ToString());
      if (absl::Status c = warm->Close(); !c.ok()) Die(c.ToString());
    }

    t0 = absl::Now();
    auto session = Connect(absl::StrCat("bench-", mode, "-", round));
    engine::AttachOptions a;
    a.pool = pool;
    a.batch_map = mode == "run" || mode == "eager";
    auto attached = session->Attach(a);
    out->attach.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (!attached.ok()) Die(attached.status().ToString());
    if (session->mapped_pages() != pages_) {
      Die(absl::StrCat("the engine mapped ", session->mapped_pages(),
                       " pages of ", pages_));
    }
    const engine::AttachStats st = session->attach_stats();
    out->receive.push_back(absl::ToDoubleSeconds(st.receive));
    out->setup.push_back(absl::ToDoubleSeconds(st.setup));
    out->import.push_back(absl::ToDoubleSeconds(st.import));
    out->map.push_back(absl::ToDoubleSeconds(st.map));
    out->access.push_back(absl::ToDoubleSeconds(st.access));
    out->access_calls.push_back(static_cast<double>(st.access_calls));

    if (absl::GetFlag(FLAGS_check_bytes)) {
      CheckBytes(*session, pool, absl::StrCat(mode, round));
    }
    t0 = absl::Now();
    if (absl::Status closed = session->Close(); !closed.ok()) {
      Die(closed.ToString());
    }
    out->close.push_back(absl::ToDoubleSeconds(absl::Now() - t0));

    grpc::ClientContext fc;
    v1::FreeRequest free;
    free.set_pool(pool);
    for (const auto& p : allocated.pages()) {
      free.mutable_block_ids()->Add(p.block_ids().begin(), p.block_ids().end());
    }
    v1::FreeResponse freed;
    if (!stub_->Free(&fc, free, &freed).ok()) Die("Free");
    grpc::ClientContext tc;
    v1::TrimRequest trim;
    trim.set_pool(pool);
    v1::TrimResponse trimmed;
    if (!stub_->Trim(&tc, trim, &trimmed).ok()) Die("Trim");
  }

  // Like an inference engine, whose framework created its CUDA context long
  // before it attaches, the bench holds each device's primary context for
  // the whole run (a copier retains it): otherwise every attach after the
  // last session closed would create the context again (mapper setup).
  void HoldDeviceContexts() {
    auto s = Connect("bench-context");
    engine::AttachOptions a;
    a.pool = "lazy";  // nothing mapped yet: only the layout is needed
    if (auto r = s->Attach(a); !r.ok()) Die(r.status().ToString());
    held_ = Copier(*s);
    if (absl::Status c = s->Close(); !c.ok()) Die(c.ToString());
  }

 private:
  std::unique_ptr<engine::Session> Connect(const std::string& holder) {
    engine::ConnectOptions c;
    c.socket_path = attach_sock_;
    c.holder = holder;
    auto session = engine::Session::Connect(c);
    if (!session.ok()) Die(session.status().ToString());
    return *std::move(session);
  }

  static std::unique_ptr<testing::DeviceCopier> Copier(
      const engine::Session& s) {
    std::vector<std::string> uuids;
    for (const auto& d : s.layout().devices()) uuids.push_back(d.uuid());
    auto copier = testing::DeviceCopier::Create(s.layout().backend(), uuids);
    if (!copier.ok()) Die(copier.status().ToString());
    return *std::move(copier);
  }

  // The writer's tag for page p: 16 bytes naming the round and the page.
  static std::string Tag(const std::string& round, int64_t p) {
    std::string tag = absl::StrCat(round, "/", p, "################");
    tag.resize(16);
    return tag;
  }

  // Block p (one per page) at its last layer's V: the far end of the page's
  // bundle from its start.
  void CheckBytes(engine::Session& writer, const std::string& pool,
                  const std::string& round) {
    auto wcopy = Copier(writer);
    for (int64_t p = 0; p < pages_; ++p) {
      auto at = writer.BlockAddress(0, p, layers_ - 1, 1);
      if (!at.ok()) Die(at.status().ToString());
      const std::string tag = Tag(round, p);
      if (absl::Status s = wcopy->ToDevice(0, *at, tag.data(), tag.size());
          !s.ok()) {
        Die(s.ToString());
      }
    }
    auto reader = Connect(absl::StrCat("reader-", round));
    engine::AttachOptions a;
    a.pool = pool;
    if (auto r = reader->Attach(a); !r.ok()) Die(r.status().ToString());
    auto rcopy = Copier(*reader);
    for (int64_t p = 0; p < pages_; ++p) {
      auto at = reader->BlockAddress(0, p, layers_ - 1, 1);
      if (!at.ok()) Die(at.status().ToString());
      char got[16] = {};
      if (absl::Status s = rcopy->FromDevice(0, got, *at, sizeof(got));
          !s.ok()) {
        Die(s.ToString());
      }
      if (std::string(got, sizeof(got)) != Tag(round, p)) {
        Die(absl::StrCat("page ", p, ": the second engine read \"",
                         std::string(got, sizeof(got)),
                         "\", the first wrote \"", Tag(round, p), "\""));
      }
    }
    if (absl::Status c = reader->Close(); !c.ok()) Die(c.ToString());
    ++checked_rounds_;
  }

  const std::string attach_sock_;
  v1::KvBroker::Stub* const stub_;
  const int64_t pages_;
  const int64_t layers_;
  std::unique_ptr<testing::DeviceCopier> held_;

 public:
  int checked_rounds_ = 0;
};

int Run() {
  const int64_t pages = absl::GetFlag(FLAGS_pages);
  const int64_t layers = absl::GetFlag(FLAGS_layers);
  const int64_t page_bytes = absl::GetFlag(FLAGS_page_mib) << 20;
  const int64_t bundle_bytes = page_bytes * layers * 2;
  const std::vector<std::string> modes =
      absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty());
  for (const std::string& m : modes) {
    if (m != "eager" && m != "base" && m != "run" && m != "cold") {
      Die(absl::StrCat("unknown mode \"", m, "\""));
    }
  }
  char dir[] = "/tmp/kvb-attach-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) Die("mkdtemp");
  const std::string attach_sock = absl::StrCat(dir, "/attach.sock");
  const std::string grpc_sock = absl::StrCat(dir, "/grpc.sock");
  const std::string pools = absl::StrCat(dir, "/pools.textproto");
  {
    std::ofstream f(pools);
    for (const char* name : {"lazy", "eager"}) {
      f << "pools { name: \"" << name << "\" page_size: " << page_bytes
        << " block_bytes: " << page_bytes << " num_layers: " << layers
        << " num_kv_buffers: 2 max_blocks: " << pages
        << " min_idle_pages: 0 max_idle_pages: 0"
        << (std::string(name) == "eager" ? " export_at_map: true" : "")
        << " }\n";
    }
  }
  std::vector<std::string> args = {
      absl::StrCat("--backend=", absl::GetFlag(FLAGS_backend)),
      "--listen=",
      absl::StrCat("--unix_socket=", grpc_sock),
      absl::StrCat("--attach_socket=", attach_sock),
      absl::StrCat("--pools=", pools),
      "--min_idle_pages=0",
      "--max_idle_pages=0",
      "--gpu_memory_utilization=0.95"};
  if (absl::GetFlag(FLAGS_backend) == "host") {
    args.push_back(absl::StrCat("--host_device_memory=",
                                absl::GetFlag(FLAGS_host_device_memory)));
  }
  testing::ChildProcess daemon(absl::GetFlag(FLAGS_kvbrokerd), args);
  const std::string line = daemon.ReadUntil("kvbrokerd:");
  if (!absl::StrContains(line, "engines attach")) Die("daemon: " + line);
  auto stub = v1::KvBroker::NewStub(grpc::CreateChannel(
      absl::StrCat("unix:", grpc_sock), grpc::InsecureChannelCredentials()));

  std::printf("pool: %ld pages of %ld MiB bundles (%.1f GiB), %s backend\n",
              static_cast<long>(pages), static_cast<long>(bundle_bytes >> 20),
              static_cast<double>(pages * bundle_bytes) / (1 << 30),
              absl::GetFlag(FLAGS_backend).c_str());
  Bench bench(attach_sock, stub.get(), pages, layers);
  bench.HoldDeviceContexts();
  std::map<std::string, Samples> samples;
  const int rounds = absl::GetFlag(FLAGS_rounds);
  for (int r = 0; r < rounds; ++r) {
    // Rotated each round, so no mode always runs first.
    for (size_t i = 0; i < modes.size(); ++i) {
      const std::string& mode = modes[(i + r) % modes.size()];
      bench.Round(mode, r, &samples[mode]);
    }
  }
  std::printf(
      "medians of %d rounds, milliseconds (import, map, access: the engine's "
      "driver calls; receive: waiting for the daemon's reply and frames)\n",
      rounds);
  std::printf("%-6s %8s %8s %8s %8s %8s %8s %8s %8s %7s %7s\n", "mode",
              "bring-up", "attach", "receive", "setup", "import", "map",
              "access", "close", "calls", "ratio");
  for (const std::string& m : modes) {
    const Samples& s = samples[m];
    const double b = Median(s.bring_up), at = Median(s.attach);
    std::printf(
        "%-6s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %7.0f %6.3fx\n",
        m.c_str(), 1e3 * b, 1e3 * at, 1e3 * Median(s.receive),
        1e3 * Median(s.setup), 1e3 * Median(s.import), 1e3 * Median(s.map),
        1e3 * Median(s.access), 1e3 * Median(s.close), Median(s.access_calls),
        at / b);
  }
  if (absl::GetFlag(FLAGS_check_bytes)) {
    std::printf(
        "byte check: a second engine read every page's tag in %d "
        "attaches\n",
        bench.checked_rounds_);
  }
  for (const std::string& m : modes) {
    const double ratio =
        Median(samples[m].attach) / Median(samples[m].bring_up);
    if (m == "eager") {
      std::printf("attach / bring-up eager: %.3fx (target <= 1.5x)\n", ratio);
    }
  }
  daemon.Kill(SIGTERM);
  unlink(pools.c_str());
  rmdir(dir);
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvbroker::Run();
}
