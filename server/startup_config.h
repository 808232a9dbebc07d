// kvbrokerd's start-up inputs, checked before anything is served: listen
// addresses, the files named by flags (--pools, --auth_tokens, --tls_*),
// and the TLS certificate against its key.
//
// Every error is an absl::Status whose message names the flag and the
// cause (with the operating system's reason for a file that cannot be
// read); none echoes the contents of a file that may hold secrets.

#ifndef KVBROKER_SERVER_STARTUP_CONFIG_H_
#define KVBROKER_SERVER_STARTUP_CONFIG_H_

#include <google/protobuf/message.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvbroker {

// Checks "host:port" (IPv6 hosts in brackets) with a decimal port in
// [0, 65535]; 0 asks the kernel for a free port. INVALID_ARGUMENT names
// `flag` otherwise.
absl::Status CheckListenAddress(absl::string_view flag,
                                absl::string_view address);

// The contents of the regular file at `path`. Errors name `flag`:
// NOT_FOUND / PERMISSION_DENIED / FAILED_PRECONDITION with strerror(errno)
// when it cannot be opened or read, INVALID_ARGUMENT when it is a
// directory or another non-regular file.
absl::StatusOr<std::string> ReadConfigFile(absl::string_view flag,
                                           const std::string& path);

// How parse errors of a text-format file are reported.
enum class FileSecrecy {
  kPublic,  // line, column and the parser's message (which quotes the text)
  kSecret,  // line and column only: the file may hold secrets
};

// Reads `path` and parses it as protobuf text format into `message`.
// INVALID_ARGUMENT names the flag, the file, the message type and the first
// error's position.
absl::Status ReadTextProtoFile(absl::string_view flag, const std::string& path,
                               FileSecrecy secrecy,
                               google::protobuf::Message* message);

// Checks that `cert_pem` holds at least one PEM certificate, `key_pem` a
// PEM private key, and that the key belongs to the first certificate.
// INVALID_ARGUMENT names the flags otherwise.
absl::Status CheckCertificateAndKey(const std::string& cert_pem,
                                    const std::string& key_pem);

// Checks that `pem` holds at least one PEM certificate (a CA bundle).
absl::Status CheckCertificateBundle(absl::string_view flag,
                                    const std::string& pem);

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_STARTUP_CONFIG_H_
