// Metrics: the exposition of a known broker state, exactly; and the HTTP
// listener over a real socket.

#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/failure.h"
#include "allocator/fault_injecting_backend.h"
#include "allocator/host_backend.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "tests/http_exchange.h"

namespace kvbroker {
namespace {

// The value of the one sample named exactly `series` ("" when absent).
std::string Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::string(line.substr(series.size() + 1));
    }
  }
  return "";
}

TEST(RenderMetrics, SeedCaseExactly) {
  HostBackend host(HostBackendOptions{1, Bytes(kGiB), MiB(2)});
  BrokerOptions bo;
  bo.gpu_memory_utilization = 1.0;
  bo.min_idle_pages = 0;
  bo.max_idle_pages = 0;
  bo.start_worker = false;
  absl::StatusOr<std::unique_ptr<Broker>> broker = Broker::Create(&host, bo);
  ASSERT_TRUE(broker.ok()) << broker.status();
  PoolConfig seed;
  seed.name = "seed";
  seed.page_size = MiB(14);
  seed.block_bytes = MiB(6);
  seed.max_blocks = 5;
  absl::StatusOr<std::shared_ptr<PagePool>> pool = (*broker)->CreatePool(seed);
  ASSERT_TRUE(pool.ok()) << pool.status();
  AllocRequest two;
  two.num_blocks = 2;
  ASSERT_TRUE((*pool)->Alloc(two).ok());  // blocks 0 and 1: page 0 mapped
  AllocRequest four;
  four.num_blocks = 4;
  EXPECT_EQ(GetReason((*pool)->Alloc(four).status()),
            FailureReason::kRequestTooLarge);

  const std::string text = RenderMetrics(**broker);
  const std::string p = "{pool=\"seed\"}";
  EXPECT_EQ(Sample(text, "kvbroker_pool_available_blocks" + p), "1");
  EXPECT_EQ(Sample(text, "kvbroker_pool_allocated_blocks" + p), "2");
  EXPECT_EQ(Sample(text, "kvbroker_pool_reserved_blocks" + p), "0");
  EXPECT_EQ(Sample(text, "kvbroker_pool_total_blocks" + p), "3");
  EXPECT_EQ(Sample(text, "kvbroker_pool_mapped_bytes" + p), "14680064");
  EXPECT_EQ(Sample(text, "kvbroker_pool_healthy" + p), "1");
  // Three pages: page 0 (blocks 0, 1) FULL, page 1 (block 3) FREE, page 2
  // (no whole block) EMPTY.
  for (const auto& [state, n] :
       std::vector<std::pair<std::string, std::string>>{{"free", "1"},
                                                        {"mapping", "0"},
                                                        {"idle", "0"},
                                                        {"open", "0"},
                                                        {"full", "1"},
                                                        {"reclaimed", "0"},
                                                        {"empty", "1"}}) {
    EXPECT_EQ(Sample(text, "kvbroker_pool_pages{pool=\"seed\",state=\"" +
                               state + "\"}"),
              n)
        << state;
  }
  EXPECT_EQ(
      Sample(text, "kvbroker_pool_calls_total{pool=\"seed\",method=\"Alloc\"}"),
      "2");
  EXPECT_EQ(
      Sample(text, "kvbroker_pool_outcomes_total{pool=\"seed\",reason=\"OK\"}"),
      "1");
  EXPECT_EQ(Sample(text,
                   "kvbroker_pool_outcomes_total{pool=\"seed\","
                   "reason=\"REQUEST_TOO_LARGE\"}"),
            "1");
  EXPECT_EQ(Sample(text, "kvbroker_pool_blocks_allocated_total" + p), "2");
  EXPECT_EQ(Sample(text, "kvbroker_pool_pages_mapped_total" + p), "1");
  EXPECT_EQ(Sample(text, "kvbroker_pool_map_seconds_count" + p), "1");
  EXPECT_EQ(Sample(text,
                   "kvbroker_pool_map_seconds_bucket{pool=\"seed\","
                   "le=\"+Inf\"}"),
            "1");
  EXPECT_EQ(Sample(text, "kvbroker_pool_unmap_seconds_count" + p), "0");
  EXPECT_EQ(Sample(text, "kvbroker_device_total_bytes{device=\"0\"}"),
            "1073741824");
  EXPECT_EQ(Sample(text, "kvbroker_device_charged_bytes{device=\"0\"}"),
            "14680064");
  EXPECT_EQ(Sample(text, "kvbroker_device_budget_bytes{device=\"0\"}"),
            absl::StrCat(kGiB - MiB(14).value()));

  // A second pool: each family still has one HELP and one TYPE line.
  PoolConfig other = seed;
  other.name = "other";
  ASSERT_TRUE((*broker)->CreatePool(other).ok());
  const std::string two_pools = RenderMetrics(**broker);
  size_t types = 0;
  for (size_t at = 0; (at = two_pools.find("# TYPE kvbroker_pool_pages ",
                                           at)) != std::string::npos;
       ++at) {
    ++types;
  }
  EXPECT_EQ(types, 1u);
  EXPECT_EQ(Sample(two_pools, "kvbroker_pool_total_blocks{pool=\"other\"}"),
            "3");
  EXPECT_TRUE(absl::StrContains(
      two_pools, "# TYPE kvbroker_pool_map_seconds histogram\n"));
  EXPECT_EQ(Sample(two_pools, "kvbroker_orphaned_handles"), "0");
}

TEST(RenderMetrics, OrphanedHandlesOfADeleteThatMetAFailingRelease) {
  HostBackend host(HostBackendOptions{1, Bytes(kGiB), MiB(2)});
  FaultInjectingBackend backend(&host);
  BrokerOptions bo;
  bo.gpu_memory_utilization = 1.0;
  bo.min_idle_pages = 0;
  bo.max_idle_pages = 0;
  bo.start_worker = false;
  absl::StatusOr<std::unique_ptr<Broker>> broker = Broker::Create(&backend, bo);
  ASSERT_TRUE(broker.ok()) << broker.status();
  PoolConfig c;
  c.name = "gone";
  c.page_size = MiB(2);
  c.block_bytes = MiB(2);
  c.max_blocks = 4;
  ASSERT_TRUE((*broker)->CreatePool(c).ok());
  AllocRequest three;
  three.num_blocks = 3;
  ASSERT_TRUE((*(*broker)->GetPool("gone"))->Alloc(three).ok());
  backend.AddFault(FaultRule{BackendOp::kRelease, FaultKind::kError, 0, -1});
  ASSERT_TRUE((*broker)->DeletePool("gone", /*force=*/true).ok());
  std::string text = RenderMetrics(**broker);
  EXPECT_EQ(Sample(text, "kvbroker_orphaned_handles"), "3");
  EXPECT_EQ(Sample(text, "kvbroker_device_charged_bytes{device=\"0\"}"),
            absl::StrCat(MiB(6).value()));
  (*broker)->RunMaintenance();  // still failing
  EXPECT_EQ(Sample(RenderMetrics(**broker), "kvbroker_orphaned_handles"), "3");
  backend.ClearFaults();
  (*broker)->RunMaintenance();
  text = RenderMetrics(**broker);
  EXPECT_EQ(Sample(text, "kvbroker_orphaned_handles"), "0");
  EXPECT_EQ(Sample(text, "kvbroker_device_charged_bytes{device=\"0\"}"), "0");
  EXPECT_EQ(host.live_handles(), 0);
}

// One gauge, counting its collections.
class UpCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    ++collections;
    prometheus::MetricFamily f{
        "kvbroker_up", "Always 1.", prometheus::MetricType::Gauge, {}};
    f.metric.emplace_back();
    f.metric.back().gauge.value = 1;
    return {f};
  }
  mutable std::atomic<int> collections{0};
};

TEST(MetricsServer, ServesMetricsOverHttp) {
  auto up = std::make_shared<UpCollector>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", up);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  std::string r = testing::HttpExchange(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.0 200") ||
              absl::StartsWith(r, "HTTP/1.1 200"))
      << r;
  EXPECT_TRUE(absl::StrContains(r, "Content-Type: text/plain")) << r;
  EXPECT_TRUE(absl::StrContains(r, "# TYPE kvbroker_up gauge\nkvbroker_up 1\n"))
      << r;
  EXPECT_EQ(up->collections, 1);

  r = testing::HttpExchange(port, "GET /elsewhere HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(r.substr(0, 16), " 404")) << r;
  EXPECT_EQ(up->collections, 1);
}

// Opens a TCP connection to 127.0.0.1:port without sending anything; -1 when
// the connection attempt fails at once.
int SilentConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
      errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// Waits (at most `bound`, generously) until the server closes `fd`: reads
// until end of stream or a reset. True when it was closed.
bool ClosedByServer(int fd, absl::Duration bound) {
  const absl::Time end = absl::Now() + bound;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(end - absl::Now());
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[512];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
  }
}

// The adversary that opens many connections and never speaks: each is
// closed after the request timeout, and the listener serves scrapes again.
TEST(MetricsServer, SilentConnectionsAreClosed) {
  auto up = std::make_shared<UpCollector>();
  MetricsOptions options;
  options.threads = 2;
  options.request_timeout = absl::Milliseconds(100);
  options.queued_connections = 8;
  options.listen_backlog = 128;
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", up, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  // Fewer than fit in the backlog, so that every handshake completes at
  // once; they hold the two threads 100 ms at a time.
  constexpr int kSilent = 100;
  std::vector<int> fds;
  for (int i = 0; i < kSilent; ++i) {
    const int fd = SilentConnection(port);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  int closed = 0;
  for (int fd : fds) {
    if (ClosedByServer(fd, absl::Seconds(120))) ++closed;
    close(fd);
  }
  EXPECT_EQ(closed, kSilent);
  EXPECT_EQ(up->collections, 0);
  const std::string r =
      testing::HttpExchange(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(r, "kvbroker_up 1\n")) << r;
  EXPECT_EQ(up->collections, 1);
}

TEST(MetricsServer, RefusesBadAddresses) {
  auto up = std::make_shared<UpCollector>();
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000",
                          "example.com:9100", "[zz]:9100"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s =
        MetricsServer::Start(bad, up);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  MetricsOptions no_threads;
  no_threads.threads = 0;
  EXPECT_EQ(MetricsServer::Start("127.0.0.1:0", up, no_threads).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A port in use: UNAVAILABLE.
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start("127.0.0.1:0", up);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), up);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvbroker
