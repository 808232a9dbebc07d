// PageAnnouncer: the pool's mapped-page hook. Contract in page_announcer.h.

#include "allocator/page_announcer.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/failure.h"

namespace kvbroker {

PageAnnouncer::PageAnnouncer(const Geometry* geometry, BundleMapper* mapper,
                             int64_t max_revocation_pages)
    : geometry_(geometry),
      mapper_(mapper),
      announced_(geometry->page_count().value(), false),
      max_revocation_pages_(std::max<int64_t>(1, max_revocation_pages)) {}

absl::Status PageAnnouncer::ExportLocked(PageId p, MappedPage* out) {
  out->page = p;
  out->fds.clear();
  for (int i = 0; i < geometry_->device_count(); ++i) {
    absl::StatusOr<int> fd = mapper_->Export(p, i);
    if (!fd.ok()) return fd.status();
    out->fds.push_back(*fd);
  }
  return absl::OkStatus();
}

void PageAnnouncer::Announce(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&mu_);
  std::vector<MappedPage> news;
  std::vector<PageId> not_passed;
  for (PageId p : pages) {
    announced_[p] = true;
    ++announced_count_;
    if (listeners_.empty()) continue;
    MappedPage m;
    if (absl::Status s = ExportLocked(p, &m); !s.ok()) {
      ++export_failures_;
      std::fprintf(stderr, "kvbroker: pool %s: cannot export page %ld: %s\n",
                   geometry_->config().name.c_str(), static_cast<long>(p),
                   s.ToString().c_str());
      not_passed.push_back(p);
      continue;
    }
    news.push_back(std::move(m));
  }
  for (PageListener* l : listeners_) {
    if (!news.empty()) l->OnPagesMapped(news);
    if (!not_passed.empty()) l->OnPagesNotPassed(not_passed);
  }
}

void PageAnnouncer::Withdraw(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&mu_);
  for (PageId p : pages) {
    if (!announced_[p]) continue;
    announced_[p] = false;
    --announced_count_;
  }
}

absl::Status PageAnnouncer::AddListener(
    PageListener* listener,
    absl::FunctionRef<void(absl::Span<const MappedPage>)> snapshot) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return MakeFailure(FailureReason::kPoolNotFound,
                       "the pool is being deleted");
  }
  std::vector<MappedPage> pages;
  pages.reserve(announced_count_);
  for (PageId p = 0; p < static_cast<PageId>(announced_.size()); ++p) {
    if (!announced_[p]) continue;
    MappedPage m;
    if (absl::Status s = ExportLocked(p, &m); !s.ok()) return s;
    pages.push_back(std::move(m));
  }
  listeners_.push_back(listener);
  snapshot(pages);
  return absl::OkStatus();
}

std::vector<PageId> PageAnnouncer::Revoke(absl::Span<const PageId> pages,
                                          absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  std::vector<PageId> now, known;
  for (PageId p : pages) {
    if (announced_[p]) {
      announced_[p] = false;
      --announced_count_;
      if (!listeners_.empty()) {
        known.push_back(p);
        continue;
      }
    }
    now.push_back(p);
  }
  for (size_t first = 0; first < known.size();
       first += static_cast<size_t>(max_revocation_pages_)) {
    const size_t end = std::min(
        known.size(), first + static_cast<size_t>(max_revocation_pages_));
    std::vector<PageId> part(known.begin() + first, known.begin() + end);
    const uint64_t id = next_revocation_id_++;
    for (PageListener* l : listeners_) l->OnPagesRevoked(id, part, deadline);
    revocations_[id] = Revocation{std::move(part), listeners_, deadline};
  }
  return now;
}

absl::StatusOr<std::vector<PageId>> PageAnnouncer::Ack(PageListener* listener,
                                                       uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = revocations_.find(id);
  if (it == revocations_.end()) {
    return absl::NotFoundError(
        absl::StrCat("revocation ", id, " is not pending"));
  }
  std::vector<PageListener*>& waiting = it->second.waiting;
  auto w = std::find(waiting.begin(), waiting.end(), listener);
  if (w == waiting.end()) {
    return absl::NotFoundError(
        absl::StrCat("revocation ", id, " is not pending for this listener"));
  }
  waiting.erase(w);
  if (!waiting.empty()) return std::vector<PageId>{};
  std::vector<PageId> done = std::move(it->second.pages);
  revocations_.erase(it);
  return done;
}

void PageAnnouncer::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (PageListener* l : listeners_) l->OnPoolClosed();
}

int64_t PageAnnouncer::revocations_in_time(const PageListener* listener,
                                           absl::Time now) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, r] : revocations_) {
    if (r.deadline >= now) {
      n += std::count(r.waiting.begin(), r.waiting.end(), listener);
    }
  }
  return n;
}

int64_t PageAnnouncer::pending_revocations(const PageListener* listener) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, r] : revocations_) {
    n += std::count(r.waiting.begin(), r.waiting.end(), listener);
  }
  return n;
}

int64_t PageAnnouncer::overdue_pages(const PageListener* listener,
                                     absl::Time now) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, r] : revocations_) {
    if (r.deadline < now &&
        std::count(r.waiting.begin(), r.waiting.end(), listener) > 0) {
      n += static_cast<int64_t>(r.pages.size());
    }
  }
  return n;
}

int64_t PageAnnouncer::revocations() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(revocations_.size());
}

std::vector<PageId> PageAnnouncer::RemoveListener(PageListener* listener) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener),
                   listeners_.end());
  std::vector<PageId> done;
  for (auto it = revocations_.begin(); it != revocations_.end();) {
    std::vector<PageListener*>& waiting = it->second.waiting;
    waiting.erase(std::remove(waiting.begin(), waiting.end(), listener),
                  waiting.end());
    if (waiting.empty()) {
      done.insert(done.end(), it->second.pages.begin(), it->second.pages.end());
      revocations_.erase(it++);
    } else {
      ++it;
    }
  }
  return done;
}

int64_t PageAnnouncer::listeners() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(listeners_.size());
}

int64_t PageAnnouncer::announced_pages() const {
  absl::MutexLock lock(&mu_);
  return announced_count_;
}

int64_t PageAnnouncer::export_failures() const {
  absl::MutexLock lock(&mu_);
  return export_failures_;
}

}  // namespace kvbroker
