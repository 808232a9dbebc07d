// Metrics: the broker's state as Prometheus metrics (prometheus-cpp), and
// the HTTP listener of kvbrokerd --metrics_listen (prometheus-cpp's Exposer
// over civetweb).
//
// BrokerCollector reads every pool's Capacity snapshot and PoolStats and
// every device budget at scrape time, without touching the driver or mapping
// anything; a scrape holds each pool's lock twice, briefly (one snapshot,
// one counter copy). The names, all prefixed "kvbroker_", carry their unit
// (_bytes, _seconds, _blocks, _pages, _total for counters):
//
//   per pool (label pool):   kvbroker_pool_pages{state}, *_available_blocks,
//     *_allocated_blocks, *_reserved_blocks, *_total_blocks, *_mapped_bytes,
//     *_virtual_bytes, *_limit_target_pages, *_healthy, *_generation,
//     *_calls_total{method}, *_outcomes_total{reason} (reason "OK" for
//     successes; only reasons that occurred), *_blocks_allocated_total,
//     *_blocks_freed_total, *_pages_mapped_total, *_pages_unmapped_total,
//     *_prealloc_pages_total, *_map_failures_total,
//     *_reservations_expired_total, *_idempotent_replays_total, and the
//     histograms kvbroker_pool_map_seconds / kvbroker_pool_unmap_seconds (one
//     page on every device of the pool);
//   per pool, with a session directory (the attach socket):
//     kvbroker_pool_sessions (live engine sessions attached),
//     kvbroker_pool_holders_in_grace, kvbroker_pool_quarantined_pages (pages
//     kept out of capacity because an engine missed a revocation deadline);
//   per attached engine (labels pool, holder, session):
//     kvbroker_engine_mapped_pages, kvbroker_engine_blocks,
//     kvbroker_engine_pending_revocations, kvbroker_engine_quarantined_pages;
//   per device (label device): kvbroker_device_total_bytes,
//     *_driver_free_bytes, *_headroom_bytes, *_charged_bytes (what this
//     daemon holds), *_budget_bytes (what pools may still map);
//   for the daemon: kvbroker_orphaned_handles (backend handles of deleted
//     pools whose release failed, retried by the background worker).
//
// The outcome counters are counted by the pool where each call is decided
// (PoolStats), not derived from replies.
//
// MetricsServer serves GET /metrics in the text format (0.0.4); other paths
// are 404. The listener is bounded (MetricsOptions): `threads` connections
// are served at once, each must send its request within `request_timeout`
// or is closed, at most `queued_connections` more wait accepted and
// `listen_backlog` more wait in the kernel; further connection attempts are
// not accepted. A client that opens connections and stays silent therefore
// holds at most that many, each for at most `request_timeout`.

#ifndef KVBROKER_SERVER_METRICS_H_
#define KVBROKER_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/broker.h"
#include "attach/session_directory.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace kvbroker {

// The broker's metrics, collected at each scrape, with those of the engines
// `sessions` reports (nullable: none). `broker` must outlive it.
class BrokerCollector final : public prometheus::Collectable {
 public:
  explicit BrokerCollector(
      Broker* broker,
      std::shared_ptr<const attach::SessionDirectory> sessions = nullptr)
      : broker_(broker), sessions_(std::move(sessions)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  Broker* const broker_;
  const std::shared_ptr<const attach::SessionDirectory> sessions_;
};

// The text exposition of `broker`'s metrics (what a scrape returns).
std::string RenderMetrics(
    Broker& broker,
    std::shared_ptr<const attach::SessionDirectory> sessions = nullptr);

struct MetricsOptions {
  int threads = 2;
  absl::Duration request_timeout = absl::Seconds(5);
  int queued_connections = 8;
  int listen_backlog = 16;
};

class MetricsServer {
 public:
  // Listens on `listen` ("host:port" with an IPv4 or bracketed IPv6 literal
  // host, or localhost; port 0 picks a free port) and serves `collector`'s
  // metrics at /metrics. INVALID_ARGUMENT for a malformed address or
  // options, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen,
      std::shared_ptr<prometheus::Collectable> collector,
      MetricsOptions options = {});

  // Stops listening; a scrape in progress finishes first.
  ~MetricsServer();

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port.
  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::shared_ptr<prometheus::Collectable> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_METRICS_H_
