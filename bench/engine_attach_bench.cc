// engine_attach_bench: what it costs an engine to map a whole pool into its
// own address space (Session::Attach: the daemon's PagesMapped frames, then
// import + map + set access of every page bundle), against what it cost the
// daemon to bring that pool up (one gRPC Alloc of every block, which
// creates, maps and enables every page), in one run against a real kvbrokerd.
//
// Default geometry, the 100 GiB pool of a 70B-class model on one GPU:
// 2 MiB pages, 32 layers, K and V, one block per page, 800 pages of 128 MiB
// bundles. Each round: Alloc(all) over gRPC (bring-up), an engine attaches
// (every page mapped), the engine closes, Free(all) and Trim unmap the pool.
// The table reports the median over rounds. Target: attach <= 1.5 x
// bring-up on the H200.
//
//   bazel run -c opt //bench:engine_attach_bench -- --backend=cuda
//   engine_attach_bench --backend=host --pages=64 --layers=2   (here)

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attach/testing/child_process.h"
#include "engine/session.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"

ABSL_FLAG(std::string, kvbrokerd, "server/kvbrokerd", "the daemon binary");
ABSL_FLAG(std::string, backend, "host", "host or cuda");
ABSL_FLAG(int64_t, pages, 800, "pages of the pool (one block each)");
ABSL_FLAG(int64_t, layers, 32, "layers");
ABSL_FLAG(int64_t, page_mib, 2, "page size, MiB");
ABSL_FLAG(int, rounds, 3, "rounds");
ABSL_FLAG(std::string, host_device_memory, "16GiB",
          "kvbrokerd --host_device_memory (host backend)");

namespace kvbroker {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "engine_attach_bench: %s\n", what.c_str());
  std::exit(1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run() {
  const int64_t pages = absl::GetFlag(FLAGS_pages);
  const int64_t layers = absl::GetFlag(FLAGS_layers);
  const int64_t page_bytes = absl::GetFlag(FLAGS_page_mib) << 20;
  const int64_t bundle_bytes = page_bytes * layers * 2;
  char dir[] = "/tmp/kvb-attach-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) Die("mkdtemp");
  const std::string attach_sock = absl::StrCat(dir, "/attach.sock");
  const std::string grpc_sock = absl::StrCat(dir, "/grpc.sock");
  const std::string pools = absl::StrCat(dir, "/pools.textproto");
  std::ofstream(pools) << "pools { name: \"big\" page_size: " << page_bytes
                       << " block_bytes: " << page_bytes
                       << " num_layers: " << layers
                       << " num_kv_buffers: 2 max_blocks: " << pages
                       << " min_idle_pages: 0 max_idle_pages: 0 }\n";
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
  std::vector<double> bring_up, attach, detach;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    grpc::ClientContext ac;
    v1::AllocRequest alloc;
    alloc.set_pool("big");
    alloc.set_num_blocks(pages);
    v1::AllocResponse allocated;
    absl::Time t0 = absl::Now();
    grpc::Status s = stub->Alloc(&ac, alloc, &allocated);
    bring_up.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (!s.ok()) Die(absl::StrCat("Alloc: ", s.error_message()));

    engine::ConnectOptions c;
    c.socket_path = attach_sock;
    c.holder = absl::StrCat("bench-engine-", r);
    t0 = absl::Now();
    auto session = engine::Session::Connect(c);
    if (!session.ok()) Die(session.status().ToString());
    engine::AttachOptions a;
    a.pool = "big";
    auto attached = (*session)->Attach(a);
    attach.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (!attached.ok()) Die(attached.status().ToString());
    if ((*session)->mapped_pages() != pages) {
      Die(absl::StrCat("the engine mapped ", (*session)->mapped_pages(),
                       " pages of ", pages,
                       ": the daemon does not send its pages (PagesMapped)"));
    }
    t0 = absl::Now();
    if (absl::Status closed = (*session)->Close(); !closed.ok()) {
      Die(closed.ToString());
    }
    detach.push_back(absl::ToDoubleSeconds(absl::Now() - t0));

    grpc::ClientContext fc;
    v1::FreeRequest free;
    free.set_pool("big");
    for (const auto& p : allocated.pages()) {
      free.mutable_block_ids()->Add(p.block_ids().begin(), p.block_ids().end());
    }
    v1::FreeResponse freed;
    if (!stub->Free(&fc, free, &freed).ok()) Die("Free");
    grpc::ClientContext tc;
    v1::TrimRequest trim;
    trim.set_pool("big");
    v1::TrimResponse trimmed;
    if (!stub->Trim(&tc, trim, &trimmed).ok()) Die("Trim");
  }
  const double b = Median(bring_up), at = Median(attach), d = Median(detach);
  std::printf("%-34s %10s %12s\n", "step (median of rounds)", "seconds",
              "us per page");
  std::printf("%-34s %10.4f %12.2f\n", "daemon bring-up: Alloc(all)", b,
              b * 1e6 / pages);
  std::printf("%-34s %10.4f %12.2f\n", "engine attach: import+map+access", at,
              at * 1e6 / pages);
  std::printf("%-34s %10.4f %12.2f\n", "engine close: unmap all", d,
              d * 1e6 / pages);
  std::printf("attach / bring-up: %.3fx (target <= 1.5x)\n", at / b);
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
