// Fuzz driver: the --auth_tokens file, from bytes to access decisions.
//
// kvbrokerd reads the file as a kvbroker.v1.AuthTokensFile in text format
// and validates it with AccessPolicy::Create. This driver does the same,
// then, for a policy that was accepted, requires that:
//   - every entry's token authenticates, as that entry, in an
//     "authorization: Bearer <token>" header;
//   - the entry is allowed exactly its pools (and every pool with "*"),
//     and refused others with a typed PERMISSION_DENIED;
//   - headers built from the rest of the input authenticate only when they
//     carry one of the file's tokens, and are otherwise refused with a typed
//     UNAUTHENTICATED;
// and, for a refused file, that the refusal is typed and does not quote any
// token (error messages name entries, never secrets).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/failure.h"
#include "fuzz/text_parse.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "server/access.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "auth_tokens_fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvbroker;  // NOLINT: a driver's entry point
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The file is everything before the first form feed; what follows are
  // authorization headers to try, one per line.
  const size_t split = text.find('\f');
  v1::AuthTokensFile file;
  if (!fuzz::ParseText(text.substr(0, split), &file)) return 0;
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::Create(file);
  if (!policy.ok()) {
    if (policy.status().code() != absl::StatusCode::kInvalidArgument) {
      Die("a refused file without INVALID_ARGUMENT: " +
          policy.status().ToString());
    }
    // Does the refusal quote a token? Compare it with the refusal of the
    // same file with every token's characters shifted (printable stays
    // printable, so the same rule refuses it): text that moved with the
    // tokens came from them.
    v1::AuthTokensFile shifted = file;
    for (v1::AuthToken& t : *shifted.mutable_tokens()) {
      for (char& c : *t.mutable_token()) {
        if (c > ' ' && c < '~') c = c == '}' ? '!' : static_cast<char>(c + 1);
      }
    }
    absl::StatusOr<AccessPolicy> other = AccessPolicy::Create(shifted);
    const std::string message = policy.status().ToString();
    for (int i = 0; i < file.tokens_size(); ++i) {
      const std::string& token = file.tokens(i).token();
      const std::string& moved = shifted.tokens(i).token();
      if (token.size() < 8 || token == moved) continue;
      // Names and pools are printed on purpose; a token that appears in
      // one (shifted or not) is public text, not a leaked secret.
      bool public_text = false;
      for (const v1::AuthToken& u : file.tokens()) {
        public_text |= absl::StrContains(u.name(), token) ||
                       absl::StrContains(u.name(), moved);
        for (const std::string& p : u.pools()) {
          public_text |=
              absl::StrContains(p, token) || absl::StrContains(p, moved);
        }
      }
      if (public_text) continue;
      if (absl::StrContains(message, token) && !other.ok() &&
          absl::StrContains(other.status().ToString(),
                            shifted.tokens(i).token())) {
        Die("the refusal quotes a token: " + message);
      }
    }
    return 0;
  }
  for (const v1::AuthToken& t : file.tokens()) {
    absl::StatusOr<const AccessPolicy::Grant*> grant =
        policy->Authenticate("Bearer " + t.token());
    if (!grant.ok() || (*grant)->name != t.name()) {
      Die("entry " + t.name() + " does not authenticate with its own token");
    }
    bool all = false;
    for (const std::string& p : t.pools()) {
      if (p == "*") all = true;
      if (!AccessPolicy::Authorize(**grant, p, "Alloc").ok()) {
        Die("entry " + t.name() + " refused its own pool " + p);
      }
    }
    const std::string other = "pool-not-in-any-entry\x01";
    absl::Status s = AccessPolicy::Authorize(**grant, other, "Alloc");
    if (s.ok() != all) Die("entry " + t.name() + ": wrong answer for a pool");
    if (!s.ok() && GetReason(s) != FailureReason::kPermissionDenied) {
      Die("authorization refused untyped: " + s.ToString());
    }
    if (AccessPolicy::AuthorizeCreate(**grant, other).ok() != all) {
      Die("entry " + t.name() + ": wrong answer for CreatePool");
    }
  }
  if (split == std::string::npos) return 0;
  size_t pos = split + 1;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string header = text.substr(pos, end - pos);
    pos = end + 1;
    absl::StatusOr<const AccessPolicy::Grant*> grant =
        policy->Authenticate(header);
    if (!grant.ok()) {
      if (GetReason(grant.status()) != FailureReason::kUnauthenticated) {
        Die("authentication refused untyped: " + grant.status().ToString());
      }
      continue;
    }
    bool carries = false;
    for (const v1::AuthToken& t : file.tokens()) {
      if (t.name() == (*grant)->name && absl::StrContains(header, t.token())) {
        carries = true;
      }
    }
    if (!carries) Die("a header without the entry's token authenticated");
  }
  return 0;
}
