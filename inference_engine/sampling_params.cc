#include "inference_engine/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace prl {

absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto found) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling params: ", field, " must be ", expected, ", found ", found));
  };
  if (p.n < 1) return bad("n", ">= 1", p.n);
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return bad("temperature", ">= 0 and finite", p.temperature);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", "in (0, 1]", p.top_p);
  if (p.top_k < 0) return bad("top_k", ">= 0 (0 disables)", p.top_k);
  if (p.max_tokens < 1) return bad("max_tokens", ">= 1", p.max_tokens);
  if (p.top_logprobs < 0 || p.top_logprobs > 20) {
    return bad("top_logprobs", "0 to 20", p.top_logprobs);
  }
  if (p.top_logprobs > 0 && !p.multi_turn) {
    return bad("top_logprobs", "0 unless multi_turn (turns report the alternatives)",
               p.top_logprobs);
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int32_t t = p.stop_token_ids[i];
    if (t < 0 || t >= vocab_size) {
      return bad(absl::StrCat("stop_token_ids[", i, "]"),
                 absl::StrCat("a token id in [0, ", vocab_size, ")"), t);
    }
  }
  return absl::OkStatus();
}

}  // namespace prl
