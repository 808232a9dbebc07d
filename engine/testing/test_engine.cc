// test_engine: a stand-in inference engine for the attach tests, run as its
// own process. It connects to --socket, says hello as --holder, attaches to
// --pool and prints
//   attached session=<id> reattached=<0|1> held=<blocks> pages=<mapped>
// then answers commands read from stdin, one per line:
//   alloc N        -> "blocks ID..."         or "error REASON message"
//   free ID...     -> "freed N"              or "error REASON message"
//   capacity       -> "capacity AVAILABLE ALLOCATED"
//   sync           -> "synced pages=<mapped>" after a round trip, so every
//                     page the daemon announced before it has been mapped
//   pages          -> "pages <mapped> end_reason <SessionEndReason>" with no
//                     round trip
//   write SEED ID...  -> "wrote N bad M": the pattern (testing/pattern.h) of
//                     SEED into every device, layer and buffer of each block
//                     (M counts the words of blocks on pages not mapped here
//                     and of copies that failed)
//   check SEED ID...  -> "checked N bad M": M words differ from the pattern
//                     (SEED 0: from zeros); a block on a page this engine
//                     has not mapped counts as entirely bad
//   end [release]  -> ends the session and exits 0
// Block bytes move through testing/device_copy.h, so the same commands work
// on a pool on the CUDA backend (device memory) and on the host backend.
// Killing it (SIGKILL) is how tests model an engine that dies.

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/failure.h"
#include "attach/frame.h"
#include "engine/session.h"
#include "engine/testing/device_copy.h"
#include "engine/testing/pattern.h"

ABSL_FLAG(std::string, socket, "", "kvbrokerd's --attach_socket");
ABSL_FLAG(std::string, holder, "test-engine", "holder name");
ABSL_FLAG(std::string, token, "", "bearer token");
ABSL_FLAG(std::string, pool, "", "pool to attach to");
ABSL_FLAG(int64_t, grace_ms, 0, "reattach grace, milliseconds");

namespace kvbroker::engine {
namespace {

// Applies `fn(region, device_index, layer, buffer)` to every region of
// `block` the session maps; false when the block's page is not mapped.
template <typename Fn>
bool ForEachRegion(Session& s, int64_t block, Fn fn) {
  const auto& layout = s.layout();
  if (block < 0 || block >= layout.max_blocks()) return false;
  const int64_t page =
      block * layout.block_stride_bytes() / layout.bundle_bytes();
  if (!s.page_mapped(page)) return false;
  for (int i = 0; i < s.device_count(); ++i) {
    for (int64_t l = 0; l < layout.num_layers(); ++l) {
      for (int64_t k = 0; k < layout.num_kv_buffers(); ++k) {
        absl::StatusOr<uint64_t> a = s.BlockAddress(i, block, l, k);
        if (!a.ok()) return false;
        fn(reinterpret_cast<void*>(*a), i, l, k);
      }
    }
  }
  return true;
}

void PrintError(const absl::Status& s) {
  const FailureReason reason = GetReason(s);
  std::string name =
      reason != FailureReason::kUnspecified
          ? std::string(ReasonName(reason))
          : attach::v1::ProtocolError_Name(attach::ProtocolErrorOf(s));
  std::printf("error %s %s\n", name.c_str(), std::string(s.message()).c_str());
}

int Run() {
  ConnectOptions c;
  c.socket_path = absl::GetFlag(FLAGS_socket);
  c.holder = absl::GetFlag(FLAGS_holder);
  c.token = absl::GetFlag(FLAGS_token);
  c.reattach_grace = absl::Milliseconds(absl::GetFlag(FLAGS_grace_ms));
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Connect(c);
  if (!session.ok()) {
    PrintError(session.status());
    return 1;
  }
  AttachOptions a;
  a.pool = absl::GetFlag(FLAGS_pool);
  absl::StatusOr<attach::v1::AttachReply> reply = (*session)->Attach(a);
  if (!reply.ok()) {
    PrintError(reply.status());
    return 1;
  }
  int64_t held = 0;
  for (const auto& p : reply->held()) held += p.block_ids_size();
  std::printf("attached session=%lu reattached=%d held=%ld pages=%ld\n",
              static_cast<unsigned long>((*session)->hello().session_id()),
              (*session)->hello().reattached() ? 1 : 0, static_cast<long>(held),
              static_cast<long>((*session)->mapped_pages()));
  std::fflush(stdout);

  std::vector<std::string> uuids;
  for (const auto& d : (*session)->layout().devices()) uuids.push_back(d.uuid());
  absl::StatusOr<std::unique_ptr<testing::DeviceCopier>> copier =
      testing::DeviceCopier::Create((*session)->layout().backend(), uuids);
  if (!copier.ok()) {
    PrintError(copier.status());
    return 1;
  }
  std::vector<char> staging((*session)->layout().block_bytes());

  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    if (words[0] == "alloc" && words.size() == 2) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(words[1], &n)) n = -1;
      absl::StatusOr<std::vector<int64_t>> ids = (*session)->Alloc(n);
      if (ids.ok()) {
        std::printf("blocks %s\n", absl::StrJoin(*ids, " ").c_str());
      } else {
        PrintError(ids.status());
      }
    } else if (words[0] == "free") {
      std::vector<int64_t> ids;
      for (size_t i = 1; i < words.size(); ++i) {
        int64_t b = -1;
        if (absl::SimpleAtoi(words[i], &b)) ids.push_back(b);
      }
      auto r = (*session)->Free(ids);
      if (r.ok()) {
        std::printf("freed %ld\n", static_cast<long>(r->freed_blocks()));
      } else {
        PrintError(r.status());
      }
    } else if (words[0] == "capacity") {
      auto r = (*session)->Capacity();
      if (r.ok()) {
        std::printf("capacity %ld %ld\n",
                    static_cast<long>(r->capacity().available_blocks()),
                    static_cast<long>(r->capacity().allocated_blocks()));
      } else {
        PrintError(r.status());
      }
    } else if (words[0] == "pages") {
      std::printf("pages %ld end_reason %s\n",
                  static_cast<long>((*session)->mapped_pages()),
                  attach::v1::SessionEndReason_Name((*session)->end_reason())
                      .c_str());
    } else if (words[0] == "sync") {
      auto r = (*session)->Capacity();
      if (r.ok()) {
        std::printf("synced pages=%ld\n",
                    static_cast<long>((*session)->mapped_pages()));
      } else {
        PrintError(r.status());
      }
    } else if ((words[0] == "write" || words[0] == "check") &&
               words.size() >= 2) {
      uint64_t seed = 0;
      (void)absl::SimpleAtoi(words[1], &seed);
      const int64_t bytes = (*session)->layout().block_bytes();
      int64_t blocks = 0, bad = 0;
      for (size_t w = 2; w < words.size(); ++w) {
        int64_t b = -1;
        (void)absl::SimpleAtoi(words[w], &b);
        ++blocks;
        bool mapped;
        if (words[0] == "write") {
          mapped = ForEachRegion(
              **session, b, [&](void* r, int i, int64_t l, int64_t k) {
                testing::WritePattern(staging.data(), bytes, seed, i, b, l, k);
                if (!(*copier)
                         ->ToDevice(i, reinterpret_cast<uint64_t>(r),
                                    staging.data(), bytes)
                         .ok()) {
                  bad += bytes / 8;
                }
              });
        } else {
          mapped = ForEachRegion(
              **session, b, [&](void* r, int i, int64_t l, int64_t k) {
                if (!(*copier)
                         ->FromDevice(i, staging.data(),
                                      reinterpret_cast<uint64_t>(r), bytes)
                         .ok()) {
                  bad += bytes / 8;
                  return;
                }
                bad += testing::PatternMismatches(staging.data(), bytes, seed,
                                                  i, b, l, k);
              });
        }
        if (!mapped) bad += bytes / 8;
      }
      if (words[0] == "write") {
        std::printf("wrote %ld bad %ld\n", static_cast<long>(blocks),
                    static_cast<long>(bad));
      } else {
        std::printf("checked %ld bad %ld\n", static_cast<long>(blocks),
                    static_cast<long>(bad));
      }
    } else if (words[0] == "end") {
      const bool release = words.size() > 1 && words[1] == "release";
      absl::Status s = (*session)->Close(release);
      return s.ok() ? 0 : 1;
    } else {
      std::printf("error INVALID_COMMAND %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace kvbroker::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvbroker::engine::Run();
}
