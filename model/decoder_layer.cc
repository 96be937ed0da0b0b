#include "model/decoder_layer.h"

#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace prl {

namespace k = kernels;

LayerActivations TakeLayerActivations(Arena& arena, const ModelConfig& c, int64_t T,
                                      bool with_attention_lse, DType dt) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  LayerActivations l;
  l.input = arena.Take(dt, {T, C});
  l.ln1 = arena.Take(dt, {T, C});
  l.ln1_rstd = arena.Take(DType::kF32, {T});
  l.qkv = arena.Take(dt, {T, c.qkv_dim()});
  l.attn = arena.Take(dt, {T, c.q_dim()});
  if (with_attention_lse) l.attn_lse = arena.Take(DType::kF32, {T, c.num_attention_heads});
  l.mid = arena.Take(dt, {T, C});
  l.ln2 = arena.Take(dt, {T, C});
  l.ln2_rstd = arena.Take(DType::kF32, {T});
  l.gate_up = arena.Take(dt, {T, 2 * I});
  l.act = arena.Take(dt, {T, I});
  return l;
}

void DecoderLayerForward(const LayerContext& ctx, const LayerParams& p, const LayerActivations& a,
                         const Tensor& next_input, AttentionStep attention) {
  const ModelConfig& c = *ctx.config;
  const float eps = static_cast<float>(c.rms_norm_eps);
  k::RmsNormForward(a.ln1, a.ln1_rstd, a.input, p.input_norm, eps);
  k::MatmulForward(a.qkv, a.ln1, p.qkv_weight, p.qkv_bias, /*accumulate=*/false, ctx.order);
  if (!ctx.attention_applies_rope) {
    k::RopeApply(a.qkv, c.num_attention_heads + c.num_key_value_heads, c.head_dim, ctx.rope_cos,
                 ctx.rope_sin, /*inverse=*/false);
  }
  attention(a);
  // mid = input + attn . Wo^T and next = mid + act . Wdown^T: the residuals fused into the
  // projections. Unfused: a copy, then the projection accumulates (ConvertDType of equal dtypes
  // is a copy on the current stream, so the engine's non-blocking stream orders it and a CUDA
  // graph captures it; CopyTensor runs on the legacy stream).
  auto project_onto = [&](const Tensor& out, const Tensor& x, const Tensor& w,
                          const Tensor& residual) {
    if (ctx.residual_in_gemm) return k::MatmulResidualForward(out, x, w, residual, ctx.order);
    k::ConvertDType(out, residual);
    k::MatmulForward(out, x, w, {}, /*accumulate=*/true, ctx.order);
  };
  project_onto(a.mid, a.attn, p.o_weight, a.input);
  k::RmsNormForward(a.ln2, a.ln2_rstd, a.mid, p.post_norm, eps);
  k::MatmulForward(a.gate_up, a.ln2, p.gate_up_weight, {}, /*accumulate=*/false, ctx.order);
  k::SwiGluForward(a.act, a.gate_up);
  project_onto(next_input, a.act, p.down_weight, a.mid);
}

}  // namespace prl
