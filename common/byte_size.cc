#include "common/byte_size.h"

#include <cctype>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace kvbroker {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

struct Unit {
  absl::string_view name;  // lower case
  int64_t bytes;
};

constexpr int64_t kKi = int64_t{1} << 10;
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"k", kKi},
    {"ki", kKi},
    {"kib", kKi},
    {"kb", kKi},
    {"m", kKi* kKi},
    {"mi", kKi* kKi},
    {"mib", kKi* kKi},
    {"mb", kKi* kKi},
    {"g", kKi* kKi* kKi},
    {"gi", kKi* kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"gb", kKi* kKi* kKi},
    {"t", kKi* kKi* kKi* kKi},
    {"ti", kKi* kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"tb", kKi* kKi* kKi* kKi},
    {"p", kKi* kKi* kKi* kKi* kKi},
    {"pi", kKi* kKi* kKi* kKi* kKi},
    {"pib", kKi* kKi* kKi* kKi* kKi},
    {"pb", kKi* kKi* kKi* kKi* kKi},
};

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad size \"", text, "\": ", why));
}

}  // namespace

absl::StatusOr<int64_t> ParseSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  int64_t whole = 0;
  bool digits = false;
  for (; i < s.size() && absl::ascii_isdigit(s[i]); ++i) {
    digits = true;
    const int d = s[i] - '0';
    if (whole > (kMax - d) / 10) return Bad(text, "too large");
    whole = whole * 10 + d;
  }
  // The fraction as num / den, at most 18 digits.
  int64_t num = 0, den = 1;
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && absl::ascii_isdigit(s[i]); ++i) {
      digits = true;
      if (den >= int64_t{100000000000000000}) return Bad(text, "too precise");
      num = num * 10 + (s[i] - '0');
      den *= 10;
    }
  }
  if (!digits) return Bad(text, "expected a number");
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(i)));
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    if (whole > kMax / u.bytes) return Bad(text, "too large");
    int64_t bytes = whole * u.bytes;
    if (num != 0) {
      // num / den * u.bytes, exactly: u.bytes and den share only 2s and 5s,
      // so reduce before multiplying.
      int64_t n = num, d = den, m = u.bytes;
      for (int64_t p : {2, 5}) {
        while (d % p == 0 && m % p == 0) {
          d /= p;
          m /= p;
        }
      }
      if (n > kMax / m) return Bad(text, "too large");
      if ((n * m) % d != 0) return Bad(text, "not a whole number of bytes");
      const int64_t frac = n * m / d;
      if (bytes > kMax - frac) return Bad(text, "too large");
      bytes += frac;
    }
    return bytes;
  }
  return Bad(text, absl::StrCat("unknown unit \"", unit,
                                "\" (use B, K/KB/KiB, M/MB/MiB, G/GB/GiB, "
                                "T/TB/TiB or P/PB/PiB)"));
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) {
    if (bytes == std::numeric_limits<int64_t>::min()) return "-8EiB";
    return absl::StrCat("-", FormatBytes(-bytes));
  }
  static constexpr std::pair<int64_t, absl::string_view> kBinary[] = {
      {int64_t{1} << 50, "PiB"}, {int64_t{1} << 40, "TiB"},
      {int64_t{1} << 30, "GiB"}, {int64_t{1} << 20, "MiB"},
      {int64_t{1} << 10, "KiB"},
  };
  if (bytes == 0) return "0B";
  for (const auto& [size, name] : kBinary) {
    if (bytes % size == 0) return absl::StrCat(bytes / size, name);
  }
  for (const auto& [size, name] : kBinary) {
    if (bytes >= size) {
      return absl::StrFormat("%.2f%s", static_cast<double>(bytes) / size, name);
    }
  }
  return absl::StrCat(bytes, "B");
}

}  // namespace kvbroker
