// PageLedger on its own: the consumption order, exact undo of an in-flight
// acquisition, unmapping in flight, the limit's moves, and a random walk
// checked step by step against the reference model (allocator/testing/),
// which shares no code with the ledger.

#include "allocator/page_ledger.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/geometry.h"
#include "allocator/testing/reference_model.h"
#include "gtest/gtest.h"

namespace kvbroker {
namespace {

using reference::MBlock;
using reference::MInFlight;
using reference::ModelConfig;
using reference::MPage;
using reference::ReferenceModel;

Geometry MakeGeometry(Bytes page, Bytes block, int64_t n) {
  PoolConfig c;
  c.name = "ledger";
  c.page_size = page;
  c.block_bytes = block;
  c.max_blocks = n;
  absl::StatusOr<Geometry> g = Geometry::Create(c, MiB(2), 1);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

std::vector<PageId> FreeOrder(const PageLedger& l) {
  std::vector<PageId> out;
  for (size_t i = 0; i < l.free_list().size(); ++i) {
    out.push_back(l.free_list()[i].page);
  }
  return out;
}

std::vector<PageId> IdleOrder(const PageLedger& l) {
  return std::vector<PageId>(l.idle_list().begin(), l.idle_list().end());
}

// Maps `k` pages from the front of the FREE list and files them IDLE.
void MapIdle(PageLedger& l, int64_t k) {
  for (PageId p : l.BeginMapFront(PageCount(k))) {
    l.CommitMap(p, BlockCount(0), BlockOwner::kAllocated, nullptr);
  }
}

// ---------------------------------------------------------------------------
// Focused cases

TEST(PageLedgerTest, SeedGeometryStartsFreeWithStraddlersUnowned) {
  // 14 MiB pages, 6 MiB blocks: pages hold {0, 1} and {3}; block 2 straddles.
  const Geometry g = MakeGeometry(MiB(14), MiB(6), 4);
  PageLedger l(&g);
  EXPECT_EQ(l.pages(PageState::kFree), PageCount(2));
  EXPECT_EQ(l.FreePrefix(PageCount(2)), BlockCount(3));
  EXPECT_EQ(l.admitted_usable(), BlockCount(3));
  EXPECT_EQ(l.FreePagesToCover(BlockCount(3)), PageCount(2));
  EXPECT_EQ(l.FreePagesToCover(BlockCount(4)), PageCount(3));
  EXPECT_EQ(l.Check(), "");
}

TEST(PageLedgerTest, OpenBestFitThenIdleFrontFirst) {
  const Geometry g = MakeGeometry(MiB(2), KiB(512), 32);  // 4 per page
  PageLedger l(&g);
  MapIdle(l, 4);  // pages 0..3 IDLE
  Stretches out;
  PageIds from_idle;
  l.TakeMapped(BlockCount(3), BlockOwner::kAllocated, &out, &from_idle);
  EXPECT_EQ(out.Ids(), (std::vector<BlockId>{0, 1, 2}));  // page 0, now OPEN (1)
  l.TakeMapped(BlockCount(2), BlockOwner::kAllocated, &out, &from_idle);
  // OPEN page 0 has 1 free: it does not cover 2, so it is drained first
  // (most free), then IDLE page 1.
  EXPECT_EQ(out.Ids(), (std::vector<BlockId>{0, 1, 2, 3, 4}));
  // Block 3 (page 0) continued 0..2, block 4 (page 1) continued that.
  EXPECT_EQ(out.list(), (Stretches::List{{0, 5}}));
  EXPECT_EQ(from_idle, (PageIds{0, 1}));
  EXPECT_EQ(l.pages(PageState::kFull), PageCount(1));
  EXPECT_EQ(l.pages(PageState::kOpen), PageCount(1));
  EXPECT_EQ(l.open_free(), BlockCount(3));
  EXPECT_EQ(l.allocated(), BlockCount(5));
  EXPECT_EQ(IdleOrder(l), (std::vector<PageId>{2, 3}));
  EXPECT_EQ(l.Check(), "");
}

TEST(PageLedgerTest, AbortedAcquisitionRestoresEverythingExactly) {
  const Geometry g = MakeGeometry(MiB(2), KiB(512), 64);  // 16 pages of 4
  PageLedger l(&g);
  MapIdle(l, 3);  // 0, 1, 2 IDLE
  Stretches kept;
  PageIds unused;
  l.TakeMapped(BlockCount(1), BlockOwner::kAllocated, &kept, &unused);
  ASSERT_EQ(l.Check(), "");
  const std::vector<PageId> free_before = FreeOrder(l);
  const std::vector<PageId> idle_before = IdleOrder(l);
  const BlockCount open_before = l.open_free();

  // An acquisition of 20 blocks: all 11 mapped ones, then 3 fresh pages.
  Stretches taken_stretches;
  PageIds from_idle;
  l.TakeMapped(l.mapped_supply(), BlockOwner::kReserved, &taken_stretches, &from_idle);
  std::vector<PageId> fresh = l.BeginMapFront(PageCount(3));
  EXPECT_EQ(fresh, (std::vector<PageId>{3, 4, 5}));
  EXPECT_EQ(l.pages(PageState::kMapping), PageCount(3));
  EXPECT_EQ(l.pages_in_flight(), PageCount(3));
  EXPECT_EQ(l.in_flight_ascending(), (std::vector<PageId>{3, 4, 5}));
  EXPECT_EQ(l.maps_in_flight(), PageCount(3));
  EXPECT_EQ(l.mapped_pages(), PageCount(6));
  EXPECT_EQ(l.mapped_supply(), BlockCount(0));
  EXPECT_EQ(l.reserved(), BlockCount(11));
  EXPECT_EQ(l.Check(), "");

  l.AbortMap(fresh);
  std::vector<BlockId> taken = taken_stretches.Ids();
  std::sort(taken.begin(), taken.end());
  EXPECT_TRUE(l.UntakeMapped(taken, from_idle).empty());
  EXPECT_EQ(FreeOrder(l), free_before);
  EXPECT_EQ(IdleOrder(l), idle_before);
  EXPECT_EQ(l.open_free(), open_before);
  EXPECT_EQ(l.reserved(), BlockCount(0));
  EXPECT_EQ(l.allocated(), BlockCount(1));
  EXPECT_EQ(l.Check(), "");
}

TEST(PageLedgerTest, OwnerRunsCountAndReturnAtAnyAlignment) {
  const Geometry g = MakeGeometry(MiB(2), KiB(32), 256);  // 4 pages of 64
  PageLedger l(&g);
  MapIdle(l, 2);
  Stretches reserved, allocated;
  PageIds from_idle;
  l.TakeMapped(BlockCount(40), BlockOwner::kReserved, &reserved, &from_idle);
  l.TakeMapped(BlockCount(60), BlockOwner::kAllocated, &allocated,
               &from_idle);
  ASSERT_EQ(reserved.list(), (Stretches::List{{0, 40}}));
  ASSERT_EQ(allocated.list(), (Stretches::List{{40, 60}}));
  // Every range of the two mapped pages, against a count of one owner at a
  // time: starts and lengths off and on eight-block boundaries alike.
  for (BlockOwner o : {BlockOwner::kNone, BlockOwner::kAllocated,
                       BlockOwner::kReserved}) {
    for (BlockId first = 0; first <= 128; ++first) {
      int64_t expected = 0;
      for (BlockId end = first; end <= 128; ++end) {
        if (end > first) expected += l.owner(end - 1) == o;
        ASSERT_EQ(l.CountOwnedBy(first, end, o), expected)
            << first << ".." << end;
        ASSERT_EQ(l.AllOwnedBy(first, end, o), expected == end - first);
      }
    }
  }
  // A run of 20 returned at once, ten of them reserved, ten allocated.
  std::vector<BlockId> run(20);
  std::iota(run.begin(), run.end(), BlockId{30});
  EXPECT_TRUE(l.ReturnBlocks(run).empty());
  EXPECT_EQ(l.reserved(), BlockCount(30));
  EXPECT_EQ(l.allocated(), BlockCount(50));
  EXPECT_EQ(l.CountOwnedBy(0, 128, BlockOwner::kNone), 48);
  EXPECT_EQ(l.Check(), "");
}

// Runs across pages, partial and whole, reserved and allocated alike, go
// back as their ids would: the same pages emptied, in order, and the same
// counts.
TEST(PageLedgerTest, ReturnRunsAgreesWithReturnBlocks) {
  const Geometry g = MakeGeometry(MiB(2), KiB(64), 160);  // 5 pages of 32
  PageLedger by_runs(&g), by_ids(&g);
  for (PageLedger* l : {&by_runs, &by_ids}) {
    MapIdle(*l, 5);
    Stretches taken;
    PageIds from_idle;
    l->TakeMapped(BlockCount(40), BlockOwner::kReserved, &taken, &from_idle);
    l->TakeMapped(BlockCount(100), BlockOwner::kAllocated, &taken,
                  &from_idle);
  }
  // 0..39 reserved, 40..139 allocated. Return 3..9, 30..69 (part of page
  // 0, all of page 1, part of page 2; both owners), all of page 3
  // (96..127) and 130..131.
  const std::vector<int64_t> runs = {3, 7, 30, 40, 96, 32, 130, 2};
  std::vector<BlockId> ids;
  for (size_t i = 0; i < runs.size(); i += 2) {
    for (int64_t k = 0; k < runs[i + 1]; ++k) ids.push_back(runs[i] + k);
  }
  const PageIds a = by_runs.ReturnRuns(runs);
  const PageIds b = by_ids.ReturnBlocks(ids);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, (PageIds{1, 3}));  // pages 1 and 3 emptied, detached
  for (PageLedger* l : {&by_runs, &by_ids}) {
    l->KeepIdle(1);
    l->KeepIdle(3);
    EXPECT_EQ(l->Check(), "");
  }
  EXPECT_EQ(by_runs.reserved(), by_ids.reserved());
  EXPECT_EQ(by_runs.reserved(), BlockCount(40 - 7 - 10));
  EXPECT_EQ(by_runs.allocated(), BlockCount(100 - 30 - 32 - 2));
  EXPECT_EQ(by_runs.open_free(), by_ids.open_free());
  for (BlockId blk = 0; blk < 160; ++blk) {
    ASSERT_EQ(by_runs.owner(blk), by_ids.owner(blk)) << blk;
  }
  for (PageId p = 0; p < 5; ++p) {
    EXPECT_EQ(by_runs.page(p).state, by_ids.page(p).state) << p;
    EXPECT_EQ(by_runs.page(p).free, by_ids.page(p).free) << p;
  }
}

// AllAllocated answers a whole FULL page from its counts: it must agree
// with the owners wherever the counts could mislead (a reserved block, the
// null block, a page in flight owning nothing, part of a page).
TEST(PageLedgerTest, AllAllocatedAgreesWithTheOwners) {
  const Geometry g = MakeGeometry(MiB(2), KiB(64), 160);  // 5 pages of 32
  PageLedger l(&g);
  Stretches got;
  // Page 0: the null block, then the rest allocated (FULL).
  std::vector<PageId> first = l.BeginMapFront(PageCount(1));
  l.CommitMap(first[0], BlockCount(1), BlockOwner::kNull, &got);
  PageIds from_idle;
  l.TakeMapped(BlockCount(31), BlockOwner::kAllocated, &got, &from_idle);
  // Page 1 all allocated; page 2 one reserved block and 31 allocated.
  MapIdle(l, 2);
  l.TakeMapped(BlockCount(32), BlockOwner::kAllocated, &got, &from_idle);
  l.TakeMapped(BlockCount(1), BlockOwner::kReserved, &got, &from_idle);
  l.TakeMapped(BlockCount(31), BlockOwner::kAllocated, &got, &from_idle);
  // Page 3 in flight (taken off FREE, not mapped yet): no free block, no
  // owner.
  ASSERT_EQ(l.BeginMapFront(PageCount(1)), std::vector<PageId>{3});
  ASSERT_EQ(l.page(0).state, PageState::kFull);
  ASSERT_EQ(l.page(2).state, PageState::kFull);
  ASSERT_EQ(l.page(3).state, PageState::kMapping);
  for (PageId p = 0; p < 4; ++p) {
    const PageLedger::Page& page = l.page(p);
    for (BlockId b = page.begin; b < page.end; ++b) {
      ASSERT_EQ(l.AllAllocated(p, b, page.end),
                l.AllOwnedBy(b, page.end, BlockOwner::kAllocated))
          << "page " << p << " from " << b;
    }
  }
  EXPECT_FALSE(l.AllAllocated(0, 0, 32));  // the null block
  EXPECT_TRUE(l.AllAllocated(0, 1, 32));
  EXPECT_TRUE(l.AllAllocated(1, 32, 64));
  EXPECT_FALSE(l.AllAllocated(2, 64, 96));  // a reserved block
  EXPECT_FALSE(l.AllAllocated(3, 96, 128));  // in flight
  EXPECT_EQ(l.Check(), "");
}

// A word's free blocks taken in part: the lowest of them, as one run.
TEST(PageLedgerTest, PartOfAFreeRunIsTakenLowestFirst) {
  const Geometry g = MakeGeometry(MiB(2), KiB(64), 128);  // 4 pages of 32
  PageLedger l(&g);
  MapIdle(l, 4);
  Stretches out;
  PageIds from_idle;
  l.TakeMapped(BlockCount(5), BlockOwner::kAllocated, &out, &from_idle);
  EXPECT_EQ(out.list(), (Stretches::List{{0, 5}}));
  out.clear();
  // Best fit now: page 0 (27 free) before the IDLE pages; then page 1,
  // whose blocks start in the upper half of word 0.
  l.TakeMapped(BlockCount(30), BlockOwner::kReserved, &out, &from_idle);
  // Page 0's rest, then page 1's lowest three: one stretch.
  EXPECT_EQ(out.list(), (Stretches::List{{5, 30}}));
  EXPECT_EQ(out.blocks(), 30);
  EXPECT_EQ(l.CountOwnedBy(0, 5, BlockOwner::kAllocated), 5);
  EXPECT_EQ(l.CountOwnedBy(5, 35, BlockOwner::kReserved), 30);
  EXPECT_EQ(l.CountOwnedBy(35, 64, BlockOwner::kNone), 29);
  EXPECT_EQ(l.page(1).free, 29);
  EXPECT_EQ(l.Check(), "");
}

TEST(PageLedgerTest, UnmapInFlightLandsWhereTold) {
  const Geometry g = MakeGeometry(MiB(2), KiB(512), 32);  // 8 pages of 4
  PageLedger l(&g);
  MapIdle(l, 3);                              // 0, 1, 2 IDLE; FREE 3..7
  l.BeginUnmap(0, Landing::kFreeBack);        // IDLE front
  l.BeginUnmap(2, Landing::kReclaimedFront);  // IDLE back
  EXPECT_EQ(l.pages(PageState::kMapping), PageCount(2));
  EXPECT_EQ(l.in_flight_ascending(), (std::vector<PageId>{0, 2}));
  EXPECT_EQ(l.maps_in_flight(), PageCount(0));
  // In flight to FREE still counts against a limit; to RECLAIMED does not.
  EXPECT_EQ(l.admitted_pages(), PageCount(7));
  EXPECT_EQ(l.reclaimed_usable(), BlockCount(4));
  EXPECT_EQ(l.mapped_supply(), BlockCount(4));  // page 1 only
  EXPECT_EQ(l.Check(), "");
  l.FinishUnmap(0);
  l.FinishUnmap(2);
  EXPECT_EQ(FreeOrder(l), (std::vector<PageId>{3, 4, 5, 6, 7, 0}));
  EXPECT_EQ(l.reclaimed_list().front(), 2);
  EXPECT_EQ(l.admitted_pages(), PageCount(7));
  EXPECT_EQ(l.Check(), "");

  // A failed unmap leaves the page mapped, IDLE at the back.
  l.BeginUnmap(1, Landing::kReclaimedBack);
  l.AbortUnmap(1);
  EXPECT_EQ(IdleOrder(l), (std::vector<PageId>{1}));
  EXPECT_EQ(l.reclaimed_usable(), BlockCount(4));
  EXPECT_EQ(l.Check(), "");
}

TEST(PageLedgerTest, ReclaimFromTheBackAdmitFromTheFrontInOrder) {
  const Geometry g = MakeGeometry(MiB(2), KiB(512), 24);  // 6 pages
  PageLedger l(&g);
  l.ReclaimFreeBack();  // 5
  l.ReclaimFreeBack();  // 4, in front of 5
  EXPECT_EQ(FreeOrder(l), (std::vector<PageId>{0, 1, 2, 3}));
  EXPECT_EQ(l.admitted_pages(), PageCount(4));
  EXPECT_EQ(l.admitted_usable(), BlockCount(16));
  EXPECT_EQ(l.AdmitReclaimed(PageCount(5)), PageCount(2));
  EXPECT_EQ(FreeOrder(l), (std::vector<PageId>{4, 5, 0, 1, 2, 3}));
  EXPECT_EQ(l.Check(), "");
}

// ---------------------------------------------------------------------------
// The ledger against the reference model: a random walk over the moves the
// pool makes with an ample budget and no limit (the pool's property test
// covers budgets and limits), including acquisitions held in flight and
// then committed or aborted.

class LedgerWalk {
 public:
  LedgerWalk(uint64_t seed, Bytes page, Bytes block, int64_t n,
             int64_t max_idle, int64_t min_idle)
      : rng_(seed),
        geometry_(MakeGeometry(page, block, n)),
        ledger_(&geometry_),
        max_idle_(max_idle),
        min_idle_(min_idle) {
    ModelConfig mc;
    mc.page_size = page.value();
    mc.block_bytes = block.value();
    mc.max_blocks = n;
    mc.min_idle_pages = min_idle;
    mc.max_idle_pages = max_idle;
    mc.budget_bundles = geometry_.page_count().value() + 1;  // ample
    model_ = std::make_unique<ReferenceModel>(mc);
  }

  std::string Run(int steps) {
    for (int i = 0; i < steps; ++i) {
      const int op = Uniform(0, 9);
      std::string what;
      if (op < 4) {
        what = Acquire(/*reserve=*/Uniform(0, 4) == 0);
      } else if (op < 7) {
        what = FreeSome();
      } else if (op < 8) {
        what = Trim();
      } else {
        what = Prealloc();
      }
      log_ << "[" << i << "] " << what << "\n";
      std::string e = Compare();
      if (what.find("MISMATCH") != std::string::npos) e += what;
      if (!e.empty()) {
        return e + "\nafter:\n" + log_.str() + model_->DebugString();
      }
    }
    return "";
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return hi <= lo ? lo : std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  std::string Acquire(bool reserve) {
    const int64_t c = model_->AvailableBlocks();
    const int64_t n = Uniform(0, c);
    const BlockOwner owner =
        reserve ? BlockOwner::kReserved : BlockOwner::kAllocated;
    const MBlock mowner = reserve ? MBlock::kReserved : MBlock::kAllocated;
    Stretches taken;
    PageIds from_idle;
    if (n <= ledger_.mapped_supply().value()) {
      ledger_.TakeMapped(BlockCount(n), owner, &taken, &from_idle);
      reference::MOutcome want =
          reserve && n > 0 ? model_->Reserve(n, Name()) : model_->Alloc(n);
      if (reserve && n == 0) return "acquire 0";
      std::vector<BlockId> got = taken.Ids();
      std::sort(got.begin(), got.end());
      return got == want.ids ? "acquire " + std::to_string(n)
                             : "MISMATCH acquire ids";
    }
    // It maps: hold it in flight, compare, then commit or abort.
    const BlockCount supply = ledger_.mapped_supply();
    ledger_.TakeMapped(supply, owner, &taken, &from_idle);
    const int64_t need = n - supply.value();
    std::vector<PageId> fresh =
        ledger_.BeginMapFront(ledger_.FreePagesToCover(BlockCount(need)));
    MInFlight f = model_->BeginAcquire(n, mowner);
    if (std::string e = Compare(); !e.empty()) return "in flight: " + e;
    if (Uniform(0, 2) == 0) {
      ledger_.AbortMap(fresh);
      std::vector<BlockId> got = taken.Ids();
      std::sort(got.begin(), got.end());
      if (!ledger_.UntakeMapped(got, from_idle).empty()) {
        return "MISMATCH: untake emptied a page no other call touched";
      }
      model_->AbortAcquire(f);
      return "acquire " + std::to_string(n) + " in flight, aborted";
    }
    int64_t rest = need;
    for (PageId p : fresh) {
      rest -= ledger_.CommitMap(p, BlockCount(rest), owner, &taken).value();
    }
    const std::string id = reserve ? Name() : "";
    reference::MOutcome want = model_->CommitAcquire(f, id);
    std::vector<BlockId> got = taken.Ids();
    std::sort(got.begin(), got.end());
    return got == want.ids && rest == 0
               ? "acquire " + std::to_string(n) + " in flight, committed"
               : "MISMATCH committed ids";
  }

  std::string FreeSome() {
    std::vector<int64_t> owned = model_->AllocatedIds();
    std::vector<BlockId> ids;
    for (int64_t b : owned) {
      if (Uniform(0, 1)) ids.push_back(b);
    }
    // Reservations go back whole, as ReleaseReservation returns them.
    std::string released;
    if (ids.empty() && !model_->reservations().empty()) {
      released = model_->reservations().begin()->first;
      ids = model_->reservations().begin()->second;
    }
    std::sort(ids.begin(), ids.end());
    // Half the time as runs (a Free named by runs alone), which must agree.
    PageIds emptied;
    if (Uniform(0, 1)) {
      Stretches runs;
      runs.AppendIds(ids);
      const BlockRuns pairs = runs.AscendingRuns();
      emptied = ledger_.ReturnRuns(pairs);
    } else {
      emptied = ledger_.ReturnBlocks(ids);
    }
    for (PageId p : emptied) {
      if (ledger_.idle_pages_listed().value() < max_idle_) {
        ledger_.KeepIdle(p);
      } else {
        ledger_.BeginUnmap(p, Landing::kFreeBack);
        ledger_.FinishUnmap(p);
      }
    }
    if (released.empty()) {
      model_->Free(ids);
    } else {
      model_->Release(released);
    }
    return "free " + std::to_string(ids.size());
  }

  std::string Trim() {
    const int64_t max = Uniform(0, 2);
    int64_t n = 0;
    std::vector<PageId> going;
    while (ledger_.idle_pages_listed().value() > 0 && (max <= 0 || n < max)) {
      going.push_back(ledger_.idle_list().front());
      ledger_.BeginUnmap(going.back(), Landing::kFreeBack);
      ++n;
    }
    for (PageId p : going) ledger_.FinishUnmap(p);
    return model_->Trim(max) == n ? "trim" : "MISMATCH trim count";
  }

  std::string Prealloc() {
    const bool ledger_maps = ledger_.idle_pages_listed().value() < min_idle_ &&
                             ledger_.free_pages().value() > 0;
    if (ledger_maps) MapIdle(ledger_, 1);
    return model_->PreallocStep() == ledger_maps ? "prealloc"
                                                 : "MISMATCH prealloc";
  }

  std::string Name() { return "r" + std::to_string(next_++); }

  std::string Compare() {
    std::ostringstream err;
    if (std::string e = ledger_.Check(); !e.empty()) err << "ledger: " << e;
    if (std::string e = model_->SelfCheck(); !e.empty()) err << "model: " << e;
    const ReferenceModel& m = *model_;
    for (PageId p = 0; p < m.page_count(); ++p) {
      const PageState s = ledger_.page(p).state;
      const MPage ms = m.page_state(p);
      const bool same = (ms == MPage::kFree && s == PageState::kFree) ||
                        (ms == MPage::kIdle && s == PageState::kIdle) ||
                        (ms == MPage::kOpen && s == PageState::kOpen) ||
                        (ms == MPage::kFull && s == PageState::kFull) ||
                        (ms == MPage::kEmpty && s == PageState::kEmpty) ||
                        (ms == MPage::kMapping && s == PageState::kMapping);
      if (!same) {
        err << "page " << p << ": ledger " << PageStateName(s) << " model "
            << reference::MPageName(ms) << "; ";
      }
    }
    const int64_t available = ledger_.mapped_supply().value() +
                              ledger_.FreePrefix(ledger_.free_pages()).value();
    if (available != m.AvailableBlocks()) {
      err << "available " << available << " vs " << m.AvailableBlocks() << "; ";
    }
    if (ledger_.allocated().value() != m.AllocatedBlocks())
      err << "allocated; ";
    if (ledger_.reserved().value() != m.ReservedBlocks()) err << "reserved; ";
    if (ledger_.mapped_pages().value() != m.MappedPages()) err << "mapped; ";
    if (IdleOrder(ledger_) !=
        std::vector<PageId>(m.idle_list().begin(), m.idle_list().end())) {
      err << "IDLE order; ";
    }
    if (FreeOrder(ledger_) !=
        std::vector<PageId>(m.free_list().begin(), m.free_list().end())) {
      err << "FREE order; ";
    }
    for (BlockId b = 0; b < geometry_.max_blocks(); ++b) {
      const BlockOwner o = ledger_.owner(b);
      const MBlock mb = m.block_state(b);
      const bool owned_same =
          (o == BlockOwner::kAllocated) == (mb == MBlock::kAllocated) &&
          (o == BlockOwner::kReserved) == (mb == MBlock::kReserved);
      if (!owned_same) {
        err << "block " << b << " owner; ";
        break;
      }
    }
    return err.str();
  }

  std::mt19937_64 rng_;
  const Geometry geometry_;
  PageLedger ledger_;
  const int64_t max_idle_;
  const int64_t min_idle_;
  std::unique_ptr<ReferenceModel> model_;
  std::ostringstream log_;
  int next_ = 1;
};

TEST(PageLedgerTest, RandomWalksAgreeWithTheReferenceModel) {
  struct Shape {
    Bytes page, block;
    int64_t n;
  };
  const Shape shapes[] = {
      {MiB(2), KiB(512), 64},   // 4 per page
      {MiB(14), MiB(6), 40},    // straddling blocks
      {MiB(2), KiB(16), 2000},  // 128 per page: whole bitmap words
      {MiB(4), KiB(1536), 90},  // 2 or 3 per page
  };
  int run = 0;
  for (const Shape& s : shapes) {
    for (uint64_t seed = 1; seed <= 15; ++seed, ++run) {
      LedgerWalk walk(seed * 7919 + run, s.page, s.block, s.n,
                      /*max_idle=*/seed % 3, /*min_idle=*/seed % 2);
      const std::string err = walk.Run(150);
      ASSERT_EQ(err, "") << "shape " << run / 15 << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace kvbroker
