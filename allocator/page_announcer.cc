// PageAnnouncer: the pool's mapped-page hook. Contract in page_announcer.h.

#include "allocator/page_announcer.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace kvbroker {

PageAnnouncer::PageAnnouncer(const Geometry* geometry, BundleMapper* mapper)
    : geometry_(geometry),
      mapper_(mapper),
      announced_(geometry->page_count().value(), false) {}

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
      continue;
    }
    news.push_back(std::move(m));
  }
  if (news.empty()) return;
  for (PageListener* l : listeners_) l->OnPagesMapped(news);
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

void PageAnnouncer::RemoveListener(PageListener* listener) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener),
                   listeners_.end());
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
