// AccessPolicy: validation of the tokens file, authentication of the
// authorization header, authorization by pool.

#include "server/access.h"

#include <google/protobuf/text_format.h>

#include <fstream>
#include <sstream>
#include <string>

#include "allocator/failure.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

v1::AuthTokensFile Parse(const std::string& text) {
  v1::AuthTokensFile file;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &file));
  return file;
}

constexpr char kFile[] = R"pb(
  tokens { name: "scheduler" token: "sched-0123456789abcdef" pools: "*" }
  tokens { name: "engine" token: "engine-0123456789abcd" pools: "a" pools: "b" }
)pb";

TEST(AccessPolicy, RefusesBadFilesNamingTheEntry) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case&
           c : {
               Case{"", "grants no token"},
               Case{R"pb(tokens { token: "0123456789abcdef" pools: "*" })pb",
                    "tokens[0]: no name"},
               Case{R"pb(tokens { name: "x" token: "short" pools: "*" })pb",
                    "shorter than 16"},
               Case{R"pb(tokens {
                           name: "x"
                           token: "0123456789 abcdef"
                           pools: "*"
                         })pb",
                    "printable"},
               Case{R"pb(tokens { name: "x" token: "0123456789abcdef" })pb",
                    "no pools"},
               Case{R"pb(tokens {
                           name: "x"
                           token: "0123456789abcdef"
                           pools: ""
                         })pb",
                    "empty pool name"},
               Case{R"pb(tokens {
                           name: "x"
                           token: "0123456789abcdef"
                           pools: "*"
                         }
                         tokens {
                           name: "x"
                           token: "fedcba9876543210"
                           pools: "*"
                         })pb",
                    "tokens[1] (x): the name is used twice"},
               Case{R"pb(tokens {
                           name: "x"
                           token: "0123456789abcdef"
                           pools: "*"
                         }
                         tokens {
                           name: "y"
                           token: "0123456789abcdef"
                           pools: "*"
                         })pb",
                    "tokens[1] (y): the token is used by another entry"},
           }) {
    absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(Parse(c.text));
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.says), std::string::npos)
        << p.status();
  }
}

TEST(AccessPolicy, AuthenticatesBearerTokens) {
  absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(Parse(kFile));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 2);

  absl::StatusOr<const AccessPolicy::Grant*> g =
      p->Authenticate("Bearer engine-0123456789abcd");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->name, "engine");
  g = p->Authenticate("bearer sched-0123456789abcdef");  // scheme: any case
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->name, "scheduler");

  for (const char* header :
       {"", "Bearer", "Bearer ", "Basic c2NoZWQ=", "sched-0123456789abcdef",
        "Bearer sched-0123456789abcde", "Bearer sched-0123456789abcdeF",
        "Bearer engine-0123456789abcd-and-more"}) {
    absl::StatusOr<const AccessPolicy::Grant*> bad = p->Authenticate(header);
    ASSERT_FALSE(bad.ok()) << header;
    EXPECT_EQ(GetReason(bad.status()), FailureReason::kUnauthenticated)
        << header;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnauthenticated);
  }
}

TEST(AccessPolicy, AuthorizesByPool) {
  absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(Parse(kFile));
  ASSERT_TRUE(p.ok()) << p.status();
  const AccessPolicy::Grant* engine =
      *p->Authenticate("Bearer engine-0123456789abcd");
  const AccessPolicy::Grant* sched =
      *p->Authenticate("Bearer sched-0123456789abcdef");

  EXPECT_TRUE(AccessPolicy::Authorize(*engine, "a", "Alloc").ok());
  EXPECT_TRUE(AccessPolicy::Authorize(*engine, "b", "Free").ok());
  absl::Status denied = AccessPolicy::Authorize(*engine, "c", "Alloc");
  EXPECT_EQ(GetReason(denied), FailureReason::kPermissionDenied);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  std::optional<Failure> f = GetFailure(denied);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->metadata["pool"], "c");
  EXPECT_EQ(f->metadata["token_name"], "engine");
  EXPECT_EQ(f->metadata["method"], "Alloc");
  EXPECT_EQ(denied.message().find("engine-0123"), std::string::npos);

  EXPECT_TRUE(AccessPolicy::Authorize(*sched, "anything", "Alloc").ok());
  EXPECT_TRUE(AccessPolicy::AuthorizeCreate(*sched, "new").ok());
  EXPECT_EQ(GetReason(AccessPolicy::AuthorizeCreate(*engine, "a")),
            FailureReason::kPermissionDenied);
}

TEST(AccessPolicy, TheExampleFileIsValid) {
  std::ifstream in("examples/auth_tokens.textproto");
  ASSERT_TRUE(in);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(Parse(text.str()));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 2);
}

}  // namespace
}  // namespace kvbroker
