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
  Workspace& ws = *ws_;
  ws.lora = params.lora;
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
  PassShape shape =
      ShapeOf(T, ws.B, ws.R, for_backward, params.lora != nullptr ? params.lora->rank : 0);
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
  ws.lb_count.assign(c.num_experts, 0.0);
  ws.lb_prob_sum.assign(c.num_experts, 0.0);
  ws.lb_loss = 0.0;
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
  if (Lm > 0) {  // aux = E sum_e f_e P_e over the Lm T (layer, token) rows
    const double rows = static_cast<double>(Lm) * ws.lb_tokens;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      ws.lb_loss += (ws.lb_count[e] / rows) * (ws.lb_prob_sum[e] / rows);
    }
    ws.lb_loss *= static_cast<double>(c.num_experts);
  }
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
  const Workspace& ws = *ws_;
  LayerContext ctx{&config_, ws.rope_cos, ws.rope_sin, options_.reduction_order};
  ctx.residual_in_gemm = options_.residual_in_gemm;
  if (p.is_moe()) ctx.moe_forced_routes = forced_routes;
  if (ws.lora != nullptr) {
    ctx.lora = &ws.lora->layers[layer];
    ctx.lora_scale = ws.lora->scale;
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
    for (int64_t kk = 0; kk < K; ++kk) {
      ws.recomputed_routes[(t * Lm + moe_index) * K + kk] =
          static_cast<uint8_t>(recomputed[t * K + kk]);
      ws.lb_count[recomputed[t * K + kk]] += 1.0;
    }
    for (int64_t e = 0; e < E; ++e) ws.lb_prob_sum[e] += probs[t * E + e];
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
  ws.lora_grads = grads.lora;
  // A frozen base (grads without the base's layers: ModelParams{} with .lora): only the
  // adapters' gradients. (Not "embed undefined": with FSDP hooks the views are bound lazily.)
  const bool frozen = grads.layers.empty();
  if (frozen && (grads.lora == nullptr || (!device_.is_cpu() && !options_.cuda_lora))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Transformer::Backward: gradients without the base weights (a frozen base) need LoRA "
        "adapters to train (grads.lora) and the CPU backend (or TransformerOptions::cuda_lora); "
        "found ",
        grads.lora == nullptr ? "no adapters" : "", " on ", device_.ToString()));
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
