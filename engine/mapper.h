// DeviceMapper: the engine's side of one device of an attached pool. It
// reserves a virtual range of the pool's size, maps page bundles received as
// POSIX fds at their offsets, makes them readable and writable, and unmaps
// them on revocation, so that the engine sees the daemon's layout (SPEC
// section 10) in its own address space.
//
// Implementations:
//   host  mmap(PROT_NONE) reserves; each bundle is mmap(MAP_FIXED |
//         MAP_SHARED) of the received memfd; unmapping puts an inaccessible
//         placeholder back so the range stays reserved.
//   cuda  the driver, dlopen()ed at run time (never linked): the device is
//         found by UUID (ordinals differ between processes under
//         CUDA_VISIBLE_DEVICES); cuMemAddressReserve, then per bundle
//         cuMemImportFromShareableHandle + cuMemMap, one cuMemSetAccess per
//         run of virtually adjacent bundles of a batch, and cuMemUnmap +
//         cuMemRelease on unmap.
//
// Batches: MapMany maps a whole PagesMapped frame's bundles: each is
// imported and mapped, then each run of bundles that lie back to back in the
// range (AdjacentRuns) is made accessible with one set-access call, falling
// back to one call per bundle of the run if that call fails. The host
// mapper does the same (mmap PROT_NONE, then one mprotect per run), so the
// batching is tested without a GPU. Map is MapMany of one bundle.
//
// Ownership: Map() and MapMany() consume the fds (closed once imported or
// mapped, whether or not the call succeeds). The mapper owns its range and
// every mapping; its destructor unmaps them all and frees the range.
//
// Thread safety: none; the engine Session serialises calls.

#ifndef KVBROKER_ENGINE_MAPPER_H_
#define KVBROKER_ENGINE_MAPPER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attach/unique_fd.h"

namespace kvbroker::engine {

// One bundle of a MapMany batch: its offset in the range and its fd.
struct BundleFd {
  int64_t offset = 0;
  UniqueFd fd;
};

// Where a mapper's time went, summed over every successful and failed
// mapping call since it was made. The host mapper has nothing to import
// (import stays zero); its map is mmap and its set access mprotect.
struct MapperStats {
  int64_t bundles = 0;       // bundles mapped
  int64_t access_calls = 0;  // set-access calls (one per run, fallbacks too)
  absl::Duration import;     // cuMemImportFromShareableHandle
  absl::Duration map;        // cuMemMap / mmap
  absl::Duration access;     // cuMemSetAccess / mprotect
};

// Runs of back-to-back bundles: `sorted_offsets` ascending, each bundle
// `bytes` long. Returns [begin, end) index ranges into `sorted_offsets`, in
// order, covering every index once; a run holds offsets o, o + bytes, ...
std::vector<std::pair<size_t, size_t>> AdjacentRuns(
    absl::Span<const int64_t> sorted_offsets, int64_t bytes);

class DeviceMapper {
 public:
  virtual ~DeviceMapper() = default;

  // Base address of the reserved range (aligned to the bundle granularity).
  virtual uint64_t base() const = 0;
  virtual int64_t size() const = 0;
  // Maps `fd` (one whole bundle of `bytes`) at base() + offset and makes it
  // readable and writable. FAILED_PRECONDITION when something is already
  // mapped there; INVALID_ARGUMENT outside the range.
  absl::Status Map(int64_t offset, int64_t bytes, UniqueFd fd);
  // Maps every bundle of `bundles` (each one whole bundle of `bytes`) as one
  // batch (file comment), all or nothing: on any error the bundles this call
  // mapped are unmapped again. Checked before anything is mapped:
  // INVALID_ARGUMENT for a bundle outside the range or two that overlap,
  // FAILED_PRECONDITION for an offset already mapped. Consumes every fd.
  virtual absl::Status MapMany(int64_t bytes, absl::Span<BundleFd> bundles) = 0;
  // Unmaps what Map put at `offset`; the range stays reserved. NOT_FOUND when
  // nothing is mapped there.
  virtual absl::Status Unmap(int64_t offset) = 0;
  // Bundles mapped now.
  virtual int64_t mapped() const = 0;
  const MapperStats& stats() const { return stats_; }

 protected:
  // The checks MapMany makes before mapping anything; sorts `bundles` by
  // offset. `is_mapped(offset)` says whether a bundle is mapped there.
  template <typename IsMapped>
  absl::Status CheckBatch(int64_t bytes, absl::Span<BundleFd> bundles,
                          IsMapped is_mapped) const;

  MapperStats stats_;
};

// `backend` is PoolLayout.backend ("host" or "cuda"); `device_uuid` the
// Device.uuid to map on (cuda only). Reserves `size` bytes.
// UNIMPLEMENTED for an unknown backend; UNAVAILABLE when the CUDA driver or a
// device with that UUID is missing.
absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateMapper(
    const std::string& backend, const std::string& device_uuid, int64_t size);

absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateHostMapper(int64_t size);
absl::StatusOr<std::unique_ptr<DeviceMapper>> CreateCudaMapper(
    const std::string& device_uuid, int64_t size);

template <typename IsMapped>
absl::Status DeviceMapper::CheckBatch(int64_t bytes,
                                      absl::Span<BundleFd> bundles,
                                      IsMapped is_mapped) const {
  std::sort(
      bundles.begin(), bundles.end(),
      [](const BundleFd& a, const BundleFd& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < bundles.size(); ++i) {
    const int64_t offset = bundles[i].offset;
    if (offset < 0 || bytes <= 0 || offset > size() - bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle [", offset, ", +", bytes, ") outside the range of ", size()));
    }
    if (i > 0 && offset < bundles[i - 1].offset + bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundles at offsets ", bundles[i - 1].offset, " and ",
                       offset, " of one batch overlap"));
    }
    if (is_mapped(offset)) {
      return absl::FailedPreconditionError(
          absl::StrCat("a bundle is already mapped at offset ", offset));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvbroker::engine

#endif  // KVBROKER_ENGINE_MAPPER_H_
