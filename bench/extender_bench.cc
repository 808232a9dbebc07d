// extender_bench: kvbroker-extender's filter against 1, 8 and 32 brokers
// (kvbrokerd processes on this machine, one per node), next to one
// Capacity RPC to one of them, in the same run. The baseline is that call on
// the client stack the filter itself uses (the async stub, one completion
// queue); the client library's blocking call is shown beside it.
//
// Every round interleaves the calls one by one (each kind once per pass, in
// a shuffled order), so that all see the same moment of the machine; the
// table reports the median over rounds of each call's p50 and p99 and of
// their ratio to the Capacity RPC's p50 / p99 in that round. The filter is
// measured twice: the extender's own work (Extender::Filter on a request
// body: JSON parse, parallel Capacity calls, verdicts, JSON encode), and as
// kube-scheduler sees it (HTTP POST /filter over a kept-alive connection).
// The floor rows start the same N Capacity calls together on one completion
// queue with nothing else: what the machine itself charges for asking N
// broker processes at once. Targets: filter <= 2 x one Capacity at 8
// brokers, <= 4 x at 32. Last, the CPU each Capacity RPC cost the brokers
// and this process, and their context switches, over the measured rounds.
//
//   bazel run -c opt //bench:extender_bench -- --rounds=10 --calls=200
//
// --server_threading=callback|poller and --poller_workers are passed to
// every broker (kvbrokerd's flags).
//
// To hold everything (brokers, extender, client) to two cores of a larger
// host: `taskset -c 0,1 bazel-bin/bench/extender_bench` (the brokers are
// children and inherit the affinity).

#include <curl/curl.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/support/async_unary_call.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/stats.h"
#include "client/kvbroker_client.h"
#include "extender/broker_directory.h"
#include "extender/extender.h"
#include "extender/http_server.h"
#include "extender/kube_client.h"
#include "extender/testing/broker_process.h"
#include "extender/testing/fake_kube_api.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, rounds, 10, "Rounds; medians over rounds are reported.");
ABSL_FLAG(int, calls, 200, "Calls of each kind per round.");
ABSL_FLAG(std::string, server_threading, "callback",
          "The brokers' --server_threading: callback or poller.");
ABSL_FLAG(int, poller_workers, 2, "The brokers' --poller_workers.");

namespace kvbroker {
namespace extender {
namespace {

using nlohmann::json;

constexpr char kPools[] = R"pb(
  pools {
    name: "kv"
    page_size: 2097152
    block_bytes: 65536
    tokens_per_block: 16
    max_blocks: 4096
  }
)pb";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "extender_bench: %s\n", what.c_str());
  std::exit(1);
}

size_t Discard(char* /*data*/, size_t size, size_t n, void* /*out*/) {
  return size * n;
}

// CPU time and context switches, summed over processes (all their threads).
struct CpuUse {
  double cpu_us = 0;
  double voluntary = 0;
  double involuntary = 0;
  CpuUse operator-(const CpuUse& o) const {
    return {cpu_us - o.cpu_us, voluntary - o.voluntary,
            involuntary - o.involuntary};
  }
};

// From /proc: utime + stime of the process (its exited threads included),
// and the context switches of its live threads.
CpuUse ProcessesCpu(const std::vector<pid_t>& pids) {
  const double tick_us = 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
  CpuUse use;
  for (pid_t pid : pids) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    // Fields after the command's closing parenthesis: state is field 3,
    // utime 14, stime 15.
    std::vector<std::string> f =
        absl::StrSplit(line.substr(line.rfind(')') + 2), ' ');
    if (f.size() < 13) Die(absl::StrCat("cannot parse /proc/", pid, "/stat"));
    use.cpu_us += (std::stod(f[11]) + std::stod(f[12])) * tick_us;
    for (const auto& task : std::filesystem::directory_iterator(
             absl::StrCat("/proc/", pid, "/task"))) {
      std::ifstream status(task.path() / "status");
      while (std::getline(status, line)) {
        absl::string_view rest = line;
        if (absl::ConsumePrefix(&rest, "voluntary_ctxt_switches:")) {
          use.voluntary += std::stod(std::string(rest));
        } else if (absl::ConsumePrefix(&rest, "nonvoluntary_ctxt_switches:")) {
          use.involuntary += std::stod(std::string(rest));
        }
      }
    }
  }
  return use;
}

CpuUse SelfCpu() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  auto us = [](const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
  return {us(r.ru_utime) + us(r.ru_stime), static_cast<double>(r.ru_nvcsw),
          static_cast<double>(r.ru_nivcsw)};
}

int Run() {
  constexpr int kMaxNodes = 32;
  std::printf("starting %d kvbrokerd processes (host backend)...\n", kMaxNodes);
  std::fflush(stdout);
  std::vector<std::unique_ptr<testing::BrokerProcess>> brokers;
  testing::FakeKubeApi api("bench-token");
  std::vector<std::string> nodes;
  for (int i = 0; i < kMaxNodes; ++i) {
    auto b = testing::BrokerProcess::Start(
        kPools, {"--max_idle_pages=0", "--host_device_memory=1GiB",
                 absl::StrCat("--server_threading=",
                              absl::GetFlag(FLAGS_server_threading)),
                 absl::StrCat("--poller_workers=",
                              absl::GetFlag(FLAGS_poller_workers))});
    if (!b.ok()) Die(b.status().ToString());
    nodes.push_back(absl::StrCat("node-", i));
    api.AddBroker(nodes.back(), (*b)->port());
    brokers.push_back(*std::move(b));
  }
  api.AddPod("serving", "llm", "uid-llm",
             {{"kvbroker.io/pool", "kv"}, {"kvbroker.io/blocks", "64"}});
  const std::string token_file = "/tmp/extender-bench-token";
  std::ofstream(token_file) << "bench-token\n";

  KubeClientOptions kube_options;
  kube_options.api_server = api.url();
  kube_options.token_file = token_file;
  std::unique_ptr<KubeClient> kube = KubeClient::Create(kube_options).value();
  BrokerDirectoryOptions directory_options;
  directory_options.namespace_ = testing::FakeKubeApi::kBrokerNamespace;
  directory_options.label_selector = testing::FakeKubeApi::kBrokerSelector;
  BrokerDirectory directory(kube.get(), directory_options);
  if (!directory.Refresh().ok() || directory.size() != kMaxNodes) {
    Die("the directory did not find the brokers");
  }
  Extender extender(&directory, kube.get(), ExtenderOptions());
  auto server = HttpServer::Start("127.0.0.1:0", [&](const HttpRequest& r) {
                  return extender.Handle(r);
                }).value();

  const json pod = api.Pod("serving", "llm");
  const std::vector<int> sizes = {1, 8, 32};
  std::vector<std::string> bodies;
  for (int n : sizes) {
    bodies.push_back(json{{"Pod", pod},
                          {"NodeNames", std::vector<std::string>(
                                            nodes.begin(), nodes.begin() + n)}}
                         .dump());
  }
  // For reference: the same call through the client library (blocking).
  std::shared_ptr<const Broker> node0 = directory.Find("node-0").value();
  auto library_capacity = [&] {
    if (!node0->filter
             ->Capacity("kv", 0, CallOptions::WithTimeout(absl::Seconds(5)))
             .ok()) {
      Die("Capacity failed");
    }
  };
  // The floor: the same Capacity calls, started together on one completion
  // queue with nothing around them (no directory, JSON or verdicts). With
  // one call it is the baseline: one Capacity RPC on the client stack the
  // filter uses (the async stub on a completion queue).
  std::vector<std::shared_ptr<const Broker>> all;
  for (const std::string& node : nodes)
    all.push_back(directory.Find(node).value());
  auto raw_parallel = [&](size_t count) {
    grpc::CompletionQueue cq;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<v1::CapacityResponse> replies(count);
    std::vector<grpc::Status> statuses(count);
    std::vector<
        std::unique_ptr<grpc::ClientAsyncResponseReader<v1::CapacityResponse>>>
        readers;
    v1::CapacityRequest request;
    request.set_pool("kv");
    for (size_t i = 0; i < count; ++i) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      readers.push_back(
          all[i]->stub->AsyncCapacity(contexts.back().get(), request, &cq));
      readers.back()->Finish(&replies[i], &statuses[i],
                             reinterpret_cast<void*>(i));
    }
    void* tag;
    bool ok;
    for (size_t i = 0; i < count; ++i) {
      if (!cq.Next(&tag, &ok) ||
          !statuses[reinterpret_cast<size_t>(tag)].ok()) {
        Die("raw Capacity failed");
      }
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  };
  auto capacity = [&] { raw_parallel(1); };
  auto filter = [&](size_t i) {
    HttpResponse r = extender.Filter(bodies[i]);
    if (r.code != 200 ||
        r.body.find("\"FailedNodes\":{}") == std::string::npos) {
      Die("filter dropped a node: " + r.body);
    }
  };
  CURL* curl = curl_easy_init();
  const std::string url =
      absl::StrCat("http://127.0.0.1:", server->port(), "/filter");
  curl_slist* headers =
      curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Discard);
  auto http_filter = [&](size_t i) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, bodies[i].data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE,
                     static_cast<long>(bodies[i].size()));
    long code = 0;
    if (curl_easy_perform(curl) != CURLE_OK) Die("HTTP filter failed");
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) Die("HTTP filter answered " + std::to_string(code));
  };
  auto timed = [](const std::function<void()>& f) {
    const absl::Time t0 = absl::Now();
    f();
    return absl::ToDoubleMicroseconds(absl::Now() - t0);
  };

  const int n = absl::GetFlag(FLAGS_calls);
  for (int i = 0; i < n / 4; ++i) {  // warm-up: channels connected
    capacity();
    library_capacity();
    for (size_t s = 0; s < sizes.size(); ++s) {
      filter(s);
      http_filter(s);
      raw_parallel(sizes[s]);
    }
  }
  // Per kind: per-round p50 and p99 and their ratios to Capacity's.
  struct Series {
    std::string name;
    std::vector<double> p50, p99, r50, r99;
  };
  std::vector<Series> series = {{"Capacity RPC (baseline)"},
                                {"Capacity, client library"}};
  for (int s : sizes)
    series.push_back({absl::StrCat("filter, ", s, " broker(s)")});
  for (int s : sizes) {
    series.push_back({absl::StrCat("HTTP /filter, ", s, " broker(s)")});
  }
  for (int s : sizes) {
    series.push_back({absl::StrCat("floor: ", s, " raw Capacity at once")});
  }
  std::vector<pid_t> broker_pids;
  for (const auto& b : brokers) broker_pids.push_back(b->pid());
  const CpuUse brokers_before = ProcessesCpu(broker_pids);
  const CpuUse self_before = SelfCpu();
  int64_t broker_rpcs = 0;
  // calls[k] makes one call of series[k].
  std::vector<std::function<void()>> calls = {capacity, library_capacity};
  int64_t rpcs_per_pass = 2;
  for (size_t s = 0; s < sizes.size(); ++s)
    calls.push_back([&, s] { filter(s); });
  for (size_t s = 0; s < sizes.size(); ++s)
    calls.push_back([&, s] { http_filter(s); });
  for (size_t s = 0; s < sizes.size(); ++s) {
    calls.push_back([&, s] { raw_parallel(sizes[s]); });
    rpcs_per_pass += 3 * sizes[s];
  }
  std::vector<size_t> order(calls.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::mt19937 random(1);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    std::vector<std::vector<double>> t(series.size());
    for (int i = 0; i < n; ++i) {
      // Each kind once, in a new order each time: a call right after a
      // 32-node fan-out finds the brokers still settling, and no kind may
      // always be the one that pays for it.
      std::shuffle(order.begin(), order.end(), random);
      for (size_t k : order) t[k].push_back(timed(calls[k]));
      broker_rpcs += rpcs_per_pass;
    }
    // Series 0 is the baseline the others' ratios are taken against.
    for (size_t k = 0; k < series.size(); ++k) {
      series[k].p50.push_back(Percentile(t[k], 0.5));
      series[k].p99.push_back(Percentile(t[k], 0.99));
      series[k].r50.push_back(series[k].p50.back() / series[0].p50.back());
      series[k].r99.push_back(series[k].p99.back() / series[0].p99.back());
    }
  }
  const CpuUse brokers_used = ProcessesCpu(broker_pids) - brokers_before;
  const CpuUse self_used = SelfCpu() - self_before;
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);

  std::printf(
      "\nbrokers: --server_threading=%s --poller_workers=%d; %d rounds x %d "
      "calls; medians over rounds\n",
      absl::GetFlag(FLAGS_server_threading).c_str(),
      absl::GetFlag(FLAGS_poller_workers), absl::GetFlag(FLAGS_rounds), n);
  std::printf("%-28s %10s %10s %12s %12s\n", "call", "p50 us", "p99 us",
              "p50/Capacity", "p99/Capacity");
  for (const Series& s : series) {
    std::printf("%-28s %10.1f %10.1f %12.2f %12.2f\n", s.name.c_str(),
                Median(s.p50), Median(s.p99), Median(s.r50), Median(s.r99));
  }
  // Where the time goes: CPU per Capacity RPC on either side (the measured
  // rounds only; this process includes its HTTP server and JSON).
  const double rpcs = static_cast<double>(broker_rpcs);
  std::printf(
      "\nper Capacity RPC (%lld in the measured rounds):\n"
      "  brokers:      %6.1f us CPU, %5.2f context switches "
      "(%.2f voluntary)\n"
      "  this process: %6.1f us CPU, %5.2f context switches\n",
      static_cast<long long>(broker_rpcs), brokers_used.cpu_us / rpcs,
      (brokers_used.voluntary + brokers_used.involuntary) / rpcs,
      brokers_used.voluntary / rpcs, self_used.cpu_us / rpcs,
      (self_used.voluntary + self_used.involuntary) / rpcs);
  return 0;
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return kvbroker::extender::Run();
}
