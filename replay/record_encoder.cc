#include "replay/record_encoder.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "replay/record_internal.h"
#include "replay/record_layout.h"
#include "replay/record_writer.h"

namespace prl {

namespace replay_internal {

namespace {

// The preconditions that keep the copies in bounds and the header's counts and lengths exact;
// values are ValidateRecord's job.
void CheckEncodable(const RolloutRecord& r) {
  const size_t n = r.completion_tokens.size();
  PRL_CHECK(r.behaviour_logprobs.size() == n && r.token_versions.size() == n,
            "EncodeRecordTo: per-token arrays disagree with completion_tokens (", n, ")");
  PRL_CHECK(r.prompt_tokens.size() <= kMaxCount && n <= kMaxCount &&
                r.sampling.stop_token_ids.size() <= kMaxCount &&
                r.reward_components.size() <= kMaxCount && r.routes.size() <= kMaxCount,
            "EncodeRecordTo: an array has 2^32 entries or more");
  PRL_CHECK((r.token_sources.empty() || r.token_sources.size() == n) &&
                r.turn_rewards.size() == r.turn_ends.size() &&
                r.routes.size() == uint64_t{n} * r.route_layers * r.route_top_k,
            "EncodeRecordTo: token_sources, turns or routes disagree with their counts");
  PRL_CHECK(r.run_id.size() <= kMaxRecordIdBytes && r.prompt_set_id.size() <= kMaxRecordIdBytes &&
                r.actor_id.size() <= kMaxRecordIdBytes,
            "EncodeRecordTo: an id is longer than ", kMaxRecordIdBytes, " bytes");
}

// The record's header; reserved bytes zero. Requires CheckEncodable(r).
RecordHeader HeaderOf(const RolloutRecord& r) {
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
  h.num_completion_tokens = static_cast<uint32_t>(r.completion_tokens.size());
  h.num_stop_token_ids = static_cast<uint32_t>(r.sampling.stop_token_ids.size());
  h.num_reward_components = static_cast<uint32_t>(r.reward_components.size());
  h.run_id_bytes = static_cast<uint8_t>(r.run_id.size());
  h.prompt_set_id_bytes = static_cast<uint8_t>(r.prompt_set_id.size());
  h.actor_id_bytes = static_cast<uint8_t>(r.actor_id.size());
  h.route_top_k = r.route_top_k;
  h.route_layers = r.route_layers;
  h.num_turns = static_cast<uint32_t>(r.turn_ends.size());
  h.num_token_sources = static_cast<uint32_t>(r.token_sources.size());
  h.segment = r.segment;
  h.segments = r.segments;
  return h;
}

// The three per-token sections; with check_values, each element is checked (out.error()) and
// *min_version lowered while its piece is in cache.
void PutCompletion(Writer& out, const RolloutRecord& r, bool check_values, int64_t* min_version) {
  if (!check_values) {
    out.PutSection(r.completion_tokens);
    out.PutSection(r.behaviour_logprobs);
    out.PutSection(r.token_versions);
    return;
  }
  out.PutCheckedSection(r.completion_tokens, "completion_tokens", "a token id >= 0",
                        [](int32_t t) { return t < 0; });
  out.PutCheckedSection(r.behaviour_logprobs, "behaviour_logprobs", "a finite log-probability",
                        NotFinite);
  out.PutCheckedSection(
      r.token_versions, "token_versions", "a weight version >= 0", [](int64_t v) { return v < 0; },
      [min_version](const int64_t* piece, size_t n) {
        int64_t m = *min_version;
        for (size_t i = 0; i < n; ++i) m = std::min(m, piece[i]);
        *min_version = m;
      });
}

// The string section: the component names' lengths, then the ids and names back to back.
void PutStrings(Writer& out, const RolloutRecord& r) {
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
}

}  // namespace

absl::Status EncodeRecordWith(const RolloutRecord& r, uint8_t* dst, XXH3_state_t* hash,
                              bool check_values, int64_t* min_version) {
  CheckEncodable(r);
  const RecordHeader h = HeaderOf(r);
  Writer out(dst, hash);
  out.Put(&h, sizeof(h));
  out.PutSection(r.prompt_tokens);
  PutCompletion(out, r, check_values, min_version);
  out.PutSection(r.sampling.stop_token_ids);
  for (const auto& [name, value] : r.reward_components) out.Put(&value, sizeof(value));
  out.Pad();
  out.PutSection(r.token_sources);
  out.PutSection(r.turn_ends);
  out.PutSection(r.turn_rewards);
  out.PutSection(r.routes);
  PutStrings(out, r);
  PRL_CHECK(out.at() == h.total_bytes, "encoder and ComputeLayout disagree");
  return out.error();
}

}  // namespace replay_internal

size_t EncodedRecordSize(const RolloutRecord& r) {
  return replay_internal::ComputeLayout(replay_internal::CountsOf(r)).total;
}

void EncodeRecordTo(const RolloutRecord& r, uint8_t* dst) {
  replay_internal::EncodeRecordWith(r, dst, nullptr, /*check_values=*/false, nullptr).IgnoreError();
}

}  // namespace prl
