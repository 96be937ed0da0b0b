// Internal to replay/: the Writer that appends the bytes of a record or group being encoded
// (replay/record_layout.h) into the replay buffer's memory, hashing them on the way and
// streaming large sections past the cache. Header-only so that the many small Puts of a record
// inline into the encoder.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/xxhash_inline.h"
#include "replay/record_internal.h"
#include "replay/record_layout.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace prl::replay_internal {

// Sections at least this long are copied with non-temporal stores: a record that large streams
// through the ring, and a normal store would first read every destination line from memory
// (read-for-ownership), a third more memory traffic than the copy itself.
inline constexpr size_t kStreamMinBytes = size_t{256} << 10;

inline void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t at = head;
  for (; at + 64 <= n; at += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + at);
    auto* d = reinterpret_cast<__m128i*>(dst + at);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(dst + at, src + at, n - at);
#else
  std::memcpy(dst, src, n);
#endif
}

// Non-temporal stores are weakly ordered: fence them before the commit publishes the frame.
inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Appends to a record or group being encoded; offsets are from `base`. With a hash state,
// every byte written is also hashed, in order, piece by piece while it is in cache.
class Writer {
 public:
  explicit Writer(uint8_t* base, XXH3_state_t* hash = nullptr) : base_(base), hash_(hash) {}
  // Large sections go out with non-temporal stores (see StreamCopy); each piece is hashed from
  // the source while it is in cache. `section_bytes`: the size of the section this is part of.
  void Put(const void* src, size_t bytes, size_t section_bytes = 0) {
    constexpr size_t kPiece = size_t{64} << 10;
    const bool stream = std::max(bytes, section_bytes) >= kStreamMinBytes;
    const auto* from = static_cast<const uint8_t*>(src);
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(kPiece, bytes - done);
      if (hash_ != nullptr) XXH3_64bits_update(hash_, from + done, n);
      if (stream) {
        StreamCopy(base_ + at_, from + done, n);
      } else {
        std::memcpy(base_ + at_, from + done, n);
      }
      at_ += n;
      done += n;
    }
    if (stream) StreamFence();
  }
  // One array section: its elements, then zeros up to the next multiple of 8.
  template <typename T>
  void PutSection(const std::vector<T>& v) {
    Put(v.data(), v.size() * sizeof(T));
    Pad();
  }
  void Pad() {
    const uint64_t end = AlignUp8(at_);
    std::memset(base_ + at_, 0, end - at_);
    if (hash_ != nullptr && end > at_) XXH3_64bits_update(hash_, base_ + at_, end - at_);
    at_ = end;
  }
  XXH3_state_t* hash() const { return hash_; }
  // PutSection that also checks every element, on the piece just copied (still in cache):
  // the first element for which bad(x) holds becomes error().
  // on_piece(piece, n) also sees each piece while it is hot.
  template <typename T, typename Bad, typename OnPiece = void (*)(const T*, size_t)>
  void PutCheckedSection(
      const std::vector<T>& v, absl::string_view field, absl::string_view expected, Bad bad,
      OnPiece on_piece = [](const T*, size_t) {}) {
    constexpr size_t kPieceElements = (size_t{64} << 10) / sizeof(T);
    for (size_t done = 0; done < v.size(); done += kPieceElements) {
      const size_t n = std::min(kPieceElements, v.size() - done);
      const T* piece = v.data() + done;  // the source: the copy may bypass the cache
      Put(piece, n * sizeof(T), v.size() * sizeof(T));
      on_piece(piece, n);
      const size_t first = FirstBad(piece, n, bad);
      if (first != n && error_.ok()) {
        error_ = Invalid(absl::StrCat(field, "[", done + first, "]"), expected, piece[first]);
      }
    }
    Pad();
  }
  const absl::Status& error() const { return error_; }
  void Skip(uint64_t bytes) { at_ += bytes; }  // past bytes written by someone else
  uint64_t at() const { return at_; }

 private:
  uint8_t* base_;
  XXH3_state_t* hash_;
  uint64_t at_ = 0;
  absl::Status error_;
};

}  // namespace prl::replay_internal
