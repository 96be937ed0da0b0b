#include "model/packed_batch.h"

#include "absl/strings/str_cat.h"

namespace prl {

int64_t PackedBatch::num_targets() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t != kNoTarget;
  return n;
}

void PackedBatch::Add(absl::Span<const int32_t> seq_tokens, absl::Span<const int32_t> seq_targets) {
  if (cu_seqlens.empty()) cu_seqlens.push_back(0);
  tokens.insert(tokens.end(), seq_tokens.begin(), seq_tokens.end());
  targets.insert(targets.end(), seq_targets.begin(), seq_targets.end());
  cu_seqlens.push_back(static_cast<int32_t>(tokens.size()));
}

void PackedBatch::AddScored(absl::Span<const int32_t> sequence, int64_t score_from) {
  const int64_t n = static_cast<int64_t>(sequence.size());
  std::vector<int32_t> seq_targets(n - 1, kNoTarget);
  for (int64_t i = score_from; i < n; ++i) seq_targets[i - 1] = sequence[i];
  Add(sequence.subspan(0, n - 1), seq_targets);
}

namespace {

absl::Status ValidateRoutes(const PackedBatch& b, const ModelConfig& c) {
  if (b.routes.empty()) return absl::OkStatus();
  const int64_t Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  if (static_cast<int64_t>(b.routes.size()) != b.num_tokens() * Lm * K) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed batch: routes: expected tokens x MoE layers x top-k = ", b.num_tokens(), " x ", Lm,
        " x ", K, " entries or none, found ", b.routes.size()));
  }
  for (int64_t row = 0; row < b.num_tokens() * Lm; ++row) {
    const int32_t* r = b.routes.data() + row * K;
    if (r[0] == PackedBatch::kRouted) continue;
    for (int64_t k = 0; k < K; ++k) {
      bool repeated = false;
      for (int64_t j = 0; j < k; ++j) repeated |= r[j] == r[k];
      if (r[k] < 0 || r[k] >= c.num_experts || repeated) {
        return absl::InvalidArgumentError(
            absl::StrCat("packed batch: routes: position ", row / Lm, " MoE layer ", row % Lm,
                         ": expected ", K, " distinct expert ids in [0, ", c.num_experts,
                         "), found ", r[k], repeated ? " twice" : ""));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePackedBatch(const PackedBatch& b, const ModelConfig& config) {
  if (b.cu_seqlens.size() < 2 || b.cu_seqlens.front() != 0 ||
      b.cu_seqlens.back() != b.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed batch: cu_seqlens must start at 0 and end at the token count ", b.num_tokens()));
  }
  if (b.targets.size() != b.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("packed batch: ", b.targets.size(),
                                                   " targets for ", b.tokens.size(), " tokens"));
  }
  if (b.num_tokens() >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("packed batch: more than 2^31 tokens");
  }
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    const int64_t len = int64_t{b.cu_seqlens[s + 1]} - b.cu_seqlens[s];
    if (len <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed batch: sequence ", s, " is empty (sequences need >= 1 token)"));
    }
    if (len > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "packed batch: sequence ", s, " has ", len,
          " tokens, more than max_position_embeddings = ", config.max_position_embeddings));
    }
    for (int64_t i = b.cu_seqlens[s]; i < b.cu_seqlens[s + 1]; ++i) {
      if (b.tokens[i] < 0 || b.tokens[i] >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("packed batch: sequence ", s, " position ", i - b.cu_seqlens[s],
                         ": token id ", b.tokens[i], " outside [0, ", config.vocab_size, ")"));
      }
      if (b.targets[i] != PackedBatch::kNoTarget &&
          (b.targets[i] < 0 || b.targets[i] >= config.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("packed batch: sequence ", s, " position ", i - b.cu_seqlens[s],
                         ": target id ", b.targets[i], " outside [0, ", config.vocab_size, ")"));
      }
    }
  }
  return ValidateRoutes(b, config);
}

}  // namespace prl
