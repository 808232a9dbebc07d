// FormatGpuUuid.

#include "common/gpu_uuid.h"

#include "absl/strings/str_cat.h"

namespace kvbroker {

std::string FormatGpuUuid(const char (&bytes)[kGpuUuidBytes]) {
  std::string out = "GPU-";
  out.reserve(4 + 2 * kGpuUuidBytes + 4);
  for (int i = 0; i < kGpuUuidBytes; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(
        &out, absl::Hex(static_cast<unsigned char>(bytes[i]), absl::kZeroPad2));
  }
  return out;
}

}  // namespace kvbroker
