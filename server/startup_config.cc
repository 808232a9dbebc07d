// Start-up input checks: addresses, config files, PEM material.

#include "server/startup_config.h"

#include <errno.h>
#include <fcntl.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvbroker {
namespace {

absl::Status FileError(absl::string_view flag, const std::string& path,
                       absl::string_view what, int err) {
  const std::string message = absl::StrCat("--", flag, ": cannot ", what, " ",
                                           path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(message);
    default: return absl::FailedPreconditionError(message);
  }
}

// Keeps the first error's position, and its text unless the file is secret.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  explicit FirstError(FileSecrecy secrecy) : secrecy_(secrecy) {}

  void AddError(int line, int column, const std::string& message) override {
    if (!first_.empty()) return;
    first_ = absl::StrCat("line ", line + 1, " column ", column + 1);
    if (secrecy_ == FileSecrecy::kPublic)
      absl::StrAppend(&first_, ": ", message);
  }
  void AddWarning(int, int, const std::string&) override {}

  const std::string& first() const { return first_; }

 private:
  const FileSecrecy secrecy_;
  std::string first_;
};

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::unique_ptr<X509, X509Free> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  if (bio == nullptr) return nullptr;
  std::unique_ptr<X509, X509Free> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();  // leave no failure behind for gRPC's TLS stack
  return cert;
}

}  // namespace

absl::Status CheckListenAddress(absl::string_view flag,
                                absl::string_view address) {
  const size_t colon = address.rfind(':');
  const absl::string_view port =
      colon == absl::string_view::npos ? "" : address.substr(colon + 1);
  const absl::string_view host =
      colon == absl::string_view::npos ? "" : address.substr(0, colon);
  int value = -1;
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char c) {
                        return absl::ascii_isdigit(c);
                      });
  if (host.empty() || !digits || !absl::SimpleAtoi(port, &value) ||
      value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": \"", address,
                     "\" is not host:port with a port in [0, 65535]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadConfigFile(absl::string_view flag,
                                           const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(flag, path, "open", errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return FileError(flag, path, "inspect", err);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": ", path,
        S_ISDIR(st.st_mode) ? " is a directory" : " is not a regular file",
        "; name a file"));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return FileError(flag, path, "read", err);
    }
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

absl::Status ReadTextProtoFile(absl::string_view flag, const std::string& path,
                               FileSecrecy secrecy,
                               google::protobuf::Message* message) {
  absl::StatusOr<std::string> text = ReadConfigFile(flag, path);
  if (!text.ok()) return text.status();
  FirstError errors(secrecy);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(*text, message)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": ", path, " is not a valid ",
        message->GetDescriptor()->full_name(), " in text format (",
        errors.first().empty() ? "parse error" : errors.first(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCertificateAndKey(const std::string& cert_pem,
                                    const std::string& key_pem) {
  std::unique_ptr<X509, X509Free> cert = FirstCertificate(cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        "--tls_cert: the file holds no PEM certificate");
  }
  auto bio = MemoryBio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      bio == nullptr
          ? nullptr
          : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        "--tls_key: the file holds no PEM private key (or it is encrypted)");
  }
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(
        "--tls_key does not match the certificate of --tls_cert");
  }
  return absl::OkStatus();
}

absl::Status CheckCertificateBundle(absl::string_view flag,
                                    const std::string& pem) {
  if (FirstCertificate(pem) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": the file holds no PEM certificate"));
  }
  return absl::OkStatus();
}

}  // namespace kvbroker
