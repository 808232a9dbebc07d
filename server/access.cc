// AccessPolicy: token validation, constant-time lookup, pool checks.

#include "server/access.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "common/error_keys.h"

namespace kvbroker {
namespace {

// The metadata key naming the grant: token_name or identity_name.
std::string NameKey(const AccessPolicy::Grant& grant) {
  return grant.kind == "token" ? std::string(error_key::kTokenName)
                               : "identity_name";
}

// Equal contents, in time that depends only on the lengths.
bool SameSecret(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^
            static_cast<unsigned char>(b.empty() ? 0 : b[i % b.size()]);
  }
  return diff == 0;
}

absl::Status Unauthenticated(absl::string_view why) {
  return MakeFailure(
      FailureReason::kUnauthenticated,
      absl::StrCat(why, "; send 'authorization: Bearer <token>'"), {});
}

}  // namespace

absl::StatusOr<AccessPolicy> AccessPolicy::Create(
    const v1::AuthTokensFile& file) {
  if (file.tokens().empty() && file.identities().empty()) {
    return absl::InvalidArgumentError(
        "the tokens file grants no token and no identity");
  }
  AccessPolicy policy;
  absl::flat_hash_set<std::string> names, tokens;
  for (int i = 0; i < file.tokens_size(); ++i) {
    const v1::AuthToken& t = file.tokens(i);
    const std::string where =
        t.name().empty() ? absl::StrCat("tokens[", i, "]")
                         : absl::StrCat("tokens[", i, "] (", t.name(), ")");
    if (t.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no name"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is used twice"));
    }
    if (t.token().size() < kMinTokenLength) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the token is shorter than ", kMinTokenLength,
                       " characters"));
    }
    for (char c : t.token()) {
      if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the token must be printable ASCII without spaces"));
      }
    }
    if (!tokens.insert(t.token()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the token is used by another entry"));
    }
    if (t.pools().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no pools (use \"*\" for every pool)"));
    }
    Entry e;
    e.token = t.token();
    e.grant.name = t.name();
    for (const std::string& pool : t.pools()) {
      if (pool == "*") {
        e.grant.all_pools = true;
      } else if (pool.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": an empty pool name"));
      } else {
        e.grant.pools.insert(pool);
      }
    }
    policy.entries_.push_back(std::move(e));
  }
  absl::flat_hash_set<std::string> identity_names, sans;
  for (int i = 0; i < file.identities_size(); ++i) {
    const v1::ClientIdentity& id = file.identities(i);
    const std::string where = absl::StrCat(
        "identities[", i, "]",
        id.name().empty() ? "" : absl::StrCat(" (", id.name(), ")"));
    if (id.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no name"));
    }
    if (!identity_names.insert(id.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is used twice"));
    }
    if (id.san().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no san"));
    }
    if (!sans.insert(id.san()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the san is used by another identity"));
    }
    if (id.pools().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no pools (use \"*\" for every pool)"));
    }
    Grant g;
    g.kind = "identity";
    g.name = id.name();
    for (const std::string& pool : id.pools()) {
      if (pool == "*") {
        g.all_pools = true;
      } else if (pool.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": an empty pool name"));
      } else {
        g.pools.insert(pool);
      }
    }
    policy.identities_.emplace_back(id.san(), std::move(g));
  }
  return policy;
}

absl::StatusOr<const AccessPolicy::Grant*> AccessPolicy::Authenticate(
    absl::string_view authorization) const {
  if (authorization.empty()) {
    return Unauthenticated("the call carries no credentials");
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(authorization, kScheme)) {
    return Unauthenticated("the authorization header is not a bearer token");
  }
  const absl::string_view token =
      absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  const Grant* found = nullptr;
  for (const Entry& e : entries_) {  // every entry: no early exit
    if (SameSecret(e.token, token)) found = &e.grant;
  }
  if (found == nullptr) return Unauthenticated("the bearer token is unknown");
  return found;
}

absl::StatusOr<const AccessPolicy::Grant*> AccessPolicy::Authenticate(
    const std::vector<absl::string_view>& authorization) const {
  if (authorization.size() > 1) {
    return Unauthenticated(absl::StrCat("the call carries ",
                                        authorization.size(),
                                        " authorization headers; send one"));
  }
  return Authenticate(authorization.empty() ? absl::string_view()
                                            : authorization.front());
}

absl::StatusOr<const AccessPolicy::Grant*> AccessPolicy::Identify(
    const std::vector<std::string>& sans) const {
  for (const auto& [san, grant] : identities_) {
    for (const std::string& presented : sans) {
      if (presented == san) return &grant;
    }
  }
  return MakeFailure(
      FailureReason::kUnauthenticated,
      absl::StrCat("the client certificate (", sans.size(),
                   " subject alternative name(s)) matches no identity of the "
                   "tokens file"),
      {{"certificate_sans", Num(static_cast<int64_t>(sans.size()))}});
}

absl::StatusOr<AccessPolicy::Caller> AccessPolicy::Identify(
    const std::vector<absl::string_view>& authorization,
    const std::vector<std::string>* certificate_sans) const {
  Caller caller;
  if (has_tokens()) {
    absl::StatusOr<const Grant*> token = Authenticate(authorization);
    if (!token.ok()) return token.status();
    caller.token = *token;
  }
  if (has_identities() && certificate_sans != nullptr) {
    absl::StatusOr<const Grant*> identity = Identify(*certificate_sans);
    if (!identity.ok()) return identity.status();
    caller.identity = *identity;
  }
  return caller;
}

absl::Status AccessPolicy::Authorize(const Caller& caller,
                                     absl::string_view pool,
                                     absl::string_view method) {
  for (const Grant* g : {caller.token, caller.identity}) {
    if (g != nullptr) KVB_RETURN_IF_ERROR(Authorize(*g, pool, method));
  }
  return absl::OkStatus();
}

absl::Status AccessPolicy::AuthorizeCreate(const Caller& caller,
                                           absl::string_view pool) {
  for (const Grant* g : {caller.token, caller.identity}) {
    if (g != nullptr) KVB_RETURN_IF_ERROR(AuthorizeCreate(*g, pool));
  }
  return absl::OkStatus();
}

absl::Status AccessPolicy::Authorize(const Grant& grant, absl::string_view pool,
                                     absl::string_view method) {
  if (grant.Allows(pool)) return absl::OkStatus();
  return MakeFailure(
      FailureReason::kPermissionDenied,
      absl::StrCat(grant.kind, " ", grant.name, " may not use pool ", pool,
                   " (", method, ")"),
      {{std::string(error_key::kPool), std::string(pool)},
       {NameKey(grant), grant.name},
       {std::string(error_key::kMethod), std::string(method)}});
}

absl::Status AccessPolicy::AuthorizeCreate(const Grant& grant,
                                           absl::string_view pool) {
  if (grant.all_pools) return absl::OkStatus();
  return MakeFailure(FailureReason::kPermissionDenied,
                     absl::StrCat(grant.kind, " ", grant.name,
                                  " may not create pools (only one granted "
                                  "\"*\" may)"),
                     {{std::string(error_key::kPool), std::string(pool)},
                      {NameKey(grant), grant.name},
                      {"method", "CreatePool"}});
}

}  // namespace kvbroker
