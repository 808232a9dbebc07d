// HttpServer: a small HTTP/1.1 listener (GNU libmicrohttpd) that hands each
// complete request, body included, to one handler function.
//
// kvbroker-extender serves the scheduler's filter / prioritize / bind calls,
// /healthz and /metrics through it, and the extender's tests run their fake
// Kubernetes API server on it. Every connection gets its own thread, so a
// handler may block (the filter waits for its brokers) without holding up
// other callers. Request bodies are capped (kMaxBodyBytes); a larger body is
// answered 413 without calling the handler.

#ifndef KVBROKER_EXTENDER_HTTP_SERVER_H_
#define KVBROKER_EXTENDER_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

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

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Bodies above this are refused with 413 (a NodeList of a few thousand
  // nodes fits easily).
  static constexpr size_t kMaxBodyBytes = 64 << 20;

  // Listens on `listen`, "host:port" with an IPv4 literal or "localhost" or
  // "0.0.0.0" as host (port 0 picks a free one). `handler` is called from the
  // connection threads, possibly concurrently.
  // Errors: INVALID_ARGUMENT for a malformed address; UNAVAILABLE when the
  // port cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& listen, Handler handler);

  // Stops listening and waits for the requests in progress.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  explicit HttpServer(Handler handler) : handler_(std::move(handler)) {}
  friend struct HttpServerCallbacks;

  const Handler handler_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_HTTP_SERVER_H_
