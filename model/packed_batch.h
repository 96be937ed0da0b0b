// PackedBatch: B variable-length sequences concatenated along one token axis (no padding),
// with explicit boundaries. Attention never crosses a boundary and positions restart at 0 in
// every sequence, so packing is invisible to the math.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "model/config.h"

namespace prl {

struct PackedBatch {
  std::vector<int32_t> tokens;      // (T) input token ids
  std::vector<int32_t> cu_seqlens;  // (B + 1) sequence b is tokens[cu_seqlens[b], cu_seqlens[b+1])
  // (T) the token whose log-prob is computed at each position, i.e. predicted from the
  // sequence's tokens up to and including this one; kNoTarget where nothing is scored.
  std::vector<int32_t> targets;

  // Qwen3-MoE routing replay (model/moe_layer.h): empty (every token routed by the router), or
  // (T, Lm, K) token-major, Lm = config.num_moe_layers(), K = num_experts_per_tok: the experts
  // input position t uses in the l-th MoE layer, or kRouted in [t, l, 0] for the router to
  // choose. Replayed rows hold K distinct ids in [0, E).
  std::vector<int32_t> routes;

  static constexpr int32_t kNoTarget = -1;
  static constexpr int32_t kRouted = -1;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_seqs() const { return cu_seqlens.empty() ? 0 : cu_seqlens.size() - 1; }
  int64_t num_targets() const;

  // Appends a sequence of input tokens with their targets (same length).
  void Add(absl::Span<const int32_t> seq_tokens, absl::Span<const int32_t> seq_targets);
  // Appends the scoring of `sequence` from position `score_from` on: inputs sequence[:-1],
  // and the target at input position i-1 is sequence[i] for i in [score_from, len).
  void AddScored(absl::Span<const int32_t> sequence, int64_t score_from);
};

// Token ids and targets within the vocabulary, non-empty sequences no longer than
// max_position_embeddings, consistent sizes. Errors name the sequence and position.
absl::Status ValidatePackedBatch(const PackedBatch& batch, const ModelConfig& config);

}  // namespace prl
