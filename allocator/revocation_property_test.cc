// Revocation against the reference model (allocator/testing/reference_model.h):
// random Alloc, Free, Trim and SetMemoryLimit on small pools while a page
// listener (an engine's session) comes and goes and acknowledges
// revocations oldest first. After every step the pool's capacity, page
// counts (REVOKING and QUARANTINED apart from MAPPING), FREE list order and
// limit state equal the model's, and the pool's invariants hold. A failure
// prints the seed and the operations.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/device_budget.h"
#include "allocator/host_backend.h"
#include "allocator/page_pool.h"
#include "allocator/testing/reference_model.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using reference::MLimitState;
using reference::ModelConfig;
using reference::MPage;
using reference::ReferenceModel;

// Records revocation ids in the order the pool sends them.
class Listener : public PageListener {
 public:
  void OnPagesMapped(absl::Span<const MappedPage>) override {}
  void OnPagesNotPassed(absl::Span<const PageId>) override {}
  void OnPagesRevoked(uint64_t id, absl::Span<const PageId>,
                      absl::Time) override {
    pending.push_back(id);
  }
  std::vector<uint64_t> pending;  // oldest first
};

class Walk {
 public:
  explicit Walk(uint64_t seed) : seed_(seed), rng_(seed) {}

  std::string Go(int steps) {
    // P = 2 MiB, B = 512 KiB or 768 KiB (straddlers), N pages' worth.
    const int64_t P = 2 * kMiB;
    const int64_t B = (rng_() % 2 == 0 ? 512 : 768) * kKiB;
    const int64_t N = 16 + static_cast<int64_t>(rng_() % 24);
    const int64_t max_idle = static_cast<int64_t>(rng_() % 3);
    HostBackendOptions ho;
    ho.device_count = 1;
    ho.device_total = Bytes(64 * P);
    ho.granularity = Bytes(P);
    host_ = std::make_unique<HostBackend>(ho);
    budgets_ = std::make_unique<DeviceBudgets>(host_.get(), 1.0);
    if (!budgets_->Init().ok()) return "budgets";
    PoolConfig pc;
    pc.name = "rev";
    pc.page_size = Bytes(P);
    pc.block_bytes = Bytes(B);
    pc.max_blocks = N;
    PoolOptions po;
    po.min_idle_pages = 0;
    po.max_idle_pages = max_idle;
    po.revoke_timeout = absl::Seconds(5);
    auto pool = PagePool::Create(pc, host_.get(), budgets_.get(), &clock_, po);
    if (!pool.ok()) return pool.status().ToString();
    pool_ = *std::move(pool);
    ModelConfig mc;
    mc.page_size = P;
    mc.block_bytes = B;
    mc.max_blocks = N;
    mc.max_idle_pages = max_idle;
    mc.budget_bundles = 64;
    model_ = std::make_unique<ReferenceModel>(mc);

    for (int step = 0; step < steps; ++step) {
      if (std::string e = Step(); !e.empty()) return Fail(step, e);
      if (std::string e = Compare(); !e.empty()) return Fail(step, e);
    }
    if (listening_) pool_->RemovePageListener(&listener_);
    return "";
  }

 private:
  std::string Fail(int step, const std::string& e) {
    return absl::StrCat("seed ", seed_, " step ", step, ": ", e,
                        "\n  model: ", model_->DebugString(),
                        "\n  ops: ", absl::StrJoin(log_, "; "));
  }

  std::string Step() {
    const int op = static_cast<int>(rng_() % 100);
    if (op < 30) {
      const int64_t n = 1 + static_cast<int64_t>(rng_() % 8);
      AllocRequest a;
      a.num_blocks = n;
      auto got = pool_->Alloc(a);
      auto want = model_->Alloc(n);
      log_.push_back(absl::StrCat("alloc ", n));
      if (got.ok() != want.ok()) {
        return absl::StrCat("alloc ", n, ": core ", got.status().ToString());
      }
      if (!got.ok()) return "";
      std::vector<int64_t> ids;
      for (const auto& pb : got->pages) {
        ids.insert(ids.end(), pb.block_ids.begin(), pb.block_ids.end());
      }
      if (ids != want.ids) return "alloc returned other blocks";
      return "";
    }
    if (op < 60) {
      std::vector<int64_t> held = model_->AllocatedIds();
      if (held.empty()) return "";
      std::shuffle(held.begin(), held.end(), rng_);
      held.resize(1 + rng_() % held.size());
      std::sort(held.begin(), held.end());
      FreeRequest f;
      f.block_ids = held;
      auto got = pool_->Free(f);
      auto want = model_->Free(held);
      log_.push_back(absl::StrCat("free ", held.size()));
      if (!got.ok() || !want.ok()) return "free refused";
      if (got->pages_unmapped != want.pages_unmapped) {
        return absl::StrCat("free unmapped ", got->pages_unmapped, " model ",
                            want.pages_unmapped);
      }
      return "";
    }
    if (op < 68) {
      const int64_t k = static_cast<int64_t>(rng_() % 3);
      auto got = pool_->Trim(k);
      const int64_t want = model_->Trim(k);
      log_.push_back(absl::StrCat("trim ", k));
      if (!got.ok() || got->pages_unmapped != want) {
        return absl::StrCat("trim unmapped ",
                            got.ok() ? got->pages_unmapped : -1, " model ",
                            want);
      }
      return "";
    }
    if (op < 76) {
      const int64_t pages =
          static_cast<int64_t>(rng_() % (model_->page_count() + 2));
      const int64_t bytes = pages * model_->bundle_bytes();
      ++revision_;
      auto got = pool_->SetMemoryLimit(Bytes(bytes), revision_);
      auto want = model_->SetMemoryLimit(bytes, revision_);
      log_.push_back(absl::StrCat("limit ", pages, " pages"));
      if (!got.ok()) return got.status().ToString();
      if (!want.ok) return "model refused the limit";
      return "";
    }
    if (op < 84) {
      listening_ = !listening_;
      log_.push_back(listening_ ? "listen" : "leave");
      if (listening_) {
        if (!pool_->AddPageListener(&listener_, [](auto) {}).ok()) {
          return "AddPageListener";
        }
      } else {
        pool_->RemovePageListener(&listener_);
        listener_.pending.clear();
      }
      model_->SetListening(listening_);
      return "";
    }
    if (op < 96) {
      if (listener_.pending.empty()) return "";
      const uint64_t id = listener_.pending.front();
      listener_.pending.erase(listener_.pending.begin());
      log_.push_back("ack");
      if (!pool_->AckRevocation(&listener_, id).ok()) return "ack refused";
      if (!model_->AckOldestRevocation()) return "model had no revocation";
      return "";
    }
    clock_.Advance(absl::Seconds(3));
    log_.push_back("+3s");
    return "";
  }

  std::string Compare() {
    if (std::string e = model_->SelfCheck(); !e.empty()) return "model: " + e;
    CapacityQuery q;
    q.max_pages = model_->page_count() + 1;
    auto c = pool_->Capacity(q);
    if (!c.ok()) return c.status().ToString();
    std::ostringstream err;
    auto eq = [&](const char* what, int64_t core, int64_t model) {
      if (core != model)
        err << what << ": core " << core << " model " << model << "; ";
    };
    const ReferenceModel& m = *model_;
    if (c->pages_quarantined.value() > 0) ++quarantined_steps;
    if (c->pages_revoking.value() > 0) ++revoking_steps;
    eq("available", c->available_blocks.value(), m.AvailableBlocks());
    eq("allocated", c->allocated_blocks.value(), m.AllocatedBlocks());
    eq("free", c->pages_free.value(), m.PagesIn(MPage::kFree));
    eq("idle", c->pages_idle.value(), m.PagesIn(MPage::kIdle));
    eq("open", c->pages_open.value(), m.PagesIn(MPage::kOpen));
    eq("full", c->pages_full.value(), m.PagesIn(MPage::kFull));
    eq("reclaimed", c->pages_reclaimed.value(), m.PagesIn(MPage::kReclaimed));
    eq("mapping", c->pages_mapping.value(), m.PagesIn(MPage::kMapping));
    eq("revoking + quarantined",
       (c->pages_revoking + c->pages_quarantined).value(),
       m.PagesIn(MPage::kRevoking));
    eq("pending revocations", pool_->pending_revocations(),
       m.pending_revocations());
    eq("affordable", c->affordable_bundles, m.Affordable());
    const LimitState want_limit =
        m.limit_state() == MLimitState::kNone      ? LimitState::kNone
        : m.limit_state() == MLimitState::kApplied ? LimitState::kApplied
                                                   : LimitState::kDeferred;
    eq("limit state", static_cast<int>(c->limit.state),
       static_cast<int>(want_limit));
    std::vector<int64_t> free_list;
    for (const PageInfo& pi : c->pages) {
      if (pi.state == PageState::kFree) free_list.push_back(pi.page_id);
    }
    if (free_list !=
        std::vector<int64_t>(m.free_list().begin(), m.free_list().end())) {
      err << "FREE list order; ";
    }
    if (absl::Status s = pool_->CheckInvariants(); !s.ok()) {
      err << s.ToString();
    }
    return err.str();
  }

 public:
  // Steps after which some page was REVOKING, or QUARANTINED.
  int64_t revoking_steps = 0;
  int64_t quarantined_steps = 0;

 private:
  const uint64_t seed_;
  std::mt19937_64 rng_;
  ManualClock clock_;
  std::unique_ptr<HostBackend> host_;
  std::unique_ptr<DeviceBudgets> budgets_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<ReferenceModel> model_;
  Listener listener_;
  bool listening_ = false;
  int64_t revision_ = 0;
  std::vector<std::string> log_;
};

TEST(RevocationPropertyTest, PoolAgreesWithTheModel) {
  int64_t revoking = 0, quarantined = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Walk walk(seed);
    const std::string e = walk.Go(400);
    ASSERT_EQ(e, "") << e;
    revoking += walk.revoking_steps;
    quarantined += walk.quarantined_steps;
  }
  // The walks did reach both states.
  EXPECT_GT(revoking, 100);
  EXPECT_GT(quarantined, 100);
  std::printf("steps with REVOKING pages: %ld, with QUARANTINED: %ld\n",
              static_cast<long>(revoking), static_cast<long>(quarantined));
}

}  // namespace
}  // namespace kvbroker
