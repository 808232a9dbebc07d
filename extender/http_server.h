// HttpServer: a small HTTP/1.1 listener (GNU libmicrohttpd) that hands each
// complete request, body included, to one handler function.
//
// kvbroker-extender serves the scheduler's filter / prioritize / bind calls,
// /healthz and /metrics through it, and the extender's tests run their fake
// Kubernetes API server on it. Every connection gets its own thread, so a
// handler may block (the filter waits for its brokers) without holding up
// other callers. Request bodies are capped (kMaxBodyBytes): a larger declared
// length is answered 413 before the body is read, and a chunked body that
// grows past the cap closes the connection; neither reaches the handler.
// Connections are bounded (HttpServerOptions::max_connections), and one that
// sends nothing for idle_timeout is closed, so clients that open connections
// and stall, or stream without end, cannot hold the threads and the
// connection slots for good.
//
// HTTPS: given a certificate and key (HttpServerOptions), the listener speaks
// TLS only (GnuTLS, through libmicrohttpd) and a plaintext request gets no
// answer. Clients are not asked for certificates.

#ifndef KVBROKER_EXTENDER_HTTP_SERVER_H_
#define KVBROKER_EXTENDER_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct MHD_Daemon;

namespace kvbroker {
namespace extender {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query string
  // Decoded query parameters ("labelSelector" -> "app=kvbroker").
  std::map<std::string, std::string> query;
  // Header names lowercased.
  std::map<std::string, std::string> headers;
  std::string body;

  // The header's value, or "" when absent. `name` in lowercase.
  std::string Header(const std::string& name) const;
};

struct HttpResponse {
  int code = 200;
  std::string content_type = "application/json";
  std::string body;
};

struct HttpServerOptions {
  // PEM. Both set: HTTPS; both empty: plain HTTP. The certificate may carry
  // its chain after it.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  // A connection that sends nothing for this long (whole seconds, at least
  // one) is closed: a request cut short, or an idle keep-alive. A handler
  // that takes longer still answers.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Connections served at once (each has its own thread); more wait in the
  // listen queue until one closes.
  int max_connections = 256;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Bodies above this are refused with 413 (100,000 NodeNames take about
  // 3 MB, a full NodeList of a thousand nodes fits). With the bound on
  // values (extender_api.h) a request's document stays well under the
  // extender's memory limit.
  static constexpr size_t kMaxBodyBytes = 16 << 20;

  // Listens on `listen`, "host:port" with an IPv4 literal or "localhost" or
  // "0.0.0.0" as host (port 0 picks a free one). `handler` is called from the
  // connection threads, possibly concurrently.
  // Errors: INVALID_ARGUMENT for a malformed address, for only one of
  // certificate and key, for a certificate or key that TLS refuses (the
  // library's reason in the message), or for max_connections < 1 or an
  // idle_timeout under a second; UNAVAILABLE when the port cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& listen, Handler handler,
      HttpServerOptions options = {});

  // Stops listening and waits for the requests in progress.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  bool tls() const { return !options_.tls_cert_pem.empty(); }

 private:
  HttpServer(Handler handler, HttpServerOptions options)
      : handler_(std::move(handler)), options_(std::move(options)) {}
  friend struct HttpServerCallbacks;

  const Handler handler_;
  // The library reads the PEM from here while it starts.
  const HttpServerOptions options_;
  MHD_Daemon* daemon_ = nullptr;
  // Where the library's error messages go while Start runs; null after
  // (they go to stderr). The daemon's threads may log while Start clears it.
  std::atomic<std::string*> log_sink_{nullptr};
  int port_ = 0;
};

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_HTTP_SERVER_H_
