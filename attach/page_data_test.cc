// Engines use the memory they hold: an in-process daemon (Broker and
// AttachServer) and test engines exec'd as separate processes. What one
// engine writes into its blocks, the daemon reads through its own mapping and
// a second engine through its own, while other pages are mapped and unmapped
// around them; every exported fd is closed once the pages are gone.
//
// The daemon runs on host memory with two devices by default, and on the GPUs
// with KVB_TEST_BACKEND=cuda (the same binary; up to two devices, one on a
// one-GPU machine). The engines and the daemon's reads then copy block bytes
// with the driver (engine/testing/device_copy.h, TestBackend::Read).

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/broker.h"
#include "allocator/failure.h"
#include "allocator/testing/test_backend.h"
#include "attach/attach_server.h"
#include "attach/testing/child_process.h"
#include "attach/testing/fd_count.h"
#include "engine/testing/pattern.h"
#include "gtest/gtest.h"
#include "server/metrics.h"

namespace kvbroker::attach {
namespace {

using ::kvbroker::testing::ChildProcess;
using ::kvbroker::testing::CountOpenFds;
using ::kvbroker::testing::Runfile;
using ::kvbroker::testing_support::TestBackend;

// P = 2 MiB, B = 256 KiB, L = 2, K = 2 on devices {0, 1} (or {0} on a
// one-GPU machine), N = 40: 8 blocks per page, T = 5 pages of 8 MiB bundles.
// No IDLE pages are kept: a page emptied is unmapped at once.
PoolConfig Config(int devices) {
  PoolConfig c;
  c.name = "kv";
  c.page_size = MiB(2);
  c.block_bytes = KiB(256);
  c.num_layers = 2;
  c.num_kv_buffers = 2;
  c.devices.clear();
  for (int d = 0; d < devices; ++d) c.devices.push_back(d);
  c.max_blocks = 40;
  c.tokens_per_block = 16;
  return c;
}

std::vector<int64_t> Ids(const std::string& line) {
  std::vector<int64_t> ids;
  std::vector<std::string> words = absl::StrSplit(line, ' ');
  for (size_t i = 1; i < words.size(); ++i) {
    int64_t b;
    if (absl::SimpleAtoi(words[i], &b)) ids.push_back(b);
  }
  return ids;
}

class PageDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    // Two devices on the host; on CUDA those the machine has, up to two.
    backend_ = TestBackend::Make(TestBackend::Kind() == "cuda" ? 1 : 2, &why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    devices_ = std::min(2, backend_->backend()->device_count());
    if (TestBackend::Kind() == "cuda") WarmDriver();
    BrokerOptions bo;
    bo.start_worker = false;
    bo.min_idle_pages = 0;
    bo.max_idle_pages = 0;
    bo.clock = &clock_;
    bo.revoke_timeout = absl::Seconds(10);
    broker_ = *Broker::Create(backend_->backend(), bo);
    pool_ = *broker_->CreatePool(Config(devices_));
    char dir[] = "/tmp/kvb-data-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    AttachServerOptions o;
    o.socket_path = dir_ + "/attach.sock";
    o.reap_interval = absl::Milliseconds(5);
    absl::StatusOr<std::unique_ptr<AttachServer>> s =
        AttachServer::Start(broker_.get(), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    rmdir(dir_.c_str());
  }

  std::unique_ptr<ChildProcess> Engine(const std::string& holder,
                                       int64_t grace_ms = 0,
                                       const std::string& pool = "kv") {
    // KVB_TEST_ENGINE names the binary outside Bazel (tools/gpu-run).
    const char* path = std::getenv("KVB_TEST_ENGINE");
    return std::make_unique<ChildProcess>(
        path != nullptr ? std::string(path) : Runfile("engine/test_engine"),
        std::vector<std::string>{
            absl::StrCat("--socket=", server_->socket_path()),
            absl::StrCat("--holder=", holder), absl::StrCat("--pool=", pool),
            absl::StrCat("--grace_ms=", grace_ms)});
  }

  // Sends `command` and returns the engine's answer.
  static std::string Ask(ChildProcess& engine, const std::string& command) {
    EXPECT_TRUE(engine.WriteLine(command));
    return engine.ReadLine();
  }

  // The driver opens descriptors of its own at the first export in a
  // process; one handle exported and released before any baseline is taken
  // keeps them out of the fd counts.
  void WarmDriver() {
    Backend* b = backend_->backend();
    absl::StatusOr<PhysicalHandle> h = b->Create(0, b->granularity(0));
    ASSERT_TRUE(h.ok()) << h.status();
    absl::StatusOr<int> fd = b->ExportHandle(0, *h);
    if (fd.ok()) close(*fd);
    ASSERT_TRUE(b->Release(0, *h).ok());
    ASSERT_TRUE(fd.ok()) << fd.status();
  }

  // Words of `blocks` that differ from pattern `seed`, read through the
  // daemon's own mapping of the pool (a failed read counts every word).
  int64_t DaemonMismatches(uint64_t seed, const std::vector<int64_t>& blocks) {
    const Geometry& g = pool_->geometry();
    const PoolConfig& c = g.config();
    std::vector<char> region(c.block_bytes.value());
    int64_t bad = 0;
    for (int i = 0; i < g.device_count(); ++i) {
      for (int64_t b : blocks) {
        for (int64_t l = 0; l < c.num_layers; ++l) {
          for (int64_t k = 0; k < c.num_kv_buffers; ++k) {
            const uint64_t addr =
                pool_->range_base(i) + b * g.block_stride().value() +
                (l * c.num_kv_buffers + k) * c.block_bytes.value();
            if (!backend_->Read(i, region.data(), addr, region.size()).ok()) {
              bad += c.block_bytes.value() / 8;
              continue;
            }
            bad += kvbroker::testing::PatternMismatches(
                region.data(), c.block_bytes.value(), seed, i, b, l, k);
          }
        }
      }
    }
    return bad;
  }

  int64_t Allocated() { return pool_->Capacity()->allocated_blocks.value(); }
  int64_t Mapped() {
    const CapacitySnapshot c = *pool_->Capacity();
    return (c.pages_idle + c.pages_open + c.pages_full).value();
  }

  // Maps and unmaps pages around the engines' blocks: a caller without a
  // session (holder "") takes every available block, then frees them.
  void ChurnPages() {
    const int64_t available = pool_->Capacity()->available_blocks.value();
    AllocRequest a;
    a.num_blocks = available;
    absl::StatusOr<AllocResult> got = pool_->Alloc(a);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<BlockId> ids;
    for (const PageBlocks& p : got->pages) {
      ids.insert(ids.end(), p.block_ids.begin(), p.block_ids.end());
    }
    FreeRequest f;
    f.block_ids = ids;
    ASSERT_TRUE(pool_->Free(f).ok());
  }

  template <typename Pred>
  void Eventually(Pred pred) {
    while (!pred()) absl::SleepFor(absl::Milliseconds(1));
  }

  // Round trips that let each engine handle what the daemon sent it
  // (revocations are acknowledged), then waits until no page is left
  // waiting for an acknowledgement.
  void Settle(std::initializer_list<ChildProcess*> engines) {
    for (ChildProcess* e : engines) {
      EXPECT_TRUE(absl::StartsWith(Ask(*e, "sync"), "synced"));
    }
    // The last answer unmaps the page on the thread that delivered it; the
    // page is in flight (MAPPING) until that unmap lands.
    Eventually([&] {
      const CapacitySnapshot c = *pool_->Capacity();
      return (c.pages_revoking + c.pages_quarantined + c.pages_mapping)
                 .value() == 0;
    });
  }

  ManualClock clock_;
  std::unique_ptr<TestBackend> backend_;
  int devices_ = 0;
  std::unique_ptr<Broker> broker_;
  std::shared_ptr<PagePool> pool_;
  std::unique_ptr<AttachServer> server_;
  std::string dir_;
};

TEST_F(PageDataTest, WritesOfOneEngineReadByTheDaemonAndAnotherEngine) {
  const int baseline = *CountOpenFds();

  auto a = Engine("engine-a");
  ASSERT_EQ(a->ReadUntil("attached"),
            "attached session=1 reattached=0 held=0 pages=0");
  // 12 blocks: page 0 whole, page 1 half; announced before the reply.
  const std::string a_line = Ask(*a, "alloc 12");
  const std::vector<int64_t> a_ids = Ids(a_line);
  ASSERT_EQ(a_ids.size(), 12u) << a_line;
  EXPECT_EQ(pool_->announced_pages(), 2);
  EXPECT_EQ(Ask(*a, "write 11 " + absl::StrJoin(a_ids, " ")), "wrote 12 bad 0");
  EXPECT_EQ(DaemonMismatches(11, a_ids), 0);

  // Pages mapped and unmapped while only A is attached: A is told of each,
  // then asked to let them go.
  ChurnPages();
  Settle({a.get()});
  EXPECT_EQ(Mapped(), 2);

  auto b = Engine("engine-b");
  // B's snapshot: the two pages mapped now.
  ASSERT_EQ(b->ReadUntil("attached"),
            "attached session=2 reattached=0 held=0 pages=2");
  EXPECT_EQ(Ask(*b, "check 11 " + absl::StrJoin(a_ids, " ")),
            "checked 12 bad 0");

  // B takes page 1's last 4 blocks and 4 of a new page 2, and writes them.
  const std::vector<int64_t> b_ids = Ids(Ask(*b, "alloc 8"));
  ASSERT_EQ(b_ids.size(), 8u);
  EXPECT_EQ(Ask(*b, "write 22 " + absl::StrJoin(b_ids, " ")), "wrote 8 bad 0");
  EXPECT_EQ(DaemonMismatches(22, b_ids), 0);
  // A learnt of page 2 while idle; a round trip maps it.
  EXPECT_EQ(Ask(*a, "sync"), "synced pages=3");
  EXPECT_EQ(Ask(*a, "check 22 " + absl::StrJoin(b_ids, " ")),
            "checked 8 bad 0");

  // Pages 3 and 4 are mapped and unmapped around them, three times.
  for (int i = 0; i < 3; ++i) {
    ChurnPages();
    Settle({a.get(), b.get()});
  }
  EXPECT_EQ(Mapped(), 3);
  EXPECT_EQ(Ask(*a, "sync"), "synced pages=3");
  EXPECT_EQ(Ask(*b, "sync"), "synced pages=3");
  EXPECT_EQ(Ask(*a, "check 11 " + absl::StrJoin(a_ids, " ")),
            "checked 12 bad 0");
  EXPECT_EQ(Ask(*b, "check 22 " + absl::StrJoin(b_ids, " ")),
            "checked 8 bad 0");
  EXPECT_EQ(Ask(*b, "check 11 " + absl::StrJoin(a_ids, " ")),
            "checked 12 bad 0");
  EXPECT_EQ(DaemonMismatches(11, a_ids), 0);
  EXPECT_EQ(DaemonMismatches(22, b_ids), 0);

  // Both end; their blocks and pages go, and so does every exported fd.
  EXPECT_TRUE(a->WriteLine("end release"));
  EXPECT_TRUE(b->WriteLine("end release"));
  EXPECT_EQ(a->Wait(), 0);
  EXPECT_EQ(b->Wait(), 0);
  Eventually([&] { return Allocated() == 0 && server_->Sessions().empty(); });
  EXPECT_EQ(Mapped(), 0);
  EXPECT_EQ(pool_->announced_pages(), 0);
  a.reset();  // the pipes to the engines
  b.reset();
  // Ended sessions are destroyed by the server's accept loop.
  for (int i = 0; i < 20000 && *CountOpenFds() != baseline; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(*CountOpenFds(), baseline);
}

TEST_F(PageDataTest, KilledEngineFreesItsBlocksAndTheNextHolderReadsZeros) {
  // A pool that keeps emptied pages mapped (IDLE), so blocks are reused.
  PoolConfig c = Config(devices_);
  c.name = "warm";
  c.max_idle_pages = 5;
  pool_ = *broker_->CreatePool(c);

  auto a = Engine("engine-a", 0, "warm");
  ASSERT_TRUE(absl::StartsWith(a->ReadUntil("attached"), "attached"));
  const std::vector<int64_t> a_ids = Ids(Ask(*a, "alloc 8"));  // page 0
  ASSERT_EQ(a_ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Ask(*a, "write 33 0 1 2 3 4 5 6 7"), "wrote 8 bad 0");
  a->Kill(SIGKILL);
  // No grace: the session's end frees the blocks; the page stays mapped
  // with A's bytes in it.
  Eventually([&] { return Allocated() == 0; });
  EXPECT_EQ(Mapped(), 1);
  EXPECT_EQ(DaemonMismatches(33, a_ids), 0);

  // R takes half of page 0 (zeroed for it), writes, dies, and comes back
  // within its grace: its blocks and bytes are still its own.
  auto r = Engine("engine-r", 600000, "warm");
  ASSERT_TRUE(absl::StartsWith(r->ReadUntil("attached"), "attached"));
  EXPECT_EQ(Ask(*r, "alloc 4"), "blocks 0 1 2 3");
  EXPECT_EQ(Ask(*r, "check 0 0 1 2 3"), "checked 4 bad 0");
  EXPECT_EQ(Ask(*r, "write 44 0 1 2 3"), "wrote 4 bad 0");
  r->Kill(SIGKILL);
  std::unique_ptr<ChildProcess> again;
  std::string line;
  for (int i = 0; i < 2000; ++i) {
    again = Engine("engine-r", 600000, "warm");
    line = again->ReadUntil("");
    if (!absl::StrContains(line, "HOLDER_BUSY")) break;
    again->Wait();
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(absl::StartsWith(line, "attached ")) << line;
  EXPECT_TRUE(absl::EndsWith(line, " reattached=1 held=4 pages=1")) << line;
  EXPECT_EQ(Ask(*again, "check 44 0 1 2 3"), "checked 4 bad 0");
  EXPECT_EQ(Allocated(), 4);

  // B gets the rest of page 0, which held A's blocks: zeros, on both
  // devices, in B's mapping and in the daemon's.
  auto b = Engine("engine-b", 0, "warm");
  ASSERT_TRUE(absl::StartsWith(b->ReadUntil("attached"), "attached"));
  EXPECT_EQ(Ask(*b, "alloc 4"), "blocks 4 5 6 7");
  EXPECT_EQ(Ask(*b, "check 0 4 5 6 7"), "checked 4 bad 0");
  EXPECT_EQ(DaemonMismatches(0, {4, 5, 6, 7}), 0);
  EXPECT_EQ(DaemonMismatches(44, {0, 1, 2, 3}), 0);
  EXPECT_EQ(pool_->Stats().blocks_zeroed_total, 8);
}

TEST_F(PageDataTest, RevocationRoundTripAndQuarantine) {
  const int baseline = *CountOpenFds();
  auto a = Engine("engine-a");
  ASSERT_TRUE(absl::StartsWith(a->ReadUntil("attached"), "attached"));
  auto b = Engine("engine-b");
  ASSERT_TRUE(absl::StartsWith(b->ReadUntil("attached"), "attached"));

  // A's own Free revokes the page it emptied; the Revoke reaches A before
  // the Free's reply, A unmaps and acknowledges, the page goes FREE.
  EXPECT_EQ(Ask(*a, "alloc 8"), "blocks 0 1 2 3 4 5 6 7");
  EXPECT_EQ(Ask(*a, "free 0 1 2 3 4 5 6 7"), "freed 8");
  EXPECT_EQ(Ask(*a, "sync"), "synced pages=0");
  // B, idle, has the page mapped too: until it answers, the page waits.
  CapacitySnapshot c = *pool_->Capacity();
  EXPECT_EQ(c.pages_revoking.value(), 1);
  EXPECT_EQ(c.available_blocks.value(), 32);
  Settle({b.get()});
  c = *pool_->Capacity();
  EXPECT_EQ(c.pages_free.value(), 5);
  EXPECT_EQ(c.available_blocks.value(), 40);

  // Twice more, B does not answer in time: the page is QUARANTINED (out of
  // capacity, visible per pool and per session) until B acknowledges late,
  // then until B is killed.
  for (const char* how : {"late ack", "kill -9"}) {
    SCOPED_TRACE(how);
    const std::vector<int64_t> ids = Ids(Ask(*a, "alloc 8"));
    ASSERT_EQ(ids.size(), 8u);
    EXPECT_TRUE(absl::StartsWith(Ask(*a, "free " + absl::StrJoin(ids, " ")),
                                 "freed 8"));
    // A has acknowledged (the daemon reads it after the Free's reply).
    Eventually([&] {
      for (const SessionInfo& s : server_->Sessions()) {
        if (s.holder == "engine-a" && s.pending_revocations != 0) return false;
      }
      return true;
    });
    EXPECT_EQ(pool_->pending_revocations(), 1);
    clock_.Advance(absl::Seconds(11));
    c = *pool_->Capacity();
    EXPECT_EQ(c.pages_revoking.value(), 0);
    EXPECT_EQ(c.pages_quarantined.value(), 1);
    EXPECT_TRUE(absl::StrContains(
        RenderMetrics(*broker_),
        "kvbroker_pool_pages{pool=\"kv\",state=\"quarantined\"} 1\n"));
    EXPECT_EQ(c.pages_free.value(), 4);
    EXPECT_EQ(c.available_blocks.value(), 32);
    EXPECT_TRUE(pool_->CheckInvariants().ok());
    for (const SessionInfo& s : server_->Sessions()) {
      EXPECT_EQ(s.quarantined_pages, s.holder == "engine-b" ? 1 : 0);
      EXPECT_EQ(s.pending_revocations, s.holder == "engine-b" ? 1 : 0);
    }
    if (std::string(how) == "late ack") {
      Settle({b.get()});
    } else {
      b->Kill(SIGKILL);
      Eventually([&] { return server_->Sessions().size() == 1; });
      Settle({});
    }
    c = *pool_->Capacity();
    EXPECT_EQ(c.pages_quarantined.value(), 0);
    EXPECT_EQ(c.pages_free.value(), 5);
    EXPECT_EQ(c.available_blocks.value(), 40);
  }

  EXPECT_TRUE(a->WriteLine("end release"));
  EXPECT_EQ(a->Wait(), 0);
  a.reset();
  b.reset();
  Eventually([&] { return server_->Sessions().empty(); });
  for (int i = 0; i < 20000 && *CountOpenFds() != baseline; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(*CountOpenFds(), baseline);
}

TEST_F(PageDataTest, ForcedDeleteRevokesEveryPageThenEndsTheSessions) {
  const int baseline = *CountOpenFds();
  auto a = Engine("engine-a");
  ASSERT_TRUE(absl::StartsWith(a->ReadUntil("attached"), "attached"));
  auto b = Engine("engine-b", 600000);
  ASSERT_TRUE(absl::StartsWith(b->ReadUntil("attached"), "attached"));
  const std::vector<int64_t> a_ids = Ids(Ask(*a, "alloc 12"));  // pages 0, 1
  ASSERT_EQ(a_ids.size(), 12u);
  EXPECT_EQ(Ask(*a, "write 55 " + absl::StrJoin(a_ids, " ")), "wrote 12 bad 0");
  EXPECT_EQ(Ask(*b, "sync"), "synced pages=2");
  const int64_t handles = 2 * devices_;

  // Without force: refused while blocks are allocated; nothing changes.
  EXPECT_EQ(GetReason(broker_->DeletePool("kv", /*force=*/false)),
            FailureReason::kPoolNotEmpty);
  EXPECT_EQ(Ask(*a, "check 55 " + absl::StrJoin(a_ids, " ")),
            "checked 12 bad 0");

  // Forced: both engines are asked to let go of both pages; the daemon
  // unmaps nothing they still map.
  ASSERT_TRUE(broker_->DeletePool("kv", /*force=*/true).ok());
  EXPECT_EQ(pool_->backend_handles(), handles);
  // A handles the Revoke, acknowledges, then reads the SessionEnd: the
  // daemon's typed reason.
  EXPECT_TRUE(absl::StartsWith(Ask(*a, "sync"), "error POOL_NOT_FOUND "));
  EXPECT_EQ(Ask(*a, "pages"), "pages 0 end_reason POOL_DELETED");
  Eventually([&] { return server_->Sessions().size() == 1; });
  // B, idle, still maps them: held, past the deadline quarantined.
  EXPECT_EQ(pool_->backend_handles(), handles);
  EXPECT_EQ(server_->Sessions()[0].pending_revocations, 1);
  clock_.Advance(absl::Seconds(11));
  // Then B's session ends without it (its holder too, despite the grace),
  // and the pages go.
  Eventually([&] { return server_->Sessions().empty(); });
  EXPECT_EQ(pool_->backend_handles(), 0);
  EXPECT_TRUE(server_->Holders().empty());
  // B finds the Revoke and the SessionEnd waiting.
  const std::string b_sync = Ask(*b, "sync");
  EXPECT_TRUE(absl::StartsWith(b_sync, "error POOL_NOT_FOUND ")) << b_sync;
  EXPECT_EQ(Ask(*b, "pages"), "pages 0 end_reason POOL_DELETED");

  EXPECT_TRUE(a->WriteLine("end release"));
  EXPECT_TRUE(b->WriteLine("end release"));
  EXPECT_EQ(a->Wait(), 0);
  EXPECT_EQ(b->Wait(), 0);
  a.reset();
  b.reset();
  pool_.reset();
  for (int i = 0; i < 20000 && *CountOpenFds() != baseline; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(*CountOpenFds(), baseline);
}

}  // namespace
}  // namespace kvbroker::attach
