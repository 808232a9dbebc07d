// Log hygiene: escaping caller text and limiting repeated lines.

#include "server/log.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvbroker {

std::string CallerText(absl::string_view text) {
  const absl::string_view kept = text.substr(0, kMaxLoggedCallerBytes);
  std::string out = absl::CHexEscape(kept);
  if (kept.size() < text.size()) {
    absl::StrAppend(&out, "...(", text.size() - kept.size(), " more bytes)");
  }
  return out;
}

bool LogLimiter::Admit(absl::string_view key, absl::Time now,
                       int64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  Spell& spell = spells_[key];
  *suppressed = 0;
  if (spell.admitted == 0 || now - spell.start >= window_) {
    *suppressed = spell.dropped;
    spell = Spell{now, 1, 0};
    return true;
  }
  if (spell.admitted < burst_) {
    ++spell.admitted;
    return true;
  }
  ++spell.dropped;
  return false;
}

LogLimiter& FailureLogLimiter() {
  static LogLimiter* const limiter = new LogLimiter(20, absl::Seconds(1));
  return *limiter;
}

}  // namespace kvbroker
