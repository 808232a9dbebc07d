// Answers lost on the wire. The C++ client talks to the daemon (tests/
// grpc_test_util.h) through a relay that cuts the connection, both ways, in
// place of passing on a chunk the daemon sends, at random: the daemon has
// done the call and the client sees the connection go, or the cut falls
// between calls and the client only reconnects. Four clients allocate and
// free on one pool meanwhile, every call under its own request id, and the
// client library retries what it may. Checks: no block is ever held by two
// clients, a call whose retries all failed is settled by sending it again
// with its request id once the wire is clean (the daemon replays it if it
// had done it), and then the pool holds exactly the blocks the clients
// hold: none once they have freed them. SPEC sections 5 and 6 (request ids,
// retries).

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/units.h"
#include "client/kvbroker_client.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "tests/block_ledger.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace testing {
namespace {

constexpr char kPool[] = "lossy";
constexpr int kClients = 4;
constexpr int kSteps = 60;

// A TCP relay from 127.0.0.1:port() to `upstream_port` that passes what
// the client sends whole and, at `chance` per chunk the daemon sends, cuts
// the connection both ways instead of passing that chunk on.
class LossyRelay {
 public:
  LossyRelay(int upstream_port, double chance, uint64_t seed)
      : upstream_port_(upstream_port), chance_(chance), random_(seed) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
            0 ||
        listen(listener_, 64) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "the relay cannot listen";
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~LossyRelay() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
    close(listener_);
  }

  int port() const { return port_; }
  int cuts() const { return cuts_; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void Accept() {
    while (!stop_) {
      pollfd p = {listener_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int daemon = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr = Loopback(upstream_port_);
      if (connect(daemon, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0) {
        close(client);
        close(daemon);
        continue;
      }
      fds_.push_back(client);
      fds_.push_back(daemon);
      pumps_.emplace_back([this, client, daemon] { Pump(client, daemon, 0); });
      pumps_.emplace_back(
          [this, client, daemon] { Pump(daemon, client, chance_); });
    }
  }

  // Copies `from` to `to` until either side ends, cutting both (shutdown;
  // the destructor closes them) at `cut_chance` per chunk read.
  void Pump(int from, int to, double cut_chance) {
    char buf[16384];
    while (!stop_) {
      pollfd p = {from, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = read(from, buf, sizeof(buf));
      if (n <= 0) break;
      if (cut_chance > 0 && Draw(cut_chance)) {
        ++cuts_;
        break;
      }
      ssize_t sent = 0;
      while (sent < n) {
        const ssize_t w = send(to, buf + sent, n - sent, MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += w;
      }
      if (sent < n) break;
    }
    shutdown(from, SHUT_RDWR);
    shutdown(to, SHUT_RDWR);
  }

  bool Draw(double chance) {
    absl::MutexLock lock(&mu_);
    return std::bernoulli_distribution(chance)(random_);
  }

  const int upstream_port_;
  const double chance_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> cuts_{0};
  absl::Mutex mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
  // Touched by the acceptor only, and by the destructor after it joined.
  std::vector<int> fds_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

// A call whose every attempt failed on the wire: whether the daemon did it
// is unknown until it is sent again with its request id.
struct Unsettled {
  std::string request_id;
  int64_t blocks = 0;          // an Alloc of this many
  std::vector<int64_t> freed;  // or a Free of these
};

struct Outcome {
  std::vector<int64_t> held;
  std::vector<Unsettled> unsettled;
  int replays = 0;  // answers the daemon replayed from an earlier attempt
};

ClientOptions Options() {
  ClientOptions options;
  options.timeout = absl::Seconds(20);
  options.retry.max_attempts = 6;
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_backoff = absl::Milliseconds(20);
  return options;
}

// A channel that reconnects at once after a cut (gRPC's default waits a
// second and more).
std::shared_ptr<grpc::Channel> FastReconnecting(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 5);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

Outcome RunClient(int id, KvBrokerClient& client, BlockLedger& ledger) {
  std::mt19937_64 random(1000 + id);
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    if (out.held.empty() || random() % 10 < 6) {
      AllocOptions alloc;
      alloc.request_id = NewRequestId();
      const int64_t n = 1 + static_cast<int64_t>(random() % 4);
      absl::StatusOr<v1::AllocResponse> r = client.Alloc(kPool, n, alloc);
      if (r.ok()) {
        const std::vector<int64_t> ids = BlockIds(*r);
        EXPECT_EQ(static_cast<int64_t>(ids.size()), n);
        ledger.Take(id, ids);
        out.held.insert(out.held.end(), ids.begin(), ids.end());
        out.replays += r->replayed();
      } else {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable)
            << r.status();
        out.unsettled.push_back({alloc.request_id, n, {}});
      }
      continue;
    }
    std::shuffle(out.held.begin(), out.held.end(), random);
    const size_t k = 1 + random() % out.held.size();
    std::vector<int64_t> ids(out.held.end() - k, out.held.end());
    out.held.resize(out.held.size() - k);
    ledger.Give(ids);
    FreeOptions free;
    free.request_id = NewRequestId();
    absl::StatusOr<v1::FreeResponse> r = client.Free(kPool, ids, free);
    if (r.ok()) {
      out.replays += r->replayed();
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable)
          << r.status();
      out.unsettled.push_back({free.request_id, 0, ids});
    }
  }
  return out;
}

TEST(LostAnswers, RetriedCallsAreDoneOnceAndThePoolEndsWhereItBegan) {
  Rig rig;
  ASSERT_NE(rig.daemon, nullptr);
  Client admin(rig.Channel(Transport::kTcp));
  ASSERT_TRUE(
      admin.CreatePool(Spec(kPool, MiB(2), Bytes(256 * kKiB), 1024)).ok());
  BlockLedger ledger;
  std::vector<Outcome> outcomes(kClients);
  int cuts = 0;
  {
    LossyRelay relay(rig.daemon->tcp_port(), 0.08, 7);
    std::vector<std::unique_ptr<KvBrokerClient>> clients;
    for (int i = 0; i < kClients; ++i) {
      clients.push_back(KvBrokerClient::FromChannel(
          FastReconnecting(relay.port()), Options()));
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back(
          [&, i] { outcomes[i] = RunClient(i, *clients[i], ledger); });
    }
    for (std::thread& t : threads) t.join();
    cuts = relay.cuts();
  }

  // The wire is clean now: every unsettled call is sent again as it was.
  std::unique_ptr<KvBrokerClient> direct =
      KvBrokerClient::FromChannel(rig.Channel(Transport::kTcp), Options());
  int replays = 0;
  int unsettled = 0;
  for (int i = 0; i < kClients; ++i) {
    Outcome& o = outcomes[i];
    replays += o.replays;
    for (const Unsettled& u : o.unsettled) {
      ++unsettled;
      if (u.blocks > 0) {
        AllocOptions alloc;
        alloc.request_id = u.request_id;
        absl::StatusOr<v1::AllocResponse> r =
            direct->Alloc(kPool, u.blocks, alloc);
        ASSERT_TRUE(r.ok()) << r.status();
        const std::vector<int64_t> ids = BlockIds(*r);
        ledger.Take(i, ids);
        o.held.insert(o.held.end(), ids.begin(), ids.end());
        replays += r->replayed();
      } else {
        FreeOptions free;
        free.request_id = u.request_id;
        absl::StatusOr<v1::FreeResponse> r = direct->Free(kPool, u.freed, free);
        ASSERT_TRUE(r.ok()) << r.status();
        replays += r->replayed();
      }
    }
  }
  int64_t held = 0;
  for (const Outcome& o : outcomes) held += o.held.size();
  v1::CapacitySnapshot cap = admin.Cap(kPool);
  EXPECT_EQ(cap.allocated_blocks(), held);
  EXPECT_EQ(cap.reserved_blocks(), 0);
  for (Outcome& o : outcomes) {
    if (o.held.empty()) continue;
    ledger.Give(o.held);
    absl::StatusOr<v1::FreeResponse> r = direct->Free(kPool, o.held);
    EXPECT_TRUE(r.ok()) << r.status();
  }
  cap = admin.Cap(kPool);
  EXPECT_EQ(cap.allocated_blocks(), 0);
  EXPECT_EQ(cap.available_blocks(), 1024);
  std::printf(
      "%d cuts on the wire; %d calls replayed by the daemon; %d calls "
      "settled after the wire was clean\n",
      cuts, replays, unsettled);
  // The run means something only if answers were lost and replayed.
  EXPECT_GT(cuts, 0);
  EXPECT_GT(replays, 0);
}

}  // namespace
}  // namespace testing
}  // namespace kvbroker
