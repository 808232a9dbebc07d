// FaultyMapper: a DeviceMapper that forwards to a real one and fails the
// operations a test switches on, as a driver might, so that the session's
// handling of a device that fails mid-way can be tested with the host
// backend.

#ifndef KVBROKER_ENGINE_TESTING_FAULTY_MAPPER_H_
#define KVBROKER_ENGINE_TESTING_FAULTY_MAPPER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/mapper.h"

namespace kvbroker::engine::testing {

class FaultyMapper : public DeviceMapper {
 public:
  explicit FaultyMapper(std::unique_ptr<DeviceMapper> target)
      : target_(std::move(target)) {}

  // While set, Unmap fails with INTERNAL and leaves the bundle mapped.
  std::atomic<bool> fail_unmap{false};

  uint64_t base() const override { return target_->base(); }
  int64_t size() const override { return target_->size(); }
  absl::Status MapMany(int64_t bytes, absl::Span<BundleFd> bundles) override {
    absl::Status s = target_->MapMany(bytes, bundles);
    stats_ = target_->stats();
    return s;
  }
  absl::Status Unmap(int64_t offset) override {
    if (fail_unmap) return absl::InternalError("injected unmap failure");
    return target_->Unmap(offset);
  }
  int64_t mapped() const override { return target_->mapped(); }

 private:
  std::unique_ptr<DeviceMapper> target_;
};

}  // namespace kvbroker::engine::testing

#endif  // KVBROKER_ENGINE_TESTING_FAULTY_MAPPER_H_
