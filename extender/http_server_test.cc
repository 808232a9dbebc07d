// HttpServer over plain HTTP and HTTPS, with libcurl as the client: the
// request reaches the handler whole, HTTPS serves only TLS clients that
// trust its certificate, and a certificate or key that TLS refuses is a
// clear error before anything listens.

#include "extender/http_server.h"

#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace extender {
namespace {

using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? absl::StrCat(srcdir, "/kvbroker/", path) : path;
}

std::string Read(const std::string& path) {
  std::ifstream in(Runfile(path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct Reply {
  CURLcode result = CURLE_OK;
  long code = 0;
  std::string body;
};

// POSTs `body` to `url`; `ca_file` (a runfile) non-empty: trust only it.
Reply Post(const std::string& url, const std::string& body,
           const std::string& ca_file = "") {
  Reply r;
  CURL* curl = curl_easy_init();
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  const std::string ca = ca_file.empty() ? "" : Runfile(ca_file);
  if (!ca.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca.c_str());
  r.result = curl_easy_perform(curl);
  if (r.result == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.code);
  }
  curl_easy_cleanup(curl);
  return r;
}

// Echoes method, path and body.
HttpResponse Echo(const HttpRequest& r) {
  return {201, "text/plain", absl::StrCat(r.method, " ", r.path, " ", r.body)};
}

HttpServerOptions TestCertificate() {
  HttpServerOptions o;
  o.tls_cert_pem = Read("client/testdata/server.pem");
  o.tls_key_pem = Read("client/testdata/server.key");
  return o;
}

TEST(HttpServer, PlainHttp) {
  auto server = HttpServer::Start("127.0.0.1:0", &Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->tls());
  Reply r =
      Post(absl::StrCat("http://127.0.0.1:", (*server)->port(), "/x"), "hello");
  EXPECT_EQ(r.code, 201);
  EXPECT_EQ(r.body, "POST /x hello");
}

TEST(HttpServer, HttpsWithTheTestCertificate) {
  auto server = HttpServer::Start("127.0.0.1:0", &Echo, TestCertificate());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->tls());
  const std::string port = absl::StrCat((*server)->port());
  // The certificate names 127.0.0.1 and localhost; curl checks both the
  // chain (against the test CA) and the name.
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    Reply r = Post(absl::StrCat("https://", host, ":", port, "/filter"), "{}",
                   "client/testdata/ca.pem");
    EXPECT_EQ(r.result, CURLE_OK)
        << host << ": " << curl_easy_strerror(r.result);
    EXPECT_EQ(r.code, 201);
    EXPECT_EQ(r.body, "POST /filter {}");
  }
  // A client that trusts another certificate only (the client one) gives up
  // in the handshake.
  Reply untrusted = Post(absl::StrCat("https://127.0.0.1:", port, "/filter"),
                         "{}", "client/testdata/client.pem");
  EXPECT_EQ(untrusted.result, CURLE_PEER_FAILED_VERIFICATION)
      << curl_easy_strerror(untrusted.result);
  // Plain HTTP to the TLS port gets no HTTP answer.
  Reply plain = Post(absl::StrCat("http://127.0.0.1:", port, "/filter"), "{}");
  EXPECT_NE(plain.result, CURLE_OK);
  EXPECT_EQ(plain.code, 0);
  // The server still serves afterwards.
  EXPECT_EQ(Post(absl::StrCat("https://127.0.0.1:", port, "/again"), "",
                 "client/testdata/ca.pem")
                .body,
            "POST /again ");
}

TEST(HttpServer, HalfOfACertificatePairIsRefused) {
  HttpServerOptions o = TestCertificate();
  o.tls_key_pem.clear();
  auto server = HttpServer::Start("127.0.0.1:0", &Echo, o);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.status().message(),
            "HTTPS needs both a certificate and its key");
}

TEST(HttpServer, AnUnparsableCertificateOrKeyIsRefusedWithTheReason) {
  HttpServerOptions bad_cert = TestCertificate();
  bad_cert.tls_cert_pem = "not a certificate\n";
  auto server = HttpServer::Start("127.0.0.1:0", &Echo, bad_cert);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
      << server.status();
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("cannot listen on 127.0.0.1:0 (HTTPS): GnuTLS failed "
                        "to setup x509 certificate/key: Base64 decoding "
                        "error."));

  HttpServerOptions wrong_key = TestCertificate();
  wrong_key.tls_key_pem = Read("client/testdata/client.key");
  server = HttpServer::Start("127.0.0.1:0", &Echo, wrong_key);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
      << server.status();
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("The certificate and the given key do not match."));
}

// A loopback connection to `port` that has sent `bytes`; -1 if it failed.
int ConnectAndSend(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(bytes.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads from `fd` until the server closes it, appending what it sent to
// `got` (if not null); false when `limit` passes first.
bool ClosedWithin(int fd, absl::Duration limit, std::string* got = nullptr) {
  const absl::Time deadline = absl::Now() + limit;
  char buf[4096];
  for (;;) {
    const int left_ms =
        static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left_ms <= 0) return false;
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, left_ms) <= 0) return false;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return true;
    if (got != nullptr) got->append(buf, static_cast<size_t>(n));
  }
}

TEST(HttpServer, ADeclaredBodyPastTheCapIsRefusedBeforeItIsSent) {
  std::atomic<int> handled{0};
  auto server = HttpServer::Start("127.0.0.1:0", [&](const HttpRequest& r) {
    ++handled;
    return Echo(r);
  });
  ASSERT_TRUE(server.ok()) << server.status();
  // The headers alone: the answer must not wait for a body never sent.
  const int fd = ConnectAndSend(
      (*server)->port(),
      absl::StrCat("POST /filter HTTP/1.1\r\nHost: a\r\nContent-Length: ",
                   HttpServer::kMaxBodyBytes + 1, "\r\n\r\n"));
  ASSERT_GE(fd, 0);
  std::string reply;
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(10), &reply));
  close(fd);
  EXPECT_THAT(reply, ::testing::StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(reply, HasSubstr("request body over 16777216 bytes"));

  // curl asks "Expect: 100-continue" for a large body and sends none of it.
  Reply big = Post(absl::StrCat("http://127.0.0.1:", (*server)->port(), "/f"),
                   std::string(HttpServer::kMaxBodyBytes + 1, 'x'));
  EXPECT_EQ(big.result, CURLE_OK) << curl_easy_strerror(big.result);
  EXPECT_EQ(big.code, 413);
  EXPECT_EQ(handled.load(), 0);

  // A body of exactly the cap is served.
  Reply cap = Post(absl::StrCat("http://127.0.0.1:", (*server)->port(), "/f"),
                   std::string(HttpServer::kMaxBodyBytes, 'y'));
  EXPECT_EQ(cap.code, 201);
  EXPECT_EQ(cap.body.size(),
            HttpServer::kMaxBodyBytes + sizeof("POST /f ") - 1);
  EXPECT_EQ(handled.load(), 1);
}

TEST(HttpServer, AChunkedBodyPastTheCapClosesTheConnection) {
  std::atomic<int> handled{0};
  HttpServerOptions options;
  options.idle_timeout = absl::Seconds(30);
  auto server = HttpServer::Start(
      "127.0.0.1:0",
      [&](const HttpRequest& r) {
        ++handled;
        return Echo(r);
      },
      options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = ConnectAndSend(
      (*server)->port(),
      "POST /filter HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_GE(fd, 0);
  // Chunks of 1 MiB without end, as long as the server takes them; it
  // must stop taking them soon after the cap.
  const std::string chunk =
      absl::StrCat("100000\r\n", std::string(1 << 20, 'z'), "\r\n");
  size_t sent = 0;
  while (sent < 4 * HttpServer::kMaxBodyBytes &&
         send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) ==
             static_cast<ssize_t>(chunk.size())) {
    sent += 1 << 20;
  }
  EXPECT_LT(sent, 4 * HttpServer::kMaxBodyBytes);
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(10)));
  close(fd);
  EXPECT_EQ(handled.load(), 0);
}

TEST(HttpServer, AClientThatStopsSendingIsClosedAtTheIdleTimeout) {
  HttpServerOptions options;
  options.idle_timeout = absl::Seconds(1);
  auto server = HttpServer::Start("127.0.0.1:0", &Echo, options);
  ASSERT_TRUE(server.ok()) << server.status();
  // Half a request: headers without their end, and a body cut short.
  const int headers = ConnectAndSend((*server)->port(), "POST /x HTTP/1.1\r\n");
  const int body = ConnectAndSend(
      (*server)->port(),
      "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc");
  ASSERT_GE(headers, 0);
  ASSERT_GE(body, 0);
  EXPECT_TRUE(ClosedWithin(headers, absl::Seconds(10)));
  EXPECT_TRUE(ClosedWithin(body, absl::Seconds(10)));
  close(headers);
  close(body);
}

TEST(HttpServer, AHandlerSlowerThanTheIdleTimeoutStillAnswers) {
  HttpServerOptions options;
  options.idle_timeout = absl::Seconds(1);
  auto server = HttpServer::Start(
      "127.0.0.1:0",
      [](const HttpRequest& r) {
        absl::SleepFor(absl::Milliseconds(2500));
        return Echo(r);
      },
      options);
  ASSERT_TRUE(server.ok()) << server.status();
  Reply r = Post(absl::StrCat("http://127.0.0.1:", (*server)->port(), "/slow"),
                 "late");
  EXPECT_EQ(r.result, CURLE_OK) << curl_easy_strerror(r.result);
  EXPECT_EQ(r.body, "POST /slow late");
}

TEST(HttpServer, ConnectionsPastTheLimitWaitUntilOneCloses) {
  HttpServerOptions options;
  options.max_connections = 2;
  auto server = HttpServer::Start("127.0.0.1:0", &Echo, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int a = ConnectAndSend((*server)->port(), "POST /x HTTP/1.1\r\n");
  const int b = ConnectAndSend((*server)->port(), "POST /x HTTP/1.1\r\n");
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  absl::SleepFor(absl::Milliseconds(200));  // both accepted
  absl::Notification answered;
  Reply third;
  std::thread client([&] {
    third = Post(absl::StrCat("http://127.0.0.1:", (*server)->port(), "/x"),
                 "third");
    answered.Notify();
  });
  EXPECT_FALSE(
      answered.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  close(a);
  client.join();
  EXPECT_EQ(third.body, "POST /x third");
  close(b);
}

}  // namespace
}  // namespace extender
}  // namespace kvbroker
