#include "learner/activation_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/enum_names.h"

namespace prl::learner {

int64_t PassPlanner::PassBytes(int64_t tokens, int64_t seqs) const {
  if (context_parallel > 1) {  // this rank's share, and the gathered keys and values
    const int64_t C = context_parallel;
    const int64_t share = std::min(tokens, (tokens + C - 1) / C + 2 * seqs);
    PassPlanner one = *this;
    one.context_parallel = 1;
    const int64_t kv_bytes = 2 * (tokens + (C + 1) * share) * 2 * config.kv_dim() *
                             static_cast<int64_t>(sizeof(float));
    return one.PassBytes(share, seqs) + kv_bytes;
  }
  const Transformer model(config, device, options);
  // The most over the rows with a target: every row, or all but one (the head's rows are then a
  // gathered copy, which every row's pass does without; any fewer rows take less).
  size_t bytes = model.PlanPassBytes(tokens, seqs, tokens, /*for_backward=*/true, lora_rank);
  if (tokens > 1) {
    bytes = std::max(bytes, model.PlanPassBytes(tokens, seqs, tokens - 1, true, lora_rank));
  }
  return static_cast<int64_t>(bytes);
}

int64_t PassPlanner::MaxSequenceTokens(int64_t budget_bytes) const {
  auto fits = [&](int64_t length) {  // a sequence of `length` tokens: its pass reads length - 1
    return PassBytes(length - 1, 1) <= budget_bytes;
  };
  // The pass's bytes grow with its tokens: the largest length that fits, by bisection.
  int64_t lo = 1, hi = std::max<int64_t>(config.max_position_embeddings, 2);
  if (fits(hi)) return hi;
  if (!fits(2)) return 0;
  lo = 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string PassPlanner::DescribeLimits(int64_t budget_bytes) const {
  const ActivationCheckpointing mode = options.activation_checkpointing;
  std::string out = absl::StrCat("learner.activation_budget_mb = ", budget_bytes >> 20,
                                 " with learner.activation_checkpointing = ",
                                 EnumName(kActivationCheckpointingNames, mode), ";");
  const char* sep = " ";
  for (const ActivationCheckpointing m :
       {ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective,
        ActivationCheckpointing::kFull}) {
    if (m == mode) continue;
    PassPlanner other = *this;
    other.options.activation_checkpointing = m;
    absl::StrAppend(&out, sep, EnumName(kActivationCheckpointingNames, m), " fits ",
                    other.MaxSequenceTokens(budget_bytes), " tokens");
    sep = ", ";
  }
  if (context_parallel == 1) {
    PassPlanner split = *this;
    split.context_parallel = 2;
    absl::StrAppend(&out, sep, "learner.context_parallel = 2 fits ",
                    split.MaxSequenceTokens(budget_bytes), " tokens");
  }
  return absl::StrCat(out, ", or raise the budget");
}

int64_t PassPlanner::BudgetMbFor(int64_t sequence_tokens) const {
  const int64_t mib = int64_t{1} << 20;
  return (PassBytes(sequence_tokens - 1, 1) + mib - 1) / mib;
}

}  // namespace prl::learner
