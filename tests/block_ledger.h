// BlockLedger: which client holds each block id, for tests where several
// clients allocate and free on one pool at once. A block handed to a
// client while another holds it fails the test.

#ifndef KVBROKER_TESTS_BLOCK_LEDGER_H_
#define KVBROKER_TESTS_BLOCK_LEDGER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace testing {

class BlockLedger {
 public:
  // Records `ids` as held by `client`; fails the test on a double hand-out.
  void Take(int client, const std::vector<int64_t>& ids) {
    absl::MutexLock lock(&mu_);
    for (int64_t id : ids) {
      auto [it, inserted] = holder_.emplace(id, client);
      EXPECT_TRUE(inserted) << "block " << id << " handed to client " << client
                            << " while client " << it->second << " holds it";
    }
  }
  // Forgets `ids` before they are sent to Free, so that a racing Alloc may
  // get them after.
  void Give(const std::vector<int64_t>& ids) {
    absl::MutexLock lock(&mu_);
    for (int64_t id : ids) holder_.erase(id);
  }

 private:
  absl::Mutex mu_;
  std::map<int64_t, int> holder_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing
}  // namespace kvbroker

#endif  // KVBROKER_TESTS_BLOCK_LEDGER_H_
