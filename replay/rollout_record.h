// The rollout record (docs/architecture.md, "rollout record"): one finished sample with everything
// the learner needs (tokens, behaviour log-probs and token versions for the importance ratio,
// reward for the group-normalised advantage) and everything needed to trace it (ids, sampling
// parameters, timestamps). Records travel in groups: all samples of one prompt.
//
// Two encodings of the same record. The binary layout (replay/record_layout.h) is what the
// shared-memory replay buffer stores (the arrays are memcpy'd, so a 10M-token record encodes at
// memory speed): replay/record_encoder.h writes it, replay/record_decoder.h reads it back from
// untrusted bytes, replay/rollout_group.h frames and checksums a group of records.
// proto/prl/v1/replay.proto carries records across machines (replay/record_proto.h).
//
// Thread-safety: all functions are pure; records are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prl {

// The version of the binary layout (replay/record_layout.h) this build writes and reads.
// 2: episodes and MoE routes; 3: agents' episodes of several records (segment, segments).
inline constexpr uint16_t kRecordLayoutVersion = 3;
inline constexpr size_t kMaxRecordIdBytes = 255;  // ids and reward component names

enum class RolloutFinishReason : uint8_t { kLength = 1, kStop = 2, kAbort = 3 };

// Where a completion token of an agentic episode came from (RolloutRecord::token_sources).
enum class TokenSource : uint8_t {
  kModel = 0,        // sampled by the model: trained, counted in the lag
  kEnvironment = 1,  // an environment's reply, appended as context: never trained
};

// The sampling parameters the completion was drawn with (inference_engine/sampling_params.h).
struct RolloutSampling {
  float temperature = 1.0f;  // >= 0 and finite; 0 = greedy
  float top_p = 1.0f;        // in (0, 1]
  int32_t top_k = 0;         // >= 0; 0 disables
  int32_t max_tokens = 0;    // >= 0; completion tokens at most (0: not recorded)
  uint64_t seed = 0;
  std::vector<int32_t> stop_token_ids;  // each >= 0

  bool operator==(const RolloutSampling&) const = default;
};

// Invariants (ValidateRecord): ids and component names valid UTF-8 of at most 255 bytes;
// component names non-empty and distinct; sample_index < group_size; tokens >= 0; one
// behaviour log-prob (finite) and one token version (>= 0) per completion token; reward and
// component values finite; 0 <= created_unix_nanos <= finished_unix_nanos; sampling as
// documented above; every array and the component list hold fewer than 2^32 entries;
// token_sources, turns, routes and segments as documented at their fields.
struct RolloutRecord {
  std::string run_id, prompt_set_id, actor_id;  // ids (UTF-8; each at most 255 bytes)
  uint64_t prompt_index = 0, group_id = 0;
  uint32_t sample_index = 0, group_size = 1;  // sample_index < group_size
  std::vector<int32_t> prompt_tokens, completion_tokens;
  std::vector<float> behaviour_logprobs;  // one per completion token
  std::vector<int64_t> token_versions;    // one per completion token
  double reward = 0.0;
  std::vector<std::pair<std::string, double>> reward_components;  // named parts of the reward
  RolloutFinishReason finish_reason = RolloutFinishReason::kLength;
  RolloutSampling sampling;
  int64_t created_unix_nanos = 0, finished_unix_nanos = 0;

  // ---- Agentic episodes (docs/environments.md) ----
  // Empty (every completion token is the model's), or one TokenSource per completion token.
  // The first completion token is the model's; an environment token has behaviour log-prob 0
  // and the version of the token before it, so versions never decrease through one.
  std::vector<uint8_t> token_sources;
  // The episode's model turns in order: the completion index just past each turn's last token
  // (increasing, > 0, at most #completion tokens) and the reward the environment gave the turn
  // (finite; 0 when none). Empty for a single-turn sample; turn_rewards.size() ==
  // turn_ends.size().
  std::vector<uint32_t> turn_ends;
  std::vector<double> turn_rewards;

  // ---- MoE routing (docs/models.md) ----
  // For each completion token and each of route_layers MoE layers, the route_top_k experts
  // (ids 0..255) the actor's engine routed it to: routes[(t * route_layers + l) * route_top_k
  // + k], taken at the position that predicts token t (input position #prompt - 1 + t: the
  // row it was sampled from, the learner's position of its log-prob; docs/models.md). All empty / 0
  // when none was recorded; else route_top_k >= 1 and routes holds #completion tokens *
  // route_layers * route_top_k (< 2^32) ids.
  uint16_t route_layers = 0;
  uint8_t route_top_k = 0;
  std::vector<uint8_t> routes;

  // ---- Agents (docs/agents.md) ----
  // An agent's episode whose agent rewrote its history is several records, each one trajectory
  // with its own prompt: this record is segment `segment` (< segments) of the `segments` records
  // of episode sample_index. A group holds every segment of each of its group_size episodes;
  // the records of one episode share its reward, and advantages are the episodes'.
  uint32_t segment = 0, segments = 1;

  // Whether completion token t was sampled by the model (trained), and how many were.
  bool is_model_token(size_t t) const {
    return token_sources.empty() || token_sources[t] == static_cast<uint8_t>(TokenSource::kModel);
  }
  int64_t model_tokens() const;
  // Oldest token version (the sample's staleness is learner version minus this);
  // INT64_MAX when there are no completion tokens. (Environment tokens never lower it.)
  int64_t min_version() const;
  // 64-bit key of the group (run_id, prompt_set_id, prompt_index, group_id); equal groups,
  // equal keys. XXH3-64 of a length-prefixed little-endian encoding of the four fields, so it
  // is the same in every process and on every machine.
  uint64_t GroupKey() const;

  bool operator==(const RolloutRecord&) const = default;
};

// All invariants above; errors are InvalidArgument naming the field, expected and found.
absl::Status ValidateRecord(const RolloutRecord& record);

}  // namespace prl
