// Metrics: the broker's state in the Prometheus text exposition format
// (version 0.0.4), and the HTTP listener of kvbrokerd --metrics_listen.
//
// RenderMetrics reads every pool's Capacity snapshot and PoolStats and every
// device budget, without touching the driver or mapping anything; a scrape
// holds each pool's lock twice, briefly (one snapshot, one counter copy).
// The names, all prefixed
// "kvbroker_", carry their unit (_bytes, _seconds, _blocks, _pages,
// _total for counters):
//
//   per pool (label pool):   kvbroker_pool_pages{state}, *_available_blocks,
//     *_allocated_blocks, *_reserved_blocks, *_total_blocks, *_mapped_bytes,
//     *_virtual_bytes, *_limit_target_pages, *_healthy, *_generation,
//     *_calls_total{method}, *_outcomes_total{reason} (reason "OK" for
//     successes), *_blocks_allocated_total, *_blocks_freed_total,
//     *_pages_mapped_total, *_pages_unmapped_total, *_prealloc_pages_total,
//     *_map_failures_total, *_reservations_expired_total,
//     *_idempotent_replays_total, and the histograms
//     kvbroker_pool_map_seconds / kvbroker_pool_unmap_seconds (one page on
//     every device of the pool);
//   per device (label device): kvbroker_device_total_bytes,
//     *_driver_free_bytes, *_headroom_bytes, *_charged_bytes (what this
//     daemon holds), *_budget_bytes (what pools may still map).
//
// MetricsServer serves GET /metrics (and HEAD) from its own thread (GNU
// libmicrohttpd); any other path is 404, any other method 405.

#ifndef KVBROKER_SERVER_METRICS_H_
#define KVBROKER_SERVER_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/broker.h"

struct MHD_Daemon;

namespace kvbroker {

std::string RenderMetrics(Broker& broker);

class MetricsServer {
 public:
  // Listens on `listen` ("host:port" with an IPv4 or bracketed IPv6 literal
  // host; port 0 picks a free port) and answers /metrics with `render()`,
  // called on the server's thread for each scrape. INVALID_ARGUMENT for a
  // malformed address, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::function<std::string()> render);

  // Stops listening; a scrape in progress finishes first.
  ~MetricsServer();

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port.
  int port() const { return port_; }

 private:
  explicit MetricsServer(std::function<std::string()> render)
      : render_(std::move(render)) {}

  const std::function<std::string()> render_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;

  friend struct MetricsHandler;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_METRICS_H_
