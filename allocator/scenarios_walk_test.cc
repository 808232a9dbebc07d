// Acceptance scenario C14: random walks of Alloc, Free, Reserve, expiry and
// prealloc, with capacity checked exact against a model after every step
// (the rig of scenarios_rig.h).

#include "allocator/scenarios_rig.h"

namespace kvbroker::scenarios {
namespace {

// What the C14 walks went through, so that the test can insist the walk
// reached every state it is meant to check.
struct WalkTally {
  std::map<std::string, int64_t> refusals;  // reason of Alloc(c + 1)
  int64_t probes = 0;
  int64_t deferred_probes = 0;
  int64_t nonzero_probes = 0;  // c > 0
  int64_t partly_counted = 0;  // some FREE pages not affordable
  int64_t reservation_allocs = 0;
  int64_t expired = 0;
  int64_t prealloc_pages = 0;
};

// C14: a seeded random walk over random geometries. After every step the
// pool's Capacity c must be exact: Alloc(c + 1) is refused with the right
// reason before any map call, and Alloc(c) succeeds and leaves nothing
// available.
class RandomWalk {
 public:
  RandomWalk(uint64_t seed, WalkTally* tally) : rng_(seed), tally_(tally) {}

  void Run(int steps) {
    ASSERT_NO_FATAL_FAILURE(Setup());
    SCOPED_TRACE(description_);
    for (step_ = 0; step_ < steps; ++step_) {
      SCOPED_TRACE(absl::StrCat("step ", step_, " op ", last_op_));
      ASSERT_NO_FATAL_FAILURE(Step());
      ASSERT_NO_FATAL_FAILURE(Probe());
    }
    const PoolStats stats = pool_->Stats();
    tally_->expired += stats.reservations_expired_total;
    tally_->prealloc_pages += stats.prealloc_pages_total;
  }

 private:
  struct Res {
    std::vector<BlockId> blocks;  // ascending
    absl::Time expires;
  };

  int64_t Uniform(int64_t lo, int64_t hi) {  // inclusive
    return lo +
           static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }

  void Setup() {
    const int64_t pages_mib[] = {2, 4, 6, 14};
    P_ = MiB(pages_mib[Uniform(0, 3)]);
    const int64_t unit = 64 * kKiB;
    const int64_t units = P_.value() / unit;
    B_ = Bytes(Uniform(std::max<int64_t>(1, units / 16), units) * unit);
    const int64_t pages = Uniform(2, 24);
    const int64_t n = Uniform(1, pages * P_.value() / B_.value());
    PoolConfig config = Geo(P_, B_, n);
    config.reserve_null_block = Uniform(0, 3) == 0;
    const int64_t min_idle = Uniform(0, 2);
    const int64_t max_idle = min_idle + Uniform(0, 2);
    description_ =
        absl::StrCat("P=", P_.value() / kKiB, "KiB B=", B_.value() / kKiB,
                     "KiB N=", n, " null=", config.reserve_null_block,
                     " idle=", min_idle, "..", max_idle);
    SCOPED_TRACE(description_);
    std::string why;
    rig_ = Rig::Make(/*devices=*/1, /*utilization=*/1.0, &why);
    ASSERT_TRUE(rig_ != nullptr) << why;
    T_ = 0;
    ASSERT_NO_FATAL_FAILURE(SetBudget(Uniform(1, pages + 2)));
    ASSERT_OK_AND_ASSIGN(pool_,
                         MakePool(*rig_, config, Quiet(min_idle, max_idle)));
    T_ = pool_->geometry().page_count().value();
    null_block_ = config.reserve_null_block;
    ASSERT_INVARIANTS(*pool_);
    ASSERT_NO_FATAL_FAILURE(Probe());
  }

  // Leaves room for `bundles` more bundles (plus a partial one).
  void SetBudget(int64_t bundles) {
    rig_->LeaveFree(0, P_ * bundles + Bytes(Uniform(0, P_.value() - 1)));
  }

  void ExpireModel() {
    const absl::Time now = rig_->clock.Now();
    for (auto it = res_.begin(); it != res_.end();) {
      // TTLs end on half seconds and the clock moves in whole seconds, so
      // no expiry ever coincides with "now".
      it = it->second.expires < now ? res_.erase(it) : std::next(it);
    }
  }

  int64_t ReservedInModel() const {
    int64_t n = 0;
    for (const auto& [id, r] : res_) n += r.blocks.size();
    return n;
  }

  bool Held(BlockId b) const {
    if (allocated_.count(b) > 0) return true;
    for (const auto& [id, r] : res_) {
      if (std::binary_search(r.blocks.begin(), r.blocks.end(), b)) return true;
    }
    return null_block_ && b == 0;
  }

  // New ids must be usable and held by nobody.
  void ExpectFresh(const std::vector<BlockId>& ids) {
    std::set<BlockId> seen;
    for (BlockId b : ids) {
      ASSERT_TRUE(pool_->geometry().is_usable_block(b)) << b;
      ASSERT_FALSE(Held(b)) << "block " << b << " handed out twice";
      ASSERT_TRUE(seen.insert(b).second) << "block " << b << " twice in a call";
    }
  }

  // The exactness contract, checked on the current state. Leaves the state
  // as Alloc(c) + Free(those) leaves it.
  void Probe() {
    ++tally_->probes;
    ExpireModel();
    ASSERT_INVARIANTS(*pool_);
    CapacitySnapshot c = Cap(*pool_, T_ + 1);
    ASSERT_TRUE(c.healthy) << c.failure;
    ASSERT_EQ(c.allocated_blocks.value(),
              static_cast<int64_t>(allocated_.size()));
    ASSERT_EQ(c.reserved_blocks.value(), ReservedInModel());
    ASSERT_EQ(c.mapped_bytes, rig_->backend.created_bytes(0));
    ASSERT_EQ(c.mapped_bytes.value(),
              rig_->backend.live_handles() * P_.value());
    // available = free blocks on mapped pages + usable of the counted FREE
    // pages, and the counted FREE pages are the first min(affordable, |FREE|).
    int64_t mapped_free = 0, free_usable = 0, counted_usable = 0;
    int64_t free_pages = 0, counted_pages = 0;
    for (const PageInfo& p : c.pages) {
      if (p.state == PageState::kFree) {
        free_usable += p.usable_blocks.value();
        ++free_pages;
        if (p.counted) {
          ASSERT_EQ(counted_pages, free_pages - 1)
              << "counted pages not a prefix";
          counted_usable += p.usable_blocks.value();
          ++counted_pages;
        }
      } else {
        mapped_free += p.free_blocks.value();
      }
    }
    ASSERT_EQ(free_pages, c.pages_free.value());
    ASSERT_EQ(counted_pages, std::min(c.affordable_bundles, free_pages));
    const int64_t available = c.available_blocks.value();
    ASSERT_EQ(available, mapped_free + counted_usable);
    tally_->nonzero_probes += available > 0;
    tally_->partly_counted += counted_pages < free_pages;

    // Alloc(c + 1): refused with the reason failure.h gives, before mapping.
    const bool deferred = c.limit.state == LimitState::kDeferred;
    tally_->deferred_probes += deferred;
    FailureReason want;
    if (available + 1 > c.total_blocks.value()) {
      want = FailureReason::kRequestTooLarge;
    } else if (deferred) {
      want = FailureReason::kShrinkPending;
    } else if (available + 1 - mapped_free > free_usable) {
      want = FailureReason::kPoolExhausted;
    } else {
      want = FailureReason::kGpuMemoryExhausted;
    }
    const uint64_t generation = c.generation;
    absl::Status s = RefusedBeforeMapping(
        *rig_, want, [&] { return Alloc(*pool_, available + 1); });
    ASSERT_EQ(GetReason(s), want) << s;
    ++tally_->refusals[std::string(ReasonName(want))];
    ASSERT_EQ(Meta(s, "requested_blocks"), Num(available + 1));
    ASSERT_EQ(Meta(s, "available_blocks"), Num(available));
    ASSERT_EQ(pool_->generation(), generation);

    // Alloc(c): succeeds, and nothing is left available.
    ASSERT_OK_AND_ASSIGN(AllocResult r, Alloc(*pool_, available));
    ASSERT_EQ(r.num_blocks, available);
    const std::vector<BlockId> ids = Ids(r);
    ASSERT_NO_FATAL_FAILURE(ExpectFresh(ids));
    ASSERT_EQ(Available(*pool_), 0);
    if (!ids.empty()) {
      ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool_, ids));
      ASSERT_EQ(f.freed_blocks, available);
    }
  }

  void Step() {
    ExpireModel();
    const int64_t c = Available(*pool_);
    const int op = static_cast<int>(Uniform(0, 12));
    last_op_ = op;
    switch (op) {
      case 0:
      case 1:
      case 2: {  // Alloc, sometimes too many
        const int64_t n = Uniform(0, c + 1);
        const int64_t maps = rig_->backend.map_calls();
        absl::StatusOr<AllocResult> r = Alloc(*pool_, n);
        if (n > c) {
          ASSERT_FALSE(r.ok());
          ASSERT_EQ(rig_->backend.map_calls(), maps);
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status() << " n=" << n << " c=" << c;
        ASSERT_NO_FATAL_FAILURE(ExpectFresh(Ids(*r)));
        for (BlockId b : Ids(*r)) allocated_.insert(b);
        break;
      }
      case 3:
      case 4: {  // Free a random subset, sometimes with a bad id
        if (allocated_.empty()) break;
        std::vector<BlockId> ids;
        for (BlockId b : allocated_) {
          if (Uniform(0, 2) == 0) ids.push_back(b);
        }
        if (ids.empty()) ids.push_back(*allocated_.begin());
        if (Uniform(0, 5) == 0) {
          const BlockId bad = Uniform(-1, pool_->geometry().max_blocks());
          if (allocated_.count(bad) == 0) {
            ids.push_back(bad);
            const int64_t before = Cap(*pool_).allocated_blocks.value();
            absl::StatusOr<FreeResult> f = Free(*pool_, ids);
            ASSERT_FALSE(f.ok());
            const FailureReason why = GetReason(f.status());
            ASSERT_TRUE(why == FailureReason::kBlockNotAllocated ||
                        why == FailureReason::kBlockInReservation)
                << f.status();
            ASSERT_EQ(Cap(*pool_).allocated_blocks.value(), before);
            break;
          }
        }
        ASSERT_OK_AND_ASSIGN(FreeResult f, Free(*pool_, ids));
        ASSERT_EQ(f.freed_blocks, static_cast<int64_t>(ids.size()));
        for (BlockId b : ids) allocated_.erase(b);
        break;
      }
      case 5: {  // Reserve
        const int64_t n = Uniform(1, c + 1);
        const absl::Duration ttl =
            absl::Seconds(Uniform(1, 6)) + absl::Milliseconds(500);
        const int64_t maps = rig_->backend.map_calls();
        absl::StatusOr<ReservationInfo> r = Reserve(*pool_, n, ttl);
        if (n > c) {
          ASSERT_FALSE(r.ok());
          ASSERT_EQ(rig_->backend.map_calls(), maps);
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->num_blocks, n);
        ASSERT_NO_FATAL_FAILURE(ExpectFresh(Ids(*r)));
        ASSERT_EQ(r->expires, rig_->clock.Now() + ttl);
        res_[r->reservation_id] = Res{Ids(*r), r->expires};
        break;
      }
      case 6: {  // Alloc from a reservation
        if (res_.empty()) break;
        auto it = std::next(res_.begin(), Uniform(0, res_.size() - 1));
        Res& res = it->second;
        const int64_t held = res.blocks.size();
        const int64_t n = Uniform(1, held + 2);
        absl::StatusOr<AllocResult> r = Alloc(*pool_, n, "", it->first);
        if (n - held > c) {
          ASSERT_EQ(GetReason(r.status()), FailureReason::kReservationTooSmall)
              << r.status();
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status() << " n=" << n << " held=" << held;
        const std::vector<BlockId> ids = Ids(*r);
        ASSERT_EQ(static_cast<int64_t>(ids.size()), n);
        const int64_t from_res = std::min(n, held);
        for (int64_t i = 0; i < from_res; ++i) {
          ASSERT_TRUE(std::binary_search(ids.begin(), ids.end(), res.blocks[i]))
              << "reservation block " << res.blocks[i] << " not used first";
        }
        res.blocks.erase(res.blocks.begin(), res.blocks.begin() + from_res);
        ++tally_->reservation_allocs;
        for (BlockId b : ids) allocated_.insert(b);
        break;
      }
      case 7: {  // Release a reservation
        if (res_.empty()) break;
        auto it = std::next(res_.begin(), Uniform(0, res_.size() - 1));
        ASSERT_OK_AND_ASSIGN(ReleaseResult r, Release(*pool_, it->first));
        ASSERT_EQ(r.released_blocks,
                  static_cast<int64_t>(it->second.blocks.size()));
        res_.erase(it);
        break;
      }
      case 8: {  // Memory limit, occasionally stale
        if (revision_ > 0 && Uniform(0, 4) == 0) {
          ASSERT_OK_AND_ASSIGN(
              LimitResult l, Limit(*pool_, P_ * Uniform(0, T_), revision_ - 1));
          ASSERT_EQ(l.outcome, LimitOutcome::kStale);
          ASSERT_EQ(l.limit.revision, revision_);
          break;
        }
        const int64_t pages = Uniform(0, T_ + 1);
        ++revision_;
        ASSERT_OK_AND_ASSIGN(
            LimitResult l,
            Limit(*pool_, P_ * pages + Bytes(Uniform(0, P_.value() - 1)),
                  revision_));
        ASSERT_TRUE(l.outcome == LimitOutcome::kApplied ||
                    l.outcome == LimitOutcome::kDeferred);
        ASSERT_EQ(l.limit.target_pages.value(), std::min(pages, T_));
        ASSERT_EQ(l.limit.revision, revision_);
        break;
      }
      case 9: {  // Trim
        ASSERT_TRUE(Checked(*pool_, pool_->Trim()).ok());
        ASSERT_EQ(Cap(*pool_).pages_idle, PageCount(0));
        break;
      }
      case 10: {  // The prealloc worker, after a trim left it work to do
        ASSERT_TRUE(Checked(*pool_, pool_->Trim(Uniform(0, 2))).ok());
        int guard = 0;
        while (Checked(*pool_, pool_->PreallocStep())) {
          ASSERT_LT(++guard, 100);
        }
        break;
      }
      case 11: {  // Other processes take or return memory
        ASSERT_NO_FATAL_FAILURE(SetBudget(Uniform(0, T_ + 1)));
        break;
      }
      case 12: {  // Time passes; reservations expire
        rig_->clock.Advance(absl::Seconds(Uniform(1, 3)));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  std::unique_ptr<Rig> rig_;
  std::unique_ptr<PagePool> pool_;
  Bytes P_, B_;
  int64_t T_ = 0;
  bool null_block_ = false;
  std::set<BlockId> allocated_;
  std::map<std::string, Res> res_;
  int64_t revision_ = 0;
  WalkTally* const tally_;
  int step_ = 0;
  int last_op_ = -1;
  std::string description_;
};

TEST(Scenarios, C14_CapacityIsExactAfterEveryStep) {
  std::string why;
  if (Rig::Make(/*devices=*/1, /*utilization=*/1.0, &why) == nullptr) {
    GTEST_SKIP() << why;
  }
  WalkTally tally;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RandomWalk walk(seed, &tally);
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    walk.Run(/*steps=*/120);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(tally.probes, 40 * 121);
  // The walks reached every kind of refusal and every state they check.
  for (const char* reason : {"REQUEST_TOO_LARGE", "POOL_EXHAUSTED",
                             "GPU_MEMORY_EXHAUSTED", "SHRINK_PENDING"}) {
    EXPECT_GE(tally.refusals[reason], 20) << reason;
  }
  EXPECT_GE(tally.nonzero_probes, tally.probes / 2);
  EXPECT_GE(tally.deferred_probes, 20);
  EXPECT_GE(tally.partly_counted, 100);
  EXPECT_GE(tally.reservation_allocs, 20);
  EXPECT_GE(tally.expired, 20);
  EXPECT_GE(tally.prealloc_pages, 20);
  for (const auto& [reason, n] : tally.refusals) {
    std::printf("C14: %s x%lld\n", reason.c_str(), static_cast<long long>(n));
  }
  std::printf(
      "C14: %lld probes, %lld with c > 0, %lld deferred, %lld partly "
      "counted, %lld reservation allocs, %lld expired, %lld prealloc pages\n",
      static_cast<long long>(tally.probes),
      static_cast<long long>(tally.nonzero_probes),
      static_cast<long long>(tally.deferred_probes),
      static_cast<long long>(tally.partly_counted),
      static_cast<long long>(tally.reservation_allocs),
      static_cast<long long>(tally.expired),
      static_cast<long long>(tally.prealloc_pages));
}

}  // namespace
}  // namespace kvbroker::scenarios
