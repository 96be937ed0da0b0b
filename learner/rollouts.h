// Training samples for the learner, and the JSONL file `prl learner step` reads.
//
// Line format: {"prompt": [int...], "completion": [int...], "behaviour_logprobs": [float...],
// "advantage": float} or, instead of "advantage", "reward": float and "group": "id" (the
// advantage then comes from the configured group normalisation, learner/advantages.h).
// Optional: "versions": [int...] (the weight version of each completion token, for lag
// statistics), "sources": [0|1...] (an agentic episode's: 0 the model sampled the token, 1 an
// environment's reply, read as context and never trained; the first is 0);
// "proximal_logprobs" is never read (the learner recomputes it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "learner/advantages.h"
#include "model/config.h"

namespace prl::learner {

struct TrainSample {
  std::vector<int32_t> prompt;
  std::vector<int32_t> completion;
  std::vector<float> behaviour_logprobs;  // one per completion token
  std::vector<int64_t> versions;          // one per completion token, or empty
  // An agentic episode's token sources (replay/rollout_record.h TokenSource): empty (every
  // completion token is the model's), or one per completion token. Environment tokens are
  // context: read by the model, never in the loss, its denominator or the lag.
  std::vector<uint8_t> sources;
  // Qwen3-MoE: the experts the actor routed each completion token to (RolloutRecord::routes'
  // layout: per token, route_layers x route_top_k ids, at the position that predicts it), or
  // empty. learner.moe_routing = replay trains on them (learner/train_step.h).
  uint16_t route_layers = 0;
  uint8_t route_top_k = 0;
  std::vector<uint8_t> routes;
  bool has_advantage = false;
  double advantage = 0;
  double reward = 0;
  std::string group;

  // Tokens the model reads (prompt + completion - 1) and tokens trained (the model's).
  int64_t input_tokens() const {
    return static_cast<int64_t>(prompt.size() + completion.size()) - 1;
  }
  bool trained(size_t t) const { return sources.empty() || sources[t] == 0; }
  int64_t trained_tokens() const {
    int64_t n = 0;
    for (size_t t = 0; t < completion.size(); ++t) n += trained(t) ? 1 : 0;
    return n;
  }
};

// Reads and validates every line (token ids in the vocabulary, prompt non-empty, completion
// non-empty with one finite behaviour log-prob <= 0 per token, the sequence within
// max_position_embeddings, either an advantage or a reward and a group on every line — not a
// mix). Errors name the file, line and field.
absl::StatusOr<std::vector<TrainSample>> ReadTrainSamples(const std::string& path,
                                                          const ModelConfig& config);

// Fills in the advantage of samples that carry a reward and group; samples of dropped groups
// are removed. Returns the Advantages report.
absl::StatusOr<Advantages> ApplyGroupAdvantages(std::vector<TrainSample>* samples,
                                                const AdvantageConfig& config);

}  // namespace prl::learner
