#include "model/decoder_layer.h"

#include <algorithm>
#include <array>

#include "core/status_macros.h"
#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "kernels/norm_matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace prl {

namespace k = kernels;

LayerActivations TakeLayerActivations(Arena& arena, const ModelConfig& c, int64_t T,
                                      bool with_attention_lse, DType dt, unsigned parts) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  LayerActivations l;
  if (parts & kLayerInput) l.input = arena.Take(dt, {T, C});
  if (parts & kLayerNorms) {
    l.ln1 = arena.Take(dt, {T, C});
    l.ln1_rstd = arena.Take(DType::kF32, {T});
    l.ln2 = arena.Take(dt, {T, C});
    l.ln2_rstd = arena.Take(DType::kF32, {T});
  }
  if (parts & kLayerAttention) {
    l.qkv = arena.Take(dt, {T, c.qkv_dim()});
    if (c.qk_norm) {
      l.q_pre = arena.Take(dt, {T, c.q_dim()});
      l.k_pre = arena.Take(dt, {T, c.kv_dim()});
      l.q_rstd = arena.Take(DType::kF32, {T * c.num_attention_heads});
      l.k_rstd = arena.Take(DType::kF32, {T * c.num_key_value_heads});
    }
    l.attn = arena.Take(dt, {T, c.q_dim()});
    if (with_attention_lse) l.attn_lse = arena.Take(DType::kF32, {T, c.num_attention_heads});
    l.mid = arena.Take(dt, {T, C});
  }
  if (parts & kLayerMlp) {
    if (c.has_dense_mlp()) {
      l.gate_up = arena.Take(dt, {T, 2 * I});
      l.act = arena.Take(dt, {T, I});
    }
    if (c.has_moe()) l.moe = TakeMoeActivations(arena, c, T, dt);
  }
  return l;
}

LayerActivations OverlayLayerActivations(const LayerActivations& kept,
                                         const LayerActivations& work) {
  LayerActivations l = kept;
  for (auto member : {&LayerActivations::input, &LayerActivations::ln1, &LayerActivations::ln1_rstd,
                      &LayerActivations::qkv, &LayerActivations::q_pre, &LayerActivations::k_pre,
                      &LayerActivations::q_rstd, &LayerActivations::k_rstd,
                      &LayerActivations::attn, &LayerActivations::attn_lse, &LayerActivations::mid,
                      &LayerActivations::ln2, &LayerActivations::ln2_rstd,
                      &LayerActivations::gate_up, &LayerActivations::act}) {
    if (!(l.*member).defined()) l.*member = work.*member;
  }
  if (!l.moe.probs.defined()) l.moe = work.moe;
  return l;
}

namespace {

// The first rows * cols elements of `t`, as a (rows, cols) matrix.
Tensor Prefix(const Tensor& t, int64_t rows, int64_t cols) {
  return t.Reshape({t.numel()}).Rows(0, rows * cols).Reshape({rows, cols});
}

// The queries or the keys of the packed qkv rows, for Qwen3's per-head norms: the RMSNorm
// kernels' rows are (token, head) pairs, so the heads are copied out of qkv into a contiguous
// (T, heads D) matrix, normalised there and copied back.
struct HeadGroup {
  int64_t first_column;  // in the qkv rows
  int64_t heads;
  const Tensor* pre;   // (T, heads D) the heads before the norm, kept for the backward
  const Tensor* rstd;  // (T heads)
  const Tensor* w;     // (D)
};

std::array<HeadGroup, 2> HeadGroups(const ModelConfig& c, const LayerParams& p,
                                    const LayerActivations& a) {
  return {HeadGroup{0, c.num_attention_heads, &a.q_pre, &a.q_rstd, &p.q_norm},
          HeadGroup{c.q_dim(), c.num_key_value_heads, &a.k_pre, &a.k_rstd, &p.k_norm}};
}

// Normalises every query and key head of a.qkv in place. a.attn, which the attention step
// writes only later, holds the normalised heads on their way back.
void QkNormForward(const ModelConfig& c, const LayerParams& p, const LayerActivations& a) {
  const int64_t T = a.qkv.size(0), D = c.head_dim;
  for (const HeadGroup& g : HeadGroups(c, p, a)) {
    const int64_t width = g.heads * D;
    const Tensor normalised = Prefix(a.attn, T, width);
    k::CopyColumns(*g.pre, 0, a.qkv, g.first_column, width);
    k::RmsNormForward(normalised.Reshape({T * g.heads, D}), *g.rstd,
                      g.pre->Reshape({T * g.heads, D}), *g.w, static_cast<float>(c.rms_norm_eps));
    k::CopyColumns(a.qkv, g.first_column, normalised, 0, width);
  }
}

}  // namespace

absl::Status QkNormBackward(const ModelConfig& c, const LayerParams& p, const LayerParams& g,
                            const LayerActivations& a, const Tensor& dqkv, const Tensor& scratch) {
  const int64_t T = dqkv.size(0), D = c.head_dim;
  const Tensor* dw[2] = {&g.q_norm, &g.k_norm};
  const Tensor flat = scratch.Reshape({scratch.numel()});
  const std::array<HeadGroup, 2> groups = HeadGroups(c, p, a);
  for (int i = 0; i < 2; ++i) {
    const HeadGroup& h = groups[i];
    const int64_t width = h.heads * D;
    const Tensor dy = flat.Rows(0, T * width).Reshape({T, width});  // d(normalised heads)
    const Tensor dx = flat.Rows(T * width, 2 * T * width).Reshape({T, width});  // d(before)
    k::CopyColumns(dy, 0, dqkv, h.first_column, width);
    PRL_RETURN_IF_ERROR(ZeroTensor(dx));
    k::RmsNormBackward(dx.Reshape({T * h.heads, D}), *dw[i], dy.Reshape({T * h.heads, D}),
                       h.pre->Reshape({T * h.heads, D}), *h.w, *h.rstd);
    k::CopyColumns(dqkv, h.first_column, dx, 0, width);
  }
  return absl::OkStatus();
}

namespace {

// A layer's forward steps for one LayerContext: its projections (with the RMSNorm before them,
// fused where the context allows) and its LoRA adapters.
class LayerSteps {
 public:
  explicit LayerSteps(const LayerContext& ctx) : ctx_(ctx), c_(*ctx.config) {
    PRL_CHECK((ctx.lora == nullptr && ctx.lora_rows.empty() && ctx.lora_segments.empty()) ||
                  !ctx.norm_in_gemm,
              "DecoderLayerForward: LoRA adapters read the normalised rows: norm_in_gemm must be "
              "off");
  }

  // out = RMSNorm(x) . w^T + bias, through `normalised` (and its rstd) unless fused.
  void NormThenProject(const Tensor& out, const Tensor& normalised, const Tensor& rstd,
                       const Tensor& x, const Tensor& norm, const Tensor& w,
                       const Tensor& bias) const {
    const float eps = static_cast<float>(c_.rms_norm_eps);
    if (ctx_.norm_in_gemm && x.size(0) <= k::kNormInGemmMaxRows &&
        k::NormMatmulSupported(out, x, norm, w, bias, ctx_.order)) {
      return k::NormMatmulForward(out, x, norm, eps, w, bias);
    }
    k::RmsNormForward(normalised, rstd, x, norm, eps);
    k::MatmulForward(out, normalised, w, bias, /*accumulate=*/false, ctx_.order);
  }

  // The layer's LoRA adapters of `targets`, reading x and adding into out's columns.
  void Adapters(std::initializer_list<LoraTarget> targets, const Tensor& x,
                const Tensor& out) const {
    for (const LoraLayerSegment& g : ctx_.lora_segments) {
      for (const LoraTarget t : targets) {
        if ((*g.layer)[t].defined()) {
          LoraForward((*g.layer)[t], g.scale, LoraSiteOf(t, c_), x.Rows(g.begin, g.end),
                      out.Rows(g.begin, g.end), *ctx_.lora_scratch, ctx_.order);
        }
      }
    }
    for (const LoraRows& r : ctx_.lora_rows) {
      for (const LoraTarget t : targets) {
        if ((*r.layer)[t].defined()) {
          LoraForwardRows((*r.layer)[t], r.scale, LoraSiteOf(t, c_), x, out, r.rows,
                          *ctx_.lora_scratch, ctx_.order);
        }
      }
    }
    if (ctx_.lora == nullptr || std::none_of(targets.begin(), targets.end(), [&](LoraTarget t) {
          return (*ctx_.lora)[t].defined();
        })) {
      return;
    }
    const Tensor xf = LoraInput(x, *ctx_.lora_scratch);  // read as F32 once for the targets
    for (const LoraTarget t : targets) {
      if ((*ctx_.lora)[t].defined()) {
        LoraForward((*ctx_.lora)[t], ctx_.lora_scale, LoraSiteOf(t, c_), xf, out,
                    *ctx_.lora_scratch, ctx_.order);
      }
    }
  }

  // out = residual + x . w^T (+ bias). The residual fused into the projection, or, unfused, a
  // copy, then the projection accumulates (ConvertDType of equal dtypes is a copy on the
  // current stream, so the engine's non-blocking stream orders it and a CUDA graph captures
  // it; CopyTensor runs on the legacy stream). A projection with a bias (Qwen3's o_proj with
  // attention_bias) takes the unfused path.
  void ProjectOnto(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                   const Tensor& residual) const {
    if (ctx_.residual_in_gemm && !bias.defined()) {
      return k::MatmulResidualForward(out, x, w, residual, ctx_.order);
    }
    k::ConvertDType(out, residual);
    k::MatmulForward(out, x, w, bias, /*accumulate=*/true, ctx_.order);
  }

 private:
  const LayerContext& ctx_;
  const ModelConfig& c_;
};

}  // namespace

void DecoderAttentionForward(const LayerContext& ctx, const LayerParams& p,
                             const LayerActivations& a, AttentionStep attention) {
  const ModelConfig& c = *ctx.config;
  const LayerSteps steps(ctx);
  steps.NormThenProject(a.qkv, a.ln1, a.ln1_rstd, a.input, p.input_norm, p.qkv_weight,
                        p.qkv_bias);
  steps.Adapters({LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV}, a.ln1, a.qkv);
  if (c.qk_norm) QkNormForward(c, p, a);
  if (!ctx.attention_applies_rope) {
    k::RopeApply(a.qkv, c.num_attention_heads + c.num_key_value_heads, c.head_dim, ctx.rope_cos,
                 ctx.rope_sin, /*inverse=*/false);
  }
  attention(a);
  // mid = input + attn . Wo^T
  steps.ProjectOnto(a.mid, a.attn, p.o_weight, p.o_bias, a.input);
  steps.Adapters({LoraTarget::kO}, a.attn, a.mid);
}

void DecoderMlpForward(const LayerContext& ctx, const LayerParams& p, const LayerActivations& a,
                       const Tensor& next_input) {
  const ModelConfig& c = *ctx.config;
  const LayerSteps steps(ctx);
  if (p.is_moe()) {  // the router and the experts read the normalised rows
    PRL_CHECK(next_input.defined(), "DecoderMlpForward: a MoE block needs an output");
    k::RmsNormForward(a.ln2, a.ln2_rstd, a.mid, p.post_norm, static_cast<float>(c.rms_norm_eps));
    return MoeForward(c, ctx.order, p, a.moe, a.ln2, a.mid, next_input, ctx.moe_forced_routes);
  }
  steps.NormThenProject(a.gate_up, a.ln2, a.ln2_rstd, a.mid, p.post_norm, p.gate_up_weight, {});
  steps.Adapters({LoraTarget::kGate, LoraTarget::kUp}, a.ln2, a.gate_up);
  k::SwiGluForward(a.act, a.gate_up);
  if (!next_input.defined()) return;  // a recomputation: the backward reads no further
  // next = mid + act . Wdown^T
  steps.ProjectOnto(next_input, a.act, p.down_weight, {}, a.mid);
  steps.Adapters({LoraTarget::kDown}, a.act, next_input);
}

void DecoderLayerForward(const LayerContext& ctx, const LayerParams& p, const LayerActivations& a,
                         const Tensor& next_input, AttentionStep attention) {
  DecoderAttentionForward(ctx, p, a, attention);
  DecoderMlpForward(ctx, p, a, next_input);
}

}  // namespace prl
