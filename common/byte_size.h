// Byte sizes as people type and read them: kvbrokerctl's arguments and
// kvbrokerd's size flags.
//
// ParseSize accepts a non-negative number, optionally with a fraction, and an
// optional unit (case-insensitive, spaces allowed between number and unit):
//   bytes     "4096", "4096B"
//   KiB       "512K", "512KB", "512KiB", "512Ki"
//   MiB       "14M",  "14MB",  "14MiB",  "14Mi"
//   GiB       "2G",   "2GB",   "2GiB",   "2Gi"
//   TiB, PiB  "1T" ... "1Pi" likewise
// Every unit is binary (powers of 1024), "GB" included, exactly as
// kvbrokerd's own size flags read them, so one string means one size
// everywhere in kvbroker. A fraction must come
// out to whole bytes: "1.5MiB" is 1572864, "0.3B" is an error.
//
// FormatBytes prints the value in the largest binary unit it is a whole
// multiple of ("14MiB", "1536KiB", "512B"); a value of at least 1 KiB that is
// no whole multiple of 1 KiB gets two decimals in the largest unit not above
// it ("4.00KiB" for 4097, "1.02GiB"). ParseSize(FormatBytes(x)) == x whenever
// the output has no decimals.
//
// Thread safety: pure functions.

#ifndef KVBROKER_COMMON_BYTE_SIZE_H_
#define KVBROKER_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvbroker {

// Errors: INVALID_ARGUMENT for an empty or malformed size, an unknown unit,
// a fraction of a byte, or a value above INT64_MAX.
absl::StatusOr<int64_t> ParseSize(absl::string_view text);

// Human form of a byte count (negative values keep their sign).
std::string FormatBytes(int64_t bytes);

}  // namespace kvbroker

#endif  // KVBROKER_COMMON_BYTE_SIZE_H_
