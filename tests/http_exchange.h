// HttpExchange: one raw HTTP request to 127.0.0.1 over a plain TCP socket,
// for tests of kvbrokerd's metrics listener (no HTTP client library needed
// for a request line and a read-to-close answer).

#ifndef KVBROKER_TESTS_HTTP_EXCHANGE_H_
#define KVBROKER_TESTS_HTTP_EXCHANGE_H_

#include <string>

namespace kvbroker {
namespace testing {

// Sends `request` (e.g. "GET /metrics HTTP/1.0\r\n\r\n") to 127.0.0.1:port
// and returns everything the server sent until it closed the connection;
// "connect failed" / "write failed" when it could not get that far.
std::string HttpExchange(int port, const std::string& request);

}  // namespace testing
}  // namespace kvbroker

#endif  // KVBROKER_TESTS_HTTP_EXCHANGE_H_
