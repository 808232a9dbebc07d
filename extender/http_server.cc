// libmicrohttpd glue of HttpServer: the body is gathered across the
// library's upload callbacks in a per-request state, then the handler runs
// once with the whole request.

#include "extender/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace kvbroker {
namespace extender {

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

namespace {

struct PendingRequest {
  HttpRequest request;
};

HttpResponse TooLarge() {
  return {413, "text/plain; charset=utf-8",
          absl::StrCat("request body over ", HttpServer::kMaxBodyBytes,
                       " bytes\n")};
}

MHD_Result CollectHeader(void* cls, MHD_ValueKind /*kind*/, const char* key,
                         const char* value) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(cls);
  (*headers)[absl::AsciiStrToLower(key)] = value != nullptr ? value : "";
  return MHD_YES;
}

MHD_Result CollectQuery(void* cls, MHD_ValueKind /*kind*/, const char* key,
                        const char* value) {
  auto* query = static_cast<std::map<std::string, std::string>*>(cls);
  (*query)[key] = value != nullptr ? value : "";
  return MHD_YES;
}

MHD_Result Send(MHD_Connection* connection, const HttpResponse& response) {
  MHD_Response* r = MHD_create_response_from_buffer(
      response.body.size(), const_cast<char*>(response.body.data()),
      MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", response.content_type.c_str());
  const MHD_Result queued = MHD_queue_response(connection, response.code, r);
  MHD_destroy_response(r);
  return queued;
}

void Completed(void* /*cls*/, MHD_Connection* /*connection*/, void** req_cls,
               MHD_RequestTerminationCode /*toe*/) {
  delete static_cast<PendingRequest*>(*req_cls);
  *req_cls = nullptr;
}

// The library's error messages: kept in `*cls` (a std::string) while the
// daemon starts, so that Start can say why it failed. Afterwards (the
// logger is given a null string by then) they go to stderr: a client's
// failed TLS handshake, an accept that failed.
void Log(void* cls, const char* format, va_list args) {
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  std::string* sink = static_cast<std::atomic<std::string*>*>(cls)->load();
  if (sink != nullptr) {
    sink->append(line);
  } else {
    std::fprintf(stderr, "http server: %s", line);
  }
}

}  // namespace

struct HttpServerCallbacks {
  static MHD_Result Handle(void* cls, MHD_Connection* connection,
                           const char* url, const char* method,
                           const char* /*version*/, const char* upload_data,
                           size_t* upload_data_size, void** req_cls) {
    auto* server = static_cast<HttpServer*>(cls);
    auto* pending = static_cast<PendingRequest*>(*req_cls);
    if (pending == nullptr) {  // headers only, first call
      pending = new PendingRequest;
      pending->request.method = method;
      pending->request.path = url;
      MHD_get_connection_values(connection, MHD_HEADER_KIND, &CollectHeader,
                                &pending->request.headers);
      MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND,
                                &CollectQuery, &pending->request.query);
      *req_cls = pending;
      // A declared length past the cap is answered before its body is
      // read: a response queued now makes the library skip the body
      // (and any "100 Continue") and close the connection after it.
      uint64_t declared = 0;
      if (absl::SimpleAtoi(pending->request.Header("content-length"),
                           &declared) &&
          declared > HttpServer::kMaxBodyBytes) {
        return Send(connection, TooLarge());
      }
      return MHD_YES;
    }
    if (*upload_data_size != 0) {
      // A chunked body has no declared length; the first byte past the cap
      // closes the connection, so no client can keep a thread reading.
      if (pending->request.body.size() + *upload_data_size >
          HttpServer::kMaxBodyBytes) {
        return MHD_NO;
      }
      pending->request.body.append(upload_data, *upload_data_size);
      *upload_data_size = 0;
      return MHD_YES;
    }
    return Send(connection, server->handler_(pending->request));
  }
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& listen, Handler handler, HttpServerOptions options) {
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "HTTPS needs both a certificate and its key");
  }
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the host of \"", listen, "\" must be an IPv4 address or localhost"));
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(std::move(handler), std::move(options)));
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD |
                       MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
  // Options after the address; HTTPS adds the key and certificate.
  MHD_OptionItem tls_options[] = {
      {MHD_OPTION_END, 0, nullptr},
      {MHD_OPTION_END, 0, nullptr},
      {MHD_OPTION_END, 0, nullptr},
  };
  if (server->tls()) {
    flags |= MHD_USE_TLS;
    tls_options[0] = {MHD_OPTION_HTTPS_MEM_KEY, 0,
                      const_cast<char*>(server->options_.tls_key_pem.c_str())};
    tls_options[1] = {MHD_OPTION_HTTPS_MEM_CERT, 0,
                      const_cast<char*>(server->options_.tls_cert_pem.c_str())};
  }
  if (server->options_.max_connections < 1 ||
      server->options_.idle_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "HTTP needs max_connections >= 1 and an idle timeout of at least 1s");
  }
  const auto idle_seconds = static_cast<unsigned int>(std::min<int64_t>(
      absl::ToInt64Seconds(server->options_.idle_timeout), 86400));
  std::string start_errors;
  server->log_sink_ = &start_errors;
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(port), nullptr, nullptr,
      &HttpServerCallbacks::Handle, server.get(), MHD_OPTION_EXTERNAL_LOGGER,
      &Log, &server->log_sink_, MHD_OPTION_SOCK_ADDR,
      reinterpret_cast<const sockaddr*>(&addr), MHD_OPTION_NOTIFY_COMPLETED,
      &Completed, nullptr, MHD_OPTION_CONNECTION_TIMEOUT, idle_seconds,
      MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(server->options_.max_connections),
      MHD_OPTION_ARRAY, tls_options, MHD_OPTION_END);
  server->log_sink_ = nullptr;
  if (server->daemon_ == nullptr) {
    std::string why(absl::StripTrailingAsciiWhitespace(start_errors));
    absl::StrReplaceAll({{"\n", "; "}}, &why);
    // A refused certificate or key names GnuTLS or x509 in the message.
    const bool tls_refused =
        server->tls() && (why.find("x509") != std::string::npos ||
                          why.find("TLS") != std::string::npos ||
                          why.find("certificate") != std::string::npos);
    const std::string message = absl::StrCat("cannot listen on ", listen,
                                             server->tls() ? " (HTTPS)" : "",
                                             why.empty() ? "" : ": ", why);
    return tls_refused ? absl::InvalidArgumentError(message)
                       : absl::UnavailableError(message);
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : port;
  return server;
}

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace extender
}  // namespace kvbroker
