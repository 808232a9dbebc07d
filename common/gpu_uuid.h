// FormatGpuUuid: a GPU's 16-byte UUID as the driver reports it (CUuuid),
// in the form nvidia-smi and NVIDIA_VISIBLE_DEVICES use:
// "GPU-" and 8-4-4-4-12 lowercase hex digits. The daemon names devices by
// it and an engine finds the device a pool names by it, so both ends must
// spell it alike.

#ifndef KVBROKER_COMMON_GPU_UUID_H_
#define KVBROKER_COMMON_GPU_UUID_H_

#include <string>

namespace kvbroker {

inline constexpr int kGpuUuidBytes = 16;

std::string FormatGpuUuid(const char (&bytes)[kGpuUuidBytes]);

}  // namespace kvbroker

#endif  // KVBROKER_COMMON_GPU_UUID_H_
