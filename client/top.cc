#include "client/top.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cli_text.h"
#include "common/byte_size.h"

namespace kvbroker {
namespace cli {
namespace {

// Puts the terminal in raw mode on the alternate screen, cursor hidden, and
// restores it on destruction.
class Terminal {
 public:
  Terminal() {
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_iflag &= ~(ICRNL | IXON);
      raw.c_lflag &= ~(ICANON | ECHO | ISIG | IEXTEN);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      raw_ = tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0;
    }
    Write("\x1b[?1049h\x1b[?25l");
  }
  ~Terminal() {
    Write("\x1b[0m\x1b[?25h\x1b[?1049l");
    if (raw_) tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_);
  }

  static void Write(const std::string& s) {
    size_t done = 0;
    while (done < s.size()) {
      ssize_t n = write(STDOUT_FILENO, s.data() + done, s.size() - done);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  static std::pair<int, int> Size() {
    winsize ws{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
      return {ws.ws_row, ws.ws_col};
    }
    return {24, 80};
  }

 private:
  termios saved_{};
  bool raw_ = false;
};

// What top shows, fed by a WatchCapacity stream per pool (up to
// max_streams of them) and a periodic ListPools.
class TopModel {
 public:
  TopModel(KvBrokerClient* client, absl::Duration interval, int max_streams)
      : client_(client), interval_(interval), max_streams_(max_streams) {}

  void Start() {
    poller_ = std::thread([this] { PollLoop(); });
  }

  // Cancels every stream and joins every thread.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& [name, watch] : watches_) watch->Cancel();
    }
    stop_.Notify();
    poller_.join();
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  // Renders the screen (rows x cols), skipping the first `scroll` pools.
  std::string Render(int rows, int cols, int* scroll) {
    absl::MutexLock lock(&mu_);
    dirty_ = false;
    std::vector<std::string> lines;
    lines.push_back(absl::StrCat(
        "\x1b[1mkvbroker top\x1b[0m  ", Printable(client_->options().target),
        "  ", pools_.size(), " pools  ",
        absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()),
        "    q quit  j/k scroll"));
    lines.push_back(server_error_.empty()
                        ? PageBarLegend()
                        : absl::StrCat("\x1b[31mserver: ",
                                       Printable(server_error_), "\x1b[0m"));
    lines.push_back("");
    const int per_pool = 6;
    const int max_scroll =
        std::max<int>(0, static_cast<int>(pools_.size()) - 1);
    *scroll = std::clamp(*scroll, 0, max_scroll);
    int index = 0;
    for (const auto& [name, view] : pools_) {
      if (index++ < *scroll) continue;
      if (static_cast<int>(lines.size()) + per_pool > rows) break;
      auto engines = engines_.find(name);
      RenderPool(name, view,
                 engines == engines_.end() ? EnginesView{} : engines->second,
                 engines_error_, cols, &lines);
    }
    if (pools_.empty()) lines.push_back("(no pools)");
    if (static_cast<int>(lines.size()) > rows) lines.resize(rows);
    // No newline after the last line, so that a full screen never scrolls.
    std::string screen = "\x1b[H";
    for (size_t i = 0; i < lines.size(); ++i) {
      absl::StrAppend(&screen, i == 0 ? "" : "\r\n", Clip(lines[i], cols),
                      "\x1b[K");
    }
    absl::StrAppend(&screen, "\x1b[J");
    return screen;
  }

  bool dirty() {
    absl::MutexLock lock(&mu_);
    return dirty_;
  }

 private:
  struct PoolView {
    v1::PoolInfo info;
    v1::CapacitySnapshot snapshot;
    // A stream is delivering `snapshot`; otherwise each ListPools does.
    bool live = false;
    std::string stream_error;
  };
  // The engines attached to one pool (ListSessions).
  struct EnginesView {
    int64_t sessions = 0;
    int64_t in_grace = 0;
    int64_t blocks = 0;
    int64_t mapped_pages = 0;
    int64_t pending_revocations = 0;
    int64_t quarantined_pages = 0;
  };

  // `line` cut to `cols` visible characters (escape sequences don't count).
  // Every string from the daemon in it went through Printable, so the only
  // escape sequences are top's own colours.
  static std::string Clip(const std::string& line, int cols) {
    std::string out;
    int visible = 0;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\x1b') {
        size_t end = line.find('m', i);
        if (end == std::string::npos) break;
        out.append(line, i, end - i + 1);
        i = end;
        continue;
      }
      if (visible >= cols) continue;
      out.push_back(line[i]);
      ++visible;
    }
    return out + "\x1b[0m";
  }

  static void RenderPool(const std::string& name, const PoolView& view,
                         const EnginesView& engines,
                         const std::string& engines_error, int cols,
                         std::vector<std::string>* lines) {
    const v1::PoolSpec& spec = view.info.spec();
    const v1::CapacitySnapshot& c = view.snapshot;
    std::string health = c.healthy() ? "\x1b[32mhealthy\x1b[0m"
                                     : absl::StrCat("\x1b[31;1mFAILED\x1b[0m ",
                                                    Printable(c.failure()));
    if (!view.stream_error.empty()) {
      absl::StrAppend(&health, "  \x1b[33m(polled, the stream failed: ",
                      Printable(view.stream_error), ")\x1b[0m");
    } else if (!view.live) {
      absl::StrAppend(&health, "  (polled)");
    }
    lines->push_back(absl::StrCat(
        "\x1b[1m", Printable(name), "\x1b[0m  page ",
        FormatBytes(spec.page_size()), "  block ",
        FormatBytes(spec.block_bytes()), "  ", spec.max_blocks(),
        " block ids  ", view.info.page_count(), " pages  devices ",
        DevicesText(spec), "  gen ", c.generation(), "  ", health));
    const int bar_width = std::clamp(cols - 90, 10, 60);
    lines->push_back(absl::StrCat("  pages   ", PageBar(c.pages(), bar_width),
                                  "  ", PageCountsText(c.pages())));
    lines->push_back(absl::StrCat(
        "  blocks  available ", c.available_blocks(), "  allocated ",
        c.allocated_blocks(), "  reserved ", c.reserved_blocks(), "  total ",
        c.total_blocks(), "  (", c.available_tokens(), " tokens available)"));
    std::string limit = LimitText(c.limit());
    if (c.limit().state() == v1::LIMIT_STATE_DEFERRED) {
      limit = absl::StrCat("\x1b[33m", limit, "\x1b[0m");
    }
    lines->push_back(absl::StrCat(
        "  memory  mapped ", FormatBytes(c.mapped_bytes()), "  virtual ",
        FormatBytes(c.virtual_bytes()), "  limit ", limit));
    if (!engines_error.empty()) {
      lines->push_back(absl::StrCat("  engines \x1b[33m",
                                    Printable(engines_error), "\x1b[0m"));
    } else {
      std::string quarantined = absl::StrCat(engines.quarantined_pages);
      if (engines.quarantined_pages > 0) {
        quarantined = absl::StrCat("\x1b[31m", quarantined, "\x1b[0m");
      }
      lines->push_back(absl::StrCat(
          "  engines ", engines.sessions, " sessions  ", engines.in_grace,
          " in grace  blocks ", engines.blocks, "  mapped pages ",
          engines.mapped_pages, "  revoking ", engines.pending_revocations,
          "  quarantined ", quarantined));
    }
    lines->push_back("");
  }

  void PollLoop() {
    do {
      const CallOptions call = CallOptions::WithTimeout(
          std::min(client_->options().timeout, interval_));
      absl::StatusOr<std::vector<v1::PoolInfo>> pools =
          client_->ListPools(call);
      absl::StatusOr<std::vector<v1::EngineSession>> sessions =
          client_->ListSessions("", call);
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      dirty_ = true;
      engines_.clear();
      engines_error_.clear();
      if (sessions.ok()) {
        for (const v1::EngineSession& s : *sessions) {
          EnginesView& e = engines_[s.pool()];
          ++(s.in_grace() ? e.in_grace : e.sessions);
          e.blocks += s.blocks();
          e.mapped_pages += s.mapped_pages();
          e.pending_revocations += s.pending_revocations();
          e.quarantined_pages += s.quarantined_pages();
        }
      } else {
        engines_error_ = GetKvbError(sessions.status())->ToString();
      }
      if (!pools.ok()) {
        server_error_ = GetKvbError(pools.status())->ToString();
        continue;
      }
      server_error_.clear();
      // A pool without a stream is gone when the list no longer names it
      // (a stream tells of its own pool's end).
      std::set<std::string> listed;
      for (const v1::PoolInfo& info : *pools) listed.insert(info.spec().name());
      for (auto it = pools_.begin(); it != pools_.end();) {
        if (!listed.count(it->first) && !watched_.count(it->first)) {
          it = pools_.erase(it);
          dirty_ = true;
        } else {
          ++it;
        }
      }
      for (v1::PoolInfo& info : *pools) {
        const std::string name = info.spec().name();
        PoolView& view = pools_[name];
        if (!view.live) {
          view.snapshot = info.capacity();
          dirty_ = true;
        }
        if (!watched_.count(name) &&
            static_cast<int>(watched_.size()) < max_streams_) {
          watched_.insert(name);
          threads_.emplace_back([this, name] { WatchLoop(name); });
        }
        view.info = std::move(info);
      }
    } while (!stop_.WaitForNotificationWithTimeout(interval_));
  }

  void WatchLoop(const std::string& pool) {
    while (true) {
      std::shared_ptr<CapacityWatch> watch = client_->WatchCapacity(pool);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        watches_[pool] = watch;
      }
      v1::CapacitySnapshot snapshot;
      while (watch->Next(&snapshot)) {
        absl::MutexLock lock(&mu_);
        PoolView& view = pools_[pool];
        view.snapshot = std::move(snapshot);
        view.live = true;
        view.stream_error.clear();
        dirty_ = true;
      }
      const absl::Status end = watch->Finish();
      {
        absl::MutexLock lock(&mu_);
        watches_.erase(pool);
        if (stopping_) return;
        dirty_ = true;
        if (GetKvbReason(end) == v1::POOL_NOT_FOUND) {
          pools_.erase(pool);
          watched_.erase(pool);
          return;
        }
        pools_[pool].live = false;
        pools_[pool].stream_error =
            end.ok() ? "stream closed" : GetKvbError(end)->ToString();
      }
      if (stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) return;
    }
  }

  KvBrokerClient* const client_;
  const absl::Duration interval_;
  const int max_streams_;
  absl::Notification stop_;
  std::thread poller_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  std::string server_error_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PoolView> pools_ ABSL_GUARDED_BY(mu_);
  // Per pool, from the last ListSessions; engines_error_ when it failed.
  std::map<std::string, EnginesView> engines_ ABSL_GUARDED_BY(mu_);
  std::string engines_error_ ABSL_GUARDED_BY(mu_);
  // Pools with a WatchLoop thread.
  std::set<std::string> watched_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<CapacityWatch>> watches_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int RunTop(KvBrokerClient& client, absl::Duration interval, int max_streams,
           const std::atomic<bool>& interrupted) {
  TopModel model(&client, interval, max_streams);
  model.Start();
  {
    Terminal terminal;
    int scroll = 0;
    std::pair<int, int> size{0, 0};
    absl::Time next_draw = absl::InfinitePast();
    bool quit = false;
    while (!quit && !interrupted) {
      pollfd pfd{STDIN_FILENO, POLLIN, 0};
      if (poll(&pfd, 1, 100) > 0 && (pfd.revents & POLLIN)) {
        char keys[64];
        const ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));
        if (n == 0) quit = true;  // stdin closed
        for (ssize_t i = 0; i < n; ++i) {
          switch (keys[i]) {
            case 'q':
            case 'Q':
            case 3:  // Ctrl-C (ISIG is off in raw mode)
              quit = true;
              break;
            case 'j':
              ++scroll;
              next_draw = absl::InfinitePast();
              break;
            case 'k':
              --scroll;
              next_draw = absl::InfinitePast();
              break;
            default: break;
          }
        }
      } else if (pfd.revents & (POLLHUP | POLLERR)) {
        quit = true;
      }
      const std::pair<int, int> now_size = Terminal::Size();
      const absl::Time now = absl::Now();
      if (now_size != size || model.dirty() || now >= next_draw) {
        size = now_size;
        Terminal::Write(model.Render(size.first, size.second, &scroll));
        next_draw = now + absl::Seconds(1);
      }
    }
  }
  model.Stop();
  return kExitOk;
}

}  // namespace cli
}  // namespace kvbroker
