#include "model/transformer.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/attention.h"
#include "kernels/context_attention.h"
#include "model/context_heads.h"
#include "kernels/embedding.h"
#include "kernels/logprob.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/decoder_layer.h"
#include "model/transformer_workspace.h"

namespace prl {

namespace k = kernels;

namespace {

absl::Status CopyToDevice(const Tensor& dst, const void* src) {
  return CopyBytes(dst.data, dst.device, src, Device::Cpu(), dst.bytes());
}

// Several adapters' segments (ModelParams::lora_segments): on the CPU in fp32 without context
// parallelism, instead of `lora`, in order and covering the batch, each whole sequences, each
// adapter made for this model.
absl::Status CheckLoraSegments(const ModelParams& params, const PackedBatch& batch,
                               const ModelConfig& c, Device device, DType compute, bool context) {
  const absl::Span<const LoraSegment> segments = params.lora_segments;
  if (segments.empty()) return absl::OkStatus();
  if (!device.is_cpu() || compute != DType::kF32 || context || params.lora != nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "several adapters in one pass (ModelParams::lora_segments) run on the CPU in fp32, "
        "without context parallelism and instead of one adapter; found ", device.ToString(), " ",
        DTypeName(compute), context ? ", a context-parallel pass" : "",
        params.lora != nullptr ? ", one adapter besides" : ""));
  }
  std::vector<bool> boundary(batch.num_tokens() + 1, false);
  for (const int32_t b : batch.cu_seqlens) boundary[b] = true;
  int64_t next = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const LoraSegment& g = segments[i];
    if (g.lora == nullptr || g.begin != next || g.end <= g.begin || g.end > batch.num_tokens() ||
        !boundary[g.end]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lora_segments[", i, "]: expected an adapter on tokens [", next,
          ", the end of a sequence <= ", batch.num_tokens(), "), found ",
          g.lora == nullptr ? "no adapter on " : "", "[", g.begin, ", ", g.end, ")"));
    }
    PRL_RETURN_IF_ERROR(ValidateLoraParams(*g.lora, c, device));
    next = g.end;
  }
  if (next != batch.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("lora_segments: cover tokens [0, ", next,
                                                   ") of a batch of ", batch.num_tokens()));
  }
  return absl::OkStatus();
}

// The gradients of a pass over several adapters' segments name the same segments, each with
// its adapter's gradients; the load-balancing loss is the batch's, not each segment's, so it
// cannot train there.
absl::Status CheckSegmentGrads(absl::Span<const LoraSegment> forward, const ModelParams& params,
                               const ModelParams& grads, double load_balancing_weight) {
  const absl::Span<const LoraSegment> p = params.lora_segments, g = grads.lora_segments;
  bool same = p.size() == forward.size() && g.size() == forward.size();
  for (size_t i = 0; same && i < p.size(); ++i) {
    same = p[i].lora == forward[i].lora && g[i].lora != nullptr &&
           g[i].begin == forward[i].begin && g[i].end == forward[i].end &&
           p[i].begin == forward[i].begin && p[i].end == forward[i].end;
  }
  if (!same) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Transformer::Backward: params.lora_segments must be the Forward's ", forward.size(),
        " segments and grads.lora_segments the same with their adapters' gradients, found ",
        p.size(), " and ", g.size()));
  }
  if (!p.empty() && load_balancing_weight != 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Transformer::Backward: a load-balancing weight (", load_balancing_weight,
        ") in a pass over several adapters' segments (the loss would be their batch's)"));
  }
  return absl::OkStatus();
}

}  // namespace


Transformer::Transformer(const ModelConfig& config, Device device, TransformerOptions options)
    : config_(config),
      device_(device),
      options_(options),
      inv_freq_(RopeInverseFrequencies(config)),
      arena_(device),
      ws_(std::make_unique<Workspace>()) {
  PRL_CHECK(ValidateModelConfig(config).ok(), "Transformer needs a valid config");
  PRL_CHECK(options_.shared_workspace == nullptr ||
                options_.shared_workspace->device() == device,
            "Transformer: a shared workspace on another device");
  PRL_CHECK(KernelBackendAvailable(device.type), "no kernel backend for ", device.ToString());
  PRL_CHECK(options_.compute_dtype == DType::kF32 ||
                (options_.compute_dtype == DType::kBF16 && device.is_cuda()),
            "Transformer: compute dtype ", DTypeName(options_.compute_dtype),
            " is not available on ", device.ToString(), " (F32 everywhere, BF16 on CUDA)");
  if (options_.logits_chunk_bytes <= 0) {
    options_.logits_chunk_bytes = device.is_cuda() ? int64_t{1} << 30 : int64_t{64} << 20;
  }
  if (!options_.keep_logits.has_value()) options_.keep_logits = device.is_cpu();
}

Transformer::~Transformer() = default;

absl::Status Transformer::Forward(const ModelParams& params, const PackedBatch& batch,
                                  float temperature, absl::Span<float> logprobs, bool for_backward,
                                  UnitHooks* hooks, const ContextShard* context) {
  PRL_RETURN_IF_ERROR(ValidatePackedBatch(batch, config_));
  if (!(temperature > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be > 0 for log-probabilities, found ", temperature));
  }
  if (static_cast<int64_t>(logprobs.size()) != batch.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs has ", logprobs.size(), " slots for ",
                                                   batch.num_tokens(), " tokens"));
  }
  const ModelConfig& c = config_;
  if (params.lora != nullptr && !device_.is_cpu() && !options_.cuda_lora) {
    return absl::UnimplementedError(
        absl::StrCat("LoRA adapters run on the CPU backend only for now (model/lora.h), found ",
                     device_.ToString(),
                     " (TransformerOptions::cuda_lora: written, not yet verified on a GPU)"));
  }
  if (params.lora != nullptr) PRL_RETURN_IF_ERROR(ValidateLoraParams(*params.lora, c, device_));
  PRL_RETURN_IF_ERROR(
      CheckLoraSegments(params, batch, c, device_, options_.compute_dtype, context != nullptr));
  Workspace& ws = *ws_;
  ws.lora = params.lora;
  ws.segments.assign(params.lora_segments.begin(), params.lora_segments.end());
  int64_t lora_rank = params.lora != nullptr ? params.lora->rank : 0;
  for (const LoraSegment& g : ws.segments) lora_rank = std::max(lora_rank, g.lora->rank);
  ws.T = batch.num_tokens();
  ws.B = batch.num_seqs();
  ws.for_backward = for_backward;
  ws.backward_ready = false;
  ws.temperature = temperature;
  ws.head_rows.clear();
  std::vector<int32_t> head_targets;
  for (int64_t t = 0; t < ws.T; ++t) {
    if (batch.targets[t] == PackedBatch::kNoTarget) continue;
    ws.head_rows.push_back(static_cast<int32_t>(t));
    head_targets.push_back(batch.targets[t]);
  }
  ws.R = static_cast<int64_t>(ws.head_rows.size());

  const int64_t T = ws.T, R = ws.R;
  PassShape shape = ShapeOf(T, ws.B, ws.R, for_backward, lora_rank,
                            std::max<int64_t>(ws.segments.size(), 1));
  ws.context.reset();
  ws.kv_cu_seqlens = Tensor();  // laid out again by a Ulysses pass only
  ws.ring.reset();
  ws.exchange = nullptr;
  if (context != nullptr) {
    const bool on_device = !device_.is_cpu() || options_.compute_dtype != DType::kF32;
    if (on_device &&
        (context->attention != ContextAttention::kUlysses || !options_.cuda_context_parallel)) {
      return absl::UnimplementedError(absl::StrCat(
          "context parallelism runs on the CPU in fp32, or on CUDA with "
          "learner.context_parallel_attention = ulysses and learner.cuda_context_parallel "
          "(written, not yet verified on a GPU), found ", device_.ToString(), " ",
          DTypeName(options_.compute_dtype), " with ",
          EnumName(kContextAttentionNames, context->attention)));
    }
    if (on_device) {
      PRL_RETURN_IF_ERROR(ContextHeadsOnDevice(c.num_attention_heads, c.num_key_value_heads,
                                               context->exchange->size()));
    }
    PRL_ASSIGN_OR_RETURN(ws.context,
                         ContextPlan::Make(*context, batch, c.max_position_embeddings));
    ws.exchange = context->exchange;
    shape.kv_rows = ws.context->kv_rows;
    shape.max_rows = ws.context->max_rows;
    shape.group = ws.context->size;
    shape.attention = context->attention;
    shape.kv_seqs = static_cast<int64_t>(ws.context->kv_cu_seqlens.size()) - 1;
    if (shape.attention == ContextAttention::kRing) ws.ring = RingSteps::Make(*ws.context);
    if (shape.attention == ContextAttention::kUlysses) {
      PRL_RETURN_IF_ERROR(UlyssesHeads(c.num_attention_heads, c.num_key_value_heads,
                                       ws.context->rank, ws.context->size)
                              .status());
    }
  }
  ws.checkpointing = shape.checkpointing;
  ws.logits_kept = for_backward && *options_.keep_logits && ws.R > 0 && shape.chunk >= ws.R;
  PRL_RETURN_IF_ERROR(workspace().Build([&](Arena& a) { LayOut(a, ws, shape); }));

  std::vector<int32_t> positions(T);
  if (ws.context) {
    positions = ws.context->positions;  // the tokens' positions in their whole sequences
  } else {
    for (int64_t s = 0; s < ws.B; ++s) {
      for (int32_t t = batch.cu_seqlens[s]; t < batch.cu_seqlens[s + 1]; ++t) {
        positions[t] = t - batch.cu_seqlens[s];
      }
    }
  }
  PRL_RETURN_IF_ERROR(CopyToDevice(ws.tokens, batch.tokens.data()));
  PRL_RETURN_IF_ERROR(CopyToDevice(ws.cu_seqlens, batch.cu_seqlens.data()));
  PRL_RETURN_IF_ERROR(CopyToDevice(ws.positions, positions.data()));
  if (ws.kv_cu_seqlens.defined()) {
    PRL_RETURN_IF_ERROR(CopyToDevice(ws.kv_cu_seqlens, ws.context->kv_cu_seqlens.data()));
  }
  PRL_RETURN_IF_ERROR(CopyToDevice(ws.inv_freq, inv_freq_.data()));
  PRL_RETURN_IF_ERROR(CopyToDevice(ws.head_rows_dev, ws.head_rows.data()));
  PRL_RETURN_IF_ERROR(CopyToDevice(ws.head_targets, head_targets.data()));
  const int64_t Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  ws.recomputed_routes.assign(T * Lm * K, 0);
  ws.lb_loss = 0.0;
  const int64_t S = static_cast<int64_t>(ws.segments.size());
  ws.token_segment.assign(S > 0 ? T : 0, 0);
  for (int64_t g = 0; g < S; ++g) {
    std::fill(ws.token_segment.begin() + ws.segments[g].begin,
              ws.token_segment.begin() + ws.segments[g].end, static_cast<int32_t>(g));
  }
  ws.lb_count.assign(std::max<int64_t>(S, 1) * c.num_experts, 0.0);  // (segments or 1, E)
  ws.lb_prob_sum.assign(ws.lb_count.size(), 0.0);
  ws.segment_lb_loss.assign(S, 0.0);
  ws.forced_routes.clear();
  ws.used_routes.assign(
      for_backward && ws.checkpointing != ActivationCheckpointing::kNone ? Lm * T * K : 0, 0);
  if (!batch.routes.empty()) {  // (T, Lm, K) -> (Lm, T, K)
    ws.forced_routes.resize(batch.routes.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t l = 0; l < Lm; ++l) {
        std::copy_n(batch.routes.data() + (t * Lm + l) * K, K,
                    ws.forced_routes.data() + (l * T + t) * K);
      }
    }
  }

  using Pass = UnitHooks::Pass;
  const int head_unit = static_cast<int>(c.num_hidden_layers) + 1;
  const bool tied = c.tie_word_embeddings;
  auto acquire = [&](int unit) {
    return hooks == nullptr ? absl::OkStatus() : hooks->Acquire(unit, Pass::kForward, true);
  };
  auto release = [&](int unit) {
    return hooks == nullptr ? absl::OkStatus() : hooks->Release(unit, Pass::kForward, false);
  };
  k::RopeTables(ws.rope_cos, ws.rope_sin, ws.positions, ws.inv_freq);
  PRL_RETURN_IF_ERROR(acquire(0));
  k::EmbeddingForward(ws.Slot(0).input, params.embed, ws.tokens);
  PRL_RETURN_IF_ERROR(release(0));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    PRL_RETURN_IF_ERROR(acquire(static_cast<int>(l) + 1));
    PRL_RETURN_IF_ERROR(ForwardLayer(params.layers[l], l));
    PRL_RETURN_IF_ERROR(release(static_cast<int>(l) + 1));
  }
  PRL_RETURN_IF_ERROR(acquire(head_unit));
  if (tied) PRL_RETURN_IF_ERROR(acquire(0));
  k::RmsNormForward(ws.lnf, ws.lnf_rstd, ws.final_input, params.final_norm,
                    static_cast<float>(c.rms_norm_eps));

  std::fill(logprobs.begin(), logprobs.end(), 0.0f);
  ws.entropies.assign(T, 0.0f);
  // The policy's entropy, for training passes (the CUDA row kernel, kernels/cuda/logprob.cu,
  // verified on an H200 by tests/kernels/cuda_logprob_test.cc).
  const bool with_entropy = for_backward;
  if (R > 0) {
    if (R < T) k::EmbeddingForward(ws.head_in, ws.lnf, ws.head_rows_dev);  // row gather
    k::LogprobForward(ws.head_logprob, ws.head_lse, ws.head_in, params.lm_head, ws.head_targets,
                      temperature, ws.logits, options_.reduction_order,
                      with_entropy ? &ws.head_entropy : nullptr);
    std::vector<float> head_logprobs(R), head_entropies(R);
    PRL_RETURN_IF_ERROR(CopyBytes(head_logprobs.data(), Device::Cpu(), ws.head_logprob.data,
                                  device_, R * sizeof(float)));
    if (with_entropy) {
      PRL_RETURN_IF_ERROR(CopyBytes(head_entropies.data(), Device::Cpu(), ws.head_entropy.data,
                                    device_, R * sizeof(float)));
    }
    for (int64_t r = 0; r < R; ++r) {
      logprobs[ws.head_rows[r]] = head_logprobs[r];
      ws.entropies[ws.head_rows[r]] = head_entropies[r];
    }
  }
  PRL_RETURN_IF_ERROR(release(head_unit));
  if (tied) PRL_RETURN_IF_ERROR(release(0));
  ws.lb_tokens = static_cast<double>(T);
  if (Lm > 0 && ws.context) {  // the group's counts, sums and tokens
    std::vector<double> sums(ws.lb_count);
    sums.insert(sums.end(), ws.lb_prob_sum.begin(), ws.lb_prob_sum.end());
    sums.push_back(ws.lb_tokens);
    PRL_RETURN_IF_ERROR(ws.exchange->AllReduceHost(absl::MakeSpan(sums)));
    std::copy_n(sums.begin(), c.num_experts, ws.lb_count.begin());
    std::copy_n(sums.begin() + c.num_experts, c.num_experts, ws.lb_prob_sum.begin());
    ws.lb_tokens = sums.back();
  }
  // aux = E sum_e f_e P_e over the Lm T (layer, token) rows; with segments, each segment's
  // over its own rows, and the whole batch's from the summed counts.
  const auto aux = [&](const double* count, const double* prob_sum, double tokens) {
    const double rows = static_cast<double>(Lm) * tokens;
    double loss = 0.0;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      loss += (count[e] / rows) * (prob_sum[e] / rows);
    }
    return loss * static_cast<double>(c.num_experts);
  };
  if (Lm > 0 && S > 0) {
    const int64_t E = c.num_experts;
    for (int64_t g = 0; g < S; ++g) {
      ws.segment_lb_loss[g] = aux(ws.lb_count.data() + g * E, ws.lb_prob_sum.data() + g * E,
                                  static_cast<double>(ws.segments[g].end - ws.segments[g].begin));
      if (g == 0) continue;
      for (int64_t e = 0; e < E; ++e) {
        ws.lb_count[e] += ws.lb_count[g * E + e];
        ws.lb_prob_sum[e] += ws.lb_prob_sum[g * E + e];
      }
    }
  }
  if (Lm > 0) ws.lb_loss = aux(ws.lb_count.data(), ws.lb_prob_sum.data(), ws.lb_tokens);
  ws.backward_ready = for_backward;
  return absl::OkStatus();
}

namespace {

// The layer's index among the MoE layers.
int64_t MoeIndex(const ModelConfig& c, int64_t layer) {
  int64_t moe_index = 0;
  for (int64_t l = 0; l < layer; ++l) moe_index += c.IsMoeLayer(l) ? 1 : 0;
  return moe_index;
}

}  // namespace

LayerContext Transformer::ContextOf(const LayerParams& p, int64_t layer,
                                    const int32_t* forced_routes) const {
  Workspace& ws = *ws_;  // (its per-layer segment views are rebuilt here)
  LayerContext ctx{&config_, ws.rope_cos, ws.rope_sin, options_.reduction_order};
  ctx.residual_in_gemm = options_.residual_in_gemm;
  if (p.is_moe()) ctx.moe_forced_routes = forced_routes;
  if (ws.lora != nullptr) {
    ctx.lora = &ws.lora->layers[layer];
    ctx.lora_scale = ws.lora->scale;
    ctx.lora_scratch = &ws.lora_scratch;
  }
  if (!ws.segments.empty()) {
    ws.layer_segments.clear();
    for (const LoraSegment& s : ws.segments) {
      ws.layer_segments.push_back({&s.lora->layers[layer], s.lora->scale, s.begin, s.end});
    }
    ctx.lora_segments = ws.layer_segments;
    ctx.lora_scratch = &ws.lora_scratch;
  }
  return ctx;
}

absl::Status Transformer::Attend(const LayerActivations& a) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const k::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  if (!ws.context) {
    k::AttentionForward(a.attn, a.attn_lse, a.qkv, ws.cu_seqlens, shape, options_.reduction_order);
    return absl::OkStatus();
  }
  if (ws.kv_cu_seqlens.defined()) return AttendHeads(a);
  if (ws.ring) {
    return RingAttentionForward(*ws.context, *ws.ring, *ws.exchange, a.qkv, shape,
                                ws.ring_buffers, a.attn, a.attn_lse);
  }
  PRL_RETURN_IF_ERROR(GatherKeysValues(*ws.context, *ws.exchange, a.qkv, c.q_dim(), ws.kv_send,
                                       ws.kv_recv, ws.kv_full));
  k::ContextAttentionForward(a.attn, a.attn_lse, a.qkv, ws.kv_full, ws.context->pieces, shape);
  return absl::OkStatus();
}

// Ulysses (model/context_heads.h): this rank's heads of every token, the packed attention over
// the group's whole sequences, the output traded back.
absl::Status Transformer::AttendHeads(const LayerActivations& a) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const ContextPlan& plan = *ws.context;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  PRL_ASSIGN_OR_RETURN(const HeadSlice h, UlyssesHeads(H, KV, plan.rank, plan.size));
  PRL_RETURN_IF_ERROR(ToHeads(plan, *ws.exchange, a.qkv, QkvColumns(H, KV, D, plan.size),
                              ws.heads_send, ws.heads_recv, ws.heads_qkv));
  k::AttentionForward(ws.heads_out, ws.heads_lse, ws.heads_qkv, ws.kv_cu_seqlens,
                      {h.heads, h.kv_heads, D}, options_.reduction_order);
  PRL_RETURN_IF_ERROR(FromHeads(plan, *ws.exchange, ws.heads_out,
                                HeadColumns(H, KV, D, plan.size), ws.heads_send, ws.heads_recv,
                                a.attn));
  return FromHeads(plan, *ws.exchange, ws.heads_lse, HeadColumns(H, KV, 1, plan.size),
                   ws.heads_send, ws.heads_recv, a.attn_lse);
}

absl::Status Transformer::AttendHeadsBackward(const LayerActivations& a, const Tensor& dattn,
                                              const Tensor& dqkv) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const ContextPlan& plan = *ws.context;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  PRL_ASSIGN_OR_RETURN(const HeadSlice h, UlyssesHeads(H, KV, plan.rank, plan.size));
  const SliceColumns qkv_columns = QkvColumns(H, KV, D, plan.size);
  const SliceColumns out_columns = HeadColumns(H, KV, D, plan.size);
  ContextExchange& ex = *ws.exchange;
  PRL_RETURN_IF_ERROR(
      ToHeads(plan, ex, a.qkv, qkv_columns, ws.heads_send, ws.heads_recv, ws.heads_qkv));
  PRL_RETURN_IF_ERROR(
      ToHeads(plan, ex, a.attn, out_columns, ws.heads_send, ws.heads_recv, ws.heads_out));
  PRL_RETURN_IF_ERROR(ToHeads(plan, ex, a.attn_lse, HeadColumns(H, KV, 1, plan.size),
                              ws.heads_send, ws.heads_recv, ws.heads_lse));
  PRL_RETURN_IF_ERROR(
      ToHeads(plan, ex, dattn, out_columns, ws.heads_send, ws.heads_recv, ws.heads_dout));
  k::AttentionBackward(ws.heads_dqkv, ws.heads_dout, ws.heads_qkv, ws.heads_out, ws.heads_lse,
                       ws.kv_cu_seqlens, {h.heads, h.kv_heads, D});
  return FromHeads(plan, ex, ws.heads_dqkv, qkv_columns, ws.heads_send, ws.heads_recv, dqkv);
}

absl::Status Transformer::AttendBackward(const LayerActivations& a, const Tensor& dattn,
                                         const Tensor& dqkv) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const k::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  if (!ws.context) {
    k::AttentionBackward(dqkv, dattn, a.qkv, a.attn, a.attn_lse, ws.cu_seqlens, shape);
    return absl::OkStatus();
  }
  if (ws.kv_cu_seqlens.defined()) return AttendHeadsBackward(a, dattn, dqkv);
  if (ws.ring) {
    return RingAttentionBackward(*ws.context, *ws.ring, *ws.exchange, dqkv, dattn, a.qkv, a.attn,
                                 a.attn_lse, shape, ws.ring_buffers);
  }
  // The layer's keys and values gathered again (one all-gather instead of keeping every
  // layer's), the local queries' share of their gradients summed over the group.
  PRL_RETURN_IF_ERROR(GatherKeysValues(*ws.context, *ws.exchange, a.qkv, c.q_dim(), ws.kv_send,
                                       ws.kv_recv, ws.kv_full));
  PRL_RETURN_IF_ERROR(ZeroTensor(ws.dkv_full));
  k::ContextAttentionBackward(dqkv, ws.dkv_full, dattn, a.qkv, ws.kv_full, a.attn, a.attn_lse,
                              ws.context->pieces, shape);
  return ScatterKeyValueGrads(*ws.context, *ws.exchange, ws.dkv_full, ws.dkv_send, ws.dkv_recv,
                              dqkv, c.q_dim());
}

absl::Status Transformer::ForwardLayer(const LayerParams& p, int64_t layer) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const Tensor next_input =
      layer + 1 < c.num_hidden_layers ? ws.Slot(layer + 1).input : ws.final_input;
  const int64_t moe_index = MoeIndex(c, layer);
  const int64_t T = ws.T, Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  const LayerContext ctx = ContextOf(
      p, layer, ws.forced_routes.empty() ? nullptr : ws.forced_routes.data() + moe_index * T * K);
  const LayerActivations a = ws.Slot(layer);
  absl::Status attended;
  DecoderLayerForward(ctx, p, a, next_input,
                      [&](const LayerActivations& act) { attended = Attend(act); });
  PRL_RETURN_IF_ERROR(attended);
  if (!p.is_moe()) return absl::OkStatus();
  std::vector<int32_t>& recomputed = ws.host_recomputed;
  std::vector<float>& probs = ws.host_probs;
  // Checkpointed: the experts used, for the recomputation (replayed or the router's).
  std::vector<int32_t> used;
  const bool keep_used = !ws.used_routes.empty();
  MoeRoutesToHost(a.moe, keep_used ? &used : nullptr, &recomputed, &probs);
  if (keep_used) std::copy(used.begin(), used.end(), ws.used_routes.begin() + moe_index * T * K);
  const int64_t E = c.num_experts;
  for (int64_t t = 0; t < T; ++t) {
    // With segments, each segment's sums (they cover the batch), else the batch's.
    const int64_t row = ws.token_segment.empty() ? 0 : ws.token_segment[t] * E;
    for (int64_t kk = 0; kk < K; ++kk) {
      ws.recomputed_routes[(t * Lm + moe_index) * K + kk] =
          static_cast<uint8_t>(recomputed[t * K + kk]);
      ws.lb_count[row + recomputed[t * K + kk]] += 1.0;
    }
    for (int64_t e = 0; e < E; ++e) ws.lb_prob_sum[row + e] += probs[t * E + e];
  }
  return absl::OkStatus();
}

absl::Status Transformer::RecomputeLayer(const LayerParams& p, int64_t layer) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const int64_t T = ws.T, K = c.num_experts_per_tok;
  const int32_t* used =
      p.is_moe() ? ws.used_routes.data() + MoeIndex(c, layer) * T * K : nullptr;
  const LayerContext ctx = ContextOf(p, layer, used);
  const LayerActivations a = ws.Slot(layer);
  if (ws.checkpointing == ActivationCheckpointing::kFull) {
    absl::Status attended;
    DecoderAttentionForward(ctx, p, a,
                            [&](const LayerActivations& act) { attended = Attend(act); });
    PRL_RETURN_IF_ERROR(attended);
  } else {  // selective: attention's outputs were kept; the norm before it was not
    k::RmsNormForward(a.ln1, a.ln1_rstd, a.input, p.input_norm,
                      static_cast<float>(c.rms_norm_eps));
  }
  // The layer's output is the next layer's kept input: a dense MLP stops before its down
  // projection; a MoE block's combine writes into dln, which BackwardLayer overwrites before
  // it reads it.
  DecoderMlpForward(ctx, p, a, p.is_moe() ? ws.dln : Tensor{});
  return absl::OkStatus();
}

double Transformer::load_balancing_loss() const { return ws_->lb_loss; }

absl::Span<const double> Transformer::segment_load_balancing_losses() const {
  return ws_->segment_lb_loss;
}

absl::Span<const uint8_t> Transformer::recomputed_routes() const { return ws_->recomputed_routes; }

absl::Span<const float> Transformer::entropies() const { return ws_->entropies; }

absl::Status Transformer::Backward(const ModelParams& params, absl::Span<const float> dlogprobs,
                                   const ModelParams& grads, UnitHooks* hooks,
                                   double load_balancing_weight) {
  Workspace& ws = *ws_;
  if (!ws.backward_ready) {
    return absl::FailedPreconditionError(
        "Transformer::Backward needs the preceding Forward to run with for_backward = true");
  }
  if (static_cast<int64_t>(dlogprobs.size()) != ws.T) {
    return absl::InvalidArgumentError(
        absl::StrCat("dlogprobs has ", dlogprobs.size(), " entries for ", ws.T, " tokens"));
  }
  if (params.lora != ws.lora || (ws.lora != nullptr && grads.lora == nullptr)) {
    return absl::InvalidArgumentError(
        "Transformer::Backward: the adapters (ModelParams::lora) must be the preceding Forward's, "
        "with their gradients in grads.lora");
  }
  PRL_RETURN_IF_ERROR(CheckSegmentGrads(ws.segments, params, grads, load_balancing_weight));
  ws.lora_grads = grads.lora;
  ws.segment_grads.assign(grads.lora_segments.begin(), grads.lora_segments.end());
  // A frozen base (grads without the base's layers: ModelParams{} with .lora): only the
  // adapters' gradients. (Not "embed undefined": with FSDP hooks the views are bound lazily.)
  const bool frozen = grads.layers.empty();
  const bool trains_adapters = grads.lora != nullptr || !grads.lora_segments.empty();
  if (frozen && (!trains_adapters || (!device_.is_cpu() && !options_.cuda_lora))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Transformer::Backward: gradients without the base weights (a frozen base) need LoRA "
        "adapters to train (grads.lora) and the CPU backend (or TransformerOptions::cuda_lora); "
        "found ",
        trains_adapters ? "" : "no adapters", " on ", device_.ToString()));
  }
  ws.backward_ready = false;  // activations are consumed: one backward per forward
  const ModelConfig& c = config_;
  // A frozen base's gradient views: every tensor undefined, so the kernels skip them.
  const std::vector<LayerParams> no_layers(frozen ? c.num_hidden_layers : 0);
  const std::vector<LayerParams>& grad_layers = frozen ? no_layers : grads.layers;
  const int64_t T = ws.T, R = ws.R;
  ws.lb_dprobs.clear();
  if (load_balancing_weight != 0.0 && c.num_moe_layers() > 0) {
    // d(weight aux) / d p[t, e] = weight E f_e / (Lm T), f_e = count_e / (Lm T).
    const double rows = static_cast<double>(c.num_moe_layers()) * ws.lb_tokens;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      ws.lb_dprobs.push_back(load_balancing_weight * static_cast<double>(c.num_experts) *
                             (ws.lb_count[e] / rows) / rows);
    }
  }

  using Pass = UnitHooks::Pass;
  const int head_unit = static_cast<int>(c.num_hidden_layers) + 1;
  const bool tied = c.tie_word_embeddings;
  auto acquire = [&](int unit, bool need_params) {
    return hooks == nullptr ? absl::OkStatus() : hooks->Acquire(unit, Pass::kBackward, need_params);
  };
  auto release = [&](int unit, bool gradient_done) {
    return hooks == nullptr ? absl::OkStatus()
                            : hooks->Release(unit, Pass::kBackward, gradient_done);
  };

  // Head: dlogprob (R) -> d lnf rows -> scattered into dln (T, C).
  PRL_RETURN_IF_ERROR(acquire(head_unit, true));
  if (tied) PRL_RETURN_IF_ERROR(acquire(0, true));
  PRL_RETURN_IF_ERROR(ZeroTensor(ws.dresid));
  if (R > 0) {
    std::vector<float> head_dlogprob(R);
    for (int64_t r = 0; r < R; ++r) head_dlogprob[r] = dlogprobs[ws.head_rows[r]];
    PRL_RETURN_IF_ERROR(CopyToDevice(ws.dlogprob, head_dlogprob.data()));
    k::LogprobBackward(ws.dhead_in, grads.lm_head, ws.dlogprob, ws.head_in, params.lm_head,
                       ws.head_targets, ws.head_lse, ws.temperature, ws.logits,
                       options_.reduction_order, ws.logits_kept);
    if (R < T) {
      PRL_RETURN_IF_ERROR(ZeroTensor(ws.dln));
      k::EmbeddingBackward(ws.dln, ws.dhead_in, ws.head_rows_dev);  // row scatter-add
    }
  } else {
    PRL_RETURN_IF_ERROR(ZeroTensor(ws.dln));
  }
  k::RmsNormBackward(ws.dresid, grads.final_norm, ws.dln, ws.final_input, params.final_norm,
                     ws.lnf_rstd);
  PRL_RETURN_IF_ERROR(release(head_unit, true));
  if (tied) PRL_RETURN_IF_ERROR(release(0, false));
  for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) {
    PRL_RETURN_IF_ERROR(acquire(static_cast<int>(l) + 1, true));
    if (ws.checkpointing != ActivationCheckpointing::kNone) {
      PRL_RETURN_IF_ERROR(RecomputeLayer(params.layers[l], l));
    }
    PRL_RETURN_IF_ERROR(BackwardLayer(params.layers[l], grad_layers[l], l));
    PRL_RETURN_IF_ERROR(release(static_cast<int>(l) + 1, true));
  }
  PRL_RETURN_IF_ERROR(acquire(0, false));
  if (!frozen) k::EmbeddingBackward(grads.embed, ws.dresid, ws.tokens);
  return release(0, !frozen);
}

absl::Status Transformer::BackwardLayer(const LayerParams& p, const LayerParams& g, int64_t layer) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const LayerActivations a = ws.Slot(layer);
  const int64_t T = ws.T, I = c.intermediate_size;
  const Tensor dqkv = ws.wide_a.Rows(0, T * c.qkv_dim()).Reshape({T, c.qkv_dim()});
  const Tensor dattn = ws.wide_b.Rows(0, T * c.q_dim()).Reshape({T, c.q_dim()});
  // The layer's LoRA adapters of `targets` (model/lora_layer.h): from the gradient at their
  // projection's output, their gradients, and their share of the gradient at its input.
  auto adapters = [&](std::initializer_list<LoraTarget> targets, const Tensor& x,
                      const Tensor& dout, const Tensor& dx) {
    for (size_t i = 0; i < ws.segments.size(); ++i) {  // each adapter on its rows
      const LoraSegment& s = ws.segments[i];
      const LoraLayerParams& lp = s.lora->layers[layer];
      const LoraLayerParams& lg = ws.segment_grads[i].lora->layers[layer];
      for (const LoraTarget t : targets) {
        if (!lp[t].defined()) continue;
        LoraBackward(lp[t], lg[t], s.lora->scale, LoraSiteOf(t, c), x.Rows(s.begin, s.end),
                     dout.Rows(s.begin, s.end), dx.Rows(s.begin, s.end), ws.lora_scratch);
      }
    }
    if (ws.lora == nullptr) return;
    const LoraLayerParams& lp = ws.lora->layers[layer];
    const LoraLayerParams& lg = ws.lora_grads->layers[layer];
    if (std::none_of(targets.begin(), targets.end(),
                     [&](LoraTarget t) { return lp[t].defined(); })) {
      return;
    }
    const Tensor xf = LoraInput(x, ws.lora_scratch);  // read as F32 once for the targets
    for (const LoraTarget t : targets) {
      if (lp[t].defined()) {
        LoraBackward(lp[t], lg[t], ws.lora->scale, LoraSiteOf(t, c), xf, dout, dx, ws.lora_scratch);
      }
    }
  };

  // MLP half: resid_out = mid + down(silu(gate(ln2)) * up(ln2)), or mid + MoE(ln2).
  if (p.is_moe()) {
    MoeBackward(c, p, g, a.moe, a.ln2, ws.dresid, ws.dln, ws.moe,
                ws.lb_dprobs.empty() ? nullptr : ws.lb_dprobs.data());
  } else {  // (the wide buffers hold the dense MLP's width only when the model has one)
    const Tensor dgate_up = ws.wide_a.Rows(0, T * 2 * I).Reshape({T, 2 * I});
    const Tensor dact = ws.wide_b.Rows(0, T * I).Reshape({T, I});
    k::MatmulBackward(dact, g.down_weight, {}, ws.dresid, a.act, p.down_weight);
    adapters({LoraTarget::kDown}, a.act, ws.dresid, dact);
    k::SwiGluBackward(dgate_up, dact, a.gate_up);
    k::MatmulBackward(ws.dln, g.gate_up_weight, {}, dgate_up, a.ln2, p.gate_up_weight);
    adapters({LoraTarget::kGate, LoraTarget::kUp}, a.ln2, dgate_up, ws.dln);
  }
  k::RmsNormBackward(ws.dresid, g.post_norm, ws.dln, a.mid, p.post_norm, a.ln2_rstd);

  // Attention half: mid = input + o_proj(attention(rope([qk_norm](qkv(ln1))))).
  k::MatmulBackward(dattn, g.o_weight, g.o_bias, ws.dresid, a.attn, p.o_weight);
  adapters({LoraTarget::kO}, a.attn, ws.dresid, dattn);
  PRL_RETURN_IF_ERROR(AttendBackward(a, dattn, dqkv));
  k::RopeApply(dqkv, c.num_attention_heads + c.num_key_value_heads, c.head_dim, ws.rope_cos,
               ws.rope_sin, /*inverse=*/true);
  if (c.qk_norm) PRL_RETURN_IF_ERROR(QkNormBackward(c, p, g, a, dqkv, ws.wide_b));  // dattn done
  k::MatmulBackward(ws.dln, g.qkv_weight, g.qkv_bias, dqkv, a.ln1, p.qkv_weight);
  adapters({LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV}, a.ln1, dqkv, ws.dln);
  k::RmsNormBackward(ws.dresid, g.input_norm, ws.dln, a.input, p.input_norm, a.ln1_rstd);
  return absl::OkStatus();
}

}  // namespace prl
