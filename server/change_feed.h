// ChangeFeed: fans the broker's "pool changed" notifications
// (BrokerOptions::on_change) out to the WatchCapacity streams watching that
// pool.
//
// A subscriber registers for one pool name. Publish(pool) calls
// OnPoolChanged() on every live subscriber of `pool`; Publish("") (the
// broker's "the set of pools changed") calls every subscriber, so that
// watchers of a deleted pool notice. Close() calls OnClose() on every
// subscriber once and refuses later subscriptions; the server calls it when
// it starts draining.
//
// Subscribers are held as weak_ptrs and called with no feed lock held, so a
// subscriber may finish, unsubscribe or be destroyed from inside its own
// callbacks, and a notification racing with its destruction is dropped.
// Subscribers must be cheap and non-blocking in their callbacks: Publish runs
// on the thread that changed the pool (an RPC thread or the broker's worker).
//
// Thread safety: thread-safe.

#ifndef KVBROKER_SERVER_CHANGE_FEED_H_
#define KVBROKER_SERVER_CHANGE_FEED_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvbroker {

class ChangeFeed {
 public:
  class Subscriber {
   public:
    virtual ~Subscriber() = default;
    // The watched pool's generation may have changed (or, for "", the set of
    // pools did).
    virtual void OnPoolChanged() = 0;
    // The feed is closing: finish the stream.
    virtual void OnClose() = 0;
  };

  ChangeFeed() = default;
  ChangeFeed(const ChangeFeed&) = delete;
  ChangeFeed& operator=(const ChangeFeed&) = delete;

  // Registers `subscriber` for changes of `pool`. Returns false (and
  // registers nothing) once the feed is closed.
  [[nodiscard]] bool Subscribe(const std::string& pool,
                               std::weak_ptr<Subscriber> subscriber)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `subscriber`; a no-op if it is not registered.
  void Unsubscribe(const Subscriber* subscriber) ABSL_LOCKS_EXCLUDED(mu_);

  // Notifies the subscribers of `pool`, or every subscriber for "".
  void Publish(const std::string& pool) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls OnClose() on every subscriber and refuses new ones. Idempotent.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Live registrations (tests).
  int subscribers() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  struct Entry {
    std::string pool;
    std::weak_ptr<Subscriber> subscriber;
  };
  // Keyed by the subscriber's address, for Unsubscribe. Publish walks every
  // entry: watchers are few (tens), changes many, and a walk allocates
  // nothing beyond the target list.
  std::map<const Subscriber*, Entry> subscribers_ ABSL_GUARDED_BY(mu_);
  // == subscribers_.size(), readable without mu_: Publish with nobody
  // watching (every Alloc and Free of a pool nobody watches) takes no lock.
  // A subscriber that registers while a Publish skips loses nothing: its
  // first snapshot is read after it registered.
  std::atomic<int> count_{0};
};

}  // namespace kvbroker

#endif  // KVBROKER_SERVER_CHANGE_FEED_H_
