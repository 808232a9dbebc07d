// Metrics: Prometheus text rendering and the libmicrohttpd listener.

#include "server/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/failure.h"
#include "allocator/stats.h"

namespace kvbroker {
namespace {

// A label value as the exposition format wants it.
std::string Escape(absl::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

// Collects samples metric by metric, so that each family's HELP and TYPE
// come once, before its samples, whatever order the pools are walked in.
class Exposition {
 public:
  void Add(const std::string& name, const char* type, const char* help,
           const std::string& labels, double value) {
    Family& f = Find(name, type, help);
    absl::StrAppend(&f.samples, name, "{", labels, "} ", Number(value), "\n");
  }
  // A histogram in seconds from a LatencyHistogram in microseconds.
  void AddHistogram(const std::string& name, const char* help,
                    const std::string& labels, const LatencyHistogram& h) {
    Family& f = Find(name, "histogram", help);
    int64_t cumulative = 0;
    for (size_t i = 0; i < h.buckets.size(); ++i) {
      cumulative += h.buckets[i];
      const std::string le =
          i < LatencyHistogram::kBoundsMicros.size()
              ? Number(LatencyHistogram::kBoundsMicros[i] / 1e6)
              : "+Inf";
      absl::StrAppend(&f.samples, name, "_bucket{", labels, ",le=\"", le,
                      "\"} ", cumulative, "\n");
    }
    absl::StrAppend(&f.samples, name, "_sum{", labels, "} ",
                    Number(h.sum_micros / 1e6), "\n", name, "_count{", labels,
                    "} ", h.count, "\n");
  }
  std::string Text() const {
    std::string out;
    for (const Family& f : families_) {
      absl::StrAppend(&out, "# HELP ", f.name, " ", f.help, "\n# TYPE ", f.name,
                      " ", f.type, "\n", f.samples);
    }
    return out;
  }

 private:
  struct Family {
    std::string name, type, help, samples;
  };
  static std::string Number(double v) { return absl::StrFormat("%.17g", v); }
  Family& Find(const std::string& name, const char* type, const char* help) {
    for (Family& f : families_) {
      if (f.name == name) return f;
    }
    families_.push_back({name, type, help, ""});
    return families_.back();
  }
  std::vector<Family> families_;
};

}  // namespace

std::string RenderMetrics(Broker& broker) {
  Exposition e;
  for (const std::shared_ptr<PagePool>& pool : broker.ListPools()) {
    absl::StatusOr<CapacitySnapshot> c = pool->Capacity();
    if (!c.ok()) continue;  // deleted meanwhile
    const PoolStats s = pool->Stats();
    const std::string p = absl::StrCat("pool=\"", Escape(pool->name()), "\"");
    const std::pair<const char*, PageCount> states[] = {
        {"free", c->pages_free},  {"mapping", c->pages_mapping},
        {"idle", c->pages_idle},  {"open", c->pages_open},
        {"full", c->pages_full},  {"reclaimed", c->pages_reclaimed},
        {"empty", c->pages_empty}};
    for (const auto& [state, n] : states) {
      e.Add("kvbroker_pool_pages", "gauge", "Pages of the pool by state.",
            absl::StrCat(p, ",state=\"", state, "\""),
            static_cast<double>(n.value()));
    }
    e.Add("kvbroker_pool_available_blocks", "gauge",
          "Blocks an Alloc could take now (exact).", p,
          c->available_blocks.value());
    e.Add("kvbroker_pool_allocated_blocks", "gauge", "Blocks allocated.", p,
          c->allocated_blocks.value());
    e.Add("kvbroker_pool_reserved_blocks", "gauge",
          "Blocks held by reservations.", p, c->reserved_blocks.value());
    e.Add("kvbroker_pool_total_blocks", "gauge",
          "Blocks the pool could ever hold under its limit.", p,
          c->total_blocks.value());
    e.Add("kvbroker_pool_mapped_bytes", "gauge",
          "GPU memory mapped by the pool, over all its devices.", p,
          c->mapped_bytes.value());
    e.Add("kvbroker_pool_virtual_bytes", "gauge",
          "Virtual address space reserved by the pool, over all its devices.",
          p, c->virtual_bytes.value());
    e.Add("kvbroker_pool_limit_target_pages", "gauge",
          "Pages the pool may keep mapped under its memory limit.", p,
          c->limit.target_pages.value());
    e.Add("kvbroker_pool_healthy", "gauge",
          "1 while the pool serves allocations, 0 once it has failed.", p,
          c->healthy ? 1 : 0);
    e.Add("kvbroker_pool_generation", "counter",
          "Changes the pool has seen (its generation).", p,
          static_cast<double>(c->generation));
    for (const auto& [method, n] :
         {std::pair<const char*, int64_t>{"Alloc", s.alloc_calls},
          {"Free", s.free_calls},
          {"Reserve", s.reserve_calls}}) {
      e.Add("kvbroker_pool_calls_total", "counter",
            "Alloc, Free and Reserve calls that reached the pool.",
            absl::StrCat(p, ",method=\"", method, "\""), n);
    }
    for (int r = 0; r <= kMaxFailureReason; ++r) {
      if (s.outcomes[r] == 0) continue;
      const absl::string_view reason =
          r == 0 ? "OK" : ReasonName(static_cast<FailureReason>(r));
      e.Add("kvbroker_pool_outcomes_total", "counter",
            "Outcomes of Alloc, Free and Reserve by reason (OK: success).",
            absl::StrCat(p, ",reason=\"", reason, "\""), s.outcomes[r]);
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
      e.Add(absl::StrCat("kvbroker_pool_", name), "counter",
            "Pool counter since the pool was created.", p, n);
    }
    e.AddHistogram("kvbroker_pool_map_seconds",
                   "Time to create, map and enable one page on every device "
                   "of the pool.",
                   p, s.map_latency);
    e.AddHistogram("kvbroker_pool_unmap_seconds",
                   "Time to unmap and release one page on every device of "
                   "the pool.",
                   p, s.unmap_latency);
  }
  DeviceBudgets* budgets = broker.budgets();
  for (int d = 0; d < budgets->device_count(); ++d) {
    const DeviceBudgetSnapshot b = budgets->Snapshot(d);
    const std::string l = absl::StrCat("device=\"", b.device, "\"");
    e.Add("kvbroker_device_total_bytes", "gauge", "Device memory.", l,
          b.total.value());
    e.Add("kvbroker_device_driver_free_bytes", "gauge",
          "Free device memory as the driver last reported it.", l,
          b.driver_free.value());
    e.Add("kvbroker_device_headroom_bytes", "gauge",
          "Device memory kept free (1 - --gpu_memory_utilization).", l,
          b.headroom.value());
    e.Add("kvbroker_device_charged_bytes", "gauge",
          "Device memory this daemon holds for its pools.", l,
          b.charged.value());
    e.Add("kvbroker_device_budget_bytes", "gauge",
          "Device memory pools may still map.", l, b.budget.value());
  }
  return e.Text();
}

// libmicrohttpd's request callback; a friend of MetricsServer.
struct MetricsHandler {
  static MHD_Result Handle(void* cls, MHD_Connection* connection,
                           const char* url, const char* method,
                           const char* /*version*/, const char* /*upload_data*/,
                           size_t* /*upload_data_size*/, void** /*req_cls*/) {
    auto* server = static_cast<MetricsServer*>(cls);
    unsigned int code = MHD_HTTP_OK;
    std::string body;
    const char* type = "text/plain; version=0.0.4; charset=utf-8";
    if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
      code = MHD_HTTP_METHOD_NOT_ALLOWED;
      body = "only GET and HEAD\n";
      type = "text/plain; charset=utf-8";
    } else if (std::strcmp(url, "/metrics") != 0) {
      code = MHD_HTTP_NOT_FOUND;
      body = "kvbrokerd serves /metrics\n";
      type = "text/plain; charset=utf-8";
    } else {
      body = server->render_();
    }
    MHD_Response* response = MHD_create_response_from_buffer(
        body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, "Content-Type", type);
    const MHD_Result queued = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return queued;
  }
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::function<std::string()> render) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: \"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  sockaddr_storage addr{};
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(),
                  &a6->sin6_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: bad IPv6 address in ", listen));
    }
    flags |= MHD_USE_IPv6;
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    if (host == "localhost") host = "127.0.0.1";
    if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: the host of \"", listen,
                       "\" must be an IPv4 address, [IPv6] or localhost"));
    }
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer(std::move(render)));
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(port), nullptr, nullptr,
      &MetricsHandler::Handle, server.get(), MHD_OPTION_SOCK_ADDR,
      reinterpret_cast<const sockaddr*>(&addr), MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen: cannot listen on ", listen));
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace kvbroker
