// Metrics: the broker's state as prometheus-cpp metric families, and the
// Exposer that serves them.

#include "server/metrics.h"

#include <arpa/inet.h>

#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "allocator/stats.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace kvbroker {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Gathers samples family by family, so that each family is one
// MetricFamily whatever order the pools are walked in.
class Families {
 public:
  void Add(const std::string& name, MetricType type, const char* help,
           std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric& m = Metric(name, type, help, std::move(labels));
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
  }
  // A histogram in seconds from a LatencyHistogram in microseconds.
  void AddHistogram(const std::string& name, const char* help,
                    std::vector<ClientMetric::Label> labels,
                    const LatencyHistogram& h) {
    ClientMetric& m =
        Metric(name, MetricType::Histogram, help, std::move(labels));
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.buckets.size(); ++i) {
      cumulative += static_cast<uint64_t>(h.buckets[i]);
      ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound = i < LatencyHistogram::kBoundsMicros.size()
                          ? LatencyHistogram::kBoundsMicros[i] / 1e6
                          : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(b);
    }
    m.histogram.sample_count = static_cast<uint64_t>(h.count);
    m.histogram.sample_sum = h.sum_micros / 1e6;
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  ClientMetric& Metric(const std::string& name, MetricType type,
                       const char* help,
                       std::vector<ClientMetric::Label> labels) {
    MetricFamily* family = nullptr;
    for (MetricFamily& f : families_) {
      if (f.name == name) family = &f;
    }
    if (family == nullptr) {
      families_.push_back(MetricFamily{name, help, type, {}});
      family = &families_.back();
    }
    family->metric.emplace_back();
    family->metric.back().label = std::move(labels);
    return family->metric.back();
  }
  std::vector<MetricFamily> families_;
};

// The attached engines' metrics: per engine, and per pool of `pools` (every
// pool gets its session gauges, zero when no engine is attached).
void AddSessions(const std::vector<attach::SessionInfo>& sessions,
                 const std::vector<std::string>& pools, Families& e) {
  struct PerPool {
    int64_t sessions = 0;
    int64_t in_grace = 0;
    int64_t quarantined = 0;
  };
  std::map<std::string, PerPool> per_pool;
  for (const std::string& pool : pools) per_pool[pool];
  for (const attach::SessionInfo& s : sessions) {
    if (s.pool.empty()) continue;  // not attached yet
    PerPool& p = per_pool[s.pool];
    if (s.in_grace) {
      ++p.in_grace;
      continue;
    }
    ++p.sessions;
    p.quarantined += s.quarantined_pages;
    const std::vector<ClientMetric::Label> l = {
        {"pool", s.pool},
        {"holder", s.holder},
        {"session", absl::StrCat(s.session_id)}};
    e.Add("kvbroker_engine_mapped_pages", MetricType::Gauge,
          "Pages of the pool the engine has been sent to map and not had "
          "revoked.",
          l, static_cast<double>(s.mapped_pages));
    e.Add("kvbroker_engine_blocks", MetricType::Gauge,
          "Blocks the engine's holder owns.", l, static_cast<double>(s.blocks));
    e.Add("kvbroker_engine_pending_revocations", MetricType::Gauge,
          "Revocations sent to the engine and not yet acknowledged.", l,
          static_cast<double>(s.pending_revocations));
    e.Add("kvbroker_engine_quarantined_pages", MetricType::Gauge,
          "Pages quarantined because the engine missed a revocation "
          "deadline.",
          l, static_cast<double>(s.quarantined_pages));
  }
  for (const auto& [pool, p] : per_pool) {
    const std::vector<ClientMetric::Label> l = {{"pool", pool}};
    e.Add("kvbroker_pool_sessions", MetricType::Gauge,
          "Engine sessions attached to the pool.", l,
          static_cast<double>(p.sessions));
    e.Add("kvbroker_pool_holders_in_grace", MetricType::Gauge,
          "Holders whose session ended and who keep their blocks for their "
          "reattach grace.",
          l, static_cast<double>(p.in_grace));
    e.Add("kvbroker_pool_quarantined_pages", MetricType::Gauge,
          "Pages kept out of capacity because an engine missed a revocation "
          "deadline.",
          l, static_cast<double>(p.quarantined));
  }
}

}  // namespace

std::vector<MetricFamily> BrokerCollector::Collect() const {
  Families e;
  std::vector<std::string> pool_names;
  for (const std::shared_ptr<PagePool>& pool : broker_->ListPools()) {
    absl::StatusOr<CapacitySnapshot> c = pool->Capacity();
    if (!c.ok()) continue;  // deleted meanwhile
    pool_names.push_back(pool->name());
    const PoolStats s = pool->Stats();
    const ClientMetric::Label p{"pool", pool->name()};
    const std::pair<const char*, PageCount> states[] = {
        {"free", c->pages_free},
        {"mapping", c->pages_mapping},
        {"idle", c->pages_idle},
        {"open", c->pages_open},
        {"full", c->pages_full},
        {"reclaimed", c->pages_reclaimed},
        {"empty", c->pages_empty},
        {"revoking", c->pages_revoking},
        {"quarantined", c->pages_quarantined}};
    for (const auto& [state, n] : states) {
      e.Add("kvbroker_pool_pages", MetricType::Gauge,
            "Pages of the pool by state.", {p, {"state", state}},
            static_cast<double>(n.value()));
    }
    e.Add("kvbroker_pool_available_blocks", MetricType::Gauge,
          "Blocks an Alloc could take now (exact).", {p},
          c->available_blocks.value());
    e.Add("kvbroker_pool_allocated_blocks", MetricType::Gauge,
          "Blocks allocated.", {p}, c->allocated_blocks.value());
    e.Add("kvbroker_pool_reserved_blocks", MetricType::Gauge,
          "Blocks held by reservations.", {p}, c->reserved_blocks.value());
    e.Add("kvbroker_pool_total_blocks", MetricType::Gauge,
          "Blocks the pool could ever hold under its limit.", {p},
          c->total_blocks.value());
    e.Add("kvbroker_pool_mapped_bytes", MetricType::Gauge,
          "GPU memory mapped by the pool, over all its devices.", {p},
          c->mapped_bytes.value());
    e.Add("kvbroker_pool_virtual_bytes", MetricType::Gauge,
          "Virtual address space reserved by the pool, over all its devices.",
          {p}, c->virtual_bytes.value());
    e.Add("kvbroker_pool_limit_target_pages", MetricType::Gauge,
          "Pages the pool may keep mapped under its memory limit.", {p},
          c->limit.target_pages.value());
    e.Add("kvbroker_pool_healthy", MetricType::Gauge,
          "1 while the pool serves allocations, 0 once it has failed.", {p},
          c->healthy ? 1 : 0);
    e.Add("kvbroker_pool_generation", MetricType::Counter,
          "Changes the pool has seen (its generation).", {p},
          static_cast<double>(c->generation));
    for (const auto& [method, n] :
         {std::pair<const char*, int64_t>{"Alloc", s.alloc_calls},
          {"Free", s.free_calls},
          {"Reserve", s.reserve_calls}}) {
      e.Add("kvbroker_pool_calls_total", MetricType::Counter,
            "Alloc, Free and Reserve calls that reached the pool.",
            {p, {"method", method}}, static_cast<double>(n));
    }
    for (int r = 0; r <= kMaxFailureReason; ++r) {
      if (s.outcomes[r] == 0) continue;
      const absl::string_view reason =
          r == 0 ? "OK" : ReasonName(static_cast<FailureReason>(r));
      e.Add("kvbroker_pool_outcomes_total", MetricType::Counter,
            "Outcomes of Alloc, Free and Reserve by reason (OK: success).",
            {p, {"reason", std::string(reason)}},
            static_cast<double>(s.outcomes[r]));
    }
    const std::pair<const char*, int64_t> counters[] = {
        {"blocks_allocated_total", s.blocks_allocated_total},
        {"blocks_freed_total", s.blocks_freed_total},
        {"pages_mapped_total", s.pages_mapped_total},
        {"pages_unmapped_total", s.pages_unmapped_total},
        {"prealloc_pages_total", s.prealloc_pages_total},
        {"map_failures_total", s.map_failures_total},
        {"reservations_expired_total", s.reservations_expired_total},
        {"idempotent_replays_total", s.idempotent_replays_total}};
    for (const auto& [name, n] : counters) {
      e.Add(absl::StrCat("kvbroker_pool_", name), MetricType::Counter,
            "Pool counter since the pool was created.", {p},
            static_cast<double>(n));
    }
    e.AddHistogram("kvbroker_pool_map_seconds",
                   "Time to create, map and enable one page on every device "
                   "of the pool.",
                   {p}, s.map_latency);
    e.AddHistogram("kvbroker_pool_unmap_seconds",
                   "Time to unmap and release one page on every device of "
                   "the pool.",
                   {p}, s.unmap_latency);
  }
  if (sessions_ != nullptr) {
    AddSessions(sessions_->ListSessions(), pool_names, e);
  }
  DeviceBudgets* budgets = broker_->budgets();
  for (int d = 0; d < budgets->device_count(); ++d) {
    const DeviceBudgetSnapshot b = budgets->Snapshot(d);
    const std::vector<ClientMetric::Label> l = {
        {"device", absl::StrCat(b.device)}};
    e.Add("kvbroker_device_total_bytes", MetricType::Gauge, "Device memory.", l,
          b.total.value());
    e.Add("kvbroker_device_driver_free_bytes", MetricType::Gauge,
          "Free device memory as the driver last reported it.", l,
          b.driver_free.value());
    e.Add("kvbroker_device_headroom_bytes", MetricType::Gauge,
          "Device memory kept free (1 - --gpu_memory_utilization).", l,
          b.headroom.value());
    e.Add("kvbroker_device_charged_bytes", MetricType::Gauge,
          "Device memory this daemon holds for its pools.", l,
          b.charged.value());
    e.Add("kvbroker_device_budget_bytes", MetricType::Gauge,
          "Device memory pools may still map.", l, b.budget.value());
  }
  e.Add("kvbroker_orphaned_handles", MetricType::Gauge,
        "Backend handles of deleted pools whose release failed; retried in "
        "the background.",
        {}, static_cast<double>(broker_->orphaned_handles()));
  return e.Take();
}

std::string RenderMetrics(
    Broker& broker, std::shared_ptr<const attach::SessionDirectory> sessions) {
  return prometheus::TextSerializer().Serialize(
      BrokerCollector(&broker, std::move(sessions)).Collect());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen,
    std::shared_ptr<prometheus::Collectable> collector,
    MetricsOptions options) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: \"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    in6_addr a6;
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6) !=
        1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: bad IPv6 address in ", listen));
    }
  } else {
    if (host == "localhost") host = "127.0.0.1";
    in_addr a4;
    if (inet_pton(AF_INET, host.c_str(), &a4) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: the host of \"", listen,
                       "\" must be an IPv4 address, [IPv6] or localhost"));
    }
  }
  if (options.threads < 1 || options.queued_connections < 1 ||
      options.listen_backlog < 1 ||
      options.request_timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "metrics listener: threads, queued connections, backlog and request "
        "timeout must be positive");
  }
  // civetweb's options (prometheus-cpp passes them through).
  std::vector<std::string> civet = {
      "listening_ports",
      absl::StrCat(host, ":", port),
      "num_threads",
      absl::StrCat(options.threads),
      "request_timeout_ms",
      absl::StrCat(absl::ToInt64Milliseconds(options.request_timeout)),
      "connection_queue",
      absl::StrCat(options.queued_connections),
      "listen_backlog",
      absl::StrCat(options.listen_backlog),
      "enable_keep_alive",
      "no",
  };
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::move(civet));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics_listen: cannot listen on ", listen, ": ", e.what()));
  }
  server->collector_ = std::move(collector);
  server->exposer_->RegisterCollectable(server->collector_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? port : ports.front();
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace kvbroker
