// AccessPolicy: who may call the KvBroker service (SPEC 9, --auth_tokens).
//
// Each entry of the tokens file grants one bearer token a set of pools ("*"
// is every pool, and only "*" may create pools). A call presents its token
// in the "authorization: Bearer <token>" header; the service authenticates
// the header first (UNAUTHENTICATED when it is missing, malformed or
// unknown), then authorizes the pool the call names (PERMISSION_DENIED).
// Both are typed failures (failure.h) and are checked before the call
// touches a pool, so a refused call changes nothing.
//
// Tokens are compared in time independent of where they differ, and against
// every entry, so response timing does not reveal a token's prefix. Logs and
// error metadata name the entry (`name`), never the secret.
//
// Thread safety: immutable after Create; safe to share.

#ifndef KVBROKER_SERVER_ACCESS_H_
#define KVBROKER_SERVER_ACCESS_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {

class AccessPolicy {
 public:
  // What one token or client identity may do.
  struct Grant {
    std::string kind = "token";  // or "identity"
    std::string name;
    bool all_pools = false;
    absl::flat_hash_set<std::string> pools;

    bool Allows(absl::string_view pool) const {
      return all_pools || pools.contains(pool);
    }
  };

  // Who a call is: the grant of its token (when the policy has tokens) and
  // of its client certificate (when the policy has identities and the call
  // came over TLS). A call may touch a pool only if every grant it has
  // allows it; a call with neither (no tokens configured, Unix socket) may
  // touch any.
  struct Caller {
    const Grant* token = nullptr;
    const Grant* identity = nullptr;

    bool Allows(absl::string_view pool) const {
      return (token == nullptr || token->Allows(pool)) &&
             (identity == nullptr || identity->Allows(pool));
    }
  };

  // Shortest token accepted: shorter secrets are guessable.
  static constexpr size_t kMinTokenLength = 16;

  // Validates the file: at least one token or identity; each token with a
  // unique non-empty name, a unique token of at least kMinTokenLength
  // printable characters, and at least one pool; each identity with a
  // unique non-empty name, a unique non-empty SAN and at least one pool.
  // INVALID_ARGUMENT names the offending entry.
  static absl::StatusOr<AccessPolicy> Create(const v1::AuthTokensFile& file);

  // The grant of the token in `authorization` (the header's value, e.g.
  // "Bearer abc..."). UNAUTHENTICATED failure when absent, not a bearer
  // credential, or unknown.
  absl::StatusOr<const Grant*> Authenticate(
      absl::string_view authorization) const;
  // The same for a call's every `authorization` header: exactly one must be
  // present (two or more are refused: which one would count is ambiguous).
  absl::StatusOr<const Grant*> Authenticate(
      const std::vector<absl::string_view>& authorization) const;

  // The identity one of whose SANs is `sans` (a client certificate's subject
  // alternative names). UNAUTHENTICATED when none is listed.
  absl::StatusOr<const Grant*> Identify(
      const std::vector<std::string>& sans) const;

  // Authenticates a call from its `authorization` headers and, for a call
  // over TLS, its client certificate's SANs (`certificate_sans`; null for
  // a plaintext call). UNAUTHENTICATED as Authenticate and Identify say.
  absl::StatusOr<Caller> Identify(
      const std::vector<absl::string_view>& authorization,
      const std::vector<std::string>* certificate_sans) const;
  // Authorize / AuthorizeCreate for every grant of `caller`.
  static absl::Status Authorize(const Caller& caller, absl::string_view pool,
                                absl::string_view method);
  static absl::Status AuthorizeCreate(const Caller& caller,
                                      absl::string_view pool);

  bool has_tokens() const { return !entries_.empty(); }
  bool has_identities() const { return !identities_.empty(); }

  // OK when `grant` covers `pool`; otherwise a PERMISSION_DENIED failure
  // naming the grant, the pool and the method.
  static absl::Status Authorize(const Grant& grant, absl::string_view pool,
                                absl::string_view method);
  // OK when `grant` may create pools (it has "*").
  static absl::Status AuthorizeCreate(const Grant& grant,
                                      absl::string_view pool);

  int size() const { return static_cast<int>(entries_.size()); }

 private:
  struct Entry {
    std::string token;
    Grant grant;
  };
  std::vector<Entry> entries_;
  // Client certificate SAN -> identity.
  std::vector<std::pair<std::string, Grant>> identities_;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_ACCESS_H_
