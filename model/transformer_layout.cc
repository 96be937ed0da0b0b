// Transformer's workspace layout (model/transformer_workspace.h): one function lays a pass out,
// in the arena for the pass or measured for a plan (PlanPassBytes).
#include <algorithm>

#include "kernels/logprob.h"
#include "model/context_heads.h"
#include "model/transformer.h"
#include "model/transformer_workspace.h"

namespace prl {

namespace k = kernels;

size_t Transformer::workspace_bytes() const { return workspace().capacity_bytes(); }

size_t Transformer::last_pass_bytes() const { return workspace().laid_out_bytes(); }

Transformer::PassShape Transformer::ShapeOf(int64_t tokens, int64_t seqs, int64_t target_rows,
                                            bool for_backward, int64_t lora_rank,
                                            int64_t lora_segments) const {
  PassShape s;
  s.T = tokens;
  s.B = seqs;
  s.R = target_rows;
  s.for_backward = for_backward;
  s.checkpointing =
      for_backward ? options_.activation_checkpointing : ActivationCheckpointing::kNone;
  s.lora_rank = lora_rank;
  // A training pass that keeps its logits for the backward: one chunk of every trained row when
  // they fit keep_logits_bytes; kept whenever one chunk holds them all.
  // A pass over several adapters' segments: the chunks their own passes would have, together.
  const int64_t V = config_.vocab_size;
  const bool keep = for_backward && *options_.keep_logits;
  const int64_t keep_bytes =
      std::max(options_.keep_logits_bytes,
               lora_segments > 1 ? lora_segments * options_.logits_chunk_bytes : int64_t{0});
  const int64_t chunk_budget =
      keep && s.R * V * static_cast<int64_t>(sizeof(float)) <= keep_bytes
          ? keep_bytes
          : options_.logits_chunk_bytes;
  s.chunk = std::min<int64_t>(std::max<int64_t>(s.R, 1), k::LogprobChunkRows(V, chunk_budget));
  return s;
}

size_t Transformer::PlanPassBytes(int64_t tokens, int64_t seqs, int64_t target_rows,
                                  bool for_backward, int64_t lora_rank,
                                  int64_t lora_segments) const {
  Workspace scratch;  // the views are discarded: this pass's own workspace stays as it was
  const PassShape shape =
      ShapeOf(tokens, seqs, target_rows, for_backward, lora_rank, lora_segments);
  return Arena::Measure(device_, [&](Arena& a) { LayOut(a, scratch, shape); });
}

void Transformer::LayOut(Arena& a, Workspace& ws, const PassShape& s) const {
  const ModelConfig& c = config_;
  const int64_t T = s.T, R = s.R, C = c.hidden_size, I = c.intermediate_size;
  const DType dt = options_.compute_dtype;
  ws.tokens = a.Take(DType::kI32, {T});
  ws.cu_seqlens = a.Take(DType::kI32, {s.B + 1});
  ws.positions = a.Take(DType::kI32, {T});
  ws.inv_freq = a.Take(DType::kF32, {c.head_dim / 2});
  ws.rope_cos = a.Take(DType::kF32, {T, c.head_dim / 2});
  ws.rope_sin = a.Take(DType::kF32, {T, c.head_dim / 2});
  const unsigned kept = s.for_backward ? KeptLayerParts(s.checkpointing) : kLayerAll;
  ws.layers.assign(s.for_backward ? c.num_hidden_layers : 2, {});
  for (LayerActivations& l : ws.layers) l = TakeLayerActivations(a, c, T, /*lse=*/true, dt, kept);
  ws.work = kept == kLayerAll ? LayerActivations{}
                              : TakeLayerActivations(a, c, T, /*lse=*/true, dt, kLayerAll & ~kept);
  if (s.lora_rank > 0) ws.lora_scratch = TakeLoraScratch(a, c, T, s.lora_rank, dt);
  ws.final_input = a.Take(dt, {T, C});
  ws.lnf = a.Take(dt, {T, C});
  ws.lnf_rstd = a.Take(DType::kF32, {T});
  ws.head_rows_dev = a.Take(DType::kI32, {R});
  ws.head_targets = a.Take(DType::kI32, {R});
  ws.head_in = R == T ? ws.lnf : a.Take(dt, {R, C});
  ws.head_lse = a.Take(DType::kF32, {R});
  ws.head_logprob = a.Take(DType::kF32, {R});
  ws.head_entropy = a.Take(DType::kF32, {R});
  ws.logits = a.Take(DType::kF32, {s.chunk, c.vocab_size});
  if (s.group > 0 && s.attention == ContextAttention::kUlysses) {
    const HeadSlice h = *UlyssesHeads(c.num_attention_heads, c.num_key_value_heads, 0, s.group);
    const int64_t D = c.head_dim, width = (h.heads + 2 * h.kv_heads) * D;
    ws.heads_qkv = a.Take(dt, {s.kv_rows, width});
    ws.heads_out = a.Take(dt, {s.kv_rows, h.heads * D});
    ws.heads_lse = a.Take(DType::kF32, {s.kv_rows, h.heads});
    ws.heads_send = a.Take(dt, {s.group * s.max_rows, width});
    ws.heads_recv = a.Take(dt, {s.group * s.max_rows, width});
    ws.kv_cu_seqlens = a.Take(DType::kI32, {s.kv_seqs + 1});
    if (s.for_backward) {
      ws.heads_dout = a.Take(dt, {s.kv_rows, h.heads * D});
      ws.heads_dqkv = a.Take(dt, {s.kv_rows, width});
    }
  } else if (s.group > 0 && s.attention == ContextAttention::kRing) {
    const int64_t width = 2 * c.kv_dim();
    RingBuffers& b = ws.ring_buffers;
    b = RingBuffers{};
    b.block = a.Take(dt, {s.max_rows, width});
    b.next = a.Take(dt, {s.max_rows, width});
    b.part_out = a.Take(dt, {T, c.q_dim()});
    b.part_lse = a.Take(DType::kF32, {T, c.num_attention_heads});
    if (s.for_backward) {
      b.dblock = a.Take(dt, {s.max_rows, width});
      b.dnext = a.Take(dt, {s.max_rows, width});
      b.part_dqkv = a.Take(dt, {T, c.qkv_dim()});
    }
  } else if (s.group > 0) {
    const int64_t width = 2 * c.kv_dim();
    ws.kv_full = a.Take(dt, {s.kv_rows, width});
    ws.kv_send = a.Take(dt, {s.max_rows, width});
    ws.kv_recv = a.Take(dt, {s.group * s.max_rows, width});
    if (s.for_backward) {
      ws.dkv_full = a.Take(dt, {s.kv_rows, width});
      ws.dkv_send = a.Take(dt, {s.group * s.max_rows, width});
      ws.dkv_recv = a.Take(dt, {s.max_rows, width});
    }
  }
  if (s.for_backward) {
    ws.dresid = a.Take(dt, {T, C});
    ws.dln = a.Take(dt, {T, C});
    const int64_t dense_I = c.has_dense_mlp() ? I : 0;
    ws.wide_a = a.Take(dt, {T * std::max(2 * dense_I, c.qkv_dim())});
    ws.wide_b = a.Take(dt, {T * std::max(dense_I, c.q_dim() * (c.qk_norm ? 2 : 1))});
    if (c.has_moe()) ws.moe = TakeMoeScratch(a, c, T, dt);
    ws.dhead_in = R == T ? ws.dln : a.Take(dt, {R, C});
    ws.dlogprob = a.Take(DType::kF32, {R});
  }
}

}  // namespace prl
