#include "replay/record_decoder.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "replay/record_internal.h"
#include "replay/record_layout.h"

namespace prl {

namespace replay_internal {

namespace {

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
  if (h.reserved0 != 0 || h.reserved1 != 0) {
    return Malformed("reserved header bytes: expected zero, found non-zero");
  }
  if (h.num_token_sources != 0 && h.num_token_sources != h.num_completion_tokens) {
    return Invalid("num_token_sources",
                   absl::StrCat("0 or the completion tokens (", h.num_completion_tokens, ")"),
                   h.num_token_sources);
  }
  const uint64_t route_bytes = uint64_t{h.num_completion_tokens} * h.route_layers * h.route_top_k;
  if (route_bytes > kMaxCount) {
    return Invalid("route_layers", "fewer than 2^32 expert ids in all", route_bytes);
  }
  // The component names' lengths sit at the start of the string section.
  auto layout = [&](uint64_t name_bytes) {
    return ComputeLayout(
        {h.num_prompt_tokens, h.num_completion_tokens, h.num_stop_token_ids,
         h.num_reward_components, h.num_token_sources, h.num_turns, route_bytes,
         uint64_t{h.run_id_bytes} + h.prompt_set_id_bytes + h.actor_id_bytes + name_bytes});
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

}  // namespace

absl::StatusOr<RolloutRecord> DecodeRecordBody(absl::Span<const uint8_t> bytes) {
  PRL_ASSIGN_OR_RETURN(const RecordHeader h, CheckRecordFrame(bytes));
  RolloutRecord r;
  r.prompt_index = h.prompt_index;
  r.group_id = h.group_id;
  r.sample_index = h.sample_index;
  r.group_size = h.group_size;
  r.segment = h.segment;
  r.segments = h.segments;
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
  in.GetSection(r.token_sources, h.num_token_sources);
  in.GetSection(r.turn_ends, h.num_turns);
  in.GetSection(r.turn_rewards, h.num_turns);
  r.route_layers = h.route_layers;
  r.route_top_k = h.route_top_k;
  in.GetSection(r.routes, uint64_t{h.num_completion_tokens} * h.route_layers * h.route_top_k);
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

}  // namespace replay_internal

absl::StatusOr<RolloutRecord> DecodeRecord(absl::Span<const uint8_t> bytes) {
  absl::StatusOr<RolloutRecord> record = replay_internal::DecodeRecordBody(bytes);
  if (!record.ok()) return replay_internal::Prefixed("rollout record: ", record.status());
  return record;
}

}  // namespace prl
