// ChangeFeed: takes capacity snapshots off the hot path. The broker's
// on_change hook (BrokerOptions::on_change) calls Publish(pool) on the thread
// that changed the pool; Publish only raises one flag (an atomic exchange;
// the first change after a pass also wakes the notifier). One notifier
// thread then finds the pools whose generation differs from what their
// watchers were last offered, builds each such pool's snapshot once per pass
// and hands the same immutable message to every WatchCapacity stream
// (Subscriber) of that pool.
//
// Coalescing: every change of a pool between two notifier passes costs one
// snapshot per distinct page-list length asked for by its watchers (watchers
// asking for 0 and for 16 pages cost two; a hundred asking for 0 cost one).
// A subscriber is offered only snapshots whose generation differs from the
// last one it was offered.
//
// Pacing: a pass starts at least `min_interval` after the previous one
// started, and at least offered / `max_offers_per_second` seconds after it,
// where offered is the number of snapshots the previous pass handed out.
// Writing a snapshot to a stream costs far more than building it, so the
// second bound caps the CPU that watchers take from Alloc and Free at a
// fixed rate of stream writes however many watchers there are; the price is
// latency: with 400 watchers of a busy pool and the default budget, each gets
// about 2.5 snapshots a second (its view at most about 400 ms old) instead of
// 50; with 20 or fewer watchers the 20 ms floor is what applies.
// A subscription's first snapshot does not count against the budget (each
// subscription has one, and a caller holds at most max_watches_per_caller):
// a burst of new watchers does not push the next pass back. Nor does it
// wait out the pause after a pass: a subscription that arrives then wakes
// the notifier, which offers first snapshots only (NotifyFirsts) and goes
// back to its pause.
//
// Bounds (documented in the README, flags of kvbrokerd): a caller may hold at
// most `max_watches_per_caller` subscriptions; the next one is refused with
// INVALID_ARGUMENT (field "pool"). The page-list length is bounded by the
// service before subscribing (kvbroker_service.h).
//
// A caller is whoever the service says it is: the bearer token's entry name
// when access control is on, else the peer's address without its port (every
// client of one host, or of the Unix socket, is one caller).
//
// Publish("") (the broker's "the set of pools changed") makes the next pass
// read every watched pool, so that watchers of a deleted pool notice: a pool
// that can no longer be read ends its subscribers with its failure
// (POOL_NOT_FOUND).
// Close() calls OnClose() on every subscriber once, stops the notifier and
// refuses later subscriptions; the server calls it when it starts draining.
//
// Subscribers are held as weak_ptrs and called with no feed lock held, so a
// subscriber may finish, unsubscribe or be destroyed from inside its own
// callbacks, and a notification racing with its destruction is dropped.
// Callbacks run on the notifier thread (OnClose: on Close's caller) and must
// not block.
//
// Thread safety: thread-safe.

#ifndef KVBROKER_SERVER_CHANGE_FEED_H_
#define KVBROKER_SERVER_CHANGE_FEED_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/page_pool.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"

namespace kvbroker {

class ChangeFeed {
 public:
  // Built once per pool, length and pass; shared by every watcher.
  using Snapshot = std::shared_ptr<const v1::WatchCapacityResponse>;

  class Subscriber {
   public:
    virtual ~Subscriber() = default;
    // A snapshot of the watched pool with a generation not offered before.
    virtual void OnSnapshot(Snapshot snapshot) = 0;
    // The pool cannot be read any more (deleted, or failed): `failure`.
    virtual void OnEnd(const absl::Status& failure) = 0;
    // The feed is closing: finish the stream.
    virtual void OnClose() = 0;
  };

  struct Watch {
    std::shared_ptr<PagePool> pool;
    // CapacityQuery::max_pages, already bounded by the service.
    int64_t max_pages = 0;
    // See the file comment.
    std::string caller;
  };

  struct Options {
    int max_watches_per_caller = 1024;
    absl::Duration min_interval = absl::Milliseconds(20);
    double max_offers_per_second = 1000;
    // False: no notifier thread; the owner calls NotifyPass() (tests).
    bool start_notifier = true;
  };

  ChangeFeed() : ChangeFeed(Options()) {}
  explicit ChangeFeed(Options options);
  // Closes and joins the notifier.
  ~ChangeFeed();
  ChangeFeed(const ChangeFeed&) = delete;
  ChangeFeed& operator=(const ChangeFeed&) = delete;

  // Registers `subscriber` for snapshots of `watch.pool`; its first
  // snapshot comes from the next pass. Errors:
  // UNAVAILABLE once the feed is closed; INVALID_ARGUMENT (field "pool") when
  // `watch.caller` already holds max_watches_per_caller subscriptions;
  // INVALID_ARGUMENT when `subscriber` is gone.
  absl::Status Subscribe(Watch watch, std::weak_ptr<Subscriber> subscriber)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `subscriber`; a no-op if it is not registered.
  void Unsubscribe(const Subscriber* subscriber) ABSL_LOCKS_EXCLUDED(mu_);

  // Tells the notifier that `pool` changed ("": the set of pools changed).
  // Takes no lock when nobody watches anything, nor when a change since the
  // last pass already did.
  void Publish(const std::string& pool) ABSL_LOCKS_EXCLUDED(mu_);

  struct PassStats {
    int built = 0;          // snapshots built (pool incarnations x lengths)
    int offered = 0;        // OnSnapshot calls
    int first_offered = 0;  // of those, a subscription's first (not paced)
  };
  // One notifier pass over the pools whose generation moved since their
  // watchers' last snapshot (every pool after Publish("")): builds their
  // snapshots and offers them. The notifier thread runs it; with
  // start_notifier == false, the owner does.
  PassStats NotifyPass() ABSL_LOCKS_EXCLUDED(mu_, pass_mu_);
  // Offers the current snapshot to every subscription that was never
  // offered one, leaving the others for the next NotifyPass. The
  // notifier runs it when a subscription arrives while it paces itself.
  PassStats NotifyFirsts() ABSL_LOCKS_EXCLUDED(mu_, pass_mu_);

  // Calls OnClose() on every subscriber, refuses new ones and returns once
  // no pass is running (no pool is read after it returns). Idempotent. Not
  // to be called from a subscriber's callback.
  void Close() ABSL_LOCKS_EXCLUDED(mu_, pass_mu_);

  // Live registrations, in all and of one caller (tests).
  int subscribers() const ABSL_LOCKS_EXCLUDED(mu_);
  int subscribers_of(const std::string& caller) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    Watch watch;
    std::weak_ptr<Subscriber> subscriber;
    // The generation last offered; written only by passes (which pass_mu_
    // serializes), at the end of the pass that offered it.
    std::optional<uint64_t> offered;
  };
  struct Watched {
    std::map<const Subscriber*, Entry> entries;
  };

  void NotifierLoop() ABSL_LOCKS_EXCLUDED(mu_);
  PassStats Pass(bool firsts_only) ABSL_LOCKS_EXCLUDED(mu_, pass_mu_);
  // Raises changed_ and wakes an idle notifier when it was down.
  void MarkChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Watchers by pool name; a name is present while it has a watcher.
  std::map<std::string, Watched> pools_ ABSL_GUARDED_BY(mu_);
  // Each subscriber's pool name, for Unsubscribe.
  std::map<const Subscriber*, std::string> names_ ABSL_GUARDED_BY(mu_);
  // Subscriptions per caller; a caller is present while it has one.
  std::map<std::string, int> callers_ ABSL_GUARDED_BY(mu_);
  // A pool changed (or a subscription arrived) since the last full pass
  // took the flag; set without mu_ by Publish, which takes mu_ only when it
  // raises the flag (to wake the notifier), so that at most one Publish per
  // pass locks. A pass lowers it (acquiring: a pool change published before
  // the Publish that raised it is visible to the pass) before it reads the
  // pools' generations.
  std::atomic<bool> changed_{false};
  // The next full pass reads every pool, not only those whose generation
  // moved (Publish("")).
  bool every_pool_ ABSL_GUARDED_BY(mu_) = false;
  // The notifier sleeps on wake_, never in a Mutex::Await: a waiter with a
  // condition on mu_ sends every Unlock of mu_ down absl::Mutex's slow path
  // to evaluate it. A Publish signals only when it raises changed_ while
  // the notifier waits for work (notifier_idle_), at most once per pass;
  // the pacing wait after a pass is woken by Close and Subscribe.
  absl::CondVar wake_;
  bool notifier_idle_ ABSL_GUARDED_BY(mu_) = false;
  // The notifier waits out its pause; a Subscribe wakes it then.
  bool notifier_pacing_ ABSL_GUARDED_BY(mu_) = false;
  // A subscription arrived since the last pass of first snapshots.
  bool unoffered_ ABSL_GUARDED_BY(mu_) = false;
  // == names_.size(), readable without mu_: Publish with nobody watching
  // (every Alloc and Free while there is no watcher) takes no lock. A
  // subscriber that registers while a Publish skips loses nothing: its
  // registration raises changed_ itself.
  std::atomic<int> count_{0};

  // Serializes passes (the thread's and the owner's).
  absl::Mutex pass_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  std::thread notifier_;
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_CHANGE_FEED_H_
