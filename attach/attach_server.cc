// AttachServer: the listener, the accept loop, the holders' blocks across
// sessions (grace, reaping) and what operators see. A session's own work is
// in session.cc.

#include "attach/attach_server.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attach/session.h"
#include "server/log.h"

namespace kvbroker::attach {
namespace {

absl::Status Errno(absl::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(err)));
}

// How long the accept loop waits after accept4 failed for want of fds or
// memory before it tries again.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);

constexpr UnixSocketRole kAttachSocketRole = {SOCK_SEQPACKET,
                                              "--attach_socket"};

struct Listener {
  UniqueFd fd;
  UnixSocketFile file;
};

// A SOCK_SEQPACKET listener reachable at `path`: bound at the staging path
// beside it, then published there by a link (common/unix_socket.h).
absl::StatusOr<Listener> Listen(const std::string& path) {
  if (absl::Status free = CheckUnixSocketPath(path, kAttachSocketRole);
      !free.ok()) {
    return free;
  }
  const std::string staging = StagingPath(path);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, staging.data(), staging.size());  // length checked
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket", errno);
  // The staging name carries this process's pid: whatever lies there was
  // left by an earlier process of the same pid.
  unlink(staging.c_str());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("bind ", staging), errno);
  }
  if (listen(fd.get(), 128) != 0) {
    const int err = errno;
    unlink(staging.c_str());
    return Errno("listen", err);
  }
  absl::StatusOr<UnixSocketFile> file =
      UnixSocketFile::Publish(staging, path, kAttachSocketRole);
  if (!file.ok()) return file.status();
  return Listener{std::move(fd), *std::move(file)};
}

}  // namespace

AttachServer::AttachServer(Broker* broker, AttachServerOptions options,
                           UniqueFd listener, UnixSocketFile socket_file,
                           UniqueFd wake)
    : broker_(broker),
      options_(std::move(options)),
      listener_(std::move(listener)),
      socket_file_(std::move(socket_file)),
      wake_(std::move(wake)) {}

absl::StatusOr<std::unique_ptr<AttachServer>> AttachServer::Start(
    Broker* broker, AttachServerOptions options) {
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Errno("eventfd", errno);
  absl::StatusOr<Listener> listener = Listen(options.socket_path);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<AttachServer> server(
      new AttachServer(broker, std::move(options), std::move(listener->fd),
                       std::move(listener->file), std::move(wake)));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

AttachServer::~AttachServer() { Stop(); }

void AttachServer::AcceptLoop() {
  const int timeout_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.reap_interval)));
  int last_accept_errno = 0;
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int n = poll(fds, 2, timeout_ms);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && (fds[1].revents & POLLIN)) break;
    std::vector<std::unique_ptr<Session>> done;
    {
      absl::MutexLock lock(&mu_);
      done.swap(finished_);
    }
    for (auto& s : done) s->Join();
    done.clear();
    ReapExpired();
    if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) {
      const int err = errno;
      // These concern one connection (or none): the next may be accepted.
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK ||
          err == ECONNABORTED || err == EPROTO) {
        continue;
      }
      // Out of fds or memory, or worse: the connection stays in the
      // backlog, so poll would report it again at once and the loop would
      // spin. Wait a moment (or for Stop), and log the first of a series.
      accept_failures_.fetch_add(1, std::memory_order_relaxed);
      if (err != last_accept_errno) {
        LogLine("attach: cannot accept connections: %s; retrying every %s",
                strerror(err), absl::FormatDuration(kAcceptBackoff));
        last_accept_errno = err;
      }
      pollfd wake = {wake_.get(), POLLIN, 0};
      poll(&wake, 1,
           static_cast<int>(absl::ToInt64Milliseconds(kAcceptBackoff)));
      continue;
    }
    last_accept_errno = 0;
    // An engine that stops reading must not hold a session thread (or Stop)
    // forever: a send that cannot proceed for this long fails instead, and
    // ends the session (outbox.h).
    const int64_t us =
        std::max<int64_t>(1, absl::ToInt64Microseconds(options_.send_timeout));
    const timeval send_timeout = {static_cast<time_t>(us / 1000000),
                                  static_cast<suseconds_t>(us % 1000000)};
    setsockopt(conn.get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout,
               sizeof(send_timeout));
    absl::MutexLock lock(&mu_);
    if (stopping_) break;
    if (!MakeRoomLocked()) {
      LogLine("attach: refusing a connection: %d sessions open",
              options_.max_sessions);
      continue;  // closes conn
    }
    const uint64_t id = next_session_id_++;
    auto session = std::make_unique<Session>(this, id, std::move(conn));
    Session* s = session.get();
    sessions_[id] = std::move(session);
    s->Start();
  }
}

bool AttachServer::MakeRoomLocked() {
  if (static_cast<int>(sessions_.size()) - evicted_ < options_.max_sessions) {
    return true;
  }
  // Connections that never say Hello must not keep engines out: the oldest
  // of them (lowest id) gives its place up. A session says Hello under mu_,
  // so one found without a holder here has none.
  for (auto& [id, session] : sessions_) {
    if (!session->holder().empty() || session->evicted()) continue;
    session->Evict();
    ++evicted_;
    return true;
  }
  return false;
}

void AttachServer::FreeAll(const std::string& name, Holder& h) {
  if (h.pool != nullptr && !h.blocks.empty()) {
    std::vector<BlockId> ids = h.blocks.Sorted();
    FreeRequest free;
    free.block_ids = ids;
    absl::StatusOr<FreeResult> r = h.pool->Free(free);
    if (GetReason(r.status()) == FailureReason::kBlockNotAllocated) {
      FreeStillAllocated(name, h, std::move(ids));
    } else if (!r.ok() &&
               GetReason(r.status()) != FailureReason::kPoolNotFound) {
      // A deleted pool took its blocks with it.
      LogLine("attach: freeing %d blocks of holder %s: %s", ids.size(), name,
              r.status().ToString());
    }
  }
  h.blocks.clear();
  h.free_request_ids.clear();
  h.remembered_frees.clear();
  h.pool = nullptr;
}

void AttachServer::FreeStillAllocated(const std::string& name, const Holder& h,
                                      std::vector<BlockId> ids) {
  const size_t owned = ids.size();
  // A block freed behind the holder's back and handed to another holder
  // since is that holder's now. (One handed out over gRPC cannot be told
  // from the holder's own: it is freed below.) A loop, not remove_if: the
  // lock analysis does not follow mu_ into a lambda.
  size_t kept = 0;
  for (BlockId b : ids) {
    bool theirs = false;
    for (const auto& [other_name, other] : holders_) {
      if (&other != &h && other.pool == h.pool && other.blocks.contains(b)) {
        theirs = true;
        break;
      }
    }
    if (!theirs) ids[kept++] = b;
  }
  ids.resize(kept);
  const size_t taken = owned - ids.size();
  // The pool frees all of a list or none: halves are tried until each
  // refused part is one block, so a few blocks gone cost a few Frees per
  // halving, not one per block.
  int64_t gone = 0;
  std::vector<absl::Span<const BlockId>> todo = {ids};
  while (!todo.empty()) {
    const absl::Span<const BlockId> part = todo.back();
    todo.pop_back();
    FreeRequest free;
    free.block_ids = part;
    absl::StatusOr<FreeResult> r = h.pool->Free(free);
    if (r.ok()) continue;
    if (GetReason(r.status()) != FailureReason::kBlockNotAllocated) {
      if (GetReason(r.status()) != FailureReason::kPoolNotFound) {
        LogLine("attach: freeing blocks of holder %s: %s", name,
                r.status().ToString());
      }
      return;
    }
    if (part.size() == 1) {
      ++gone;
      continue;
    }
    const size_t half = part.size() / 2;
    todo.push_back(part.subspan(half));
    todo.push_back(part.subspan(0, half));
  }
  LogLine(
      "attach: holder %s: %d of its %d blocks were freed elsewhere and %d "
      "are another holder's now; the rest were freed",
      name, gone, owned, taken);
}

std::string AttachServer::Finished(Session* session) {
  absl::MutexLock lock(&mu_);
  std::string outcome = "session ended";
  if (!session->holder().empty()) {
    auto it = holders_.find(session->holder());
    if (it != holders_.end() && it->second.session == session) {
      Holder& h = it->second;
      h.session = nullptr;
      const size_t blocks = h.blocks.size();
      if (session->release_on_end() ||
          session->grace() <= absl::ZeroDuration() || stopping_ ||
          h.blocks.empty()) {
        FreeAll(it->first, h);
        holders_.erase(it);
        outcome = absl::StrCat("holder ", session->holder(), ": ", blocks,
                               " blocks freed");
      } else {
        h.grace_ends = absl::Now() + session->grace();
        h.pid = session->pid();
        h.attached_since = session->attached_since();
        h.grace = session->grace();
        outcome = absl::StrCat("holder ", session->holder(), ": ", blocks,
                               " blocks kept for ",
                               absl::FormatDuration(session->grace()));
      }
    }
  }
  if (session->evicted()) --evicted_;
  auto node = sessions_.extract(session->id());
  if (!node.empty()) finished_.push_back(std::move(node.mapped()));
  return outcome;
}

void AttachServer::ReapExpired() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (auto it = holders_.begin(); it != holders_.end();) {
    Holder& h = it->second;
    if (h.session == nullptr && h.grace_ends <= now) {
      FreeAll(it->first, h);
      it = holders_.erase(it);
    } else {
      ++it;
    }
  }
}

void AttachServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_.store(true, std::memory_order_release);
    // A session thread waiting for its engine reads end of stream and
    // ends, telling the engine why (Session::Run).
    for (auto& [id, session] : sessions_) session->Interrupt();
  }
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    LogLine("attach: cannot wake the sessions: %s", strerror(errno));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  // Session threads end on the interruption and move themselves to
  // finished_.
  while (true) {
    std::vector<std::unique_ptr<Session>> done;
    bool empty;
    {
      absl::MutexLock lock(&mu_);
      done.swap(finished_);
      empty = sessions_.empty();
    }
    for (auto& s : done) s->Join();
    if (empty && done.empty()) break;
    if (done.empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, h] : holders_) FreeAll(name, h);
    holders_.clear();
  }
  socket_file_.Remove();
}

SessionInfo AttachServer::InfoOf(const Session& s) const {
  SessionInfo info;
  info.session_id = s.id();
  info.holder = s.holder();
  info.pid = s.pid();
  info.pool = s.pool_name();
  s.FillPageInfo(&info);
  info.attached_since = s.attached_since();
  info.reattach_grace = s.grace();
  auto it = holders_.find(s.holder());
  if (it != holders_.end() && it->second.session == &s) {
    info.blocks = static_cast<int64_t>(it->second.blocks.size());
  }
  return info;
}

std::vector<SessionInfo> AttachServer::Sessions() const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, s] : sessions_) out.push_back(InfoOf(*s));
  return out;
}

std::vector<SessionInfo> AttachServer::ListSessions() const {
  std::vector<SessionInfo> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) {
      if (s->holder().empty()) continue;  // no Hello yet
      out.push_back(InfoOf(*s));
    }
    for (const auto& [name, h] : holders_) {
      if (h.session != nullptr) continue;
      SessionInfo info;
      info.holder = name;
      info.pid = h.pid;
      info.pool = h.pool != nullptr ? h.pool->name() : "";
      info.blocks = static_cast<int64_t>(h.blocks.size());
      info.attached_since = h.attached_since;
      info.reattach_grace = h.grace;
      info.in_grace = true;
      info.grace_ends = h.grace_ends;
      out.push_back(std::move(info));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SessionInfo& a, const SessionInfo& b) {
              return std::tie(a.pool, a.holder, a.session_id) <
                     std::tie(b.pool, b.holder, b.session_id);
            });
  return out;
}

std::vector<HolderInfo> AttachServer::Holders() const {
  absl::MutexLock lock(&mu_);
  std::vector<HolderInfo> out;
  for (const auto& [name, h] : holders_) {
    HolderInfo info;
    info.holder = name;
    info.pool = h.pool != nullptr ? h.pool->name() : "";
    info.blocks = static_cast<int64_t>(h.blocks.size());
    info.live = h.session != nullptr;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace kvbroker::attach
