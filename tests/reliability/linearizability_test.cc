// Linearizability of one pool under concurrent gRPC clients (SPEC 4).
//
// Each history: a fresh small pool on the daemon's wiring (tests/
// grpc_test_util.h: host backend, worker off), three clients on their own
// TCP channels starting together, each making six calls chosen at random
// among Alloc, Alloc from its own reservation, Free (its own blocks, or
// now and then an id it does not hold; named by ids and by runs alone in
// turn), Reserve, ReleaseReservation,
// SetMemoryLimit (revisions drawn from one shared counter, so they race)
// and Capacity. Every call is stamped with a shared logical clock before
// it is sent and after its response arrives. The history must then be
// linearizable against the reference model of the pool
// (linearizability.h). The pool pauses between the steps of its stepped
// walks (docs/design.md, "Bounded lock hold"), so that calls overlap them.
//
// KVB_LIN_HISTORIES sets the number of histories (default 200);
// KVB_LIN_SEED the first seed. A failure prints the seed, the geometry and
// the history.

#include "tests/reliability/linearizability.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocator/failure.h"
#include "allocator/testing/reference_model.h"
#include "allocator/units.h"
#include "common/block_runs.h"
#include "gtest/gtest.h"
#include "proto/kvbroker/v1/kvbroker.pb.h"
#include "server/status_convert.h"
#include "tests/grpc_test_util.h"

namespace kvbroker {
namespace lin {
namespace {

using ::kvbroker::testing::Client;
using ::kvbroker::testing::Ids;
using ::kvbroker::testing::Rig;
using ::kvbroker::testing::RigOptions;
using ::kvbroker::testing::Transport;

constexpr int kClients = 3;
constexpr int kOpsPerClient = 6;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

struct Geometry {
  int64_t block = 0;
  int64_t max_blocks = 0;
  int64_t max_idle = 0;
  bool null_block = false;
  std::string ToString() const {
    return absl::StrCat("page 2 MiB, block ", block, " B, ", max_blocks,
                        " blocks, max_idle_pages ", max_idle,
                        null_block ? ", null block" : "");
  }
};

Geometry RandomGeometry(std::mt19937_64& rng) {
  static const int64_t kBlocks[] = {kMiB, 700 * kKiB, 2 * kMiB, 512 * kKiB,
                                    1536 * kKiB};
  Geometry g;
  g.block = kBlocks[rng() % 5];
  g.max_blocks = 4 + rng() % 13;
  g.max_idle = rng() % 3;
  g.null_block = rng() % 5 == 0;
  return g;
}

// One client's part of a history.
class Worker {
 public:
  Worker(int id, Client* client, std::atomic<int64_t>* clock,
         std::atomic<int64_t>* revisions)
      : id_(id), client_(client), clock_(clock), revisions_(revisions) {}

  void Run(const std::string& pool, const Geometry& g, uint64_t seed,
           History* out) {
    rng_.seed(seed);
    held_.clear();
    reservations_.clear();
    for (int i = 0; i < kOpsPerClient; ++i) out->push_back(Step(pool, g));
  }

 private:
  // Runs `call` between two ticks of the shared clock.
  template <typename F>
  auto Timed(Operation* op, F call) {
    op->invoke = clock_->fetch_add(1);
    auto reply = call();
    op->response = clock_->fetch_add(1);
    return reply;
  }

  Operation Step(const std::string& pool, const Geometry& g) {
    Operation op;
    op.client = id_;
    const int choice = static_cast<int>(rng_() % 100);
    if (choice < 28) {
      op.kind = OpKind::kAlloc;
      op.num_blocks = 1 + rng_() % 3;
      auto r = Timed(&op, [&] { return client_->Alloc(pool, op.num_blocks); });
      Record(&op, r.status);
      if (r.ok()) {
        op.result_ids = Ids(r->pages());
        held_.insert(held_.end(), op.result_ids.begin(), op.result_ids.end());
      }
    } else if (choice < 36 && !reservations_.empty() &&
               reservations_.back().second >= 2) {
      auto& [rid, size] = reservations_.back();
      op.kind = OpKind::kAlloc;
      op.reservation_id = rid;
      op.num_blocks = 1 + rng_() % (size - 1);  // never empties it
      auto r = Timed(&op, [&] {
        return client_->Alloc(pool, op.num_blocks, "", op.reservation_id);
      });
      Record(&op, r.status);
      if (r.ok()) {
        op.result_ids = Ids(r->pages());
        held_.insert(held_.end(), op.result_ids.begin(), op.result_ids.end());
        size -= op.num_blocks;
      }
    } else if (choice < 58) {
      op.kind = OpKind::kFree;
      if (!held_.empty() && rng_() % 6 != 0) {
        const size_t k = 1 + rng_() % std::min<size_t>(held_.size(), 3);
        for (size_t j = 0; j < k; ++j) {
          const size_t at = rng_() % held_.size();
          op.block_ids.push_back(held_[at]);
          held_.erase(held_.begin() + at);
        }
      } else {
        op.block_ids.push_back(static_cast<int64_t>(rng_() % g.max_blocks));
      }
      // Every other Free of a client names its blocks by runs alone, as the
      // attach session does: the pool then checks and returns them run by
      // run (docs/design.md, "Acquisitions as stretches"). Same blocks,
      // same call for the model.
      v1::FreeRequest by_runs;
      free_by_runs_ = !free_by_runs_;
      if (free_by_runs_) {
        std::vector<int64_t> sorted = op.block_ids;
        std::sort(sorted.begin(), sorted.end());
        by_runs.set_pool(pool);
        AppendBlockRuns(sorted, by_runs.mutable_block_runs());
      }
      auto r = Timed(&op, [&] {
        return free_by_runs_ ? client_->Free(by_runs)
                             : client_->Free(pool, op.block_ids);
      });
      Record(&op, r.status);
    } else if (choice < 70) {
      op.kind = OpKind::kReserve;
      op.num_blocks = 1 + rng_() % 3;
      auto r = Timed(&op, [&] {
        return client_->Reserve(pool, op.num_blocks, absl::Hours(1));
      });
      Record(&op, r.status);
      if (r.ok()) {
        op.result_ids = Ids(r->pages());
        op.result_reservation = r->reservation_id();
        reservations_.push_back({op.result_reservation, op.num_blocks});
      }
    } else if (choice < 78 && !reservations_.empty()) {
      op.kind = OpKind::kRelease;
      op.reservation_id = reservations_.front().first;
      reservations_.erase(reservations_.begin());
      auto r =
          Timed(&op, [&] { return client_->Release(pool, op.reservation_id); });
      Record(&op, r.status);
      if (r.ok()) op.result_count = r->released_blocks();
    } else if (choice < 84) {
      op.kind = OpKind::kSetMemoryLimit;
      const int64_t pages = static_cast<int64_t>(rng_() % 12);
      op.limit_bytes = pages * 2 * kMiB;
      // Mostly a fresh revision; sometimes the latest again (CONFLICT or a
      // repeat) or an older one (STALE).
      const int64_t latest = revisions_->load();
      const int r = static_cast<int>(rng_() % 6);
      op.revision = r < 4 ? revisions_->fetch_add(1) + 1
                          : std::max<int64_t>(0, latest - (r - 4));
      auto reply = Timed(&op, [&] {
        return client_->SetLimit(pool, Bytes(op.limit_bytes), op.revision);
      });
      Record(&op, reply.status);
      if (reply.ok()) {
        op.limit_outcome =
            static_cast<reference::MLimitOutcome>(reply->outcome() - 1);
        op.target_pages = reply->limit().target_pages();
      }
    } else {
      op.kind = OpKind::kCapacity;
      auto r = Timed(&op, [&] { return client_->Capacity(pool); });
      Record(&op, r.status);
      if (r.ok()) {
        op.available_blocks = r->capacity().available_blocks();
        op.allocated_blocks = r->capacity().allocated_blocks();
        op.reserved_blocks = r->capacity().reserved_blocks();
      }
    }
    return op;
  }

  static void Record(Operation* op, const grpc::Status& status) {
    if (status.ok()) return;
    op->reason = GetReason(FromGrpcStatus(status));
    // An untyped failure (transport, deadline) cannot be placed in the
    // model: report it rather than guess.
    EXPECT_NE(op->reason, FailureReason::kUnspecified)
        << OpKindName(op->kind) << ": " << status.error_code() << " "
        << status.error_message();
  }

  const int id_;
  Client* const client_;
  bool free_by_runs_ = false;
  std::atomic<int64_t>* const clock_;
  std::atomic<int64_t>* const revisions_;
  std::mt19937_64 rng_;
  std::vector<int64_t> held_;
  std::vector<std::pair<std::string, int64_t>> reservations_;
};

// KVB_LIN_HISTORIES histories from seed KVB_LIN_SEED on, each checked.
// Every pause between two steps of a call (one page a step) is widened,
// so that other clients' calls land inside it. With free_one_step_blocks
// 0 every Free on more than one page steps; with the default, Frees of up
// to that many ids are one step whatever pages they span, as in the
// daemon.
void CheckHistories(int64_t free_one_step_blocks) {
  const int64_t histories = EnvInt("KVB_LIN_HISTORIES", 200);
  const uint64_t first_seed = static_cast<uint64_t>(EnvInt("KVB_LIN_SEED", 1));
  RigOptions ro;
  ro.between_steps = [] { absl::SleepFor(absl::Microseconds(200)); };
  ro.free_one_step_blocks = free_one_step_blocks;
  Rig rig(ro);
  ASSERT_NE(rig.daemon, nullptr);
  Client admin(rig.Channel(Transport::kTcp));
  std::vector<std::unique_ptr<Client>> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(std::make_unique<Client>(rig.Channel(Transport::kTcp)));
  }
  std::atomic<int64_t> clock{1};
  std::atomic<int64_t> revisions{0};
  std::vector<Worker> workers;
  for (int c = 0; c < kClients; ++c) {
    workers.emplace_back(c, clients[c].get(), &clock, &revisions);
  }

  int64_t checked = 0, explored = 0, operations = 0, reordered = 0;
  std::map<std::string, int64_t> outcomes;
  for (int64_t h = 0; h < histories; ++h) {
    const uint64_t seed = first_seed + h;
    std::mt19937_64 rng(seed);
    const Geometry g = RandomGeometry(rng);
    const std::string pool = absl::StrCat("lin", seed);
    v1::PoolSpec spec = ::kvbroker::testing::Spec(pool, Bytes(2 * kMiB),
                                                  Bytes(g.block), g.max_blocks);
    spec.set_max_idle_pages(g.max_idle);
    spec.set_reserve_null_block(g.null_block);
    ASSERT_TRUE(admin.CreatePool(spec).ok()) << g.ToString();
    revisions = 0;

    std::vector<History> parts(kClients);
    {
      auto* start = new absl::Barrier(kClients);
      std::vector<std::thread> threads;
      for (int c = 0; c < kClients; ++c) {
        threads.emplace_back([&, c, start] {
          if (start->Block()) delete start;
          workers[c].Run(pool, g, seed * 31 + c, &parts[c]);
        });
      }
      for (std::thread& t : threads) t.join();
    }
    History history;
    for (History& part : parts) {
      history.insert(history.end(), part.begin(), part.end());
    }
    for (const Operation& op : history) {
      ++outcomes[absl::StrCat(OpKindName(op.kind),
                              op.ok() ? " ok" : " refused")];
    }

    reference::ModelConfig mc;
    mc.page_size = 2 * kMiB;
    mc.block_bytes = g.block;
    mc.max_blocks = g.max_blocks;
    mc.reserve_null_block = g.null_block;
    mc.max_idle_pages = g.max_idle;
    mc.budget_bundles = int64_t{1} << 20;
    const CheckResult result = CheckLinearizable(history, PoolSpec(mc));
    ASSERT_TRUE(result.linearizable)
        << "seed " << seed << ": " << g.ToString() << "\nnot linearizable:\n"
        << DebugString(history);
    ++checked;
    explored += result.explored;
    // Histories whose only witnesses put some call before one that was
    // invoked earlier: the checker had to reorder overlapping calls.
    for (size_t i = 1; i < result.order.size(); ++i) {
      if (history[result.order[i]].invoke <
          history[result.order[i - 1]].invoke) {
        ++reordered;
        break;
      }
    }
    operations += history.size();
    ASSERT_TRUE(admin.DeletePool(pool, /*force=*/true).ok());
  }
  std::printf(
      "%lld histories of %d clients x %d calls linearizable "
      "(%lld calls, %lld search states, %lld with a witness that "
      "reorders overlapping calls)\n",
      static_cast<long long>(checked), kClients, kOpsPerClient,
      static_cast<long long>(operations), static_cast<long long>(explored),
      static_cast<long long>(reordered));
  for (const auto& [what, n] : outcomes) {
    std::printf("  %-28s %lld\n", what.c_str(), static_cast<long long>(n));
  }
  EXPECT_EQ(checked, histories);
}

TEST(Linearizability, ConcurrentHistoriesOfOnePool) { CheckHistories(0); }

TEST(Linearizability, ConcurrentHistoriesWithOneStepFrees) {
  CheckHistories(RigOptions{}.free_one_step_blocks);
}

}  // namespace
}  // namespace lin
}  // namespace kvbroker
