#include "replay/rollout_record.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "core/xxhash_inline.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/check.h"
#include "core/status_macros.h"

namespace prl {

namespace {

// The arrays are memcpy'd between records and the layout; a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little, "the record layout is little-endian");

constexpr char kRecordMagic[4] = {'P', 'R', 'L', 'R'};
constexpr char kGroupMagic[4] = {'P', 'R', 'L', 'G'};
constexpr uint64_t kMaxCount = std::numeric_limits<uint32_t>::max();

// The first 112 bytes of a record, exactly as laid out in the header comment.
struct RecordHeader {
  char magic[4];
  uint16_t layout_version;
  uint8_t finish_reason;
  uint8_t reserved0;
  uint64_t total_bytes;
  uint64_t prompt_index;
  uint64_t group_id;
  uint32_t sample_index;
  uint32_t group_size;
  double reward;
  int64_t created_unix_nanos;
  int64_t finished_unix_nanos;
  float temperature;
  float top_p;
  int32_t top_k;
  int32_t max_tokens;
  uint64_t seed;
  uint32_t num_prompt_tokens;
  uint32_t num_completion_tokens;
  uint32_t num_stop_token_ids;
  uint32_t num_reward_components;
  uint8_t run_id_bytes;
  uint8_t prompt_set_id_bytes;
  uint8_t actor_id_bytes;
  uint8_t reserved1[5];
};
static_assert(sizeof(RecordHeader) == 112);
static_assert(offsetof(RecordHeader, reward) == 40 && offsetof(RecordHeader, temperature) == 64);
static_assert(offsetof(RecordHeader, num_prompt_tokens) == 88);
static_assert(offsetof(RecordHeader, run_id_bytes) == 104);

struct GroupHeader {
  char magic[4];
  uint16_t layout_version;
  uint16_t reserved0;
  uint32_t num_records;
  uint32_t reserved1;
};
static_assert(sizeof(GroupHeader) == 16);

constexpr uint64_t AlignUp8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// Where the string section of a record starts and where the record ends, from its counts
// (sections in the order of the header comment). Encoder and decoder both size records with
// this. Counts are below 2^32 and strings below 2^8 (R + 3) bytes, so every value stays below
// 2^40: no uint64_t overflow.
struct RecordLayout {
  uint64_t strings;
  uint64_t total;
};

RecordLayout ComputeLayout(uint64_t num_prompt, uint64_t num_completion, uint64_t num_stop,
                           uint64_t num_components, uint64_t string_bytes) {
  uint64_t at = sizeof(RecordHeader);
  for (const uint64_t section_bytes : {4 * num_prompt, 4 * num_completion, 4 * num_completion,
                                       8 * num_completion, 4 * num_stop, 8 * num_components}) {
    at = AlignUp8(at + section_bytes);
  }
  // The strings: one length byte per component name, then the bytes of the ids and names.
  return {at, AlignUp8(at + num_components + string_bytes)};
}

uint64_t StringBytes(const RolloutRecord& r) {
  uint64_t n = r.run_id.size() + r.prompt_set_id.size() + r.actor_id.size();
  for (const auto& [name, value] : r.reward_components) n += name.size();
  return n;
}

// ---- Validation ----------------------------------------------------------------------------

template <typename Found>
absl::Status Invalid(absl::string_view field, absl::string_view expected, const Found& found) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

// Offset of the first byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF are invalid, as in protobuf); npos if none.
size_t FirstInvalidUtf8(absl::string_view s) {
  static constexpr uint32_t kMinCodePoint[5] = {0, 0, 0x80, 0x800, 0x10000};
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (s.size() - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < kMinCodePoint[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return absl::string_view::npos;
}

absl::Status ValidateName(absl::string_view field, const std::string& name) {
  if (name.size() > kMaxRecordIdBytes) {
    return Invalid(field, absl::StrCat("at most ", kMaxRecordIdBytes, " bytes"),
                   absl::StrCat(name.size(), " bytes"));
  }
  if (const size_t bad = FirstInvalidUtf8(name); bad != absl::string_view::npos) {
    return Invalid(
        field, "valid UTF-8",
        absl::StrCat("byte 0x", absl::Hex(static_cast<uint8_t>(name[bad])), " at offset ", bad));
  }
  return absl::OkStatus();
}

absl::Status ValidateCount(absl::string_view field, size_t count) {
  if (count > kMaxCount) return Invalid(field, "fewer than 2^32 entries", count);
  return absl::OkStatus();
}

// Index of the first element for which bad(x) holds, or n. Scans blocks with a branch-free
// OR (which the compiler vectorises) and searches only the block that fails: records reach
// tens of millions of elements.
template <typename T, typename Bad>
size_t FirstBad(const T* v, size_t n, Bad bad) {
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t end = std::min(n, b + kBlock);
    uint32_t any = 0;  // an integer OR vectorises; a bool one does not
    for (size_t i = b; i < end; ++i) any |= static_cast<uint32_t>(bad(v[i]));
    if (any != 0) return static_cast<size_t>(std::find_if(v + b, v + end, bad) - v);
  }
  return n;
}

// NaN or infinity, from the bits (std::isfinite does not vectorise without -ffast-math).
inline bool NotFinite(float x) { return (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u; }

absl::Status ValidateTokens(absl::string_view field, absl::Span<const int32_t> tokens) {
  PRL_RETURN_IF_ERROR(ValidateCount(field, tokens.size()));
  const size_t bad = FirstBad(tokens.data(), tokens.size(), [](int32_t t) { return t < 0; });
  if (bad != tokens.size()) {
    return Invalid(absl::StrCat(field, "[", bad, "]"), "a token id >= 0", tokens[bad]);
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const RolloutSampling& s) {
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature)) {
    return Invalid("sampling.temperature", ">= 0 and finite", s.temperature);
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return Invalid("sampling.top_p", "in (0, 1]", s.top_p);
  if (s.top_k < 0) return Invalid("sampling.top_k", ">= 0 (0 disables)", s.top_k);
  if (s.max_tokens < 0) return Invalid("sampling.max_tokens", ">= 0", s.max_tokens);
  return ValidateTokens("sampling.stop_token_ids", s.stop_token_ids);
}

absl::Status ValidateRewardComponents(const RolloutRecord& r) {
  PRL_RETURN_IF_ERROR(ValidateCount("reward_components", r.reward_components.size()));
  // Sorted (name, position) pairs find duplicates in O(R log R): R comes from untrusted bytes.
  std::vector<std::pair<absl::string_view, size_t>> names;
  names.reserve(r.reward_components.size());
  for (size_t i = 0; i < r.reward_components.size(); ++i) {
    const auto& [name, value] = r.reward_components[i];
    const std::string field = absl::StrCat("reward_components[", i, "]");
    if (name.empty()) return Invalid(field + ".name", "a non-empty name", "\"\"");
    PRL_RETURN_IF_ERROR(ValidateName(field + ".name", name));
    if (!std::isfinite(value)) return Invalid(field + ".value", "a finite number", value);
    names.emplace_back(name, i);
  }
  std::sort(names.begin(), names.end());
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i].first == names[i - 1].first) {
      return Invalid(absl::StrCat("reward_components[", names[i].second, "].name"),
                     "distinct names",
                     absl::StrCat("\"", names[i].first, "\" again (also reward_components[",
                                  names[i - 1].second, "])"));
    }
  }
  return absl::OkStatus();
}

// The per-token arrays' sizes; with scan_values, also every completion token id, log-prob and
// version (EncodeGroupToWithChecksum runs those scans on its own, while copying).
absl::Status ValidatePerTokenArrays(const RolloutRecord& r, bool scan_values) {
  const size_t n = r.completion_tokens.size();
  PRL_RETURN_IF_ERROR(ValidateCount("completion_tokens", n));
  const std::string one_each = absl::StrCat("one per completion token (", n, ")");
  if (r.behaviour_logprobs.size() != n) {
    return Invalid("behaviour_logprobs", one_each, r.behaviour_logprobs.size());
  }
  if (r.token_versions.size() != n)
    return Invalid("token_versions", one_each, r.token_versions.size());
  if (!scan_values) return absl::OkStatus();
  PRL_RETURN_IF_ERROR(ValidateTokens("completion_tokens", r.completion_tokens));
  const auto& lp = r.behaviour_logprobs;
  const size_t bad_lp = FirstBad(lp.data(), lp.size(), NotFinite);
  if (bad_lp != lp.size()) {
    return Invalid(absl::StrCat("behaviour_logprobs[", bad_lp, "]"), "a finite log-probability",
                   lp[bad_lp]);
  }
  const auto& v = r.token_versions;
  const size_t bad_v = FirstBad(v.data(), v.size(), [](int64_t x) { return x < 0; });
  if (bad_v != v.size()) {
    return Invalid(absl::StrCat("token_versions[", bad_v, "]"), "a weight version >= 0", v[bad_v]);
  }
  return absl::OkStatus();
}

// ---- Encoding and decoding -----------------------------------------------------------------

// Sections at least this long are copied with non-temporal stores: a record that large streams
// through the ring, and a normal store would first read every destination line from memory
// (read-for-ownership), a third more memory traffic than the copy itself.
constexpr size_t kStreamMinBytes = size_t{256} << 10;

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
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
void StreamFence() {
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

// Reads a record whose size has already been checked against its counts: reading past that
// size is a bug in this file, not bad input, hence the PRL_CHECK. Remembers whether any
// padding byte was non-zero (a non-canonical encoding).
class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> bytes, uint64_t at) : bytes_(bytes), at_(at) {}
  void Get(void* dst, size_t bytes) {
    PRL_CHECK(bytes <= bytes_.size() - at_, "record reader past the checked size");
    if (bytes > 0) std::memcpy(dst, bytes_.data() + at_, bytes);
    at_ += bytes;
  }
  template <typename T>
  void GetSection(std::vector<T>& v, size_t count) {
    v.resize(count);
    Get(v.data(), count * sizeof(T));
    SkipPadding();
  }
  std::string GetString(size_t bytes) {
    std::string s(bytes, '\0');
    Get(s.data(), bytes);
    return s;
  }
  void SkipPadding() {
    const uint64_t end = AlignUp8(at_);
    PRL_CHECK(end <= bytes_.size(), "record reader past the checked size");
    for (; at_ < end; ++at_) nonzero_padding_ |= bytes_[at_] != 0;
  }
  uint64_t at() const { return at_; }
  bool nonzero_padding() const { return nonzero_padding_; }

 private:
  absl::Span<const uint8_t> bytes_;
  uint64_t at_;
  bool nonzero_padding_ = false;
};

absl::Status Malformed(absl::string_view message) { return absl::InvalidArgumentError(message); }

std::string MagicString(const char (&magic)[4]) {
  return absl::StrCat("\"", absl::CHexEscape(absl::string_view(magic, 4)), "\"");
}

bool AllZero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

// The header of a record, once its magic, version and reserved bytes are checked and its
// counts and lengths add up to exactly bytes.size(). Reads nothing past bytes.size().
absl::StatusOr<RecordHeader> CheckRecordFrame(absl::Span<const uint8_t> bytes) {
  RecordHeader h;
  if (bytes.size() < sizeof(h)) {
    return Malformed(absl::StrCat("truncated: expected at least the ", sizeof(h),
                                  "-byte header, found ", bytes.size(), " bytes"));
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kRecordMagic, 4) != 0) {
    return Invalid("magic", MagicString(kRecordMagic), MagicString(h.magic));
  }
  if (h.layout_version != kRecordLayoutVersion) {
    return Invalid("layout_version", absl::StrCat(kRecordLayoutVersion), h.layout_version);
  }
  if (h.reserved0 != 0 || !AllZero(h.reserved1, sizeof(h.reserved1))) {
    return Malformed("reserved header bytes: expected zero, found non-zero");
  }
  // The component names' lengths sit at the start of the string section.
  auto layout = [&h](uint64_t name_bytes) {
    return ComputeLayout(
        h.num_prompt_tokens, h.num_completion_tokens, h.num_stop_token_ids, h.num_reward_components,
        uint64_t{h.run_id_bytes} + h.prompt_set_id_bytes + h.actor_id_bytes + name_bytes);
  };
  const uint64_t lengths_at = layout(0).strings;
  const uint64_t lengths_end = lengths_at + h.num_reward_components;
  if (lengths_end > bytes.size()) {
    return Malformed(absl::StrCat("truncated: the header's counts need at least ", lengths_end,
                                  " bytes, found ", bytes.size()));
  }
  uint64_t name_bytes = 0;
  for (uint64_t i = lengths_at; i < lengths_end; ++i) name_bytes += bytes[i];
  const uint64_t total = layout(name_bytes).total;
  if (h.total_bytes != total) {
    return Invalid("total_bytes", absl::StrCat(total, " (from the counts and lengths)"),
                   h.total_bytes);
  }
  if (bytes.size() < total) {
    return Malformed(absl::StrCat("truncated: expected ", total, " bytes, found ", bytes.size()));
  }
  if (bytes.size() > total) {
    return Malformed(
        absl::StrCat("trailing bytes: expected exactly ", total, " bytes, found ", bytes.size()));
  }
  return h;
}

// DecodeRecord without the "rollout record: " prefix on its errors.
absl::StatusOr<RolloutRecord> DecodeRecordBody(absl::Span<const uint8_t> bytes) {
  PRL_ASSIGN_OR_RETURN(const RecordHeader h, CheckRecordFrame(bytes));
  RolloutRecord r;
  r.prompt_index = h.prompt_index;
  r.group_id = h.group_id;
  r.sample_index = h.sample_index;
  r.group_size = h.group_size;
  r.reward = h.reward;
  r.finish_reason = static_cast<RolloutFinishReason>(h.finish_reason);
  r.created_unix_nanos = h.created_unix_nanos;
  r.finished_unix_nanos = h.finished_unix_nanos;
  r.sampling.temperature = h.temperature;
  r.sampling.top_p = h.top_p;
  r.sampling.top_k = h.top_k;
  r.sampling.max_tokens = h.max_tokens;
  r.sampling.seed = h.seed;

  Reader in(bytes, sizeof(RecordHeader));
  in.GetSection(r.prompt_tokens, h.num_prompt_tokens);
  in.GetSection(r.completion_tokens, h.num_completion_tokens);
  in.GetSection(r.behaviour_logprobs, h.num_completion_tokens);
  in.GetSection(r.token_versions, h.num_completion_tokens);
  in.GetSection(r.sampling.stop_token_ids, h.num_stop_token_ids);
  std::vector<double> values;
  in.GetSection(values, h.num_reward_components);
  std::vector<uint8_t> name_lengths(h.num_reward_components);
  in.Get(name_lengths.data(), name_lengths.size());
  r.run_id = in.GetString(h.run_id_bytes);
  r.prompt_set_id = in.GetString(h.prompt_set_id_bytes);
  r.actor_id = in.GetString(h.actor_id_bytes);
  r.reward_components.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    r.reward_components.emplace_back(in.GetString(name_lengths[i]), values[i]);
  }
  in.SkipPadding();
  PRL_CHECK(in.at() == h.total_bytes, "decoder and ComputeLayout disagree");
  if (in.nonzero_padding()) {
    return Malformed("padding between sections: expected zero, found non-zero");
  }
  PRL_RETURN_IF_ERROR(ValidateRecord(r));
  return r;
}

// How DescribeGroup shows a group id in errors: strings quoted, numbers as they are.
std::string Shown(const std::string& id) { return absl::StrCat("\"", id, "\""); }
uint64_t Shown(uint64_t number) { return number; }

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace

int64_t RolloutRecord::min_version() const {
  if (token_versions.empty()) return std::numeric_limits<int64_t>::max();
  return *std::min_element(token_versions.begin(), token_versions.end());
}

uint64_t RolloutRecord::GroupKey() const {
  // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
  std::string key;
  key.reserve(32 + run_id.size() + prompt_set_id.size());
  auto put_u64 = [&key](uint64_t v) { key.append(reinterpret_cast<const char*>(&v), 8); };
  put_u64(run_id.size());
  key += run_id;
  put_u64(prompt_set_id.size());
  key += prompt_set_id;
  put_u64(prompt_index);
  put_u64(group_id);
  return XXH3_64bits(key.data(), key.size());
}

namespace {
absl::Status ValidateRecordImpl(const RolloutRecord& r, bool scan_values) {
  PRL_RETURN_IF_ERROR(ValidateName("run_id", r.run_id));
  PRL_RETURN_IF_ERROR(ValidateName("prompt_set_id", r.prompt_set_id));
  PRL_RETURN_IF_ERROR(ValidateName("actor_id", r.actor_id));
  if (r.group_size < 1) return Invalid("group_size", ">= 1", r.group_size);
  if (r.sample_index >= r.group_size) {
    return Invalid("sample_index", absl::StrCat("< group_size (", r.group_size, ")"),
                   r.sample_index);
  }
  PRL_RETURN_IF_ERROR(ValidateTokens("prompt_tokens", r.prompt_tokens));
  PRL_RETURN_IF_ERROR(ValidatePerTokenArrays(r, scan_values));
  if (!std::isfinite(r.reward)) return Invalid("reward", "a finite number", r.reward);
  PRL_RETURN_IF_ERROR(ValidateRewardComponents(r));
  const auto reason = static_cast<int>(r.finish_reason);
  if (reason < 1 || reason > 3) {
    return Invalid("finish_reason", "1 (length), 2 (stop) or 3 (abort)", reason);
  }
  PRL_RETURN_IF_ERROR(ValidateSampling(r.sampling));
  if (r.created_unix_nanos < 0) return Invalid("created_unix_nanos", ">= 0", r.created_unix_nanos);
  if (r.finished_unix_nanos < r.created_unix_nanos) {
    return Invalid("finished_unix_nanos",
                   absl::StrCat(">= created_unix_nanos (", r.created_unix_nanos, ")"),
                   r.finished_unix_nanos);
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status ValidateRecord(const RolloutRecord& r) {
  return ValidateRecordImpl(r, /*scan_values=*/true);
}

size_t EncodedRecordSize(const RolloutRecord& r) {
  return ComputeLayout(r.prompt_tokens.size(), r.completion_tokens.size(),
                       r.sampling.stop_token_ids.size(), r.reward_components.size(), StringBytes(r))
      .total;
}

namespace {
absl::Status EncodeRecordWith(const RolloutRecord& r, uint8_t* dst, XXH3_state_t* hash,
                              bool check_values, int64_t* min_version);
}  // namespace

void EncodeRecordTo(const RolloutRecord& r, uint8_t* dst) {
  EncodeRecordWith(r, dst, nullptr, /*check_values=*/false, nullptr).IgnoreError();
}

namespace {
// Encodes one record; with check_values, also scans the completion's token ids, log-probs and
// versions as they are copied, returns the first bad one (the bytes are then garbage), and
// lowers *min_version to the oldest token version.
absl::Status EncodeRecordWith(const RolloutRecord& r, uint8_t* dst, XXH3_state_t* hash,
                              bool check_values, int64_t* min_version) {
  // The preconditions that keep the copies below in bounds; values are ValidateRecord's job.
  const size_t n = r.completion_tokens.size();
  PRL_CHECK(r.behaviour_logprobs.size() == n && r.token_versions.size() == n,
            "EncodeRecordTo: per-token arrays disagree with completion_tokens (", n, ")");
  PRL_CHECK(r.prompt_tokens.size() <= kMaxCount && n <= kMaxCount &&
                r.sampling.stop_token_ids.size() <= kMaxCount &&
                r.reward_components.size() <= kMaxCount,
            "EncodeRecordTo: an array has 2^32 entries or more");
  PRL_CHECK(r.run_id.size() <= kMaxRecordIdBytes && r.prompt_set_id.size() <= kMaxRecordIdBytes &&
                r.actor_id.size() <= kMaxRecordIdBytes,
            "EncodeRecordTo: an id is longer than ", kMaxRecordIdBytes, " bytes");

  RecordHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kRecordMagic, 4);
  h.layout_version = kRecordLayoutVersion;
  h.finish_reason = static_cast<uint8_t>(r.finish_reason);
  h.total_bytes = EncodedRecordSize(r);
  h.prompt_index = r.prompt_index;
  h.group_id = r.group_id;
  h.sample_index = r.sample_index;
  h.group_size = r.group_size;
  h.reward = r.reward;
  h.created_unix_nanos = r.created_unix_nanos;
  h.finished_unix_nanos = r.finished_unix_nanos;
  h.temperature = r.sampling.temperature;
  h.top_p = r.sampling.top_p;
  h.top_k = r.sampling.top_k;
  h.max_tokens = r.sampling.max_tokens;
  h.seed = r.sampling.seed;
  h.num_prompt_tokens = static_cast<uint32_t>(r.prompt_tokens.size());
  h.num_completion_tokens = static_cast<uint32_t>(n);
  h.num_stop_token_ids = static_cast<uint32_t>(r.sampling.stop_token_ids.size());
  h.num_reward_components = static_cast<uint32_t>(r.reward_components.size());
  h.run_id_bytes = static_cast<uint8_t>(r.run_id.size());
  h.prompt_set_id_bytes = static_cast<uint8_t>(r.prompt_set_id.size());
  h.actor_id_bytes = static_cast<uint8_t>(r.actor_id.size());

  Writer out(dst, hash);
  out.Put(&h, sizeof(h));
  out.PutSection(r.prompt_tokens);
  if (check_values) {
    out.PutCheckedSection(r.completion_tokens, "completion_tokens", "a token id >= 0",
                          [](int32_t t) { return t < 0; });
    out.PutCheckedSection(r.behaviour_logprobs, "behaviour_logprobs", "a finite log-probability",
                          NotFinite);
    out.PutCheckedSection(
        r.token_versions, "token_versions", "a weight version >= 0",
        [](int64_t v) { return v < 0; },
        [min_version](const int64_t* piece, size_t n) {
          int64_t m = *min_version;
          for (size_t i = 0; i < n; ++i) m = std::min(m, piece[i]);
          *min_version = m;
        });
  } else {
    out.PutSection(r.completion_tokens);
    out.PutSection(r.behaviour_logprobs);
    out.PutSection(r.token_versions);
  }
  out.PutSection(r.sampling.stop_token_ids);
  for (const auto& [name, value] : r.reward_components) out.Put(&value, sizeof(value));
  out.Pad();
  for (const auto& [name, value] : r.reward_components) {
    PRL_CHECK(name.size() <= kMaxRecordIdBytes, "EncodeRecordTo: reward component name '", name,
              "' is longer than ", kMaxRecordIdBytes, " bytes");
    const auto length = static_cast<uint8_t>(name.size());
    out.Put(&length, 1);
  }
  out.Put(r.run_id.data(), r.run_id.size());
  out.Put(r.prompt_set_id.data(), r.prompt_set_id.size());
  out.Put(r.actor_id.data(), r.actor_id.size());
  for (const auto& [name, value] : r.reward_components) out.Put(name.data(), name.size());
  out.Pad();
  PRL_CHECK(out.at() == h.total_bytes, "encoder and ComputeLayout disagree");
  return out.error();
}
}  // namespace

absl::StatusOr<RolloutRecord> DecodeRecord(absl::Span<const uint8_t> bytes) {
  absl::StatusOr<RolloutRecord> record = DecodeRecordBody(bytes);
  if (!record.ok()) return Prefixed("rollout record: ", record.status());
  return record;
}

absl::StatusOr<GroupInfo> DescribeGroup(absl::Span<const RolloutRecord> records, bool scan_values) {
  if (records.empty()) {
    return absl::InvalidArgumentError("group: expected at least one record, found none");
  }
  const size_t n = records.size();
  const RolloutRecord& first = records[0];
  GroupInfo info;
  info.key = first.GroupKey();
  info.size = static_cast<uint32_t>(n);
  info.min_version = std::numeric_limits<int64_t>::max();
  info.payload_bytes = sizeof(GroupHeader) + 8 * (n + 1);
  std::vector<int64_t> seen_at(n, -1);  // record position holding each sample index
  for (size_t i = 0; i < n; ++i) {
    const RolloutRecord& r = records[i];
    const std::string where = absl::StrCat("group record ", i, ": ");
    PRL_RETURN_IF_ERROR(Prefixed(where, ValidateRecordImpl(r, scan_values)));
    auto same = [&](absl::string_view field, const auto& found, const auto& expected) {
      if (found == expected) return absl::OkStatus();
      return Prefixed(
          where, Invalid(field, absl::StrCat(Shown(expected), " (as record 0)"), Shown(found)));
    };
    PRL_RETURN_IF_ERROR(same("run_id", r.run_id, first.run_id));
    PRL_RETURN_IF_ERROR(same("prompt_set_id", r.prompt_set_id, first.prompt_set_id));
    PRL_RETURN_IF_ERROR(same("prompt_index", r.prompt_index, first.prompt_index));
    PRL_RETURN_IF_ERROR(same("group_id", r.group_id, first.group_id));
    if (r.group_size != n) {
      return Prefixed(
          where, Invalid("group_size", absl::StrCat(n, " (the number of records)"), r.group_size));
    }
    // sample_index < group_size == n (ValidateRecord); n distinct indices below n are 0..n-1.
    if (seen_at[r.sample_index] >= 0) {
      return Prefixed(where, Invalid("sample_index", "each index once",
                                     absl::StrCat(r.sample_index, " again (also record ",
                                                  seen_at[r.sample_index], ")")));
    }
    seen_at[r.sample_index] = static_cast<int64_t>(i);
    if (scan_values) info.min_version = std::min(info.min_version, r.min_version());
    info.payload_bytes += EncodedRecordSize(r);
  }
  return info;
}

namespace {
absl::Status EncodeGroupWith(absl::Span<const RolloutRecord> records, uint8_t* dst,
                             XXH3_state_t* hash, bool check_values, int64_t* min_version) {
  PRL_CHECK(!records.empty() && records.size() <= kMaxCount, "EncodeGroupTo: ", records.size(),
            " records");
  const size_t n = records.size();
  GroupHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kGroupMagic, 4);
  h.layout_version = kRecordLayoutVersion;
  h.num_records = static_cast<uint32_t>(n);
  Writer out(dst, hash);
  out.Put(&h, sizeof(h));
  uint64_t offset = sizeof(GroupHeader) + 8 * (n + 1);
  out.Put(&offset, 8);
  for (const RolloutRecord& r : records) {
    offset += EncodedRecordSize(r);
    out.Put(&offset, 8);
  }
  for (size_t i = 0; i < n; ++i) {
    // Continues the hash in payload order.
    const absl::Status s =
        EncodeRecordWith(records[i], dst + out.at(), hash, check_values, min_version);
    if (!s.ok()) return Prefixed(absl::StrCat("group record ", i, ": "), s);
    out.Skip(EncodedRecordSize(records[i]));
  }
  return absl::OkStatus();
}
}  // namespace

void EncodeGroupTo(absl::Span<const RolloutRecord> records, uint8_t* dst) {
  EncodeGroupWith(records, dst, nullptr, /*check_values=*/false, nullptr).IgnoreError();
}

absl::StatusOr<EncodedGroup> EncodeGroupToWithChecksum(absl::Span<const RolloutRecord> records,
                                                       uint8_t* dst) {
  XXH3_state_t* state = XXH3_createState();
  PRL_CHECK(state != nullptr && XXH3_64bits_reset(state) == XXH_OK, "XXH3 state");
  EncodedGroup out;
  out.min_version = std::numeric_limits<int64_t>::max();
  const absl::Status s =
      EncodeGroupWith(records, dst, state, /*check_values=*/true, &out.min_version);
  out.checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<RolloutRecord>> DecodeGroup(absl::Span<const uint8_t> bytes) {
  auto error = [](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("rollout group: ", message));
  };
  GroupHeader h;
  if (bytes.size() < sizeof(h)) {
    return error(absl::StrCat("truncated: expected at least the ", sizeof(h),
                              "-byte header, found ", bytes.size(), " bytes"));
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kGroupMagic, 4) != 0) {
    return error(absl::StrCat("magic: expected ", MagicString(kGroupMagic), ", found ",
                              MagicString(h.magic)));
  }
  if (h.layout_version != kRecordLayoutVersion) {
    return error(absl::StrCat("layout_version: expected ", kRecordLayoutVersion, ", found ",
                              h.layout_version));
  }
  if (h.reserved0 != 0 || h.reserved1 != 0) {
    return error("reserved header bytes: expected zero, found non-zero");
  }
  if (h.num_records == 0) return error("num_records: expected at least 1, found 0");
  const uint64_t n = h.num_records;
  uint64_t table_end = 0;  // 16 + 8 (n + 1): n < 2^32 cannot overflow, checked all the same
  if (__builtin_mul_overflow(n + 1, uint64_t{8}, &table_end) ||
      __builtin_add_overflow(table_end, uint64_t{sizeof(h)}, &table_end) ||
      table_end > bytes.size()) {
    return error(absl::StrCat("truncated: ", n, " records need an offset table ending at byte ",
                              sizeof(h) + 8 * (n + 1), ", found ", bytes.size(), " bytes"));
  }
  std::vector<uint64_t> offsets(n + 1);
  std::memcpy(offsets.data(), bytes.data() + sizeof(h), 8 * (n + 1));
  if (offsets[0] != table_end) {
    return error(absl::StrCat("offsets[0]: expected ", table_end, " (the end of the table), found ",
                              offsets[0]));
  }
  if (offsets[n] != bytes.size()) {
    return error(absl::StrCat("offsets[", n, "]: expected ", bytes.size(),
                              " (the size of the group), found ", offsets[n]));
  }
  for (uint64_t i = 0; i < n; ++i) {
    // Non-decreasing and within the group; the record decoder checks each span's size.
    if (offsets[i + 1] < offsets[i] || offsets[i + 1] > bytes.size()) {
      return error(absl::StrCat("offsets[", i + 1, "]: expected in [", offsets[i], ", ",
                                bytes.size(), "], found ", offsets[i + 1]));
    }
  }
  std::vector<RolloutRecord> records;
  records.reserve(std::min<uint64_t>(n, bytes.size() / sizeof(RecordHeader)));
  for (uint64_t i = 0; i < n; ++i) {
    absl::StatusOr<RolloutRecord> record =
        DecodeRecordBody(bytes.subspan(offsets[i], offsets[i + 1] - offsets[i]));
    if (!record.ok()) {
      return Prefixed(absl::StrCat("rollout group: record ", i, " at byte ", offsets[i], ": "),
                      record.status());
    }
    records.push_back(*std::move(record));
  }
  const absl::StatusOr<GroupInfo> info = DescribeGroup(records);
  if (!info.ok()) return Prefixed("rollout ", info.status());
  return records;
}

}  // namespace prl
