// The one check of a rollout group against the model that will train on it (quarantine for
// bad input, docs/replay.md). The replay ingest runs it before a group is written, the learner
// before it trains on one (replay/quarantine.h dead-letters what fails), so that a group the
// model cannot take — a token id at or above the vocabulary, a sequence longer than the
// context — never reaches a training step, where it would crash the learner on every restart.
//
// A group passes when it is a complete group (DescribeGroup: ids, sizes, sample indices) and
// every record has
//   - prompt and completion token ids in [0, vocab_size);
//   - prompt + completion tokens <= max_position_embeddings, and <= the longest sequence the
//     learner's activation budget fits (the learner's own check);
//   - one behaviour log-prob and one token version per completion token;
//   - finite behaviour log-probs <= 0 (log-probabilities);
//   - token versions in [0, learner_version] (a version above the learner's own is from the
//     future: weights of another run or lineage).
// The first failure is reported: the reason (a small fixed set, the label of
// prl_replay_groups_dead_lettered_total) and the field, expected and found.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "replay/rollout_record.h"

namespace prl {

struct ModelLimits {
  int64_t vocab_size = 0;               // token ids in [0, vocab_size); 0: not checked
  int64_t max_position_embeddings = 0;  // prompt + completion at most this; 0: not checked
  // Qwen3-MoE routes (RolloutRecord::routes) the model can replay: its MoE layers, experts per
  // token and experts. With moe_layers 0 (a dense model) a record with routes is refused; with
  // check_routes false nothing about routes is checked.
  bool check_routes = false;
  int64_t moe_layers = 0, top_k = 0, num_experts = 0;
  // The learner's activation budget (learner/activation_budget.h): the longest sequence
  // (prompt + completion) its training pass fits, and the settings' account of it for the
  // refusal; 0: not checked.
  int64_t max_trained_tokens = 0;
  std::string max_trained_tokens_why;
};

// Every limit of a model (model/config.h's ModelConfig; a template, so that replay/ does not
// depend on model/): its vocabulary, context and MoE routes.
template <typename ModelConfig>
ModelLimits LimitsOfModel(const ModelConfig& c) {
  ModelLimits limits{c.vocab_size, c.max_position_embeddings};
  limits.check_routes = true;
  limits.moe_layers = c.num_moe_layers();
  limits.top_k = limits.moe_layers > 0 ? c.num_experts_per_tok : 0;
  limits.num_experts = limits.moe_layers > 0 ? c.num_experts : 0;
  return limits;
}

enum class DeadLetterReason : int {
  kTokenId = 0,    // a token id outside the vocabulary
  kContext,        // prompt + completion longer than the model's context
  kShape,          // log-probs or versions not one per completion token
  kLogprob,        // a behaviour log-prob that is not finite or is above 0
  kFutureVersion,  // a token version above the learner's (or below 0)
  kMalformed,      // not a valid, complete group (ids, sizes, indices, values)
  kCorrupt,        // bytes that fail their checksum or do not decode
  kRoutes,         // MoE routes that do not fit the model (layers, top-k, experts, count)
};
inline constexpr int kNumDeadLetterReasons = 8;
// "token_id", "context", "shape", "logprob", "future_version", "malformed", "corrupt", "routes".
absl::string_view DeadLetterReasonName(DeadLetterReason reason);

struct GroupProblem {
  DeadLetterReason reason = DeadLetterReason::kMalformed;
  std::string field;             // e.g. "records[2].completion_tokens[17]"
  std::string expected;          // e.g. "a token id in [0, 32000)"
  std::string found;             // e.g. "32001"
  std::string Describe() const;  // "<field>: expected <expected>, found <found>"
};

// nullopt when the group passes. learner_version INT64_MAX: versions only checked >= 0 (a
// checker that does not know the learner's version).
std::optional<GroupProblem> ValidateGroup(absl::Span<const RolloutRecord> records,
                                          const ModelLimits& limits, int64_t learner_version);

}  // namespace prl
