#include "learner/activation_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/enum_names.h"

namespace prl::learner {

PassPlanner PlannerOf(const FsdpModel& model) {
  const LoraConfig* lora = model.lora_config();
  return PassPlanner{model.config(), model.device(), model.transformer_options(),
                     lora != nullptr ? lora->rank : 0,
                     model.context() != nullptr ? model.context()->size() : 1,
                     model.context_attention()};
}

int64_t PassPlanner::PassBytes(int64_t tokens, int64_t seqs) const {
  if (context_parallel > 1) {  // this rank's share, and the exchanges' rows of the group
    const int64_t C = context_parallel;
    const int64_t share = std::min(tokens, (tokens + C - 1) / C + 2 * seqs);
    PassPlanner one = *this;
    one.context_parallel = 1;
    const int64_t f = static_cast<int64_t>(sizeof(float));
    // allgather: the group's k|v and their gradients, the exchanges' buffers.
    int64_t exchange_bytes = 2 * (tokens + (C + 1) * share) * 2 * config.kv_dim() * f;
    if (context_attention == ContextAttention::kUlysses) {
      // ulysses: this rank's heads of the group's rows: q|k|v, output, log-sum-exp and their
      // gradients, and two exchange buffers of q|k|v's width.
      const int64_t H = config.num_attention_heads, KV = config.num_key_value_heads;
      const int64_t heads = std::max<int64_t>(1, H / C), group = std::max<int64_t>(1, H / KV);
      const int64_t width = (heads + 2 * std::max<int64_t>(1, heads / group)) * config.head_dim;
      exchange_bytes = (tokens * (2 * width + 2 * heads * config.head_dim + heads) +
                        2 * C * share * width) * f;
    }
    if (context_attention == ContextAttention::kRing) {
      // ring: four blocks of the share's k|v rows (two and their gradients' two), one call's
      // partial output and log-sum-exp, and its query gradients.
      exchange_bytes = (4 * share * 2 * config.kv_dim() +
                        share * (config.q_dim() + config.num_attention_heads + config.qkv_dim())) *
                       f;
    }
    return one.PassBytes(share, seqs) + exchange_bytes;
  }
  const Transformer model(config, device, options);
  // The most over the rows with a target: every row, or all but one (the head's rows are then a
  // gathered copy, which every row's pass does without; any fewer rows take less).
  size_t bytes =
      model.PlanPassBytes(tokens, seqs, tokens, /*for_backward=*/true, lora_rank, lora_segments);
  if (tokens > 1) {
    bytes = std::max(bytes,
                     model.PlanPassBytes(tokens, seqs, tokens - 1, true, lora_rank, lora_segments));
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
