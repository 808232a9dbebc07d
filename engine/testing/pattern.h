// The byte pattern the data tests write into blocks and read back: every
// 8-byte word of one (device, block, layer, buffer) region is a function of
// a seed and of the region, so a word written to the wrong place, or a stale
// or foreign page, is caught. Seed 0 means zeros (a page zeroed for a new
// holder).

#ifndef KVBROKER_ENGINE_TESTING_PATTERN_H_
#define KVBROKER_ENGINE_TESTING_PATTERN_H_

#include <cstdint>
#include <cstring>

namespace kvbroker::testing {

inline uint64_t PatternWord(uint64_t seed, int device_index, int64_t block,
                            int64_t layer, int64_t buffer, int64_t word) {
  if (seed == 0) return 0;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(device_index) << 56) ^
               (static_cast<uint64_t>(block) << 32) ^
               (static_cast<uint64_t>(layer) << 22) ^
               (static_cast<uint64_t>(buffer) << 20) ^
               static_cast<uint64_t>(word);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Fills `bytes` (a multiple of 8) at `region` with the region's pattern.
inline void WritePattern(void* region, int64_t bytes, uint64_t seed,
                         int device_index, int64_t block, int64_t layer,
                         int64_t buffer) {
  char* p = static_cast<char*>(region);
  for (int64_t j = 0; j < bytes / 8; ++j) {
    const uint64_t w = PatternWord(seed, device_index, block, layer, buffer, j);
    std::memcpy(p + j * 8, &w, 8);
  }
}

// Words of `region` that differ from its pattern.
inline int64_t PatternMismatches(const void* region, int64_t bytes,
                                 uint64_t seed, int device_index, int64_t block,
                                 int64_t layer, int64_t buffer) {
  const char* p = static_cast<const char*>(region);
  int64_t bad = 0;
  for (int64_t j = 0; j < bytes / 8; ++j) {
    uint64_t w;
    std::memcpy(&w, p + j * 8, 8);
    if (w != PatternWord(seed, device_index, block, layer, buffer, j)) ++bad;
  }
  return bad;
}

}  // namespace kvbroker::testing

#endif  // KVBROKER_ENGINE_TESTING_PATTERN_H_
