#include "inference_engine/model_runner.h"

#include <algorithm>

#include "core/status_macros.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/paged_attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

namespace prl {

namespace k = kernels;

namespace {
absl::Status Upload(const Tensor& dst, const void* src) {
  return CopyBytes(dst.data, dst.device, src, Device::Cpu(), dst.bytes());
}
}  // namespace

ModelRunner::ModelRunner(const ModelConfig& config, Device device, KvCache* cache,
                         kernels::ReductionOrder order)
    : config_(config),
      device_(device),
      cache_(cache),
      order_(order),
      inv_freq_(RopeInverseFrequencies(config)),
      arena_(device) {}

absl::Status ModelRunner::Execute(const ModelParams& params, const SchedulerOutput& step,
                                  Tensor* logits) {
  const ModelConfig& c = config_;
  const int64_t B = static_cast<int64_t>(step.chunks.size());
  const int64_t T = step.num_tokens, C = c.hidden_size, bs = cache_->block_size;
  int64_t max_blocks = 1, R = 0;
  for (const ScheduledChunk& ch : step.chunks) {
    max_blocks = std::max<int64_t>(max_blocks, ch.seq->block_table.size());
    R += ch.samples;
  }

  // Host-side step description.
  std::vector<int32_t> tokens, positions, slots, q_start = {0}, context_lens, sample_rows;
  std::vector<int32_t> tables(B * max_blocks, 0);
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& seq = *step.chunks[b].seq;
    const int64_t first = seq.num_computed_tokens, n = step.chunks[b].num_tokens;
    for (int64_t p = first; p < first + n; ++p) {
      tokens.push_back(seq.tokens[p]);
      positions.push_back(static_cast<int32_t>(p));
      slots.push_back(static_cast<int32_t>(seq.block_table[p / bs] * bs + p % bs));
    }
    q_start.push_back(static_cast<int32_t>(tokens.size()));
    context_lens.push_back(static_cast<int32_t>(first + n));
    std::copy(seq.block_table.begin(), seq.block_table.end(), tables.begin() + b * max_blocks);
    if (step.chunks[b].samples) sample_rows.push_back(q_start.back() - 1);
  }

  LayerActivations slot[2];
  Tensor d_tokens, d_positions, d_slots, d_q_start, d_context, d_tables, d_rows, d_inv_freq;
  Tensor cos, sin, final_input, gathered, lnf_rstd, head_in, out_logits, pairs;
  PRL_RETURN_IF_ERROR(arena_.Build([&](Arena& a) {
    d_tokens = a.Take(DType::kI32, {T});
    d_positions = a.Take(DType::kI32, {T});
    d_slots = a.Take(DType::kI32, {T});
    d_q_start = a.Take(DType::kI32, {B + 1});
    d_context = a.Take(DType::kI32, {B});
    d_tables = a.Take(DType::kI32, {B, max_blocks});
    d_rows = a.Take(DType::kI32, {R});
    d_inv_freq = a.Take(DType::kF32, {c.head_dim / 2});
    pairs = a.Take(DType::kI32, {static_cast<int64_t>(step.block_copies.size()), 2});
    cos = a.Take(DType::kF32, {T, c.head_dim / 2});
    sin = a.Take(DType::kF32, {T, c.head_dim / 2});
    for (LayerActivations& l : slot) l = TakeLayerActivations(a, c, T, /*lse=*/false);
    final_input = a.Take(DType::kF32, {T, C});
    gathered = a.Take(DType::kF32, {R, C});
    lnf_rstd = a.Take(DType::kF32, {R});
    head_in = a.Take(DType::kF32, {R, C});
    out_logits = a.Take(DType::kF32, {R, c.vocab_size});
  }));
  PRL_RETURN_IF_ERROR(Upload(d_tokens, tokens.data()));
  PRL_RETURN_IF_ERROR(Upload(d_positions, positions.data()));
  PRL_RETURN_IF_ERROR(Upload(d_slots, slots.data()));
  PRL_RETURN_IF_ERROR(Upload(d_q_start, q_start.data()));
  PRL_RETURN_IF_ERROR(Upload(d_context, context_lens.data()));
  PRL_RETURN_IF_ERROR(Upload(d_tables, tables.data()));
  PRL_RETURN_IF_ERROR(Upload(d_rows, sample_rows.data()));
  PRL_RETURN_IF_ERROR(Upload(d_inv_freq, inv_freq_.data()));

  if (!step.block_copies.empty()) {
    std::vector<int32_t> flat;
    for (const auto& [src, dst] : step.block_copies) flat.insert(flat.end(), {src, dst});
    PRL_RETURN_IF_ERROR(Upload(pairs, flat.data()));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      k::KvCacheCopyBlocks(cache_->k[l], cache_->v[l], pairs);
    }
  }

  const k::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  k::RopeTables(cos, sin, d_positions, d_inv_freq);
  k::EmbeddingForward(slot[0].input, params.embed, d_tokens);
  const LayerContext ctx{&config_, cos, sin, order_};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerActivations& a = slot[l % 2];
    const Tensor& next = l + 1 < c.num_hidden_layers ? slot[(l + 1) % 2].input : final_input;
    DecoderLayerForward(ctx, params.layers[l], a, next, [&](const LayerActivations& act) {
      k::KvCacheWrite(cache_->k[l], cache_->v[l], act.qkv, d_slots, shape);
      k::PagedAttentionForward(act.attn, act.qkv, cache_->k[l], cache_->v[l], d_tables, d_q_start,
                               d_context, shape, order_);
    });
  }
  if (R > 0) {
    // Only the sampled rows need the final norm and the head (RMSNorm is per row).
    k::EmbeddingForward(gathered, final_input, d_rows);  // row gather
    k::RmsNormForward(head_in, lnf_rstd, gathered, params.final_norm,
                      static_cast<float>(c.rms_norm_eps));
    k::MatmulForward(out_logits, head_in, params.lm_head, {}, /*accumulate=*/false, order_);
  }
  *logits = out_logits;
  return absl::OkStatus();
}

}  // namespace prl
