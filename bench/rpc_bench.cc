// rpc_bench: the KvBroker RPCs against a bare ping served by the same server
// (same process, same listener, same threads), in one run.
//
// Every measured call alternates with a ping on the same channel, so both
// see the same state of the machine; the table reports, per RPC, the median
// over rounds of p50 and p99 and of their ratio to the ping's in that round.
// Then QPS with 64 calls in flight (callback client), ping against Capacity and
// Alloc+Free. Targets: p50 <= 1.10 x ping, p99 <= 1.20 x ping, QPS >= 0.9 x
// ping.
//
// --server_threading=callback|poller (and --poller_workers): how the daemon
// serves its calls (server/daemon.h). The ping is served the same way as
// the KvBroker calls: a callback service, or a raw method of the poller
// (parsed and answered inline on a worker, like every KvBroker method).
//
// --mode=watchers: Alloc(16)+Free throughput on one pool (QPS phase, same
// calls in flight) with --watchers WatchCapacity streams of that pool open,
// against the same with none, alternating within one run. The watchers are
// idle clients: each reads and discards every snapshot it is sent. Target:
// >= 0.9 x the throughput without watchers. Its baseline, in the same
// rounds (callback threading): the same throughput with as many bare idle
// streams of the same server open (bench.Ping/Hold: one message, then
// silence), i.e. what that many open gRPC streams cost by themselves.
// --watchers_in=child (the default) holds the streams open from a separate
// client process (this binary again, --stream_client), as a real daemon's
// watchers are other processes; --watchers_in=bench holds them in the
// bench's own process, beside the daemon and the measured client, so that
// their client side is paid by the measured process too.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocator/host_backend.h"
#include "allocator/spin_then_lock.h"
#include "attach/testing/child_process.h"
#include "bench/proto/ping.grpc.pb.h"
#include "bench/stats.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "server/daemon.h"
#include "server/unary_poller.h"

ABSL_FLAG(int, calls, 3000, "sequential calls per phase per round");
ABSL_FLAG(int, rounds, 7, "rounds of the latency phases");
ABSL_FLAG(int, inflight, 64, "calls in flight in the QPS phase");
ABSL_FLAG(double, qps_seconds, 3, "seconds per QPS phase");
ABSL_FLAG(std::string, transport, "tcp", "tcp or unix");
ABSL_FLAG(std::string, mode, "latency",
          "latency (RPCs against ping) or watchers (Alloc+Free with and "
          "without open WatchCapacity streams)");
ABSL_FLAG(int, watchers, 400,
          "watchers mode: streams open in the loaded phase");
ABSL_FLAG(std::string, watchers_in, "child",
          "watchers mode: where the streams' clients live: child (a separate "
          "process) or bench (this process)");
ABSL_FLAG(std::string, stream_client, "",
          "internal: serve as the streams' client process against this "
          "target (--stream_kind, --watchers), reading stop from stdin");
ABSL_FLAG(std::string, stream_kind, "watch", "internal: watch or hold");
ABSL_FLAG(double, watch_offers_per_second, -1,
          "the daemon's watch fan-out budget; -1: its default");
ABSL_FLAG(int, watch_interval_ms, -1,
          "the daemon's watch notifier interval; -1: its default");
ABSL_FLAG(std::string, server_threading, "callback",
          "callback or poller (kvbrokerd --server_threading)");
ABSL_FLAG(absl::Duration, pool_lock_spin,
          absl::Nanoseconds(kvbroker::SpinThenLock::kDefaultSpinBoundNs),
          "how long a call that finds the pool lock held spins before it "
          "sleeps (kvbrokerd --pool_lock_spin)");
ABSL_FLAG(int, poller_workers, 2, "poller mode: worker threads");

namespace kvbroker {
namespace {

class PingService final : public bench::Ping::CallbackService {
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx,
                                 const bench::PingRequest* request,
                                 bench::PingResponse* response) override {
    if (request->reply_bytes() > 0) {
      response->set_pad(std::string(request->reply_bytes(), 'x'));
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerWriteReactor<bench::PingResponse>* Hold(
      grpc::CallbackServerContext* /*ctx*/,
      const bench::PingRequest* /*request*/) override {
    return new HoldStream;
  }

 private:
  // One message, then open and silent until the client cancels.
  class HoldStream final
      : public grpc::ServerWriteReactor<bench::PingResponse> {
   public:
    HoldStream() { StartWrite(&first_); }
    void OnWriteDone(bool /*ok*/) override {}
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }

   private:
    bench::PingResponse first_;
  };
};

// The ping of the poller mode: a raw method the daemon's poller serves.
class RawPingService final
    : public bench::Ping::WithRawMethod_Ping<bench::Ping::Service> {
 public:
  UnaryPoller::Method Method() {
    UnaryPoller::Method m;
    m.name = "/kvbroker.bench.Ping/Ping";
    m.request = [this](grpc::ServerContext* ctx, grpc::ByteBuffer* request,
                       UnaryPoller::Writer* writer,
                       grpc::ServerCompletionQueue* cq, void* tag) {
      RequestPing(ctx, request, writer, cq, cq, tag);
    };
    m.handle = [](grpc::ServerContext* /*ctx*/, grpc::ByteBuffer* in,
                  grpc::ByteBuffer* out) {
      bench::PingRequest request;
      if (!grpc::SerializationTraits<bench::PingRequest>::Deserialize(in,
                                                                      &request)
               .ok()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "ping");
      }
      bench::PingResponse response;
      if (request.reply_bytes() > 0) {
        response.set_pad(std::string(request.reply_bytes(), 'x'));
      }
      bool own;
      return grpc::SerializationTraits<bench::PingResponse>::Serialize(
          response, out, &own);
    };
    return m;
  }
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "rpc_bench: %s\n", what.c_str());
  std::exit(1);
}

// Keeps `inflight` calls going for `seconds`; `start(done)` issues one call
// and invokes done() when it completes.
double Qps(const std::function<void(std::function<void()>)>& start,
           int inflight, double seconds) {
  absl::Mutex mu;
  int64_t completed = 0;
  int outstanding = 0;
  bool stopping = false;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  std::function<void()> issue;
  issue = [&]() {
    start([&]() {
      bool again;
      {
        absl::MutexLock lock(&mu);
        ++completed;
        again = !stopping && absl::Now() < end;
        if (!again) {
          stopping = true;
          --outstanding;
        }
      }
      if (again) issue();
    });
  };
  {
    absl::MutexLock lock(&mu);
    outstanding = inflight;
  }
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < inflight; ++i) issue();
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* o) { return *o == 0; }, &outstanding));
  return completed / absl::ToDoubleSeconds(absl::Now() - t0);
}

// An idle client of a server stream: reads and drops every message, counts
// them. `Request` is the stream's request message, `Response` its message.
template <typename Request, typename Response>
class IdleStream final : public grpc::ClientReadReactor<Response> {
 public:
  // `call(ctx, request, reactor)` starts the stream (a Stub::async() method).
  template <typename Call>
  void Start(Call call, Request request) {
    request_ = std::move(request);
    call(&ctx_, &request_, this);
    this->StartRead(&response_);
    this->StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      ++reads_;
    }
    this->StartRead(&response_);
  }
  void OnDone(const grpc::Status& /*status*/) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void AwaitFirstMessage() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &IdleStream::HasReadOrEnded));
    if (reads_ == 0) Die("an idle stream ended before its first message");
  }
  void CancelAndWait() {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }
  int64_t reads() {
    absl::MutexLock lock(&mu_);
    return reads_;
  }

 private:
  bool HasReadOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reads_ > 0 || done_;
  }

  grpc::ClientContext ctx_;
  Request request_;
  Response response_;
  absl::Mutex mu_;
  int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};
using IdleWatcher =
    IdleStream<v1::WatchCapacityRequest, v1::WatchCapacityResponse>;
using IdleHold = IdleStream<bench::PingRequest, bench::PingResponse>;

// `count` idle streams of Stream (IdleWatcher: WatchCapacity of pool
// "bench"; IdleHold: bench.Ping/Hold) over 8 connections of their own, as
// separate clients' would be; open once each has had its first message.
template <typename Stream>
class OpenStreams {
 public:
  OpenStreams(const std::string& target, int count) {
    for (int i = 0; i < kChannels; ++i) {
      grpc::ChannelArguments args;
      args.SetInt("kvbroker.bench.stream_channel", i);  // a connection each
      auto channel = grpc::CreateCustomChannel(
          target, grpc::InsecureChannelCredentials(), args);
      watch_stubs_.push_back(v1::KvBroker::NewStub(channel));
      hold_stubs_.push_back(bench::Ping::NewStub(channel));
    }
    for (int i = 0; i < count; ++i) {
      streams_.push_back(std::make_unique<Stream>());
      if constexpr (std::is_same_v<Stream, IdleWatcher>) {
        v1::WatchCapacityRequest request;
        request.set_pool("bench");
        v1::KvBroker::Stub* stub = watch_stubs_[i % kChannels].get();
        streams_.back()->Start(
            [stub](auto... a) { stub->async()->WatchCapacity(a...); },
            std::move(request));
      } else {
        bench::Ping::Stub* stub = hold_stubs_[i % kChannels].get();
        streams_.back()->Start([stub](auto... a) { stub->async()->Hold(a...); },
                               bench::PingRequest());
      }
    }
    for (auto& w : streams_) w->AwaitFirstMessage();
    ready_reads_ = Reads();
  }
  ~OpenStreams() {
    for (auto& w : streams_) w->CancelAndWait();
  }

  // Messages read since every stream had its first.
  int64_t ReadsSinceReady() { return Reads() - ready_reads_; }

 private:
  static constexpr int kChannels = 8;
  int64_t Reads() {
    int64_t n = 0;
    for (auto& w : streams_) n += w->reads();
    return n;
  }

  std::vector<std::unique_ptr<v1::KvBroker::Stub>> watch_stubs_;
  std::vector<std::unique_ptr<bench::Ping::Stub>> hold_stubs_;
  std::vector<std::unique_ptr<Stream>> streams_;
  int64_t ready_reads_ = 0;
};

// --stream_client: holds --watchers streams of --stream_kind open against
// the target; prints "ready" once each has its first message, then, after
// a line (or the end) of stdin, "reads N" (the messages read since ready),
// and closes them.
template <typename Stream>
int StreamClientOf(const std::string& target) {
  OpenStreams<Stream> streams(target, absl::GetFlag(FLAGS_watchers));
  std::printf("ready\n");
  std::fflush(stdout);
  char line[64];
  if (std::fgets(line, sizeof(line), stdin) == nullptr) line[0] = '\0';
  std::printf("reads %lld\n",
              static_cast<long long>(streams.ReadsSinceReady()));
  std::fflush(stdout);
  return 0;
}

int StreamClient() {
  const std::string target = absl::GetFlag(FLAGS_stream_client);
  if (absl::GetFlag(FLAGS_stream_kind) == "watch") {
    return StreamClientOf<IdleWatcher>(target);
  }
  if (absl::GetFlag(FLAGS_stream_kind) == "hold") {
    return StreamClientOf<IdleHold>(target);
  }
  Die("--stream_kind must be watch or hold");
}

// One Alloc(16) on pool "bench", then the Free of its blocks: two RPCs per
// completion.
void AllocFreeAsync(v1::KvBroker::Stub* kvb, std::function<void()> done) {
  auto* ctx = new grpc::ClientContext;
  auto* req = new v1::AllocRequest;
  req->set_pool("bench");
  req->set_num_blocks(16);
  auto* resp = new v1::AllocResponse;
  kvb->async()->Alloc(ctx, req, resp, [=](grpc::Status s) {
    if (!s.ok()) Die("async alloc: " + s.error_message());
    auto* fctx = new grpc::ClientContext;
    auto* freq = new v1::FreeRequest;
    freq->set_pool("bench");
    for (const auto& pb : resp->pages()) {
      freq->mutable_block_ids()->Add(pb.block_ids().begin(),
                                     pb.block_ids().end());
    }
    auto* fresp = new v1::FreeResponse;
    delete ctx;
    delete req;
    delete resp;
    kvb->async()->Free(fctx, freq, fresp, [=](grpc::Status fs) {
      if (!fs.ok()) Die("async free");
      delete fctx;
      delete freq;
      delete fresp;
      done();
    });
  });
}

// --mode=watchers; see the file comment. Rounds alternate: no watcher, then
// --watchers streams opened (each has its first snapshot before the phase
// starts) and closed again after it.
int WatchersMode(const std::string& target, v1::KvBroker::Stub* kvb,
                 bool with_baseline) {
  const int count = absl::GetFlag(FLAGS_watchers);
  const int inflight = absl::GetFlag(FLAGS_inflight);
  const double secs = absl::GetFlag(FLAGS_qps_seconds);
  const std::string where = absl::GetFlag(FLAGS_watchers_in);
  if (where != "child" && where != "bench") {
    Die("--watchers_in must be child or bench");
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) Die("readlink /proc/self/exe");
  self[len] = '\0';
  auto allocfree = [&](std::function<void()> done) {
    AllocFreeAsync(kvb, std::move(done));
  };
  // Alloc+Free throughput with `count` streams of Stream open (each has its
  // first message before the phase starts); the messages they read during
  // the phase are added to *read.
  auto loaded = [&](auto* kind, int64_t* read) {
    using Stream = std::remove_pointer_t<decltype(kind)>;
    if (where == "bench") {
      OpenStreams<Stream> streams(target, count);
      const double qps = 2 * Qps(allocfree, inflight, secs);
      *read += streams.ReadsSinceReady();
      return qps;
    }
    testing::ChildProcess client(
        self,
        {absl::StrCat("--stream_client=", target),
         absl::StrCat("--stream_kind=",
                      std::is_same_v<Stream, IdleWatcher> ? "watch" : "hold"),
         absl::StrCat("--watchers=", count)});
    if (client.ReadUntil("ready", absl::Seconds(120)).empty()) {
      Die("the streams' client process did not get ready");
    }
    const double qps = 2 * Qps(allocfree, inflight, secs);
    client.WriteLine("stop");
    const std::string reads = client.ReadUntil("reads ");
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripPrefix(reads, "reads "), &n)) {
      Die("the streams' client process: \"" + reads + "\"");
    }
    *read += n;
    if (client.Wait() != 0) Die("the streams' client process failed");
    return qps;
  };
  Qps(allocfree, inflight, secs / 2);  // warm-up
  std::vector<double> alone, watched, held, ratios, held_ratios, net_ratios;
  int64_t snapshots = 0, held_reads = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    alone.push_back(2 * Qps(allocfree, inflight, secs));
    watched.push_back(loaded(static_cast<IdleWatcher*>(nullptr), &snapshots));
    ratios.push_back(watched.back() / alone.back());
    std::printf(
        "round %d: Alloc+Free(16) %.0f RPC/s alone, %.0f with %d "
        "watchers (%.3fx)",
        round, alone.back(), watched.back(), count, ratios.back());
    if (with_baseline) {
      held.push_back(loaded(static_cast<IdleHold*>(nullptr), &held_reads));
      held_ratios.push_back(held.back() / alone.back());
      net_ratios.push_back(watched.back() / held.back());
      std::printf(", %.0f with %d bare idle streams (%.3fx)", held.back(),
                  count, held_ratios.back());
    }
    std::printf("\n");
  }
  std::printf(
      "\nwatchers, %d in flight over %s: Alloc+Free(16) %.0f RPC/s alone, "
      "%.0f with %d idle watchers (clients in %s): %.3fx (median of %d "
      "rounds; %.1f snapshots per watcher per loaded second)\n",
      inflight,
      target.rfind("unix:", 0) == 0 ? "a Unix socket" : "loopback TCP",
      Median(alone), Median(watched), count,
      where == "child" ? "a separate process" : "the bench's process",
      Median(ratios), absl::GetFlag(FLAGS_rounds),
      static_cast<double>(snapshots) /
          (count * secs * absl::GetFlag(FLAGS_rounds)));
  if (with_baseline) {
    std::printf(
        "baseline: %.0f RPC/s with %d bare idle streams of the same server "
        "(Ping.Hold): %.3fx alone; watchers / bare idle streams: %.3fx "
        "(medians of the rounds; %lld messages on the bare streams during "
        "the phases: none is sent after the first)\n",
        Median(held), count, Median(held_ratios), Median(net_ratios),
        static_cast<long long>(held_reads));
  }
  return 0;
}

int Main() {
  const bool watchers_mode = absl::GetFlag(FLAGS_mode) == "watchers";
  if (!watchers_mode && absl::GetFlag(FLAGS_mode) != "latency") {
    Die("--mode must be latency or watchers");
  }
  HostBackend host(HostBackendOptions{1, Bytes(int64_t{1} << 40), MiB(2)});
  BrokerOptions bo;
  bo.min_idle_pages = 4;
  bo.max_idle_pages = 64;
  DaemonOptions dopt;
  const bool unix = absl::GetFlag(FLAGS_transport) == "unix";
  std::string sock = absl::StrFormat("/tmp/kvb-rpc-bench-%d.sock", getpid());
  dopt.listen = unix ? "" : "127.0.0.1:0";
  dopt.unix_socket = unix ? sock : "";
  absl::StatusOr<ServerThreading> threading =
      ParseServerThreading(absl::GetFlag(FLAGS_server_threading));
  if (!threading.ok()) Die(threading.status().ToString());
  dopt.threading = *threading;
  dopt.poller_workers = absl::GetFlag(FLAGS_poller_workers);
  PingService ping_service;
  RawPingService raw_ping_service;
  if (dopt.threading == ServerThreading::kPoller) {
    dopt.extra_services.push_back(&raw_ping_service);
    dopt.extra_poller_methods.push_back(raw_ping_service.Method());
  } else {
    dopt.extra_services.push_back(&ping_service);
  }
  if (const int ms = absl::GetFlag(FLAGS_watch_interval_ms); ms >= 0) {
    dopt.watch.min_interval = absl::Milliseconds(ms);
  }
  if (const double r = absl::GetFlag(FLAGS_watch_offers_per_second); r >= 0) {
    dopt.watch.max_offers_per_second = r;
  }
  auto daemon = Daemon::Create(&host, bo, dopt);
  if (!daemon.ok()) Die(daemon.status().ToString());
  if (auto s = (*daemon)->Start(); !s.ok()) Die(s.ToString());
  const std::string target =
      unix ? "unix:" + sock
           : absl::StrFormat("127.0.0.1:%d", (*daemon)->tcp_port());
  auto channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  std::unique_ptr<bench::Ping::Stub> ping_stub = bench::Ping::NewStub(channel);
  std::unique_ptr<v1::KvBroker::Stub> kvb_stub = v1::KvBroker::NewStub(channel);
  bench::Ping::Stub* ping = ping_stub.get();
  v1::KvBroker::Stub* kvb = kvb_stub.get();

  {
    grpc::ClientContext ctx;
    v1::CreatePoolRequest req;
    v1::CreatePoolResponse resp;
    auto* spec = req.mutable_pool();
    spec->set_name("bench");
    spec->set_page_size(2 * kMiB);
    spec->set_block_bytes(16 * kKiB);
    spec->set_max_blocks(1 << 16);
    grpc::Status s = kvb->CreatePool(&ctx, req, &resp);
    if (!s.ok()) Die("CreatePool: " + s.error_message());
  }

  // The latency phases reuse one request and one response message per RPC,
  // as a client that cares about latency does (parsing into a used message
  // keeps its repeated fields' capacity): what is measured is then the call
  // and the server, not the client's heap.
  bench::PingRequest ping_req;
  bench::PingResponse ping_resp;
  auto do_ping = [&] {
    grpc::ClientContext ctx;
    if (!ping->Ping(&ctx, ping_req, &ping_resp).ok()) Die("ping");
  };
  // A ping carrying Capacity's request and response sizes.
  int64_t cap_request_bytes = 0, cap_response_bytes = 0;
  {
    grpc::ClientContext ctx;
    v1::CapacityRequest req;
    req.set_pool("bench");
    v1::CapacityResponse resp;
    if (!kvb->Capacity(&ctx, req, &resp).ok()) Die("capacity");
    cap_request_bytes = static_cast<int64_t>(req.ByteSizeLong());
    cap_response_bytes = static_cast<int64_t>(resp.ByteSizeLong());
  }
  bench::PingRequest sized_req;
  sized_req.set_pad(std::string(cap_request_bytes, 'x'));
  sized_req.set_reply_bytes(static_cast<int32_t>(cap_response_bytes));
  bench::PingResponse sized_resp;
  auto do_sized_ping = [&] {
    grpc::ClientContext ctx;
    if (!ping->Ping(&ctx, sized_req, &sized_resp).ok()) Die("sized ping");
  };
  v1::CapacityRequest cap_req;
  cap_req.set_pool("bench");
  v1::CapacityResponse cap_resp;
  auto do_capacity = [&] {
    grpc::ClientContext ctx;
    if (!kvb->Capacity(&ctx, cap_req, &cap_resp).ok()) Die("capacity");
  };
  // Alloc and Free are timed separately; each phase alternates them.
  v1::AllocRequest alloc_req;
  alloc_req.set_pool("bench");
  v1::AllocResponse alloc_resp;
  v1::FreeRequest free_req;
  free_req.set_pool("bench");
  v1::FreeResponse free_resp;
  auto do_alloc = [&](int n) {
    grpc::ClientContext ctx;
    alloc_req.set_num_blocks(n);
    grpc::Status s = kvb->Alloc(&ctx, alloc_req, &alloc_resp);
    if (!s.ok()) Die("alloc: " + s.error_message());
    free_req.clear_block_ids();
    for (const auto& pb : alloc_resp.pages()) {
      free_req.mutable_block_ids()->Add(pb.block_ids().begin(),
                                        pb.block_ids().end());
    }
  };
  auto do_free = [&] {
    grpc::ClientContext ctx;
    if (!kvb->Free(&ctx, free_req, &free_resp).ok()) Die("free");
  };

  if (watchers_mode) {
    // The bare idle streams are a callback method; the poller serves only
    // unary calls.
    const int rc =
        WatchersMode(target, kvb, dopt.threading != ServerThreading::kPoller);
    (*daemon)->Drain();
    return rc;
  }

  const int n = absl::GetFlag(FLAGS_calls);
  // Each measured RPC is interleaved call by call with a ping, so both see
  // the same moment of the machine; the ratio is taken within each round.
  struct Series {
    std::string name;
    std::vector<double> p50, p99, ping50, ping99;
  };
  std::vector<Series> series = {{"Capacity"}, {"sized ping"}, {"Alloc(16)"},
                                {"Free(16)"}, {"Alloc(128)"}, {"Free(128)"}};
  auto timed = [](const std::function<void()>& f) {
    absl::Time t0 = absl::Now();
    f();
    return absl::ToDoubleMicroseconds(absl::Now() - t0);
  };
  auto pct = [](std::vector<double>& v, int q) {
    std::sort(v.begin(), v.end());
    return v[std::min<size_t>(v.size() - 1, v.size() * q / 100)];
  };
  auto record = [&](Series& s, std::vector<double>& rpc,
                    std::vector<double>& pings) {
    s.p50.push_back(pct(rpc, 50));
    s.p99.push_back(pct(rpc, 99));
    s.ping50.push_back(pct(pings, 50));
    s.ping99.push_back(pct(pings, 99));
  };
  for (int i = 0; i < n / 4; ++i) {  // warm-up
    do_ping();
    do_capacity();
  }
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    {
      std::vector<double> rpc, pings;
      for (int i = 0; i < n; ++i) {
        pings.push_back(timed(do_ping));
        rpc.push_back(timed(do_capacity));
      }
      record(series[0], rpc, pings);
    }
    {
      std::vector<double> rpc, pings;
      for (int i = 0; i < n; ++i) {
        pings.push_back(timed(do_ping));
        rpc.push_back(timed(do_sized_ping));
      }
      record(series[1], rpc, pings);
    }
    for (int size : {16, 128}) {
      std::vector<double> a, f, pa, pf;
      for (int i = 0; i < n; ++i) {
        pa.push_back(timed(do_ping));
        a.push_back(timed([&] { do_alloc(size); }));
        pf.push_back(timed(do_ping));
        f.push_back(timed(do_free));
      }
      const int idx = size == 16 ? 2 : 4;
      record(series[idx], a, pa);
      record(series[idx + 1], f, pf);
    }
  }

  // QPS with `inflight` calls outstanding.
  const int inflight = absl::GetFlag(FLAGS_inflight);
  const double secs = absl::GetFlag(FLAGS_qps_seconds);
  auto ping_async = [&](std::function<void()> done) {
    auto* ctx = new grpc::ClientContext;
    auto* req = new bench::PingRequest;
    auto* resp = new bench::PingResponse;
    ping->async()->Ping(ctx, req, resp, [=](grpc::Status s) {
      if (!s.ok()) Die("async ping");
      delete ctx;
      delete req;
      delete resp;
      done();
    });
  };
  auto capacity_async = [&](std::function<void()> done) {
    auto* ctx = new grpc::ClientContext;
    auto* req = new v1::CapacityRequest;
    req->set_pool("bench");
    auto* resp = new v1::CapacityResponse;
    kvb->async()->Capacity(ctx, req, resp, [=](grpc::Status s) {
      if (!s.ok()) Die("async capacity");
      delete ctx;
      delete req;
      delete resp;
      done();
    });
  };
  auto allocfree_async = [&](std::function<void()> done) {
    AllocFreeAsync(kvb, std::move(done));
  };
  std::vector<double> qps_ping, qps_capacity, qps_allocfree;
  for (int round = 0; round < 3; ++round) {
    qps_ping.push_back(Qps(ping_async, inflight, secs));
    qps_capacity.push_back(Qps(capacity_async, inflight, secs));
    qps_allocfree.push_back(2 * Qps(allocfree_async, inflight, secs));
  }

  absl::PrintF(
      "\nrpc_bench over %s, server_threading=%s%s, %d calls x %d rounds per "
      "phase, each call interleaved with a ping\n",
      unix ? "a Unix socket" : "loopback TCP",
      ServerThreadingName(dopt.threading),
      dopt.threading == ServerThreading::kPoller
          ? absl::StrFormat(" (%d workers)", dopt.poller_workers)
          : "",
      n, absl::GetFlag(FLAGS_rounds));
  std::printf("%-12s %9s %9s %9s %9s %11s %11s\n", "rpc", "p50 us", "p99 us",
              "ping p50", "ping p99", "p50/ping", "p99/ping");
  for (Series& s : series) {
    std::vector<double> r50, r99;
    for (size_t i = 0; i < s.p50.size(); ++i) {
      r50.push_back(s.p50[i] / s.ping50[i]);
      r99.push_back(s.p99[i] / s.ping99[i]);
    }
    std::printf("%-12s %9.1f %9.1f %9.1f %9.1f %10.3fx %10.3fx\n",
                s.name.c_str(), Median(s.p50), Median(s.p99), Median(s.ping50),
                Median(s.ping99), Median(r50), Median(r99));
  }
  const double qp = Median(qps_ping);
  std::printf(
      "QPS, %d in flight: ping %.0f, Capacity %.0f (%.3fx), "
      "Alloc+Free(16) %.0f RPC/s (%.3fx)\n",
      inflight, qp, Median(qps_capacity), Median(qps_capacity) / qp,
      Median(qps_allocfree), Median(qps_allocfree) / qp);
  (*daemon)->Drain();
  return 0;
}

}  // namespace
}  // namespace kvbroker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_stream_client).empty()) {
    return kvbroker::StreamClient();
  }
  kvbroker::SpinThenLock::SetSpinBound(absl::GetFlag(FLAGS_pool_lock_spin));
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return kvbroker::Main();
}
