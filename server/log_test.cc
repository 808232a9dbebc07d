#include "server/log.h"

#include <string>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

TEST(CallerText, EscapesEverythingThatCouldForgeOrCorruptALine) {
  constexpr char kForged[] =
      "a\nkvbrokerd 2099-01-01T00:00:00.000Z forged\0z\"\\";
  EXPECT_EQ(CallerText(std::string(kForged, sizeof(kForged) - 1)),
            "a\\nkvbrokerd 2099-01-01T00:00:00.000Z forged\\x00z\\\"\\\\");
  EXPECT_EQ(CallerText("caf\xc3\xa9\t\r"), "caf\\xc3\\xa9\\t\\r");
  EXPECT_EQ(CallerText("llama-70b_v1.2"), "llama-70b_v1.2");
}

TEST(CallerText, CutsLongTextAndSaysHowMuch) {
  const std::string text = CallerText(std::string(1 << 20, 'x'));
  EXPECT_EQ(text, std::string(kMaxLoggedCallerBytes, 'x') + "...(" +
                      std::to_string((1 << 20) - kMaxLoggedCallerBytes) +
                      " more bytes)");
}

TEST(LogLimiter, AdmitsABurstPerKeyThenCountsWhatItDropped) {
  LogLimiter limiter(3, absl::Seconds(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t suppressed = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Admit("Capacity UNAUTHENTICATED",
                              t0 + absl::Milliseconds(i), &suppressed));
    EXPECT_EQ(suppressed, 0);
  }
  for (int i = 0; i < 7; ++i) {
    EXPECT_FALSE(limiter.Admit("Capacity UNAUTHENTICATED",
                               t0 + absl::Milliseconds(10 + i), &suppressed));
  }
  // Another key has its own budget.
  EXPECT_TRUE(limiter.Admit("Alloc POOL_EXHAUSTED", t0, &suppressed));
  EXPECT_EQ(suppressed, 0);
  // A new spell: admitted, and it reports the 7 dropped lines once.
  EXPECT_TRUE(limiter.Admit("Capacity UNAUTHENTICATED", t0 + absl::Seconds(1),
                            &suppressed));
  EXPECT_EQ(suppressed, 7);
  EXPECT_TRUE(limiter.Admit("Capacity UNAUTHENTICATED",
                            t0 + absl::Seconds(1) + absl::Milliseconds(1),
                            &suppressed));
  EXPECT_EQ(suppressed, 0);
}

}  // namespace
}  // namespace kvbroker
