// Fanout: runs n independent calls in parallel on a fixed set of worker
// threads and waits for all of them. The filter asks every candidate
// node's broker at once through it.
//
// The calling thread works too: it takes queued calls like any worker, so
// a fan-out of one runs inline and no call waits for a free thread while
// the caller idles. Workers are created once (no thread start per filter).
//
// Thread safety: Run may be called from several threads at once; their
// calls share the workers.

#ifndef KVBROKER_EXTENDER_FANOUT_H_
#define KVBROKER_EXTENDER_FANOUT_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvbroker {
namespace extender {

class Fanout {
 public:
  // REQUIRES: threads >= 0 (0: everything runs on the caller).
  explicit Fanout(int threads);
  // Finishes the queued calls, then joins the workers.
  ~Fanout();
  Fanout(const Fanout&) = delete;
  Fanout& operator=(const Fanout&) = delete;

  // Calls fn(0) ... fn(n - 1), each exactly once, in parallel; returns when
  // all have returned.
  void Run(size_t n, const std::function<void(size_t)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Batch;
  struct Item {
    Batch* batch;
    size_t index;
  };

  void Work() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }
  static void Execute(const Item& item);

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace extender
}  // namespace kvbroker

#endif  // KVBROKER_EXTENDER_FANOUT_H_
