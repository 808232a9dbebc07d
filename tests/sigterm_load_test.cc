// SIGTERM under load, with real processes: a kvbrokerd child serving TCP and
// a Unix socket, eight client threads (four per transport, each on its own
// channel) making Alloc, Free, Reserve, ReleaseReservation and Capacity
// calls back to back, and a SIGTERM while they do.
//
// Every call that was in flight when the signal was sent ends OK, or with a
// typed kvbroker answer (a capacity refusal, say), or DRAINING (UNAVAILABLE
// with RetryInfo); never CANCELLED and never untyped. Calls started after
// the signal may also find the daemon gone (an untyped UNAVAILABLE from the
// channel: nothing reached the daemon), but are never CANCELLED. The
// daemon exits 0. Each thread stops at its first UNAVAILABLE. The test
// waits on counts, never on time.

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/units.h"
#include "client/error_codec.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.grpc.pb.h"
#include "tests/daemon_process.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

constexpr int kThreads = 8;
constexpr int64_t kCallsBeforeSignal = 200;  // per thread

// What the threads saw, by class of outcome.
struct Outcomes {
  absl::Mutex mu;
  int64_t calls ABSL_GUARDED_BY(mu) = 0;
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;  // across the signal
  int64_t in_flight_ok ABSL_GUARDED_BY(mu) = 0;
  int64_t draining ABSL_GUARDED_BY(mu) = 0;
  int64_t gone ABSL_GUARDED_BY(mu) = 0;  // untyped UNAVAILABLE after it
  std::vector<std::string> bad ABSL_GUARDED_BY(mu);
  std::vector<int64_t> per_thread ABSL_GUARDED_BY(mu) =
      std::vector<int64_t>(kThreads, 0);
};

class LoadThread {
 public:
  LoadThread(int index, std::shared_ptr<grpc::Channel> channel,
             const std::atomic<bool>* signalled, Outcomes* out)
      : index_(index),
        client_(std::move(channel)),
        signalled_(signalled),
        out_(out),
        rng_(index) {}

  // Calls until one ends UNAVAILABLE.
  void Run() {
    for (;;) {
      const bool started_before = !signalled_->load();
      std::string what;
      const grpc::Status s = OneCall(&what);
      const bool ended_after = signalled_->load();
      if (!Record(s, what, started_before && ended_after, started_before)) {
        return;
      }
    }
  }

 private:
  grpc::Status OneCall(std::string* what) {
    const int choice = static_cast<int>(rng_() % 10);
    if (choice < 4 || held_.empty()) {
      const int64_t n = 1 + static_cast<int64_t>(rng_() % 4);
      *what = absl::StrCat("Alloc(", n, ")");
      Reply<v1::AllocResponse> r = client_.Alloc("load", n);
      if (r.ok()) {
        for (int64_t id : Ids(r->pages())) held_.push_back(id);
      }
      return r.status;
    }
    if (choice < 7) {
      std::vector<int64_t> ids(held_.begin(),
                               held_.begin() + (held_.size() + 1) / 2);
      *what = absl::StrCat("Free(", ids.size(), " blocks)");
      Reply<v1::FreeResponse> r = client_.Free("load", ids);
      if (r.ok()) held_.erase(held_.begin(), held_.begin() + ids.size());
      return r.status;
    }
    if (choice < 8) {
      *what = "Reserve(2)";
      Reply<v1::ReserveResponse> r = client_.Reserve("load", 2);
      if (!r.ok()) return r.status;
      *what = "ReleaseReservation";
      return client_.Release("load", r->reservation_id()).status;
    }
    *what = "Capacity";
    return client_.Capacity("load").status;
  }

  // Classifies one outcome; false when the thread should stop.
  bool Record(const grpc::Status& s, const std::string& what, bool in_flight,
              bool started_before) {
    const std::optional<KvbError> e = DecodeError(s);
    absl::MutexLock lock(&out_->mu);
    ++out_->calls;
    ++out_->per_thread[index_];
    out_->in_flight += in_flight;
    const auto bad =
        [&](const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_->mu) {
          out_->bad.push_back(absl::StrCat(
              "thread ", index_, " ", what, " (", in_flight ? "in flight" : "",
              "): ", why, ": ", s.error_code(), " ", s.error_message()));
        };
    if (s.ok()) {
      out_->in_flight_ok += in_flight;
      return true;
    }
    if (s.error_code() == grpc::StatusCode::CANCELLED) {
      bad("cancelled");
      return false;
    }
    const bool typed = e.has_value() && e->reason != v1::REASON_UNSPECIFIED;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      if (typed && e->reason == v1::DRAINING && e->retry_delay.has_value()) {
        ++out_->draining;
      } else if (!typed && !started_before) {
        ++out_->gone;
      } else {
        bad("UNAVAILABLE that is not DRAINING with RetryInfo");
      }
      return false;
    }
    if (!typed) {
      bad("untyped");
      return false;
    }
    return true;  // a typed answer such as POOL_EXHAUSTED
  }

  const int index_;
  Client client_;
  const std::atomic<bool>* const signalled_;
  Outcomes* const out_;
  std::mt19937_64 rng_;
  std::vector<int64_t> held_;
};

TEST(SigtermUnderLoad, CallsInFlightFinishAndArrivalsAreToldToRetry) {
  const std::string socket = NewSocketPath();
  DaemonProcess daemon({"--backend=host", "--listen=127.0.0.1:0",
                        absl::StrCat("--unix_socket=", socket),
                        "--min_idle_pages=0", "--host_device_memory=1GiB",
                        "--drain_timeout=60s",
                        // Refusals go on until arrivals pause this long: a
                        // thread that read "not signalled" and was then
                        // descheduled still meets the draining daemon.
                        "--drain_quiet=5s"});
  const std::string serving = daemon.WaitServing();
  ASSERT_FALSE(serving.empty()) << daemon.Stderr();
  const int port = DaemonProcess::PortOf(serving);
  ASSERT_GT(port, 0) << serving;
  // Each thread on a connection of its own, connected before any call: a
  // failed connection attempt before the signal says nothing of draining.
  auto channel = [&](int i) {
    return ConnectedChannel(i % 2 == 0 ? absl::StrCat("127.0.0.1:", port)
                                       : absl::StrCat("unix:", socket));
  };
  ASSERT_TRUE(
      Client(channel(0)).CreatePool(Spec("load", MiB(2), MiB(1), 256)).ok());

  Outcomes out;
  std::atomic<bool> signalled{false};
  std::vector<std::unique_ptr<LoadThread>> load;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    load.push_back(
        std::make_unique<LoadThread>(i, channel(i), &signalled, &out));
  }
  for (auto& l : load) threads.emplace_back([&l] { l->Run(); });
  {
    absl::MutexLock lock(&out.mu);
    out.mu.Await(absl::Condition(
        +[](Outcomes* o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(o->mu) {
          if (!o->bad.empty()) return true;
          for (int64_t n : o->per_thread) {
            if (n < kCallsBeforeSignal) return false;
          }
          return true;
        },
        &out));
  }
  signalled.store(true);
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(120)), 0) << daemon.Stderr();

  absl::MutexLock lock(&out.mu);
  EXPECT_TRUE(out.bad.empty())
      << out.bad.size() << " bad outcomes, first: " << out.bad.front();
  EXPECT_GT(out.in_flight, 0);
  std::printf(
      "%lld calls; %lld in flight across the SIGTERM (%lld OK); %lld "
      "DRAINING; %lld found the daemon gone\n",
      static_cast<long long>(out.calls), static_cast<long long>(out.in_flight),
      static_cast<long long>(out.in_flight_ok),
      static_cast<long long>(out.draining), static_cast<long long>(out.gone));
  RemoveSocketPath(socket);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
