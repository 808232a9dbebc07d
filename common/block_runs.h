// Block runs: a list of block ids written as pairs (first, count), each
// naming first .. first + count - 1 (kvbroker.v1 AllocResponse.block_runs
// and FreeRequest.block_runs). An Alloc of whole pages is one pair instead
// of a varint per block and a message per page, which is what the engine's
// hot path and the daemon's spend most on for large calls
// (bench/RESULTS.md, "Block runs on the session"). The daemon reads a
// caller's runs with CheckBlockRuns and refuses what it rejects
// (server/proto_convert.h, FromProto of a FreeRequest), passing valid runs
// on to the pool unexpanded; the engine reads the daemon's with
// WriteBlockRuns.
#ifndef KVBROKER_COMMON_BLOCK_RUNS_H_
#define KVBROKER_COMMON_BLOCK_RUNS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/consecutive_ids.h"
#include "google/protobuf/repeated_field.h"

namespace kvbroker {

using BlockRunList = google::protobuf::RepeatedField<int64_t>;

// Appends the run first .. first + count - 1 (count >= 1) to `*runs`,
// extending the last pair instead when the run continues it.
inline void AppendBlockRun(int64_t first, int64_t count, BlockRunList* runs) {
  const int n = runs->size();
  if (n >= 2 &&
      (*runs)[n - 2] <= std::numeric_limits<int64_t>::max() - (*runs)[n - 1] &&
      (*runs)[n - 2] + (*runs)[n - 1] == first) {
    runs->Set(n - 1, (*runs)[n - 1] + count);
    return;
  }
  runs->Add(first);
  runs->Add(count);
}

// Appends `ids`, in the order given, one pair per stretch of consecutive
// ids (merged with the last pair already there when it continues it):
// expanding the pairs gives the ids back exactly.
inline void AppendBlockRuns(absl::Span<const int64_t> ids, BlockRunList* runs) {
  for (size_t i = 0; i < ids.size();) {
    const size_t end = ConsecutiveEnd(ids, i);
    AppendBlockRun(ids[i], static_cast<int64_t>(end - i), runs);
    i = end;
  }
}

// AppendBlockRuns into an empty `*runs` when the pairs take fewer values
// than the ids themselves (a caller's choice between FreeRequest's
// block_runs and block_ids): true then; otherwise false and `*runs` empty.
// One pass, given up as soon as the pairs reach the ids' length.
inline bool BlockRunsIfShorter(absl::Span<const int64_t> ids,
                               BlockRunList* runs) {
  runs->Clear();
  for (size_t i = 0; i < ids.size();) {
    const size_t end = ConsecutiveEnd(ids, i);
    AppendBlockRun(ids[i], static_cast<int64_t>(end - i), runs);
    if (static_cast<size_t>(runs->size()) >= ids.size()) {
      runs->Clear();
      return false;
    }
    i = end;
  }
  return !ids.empty();
}

// Whether `runs` can name ids: INVALID_ARGUMENT for an odd number of
// values, a count below 1, a run past the largest int64, or more than
// `max_ids` ids in all (`already` of them named elsewhere in the call).
// Sets `*total` to the ids the runs name. Which ids are blocks of a pool is
// the pool's to say, as for listed ids.
inline absl::Status CheckBlockRuns(absl::Span<const int64_t> runs,
                                   int64_t max_ids, int64_t already,
                                   int64_t* total) {
  if (runs.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(runs.size(), " values do not make (first, count) pairs"));
  }
  int64_t sum = already;
  for (size_t i = 0; i < runs.size(); i += 2) {
    const int64_t first = runs[i], count = runs[i + 1];
    if (count < 1 ||
        first > std::numeric_limits<int64_t>::max() - (count - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run (", first, ", ", count, ") names no ids or ids past 2^63 - 1"));
    }
    if (count > max_ids - sum) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", max_ids, " blocks in one call"));
    }
    sum += count;
  }
  *total = sum - already;
  return absl::OkStatus();
}

// Writes the ids of runs CheckBlockRuns accepted to `out`, in order.
// REQUIRES: `out` has room for them.
inline void WriteCheckedBlockRuns(absl::Span<const int64_t> runs,
                                  int64_t* out) {
  for (size_t i = 0; i < runs.size(); i += 2) {
    WriteConsecutive(out, runs[i], runs[i + 1]);
    out += runs[i + 1];
  }
}

// Appends the ids `runs` names to `*ids`; refuses as CheckBlockRuns does
// (counting the ids already in `*ids`), with `*ids` unchanged.
inline absl::Status ExpandBlockRuns(absl::Span<const int64_t> runs,
                                    int64_t max_ids,
                                    std::vector<int64_t>* ids) {
  const int64_t before = static_cast<int64_t>(ids->size());
  int64_t named = 0;
  if (absl::Status s = CheckBlockRuns(runs, max_ids, before, &named);
      !s.ok()) {
    return s;
  }
  ids->resize(static_cast<size_t>(before + named));
  WriteCheckedBlockRuns(runs, ids->data() + before);
  return absl::OkStatus();
}

// Writes the ids `runs` names to the front of `out` and adds their number
// to `*written`; refuses as CheckBlockRuns does, with at most `out.size()`
// ids allowed, having written nothing.
inline absl::Status WriteBlockRuns(absl::Span<const int64_t> runs,
                                   absl::Span<int64_t> out, size_t* written) {
  int64_t named = 0;
  if (absl::Status s = CheckBlockRuns(
          runs, static_cast<int64_t>(out.size()), 0, &named);
      !s.ok()) {
    return s;
  }
  WriteCheckedBlockRuns(runs, out.data());
  *written += static_cast<size_t>(named);
  return absl::OkStatus();
}

}  // namespace kvbroker

#endif  // KVBROKER_COMMON_BLOCK_RUNS_H_
