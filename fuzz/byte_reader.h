// ByteReader: decodes a fuzz input as a stream of small choices.
//
// Every read succeeds: once the input is used up, reads return the low end
// of their range, so every prefix of an input is itself a valid program and
// libFuzzer's mutations (insert, erase, flip) map to nearby programs.
//
// Thread safety: none.

#ifndef KVBROKER_FUZZ_BYTE_READER_H_
#define KVBROKER_FUZZ_BYTE_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvbroker {
namespace fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool Bool() { return (Byte() & 1) != 0; }

  // Little-endian, from up to eight bytes.
  uint64_t U64(int bytes = 8) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }

  // Uniform enough in [lo, hi] for small ranges; REQUIRES lo <= hi.
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    if (span == 0) return lo;
    const int bytes = span < 0x100          ? 1
                      : span < 0x10000      ? 2
                      : span < (1ull << 32) ? 4
                                            : 8;
    const uint64_t raw = U64(bytes);
    if (span == UINT64_MAX) return static_cast<int64_t>(raw);
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + raw % (span + 1));
  }

  // One of `options`, by index.
  template <typename T, size_t N>
  const T& Pick(const T (&options)[N]) {
    return options[Range(0, N - 1)];
  }

  // Up to `max` raw bytes, length first.
  std::string Bytes(size_t max) {
    const size_t n = static_cast<size_t>(Range(0, static_cast<int64_t>(max)));
    std::string out;
    for (size_t i = 0; i < n && !empty(); ++i) {
      out.push_back(static_cast<char>(Byte()));
    }
    return out;
  }

  // Up to `max` characters of valid UTF-8 (what a proto3 string field may
  // carry): ASCII including control characters and NUL, and two- and
  // three-byte sequences.
  std::string Utf8(size_t max) {
    const size_t n = static_cast<size_t>(Range(0, static_cast<int64_t>(max)));
    std::string out;
    for (size_t i = 0; i < n && !empty(); ++i) {
      const uint8_t b = Byte();
      if (b < 0x80) {
        out.push_back(static_cast<char>(b));
      } else if (b < 0xc0) {
        out += "\xc3\xa9";  // U+00E9
      } else {
        out += "\xe2\x80\xa8";  // U+2028, a line separator
      }
    }
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace fuzz
}  // namespace kvbroker

#endif  // KVBROKER_FUZZ_BYTE_READER_H_
