// Transformer's workspace (model/transformer.h): what a pass lays out in its arena and keeps
// between Forward and Backward. Internal to model/transformer*.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/context_parallel.h"
#include "model/context_ring.h"
#include "model/decoder_layer.h"
#include "model/lora_layer.h"
#include "model/moe_layer.h"
#include "model/transformer.h"

namespace prl {

struct Transformer::Workspace {
  int64_t T = 0;  // tokens
  int64_t B = 0;  // sequences
  int64_t R = 0;  // rows with a target (the LM head only runs on these)
  bool for_backward = false;
  bool backward_ready = false;
  float temperature = 1.0f;
  std::vector<int32_t> head_rows;  // host copy of the target positions (R)

  Tensor tokens;                         // (T) I32
  Tensor cu_seqlens;                     // (B + 1) I32
  Tensor positions;                      // (T) I32
  Tensor inv_freq;                       // (D/2)
  Tensor rope_cos;                       // (T, D/2)
  Tensor rope_sin;                       // (T, D/2)
  // The pass's checkpointing (none for a forward-only pass).
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  // With for_backward, each layer's kept activations (all of them without checkpointing),
  // else 2 alternating slots of every activation.
  std::vector<LayerActivations> layers;
  LayerActivations work;  // checkpointing: the parts not kept, for the layer being computed
  Tensor final_input;                    // (T, C) residual stream after the last layer
  Tensor lnf;                            // (T, C) final norm output
  Tensor lnf_rstd;                       // (T)
  Tensor head_rows_dev;                  // (R) I32 positions with a target
  Tensor head_targets;                   // (R) I32
  Tensor head_in;                        // (R, C) lnf rows with a target (lnf itself when R == T)
  Tensor head_lse;                       // (R)
  Tensor head_logprob;                   // (R)
  Tensor head_entropy;                   // (R) the rows' softmax entropies (nats)
  Tensor logits;                         // (chunk, V) scratch
  bool logits_kept = false;  // logits holds every trained row's logits (Backward reads them)

  // Backward scratch. The two "wide" buffers are shared by the MLP and attention halves.
  Tensor dresid;    // (T, C) gradient of the residual stream
  Tensor dln;       // (T, C)
  Tensor wide_a;    // (T * max(2 I, QKV)): dgate_up, then dqkv
  Tensor wide_b;    // (T * max(I, H D [x 2 with q/k norms])): dact, dattn, q/k-norm scratch
  Tensor dhead_in;  // (R, C)
  Tensor dlogprob;  // (R)
  MoeScratch moe;   // MoE layers' backward scratch
  // LoRA (model/lora.h): the adapters of the last Forward (null: none), their gradients in
  // Backward, and their scratch.
  const LoraParams* lora = nullptr;
  const LoraParams* lora_grads = nullptr;
  LoraScratch lora_scratch;
  // Instead of lora: several adapters, each on its segment of the tokens (ModelParams::
  // lora_segments), and in Backward their gradients (the same segments); one layer's view of
  // them, rebuilt for each layer the pass runs.
  std::vector<LoraSegment> segments, segment_grads;
  std::vector<LoraLayerSegment> layer_segments;

  // Qwen3-MoE: the batch's replayed routes per MoE layer, (Lm, T, K) layer-major (empty: none),
  // and the router's own routes of the last Forward, (T, Lm, K) token-major.
  std::vector<int32_t> forced_routes;
  std::vector<uint8_t> recomputed_routes;
  // Checkpointing a Qwen3-MoE model: the experts each MoE layer used in Forward (replayed or
  // the router's), (Lm, T, K) layer-major, replayed when Backward recomputes the layer.
  std::vector<int32_t> used_routes;
  // A context-parallel pass (model/context_parallel.h): its plan and the group; the gathered
  // keys and values of one layer and the exchanges' buffers (and in Backward their gradients').
  std::optional<ContextPlan> context;
  ContextExchange* exchange = nullptr;
  Tensor kv_full, kv_send, kv_recv, dkv_full, dkv_send, dkv_recv;
  // Ulysses (model/context_heads.h): this rank's heads of the group's rows, (kv_rows, width):
  // q|k|v, output, log-sum-exp and in Backward the output's and q|k|v's gradients; the
  // all-to-alls' buffers (group max_rows of the widest, q|k|v's); the rows' sequences.
  Tensor heads_qkv, heads_out, heads_lse, heads_dout, heads_dqkv, heads_send, heads_recv;
  Tensor kv_cu_seqlens;
  // Ring attention (model/context_ring.h): its steps and buffers.
  std::optional<RingSteps> ring;
  RingBuffers ring_buffers;
  std::vector<float> entropies;  // (T) of the last Forward; 0 where no target
  // The load-balancing loss's sums over the MoE layers of the last Forward(for_backward)
  // (model/moe_layer.h): the routers' own choices per expert and their probabilities per
  // expert, (E) each; its value; and in Backward its gradient at each p[t, e], (E).
  std::vector<double> lb_count, lb_prob_sum, lb_dprobs;
  // With segments: each segment's load-balancing loss, and each token's segment (-1: none).
  std::vector<double> segment_lb_loss;
  std::vector<int32_t> token_segment;
  // A MoE layer's router outputs on the host (MoeRoutesToHost), reused by every layer.
  std::vector<int32_t> host_recomputed;
  std::vector<float> host_probs;
  double lb_loss = 0.0;
  double lb_tokens = 0.0;  // the tokens the load-balancing loss is over (the group's: context)

  // Layer `layer`'s activations in this pass (views: a checkpointed layer's kept ones with the
  // shared work slot's).
  LayerActivations Slot(int64_t layer) const {
    if (!for_backward) return layers[layer % static_cast<int64_t>(layers.size())];
    if (checkpointing == ActivationCheckpointing::kNone) return layers[layer];
    return OverlayLayerActivations(layers[layer], work);
  }
};

// What a pass lays out depends on.
struct Transformer::PassShape {
  int64_t T = 0, B = 0, R = 0;  // tokens, sequences, rows with a target
  int64_t chunk = 0;            // logits chunk rows
  bool for_backward = false;
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  int64_t lora_rank = 0;  // 0: no adapters
  // Context parallelism: the gathered rows, the most rows a rank holds, the group's size.
  int64_t kv_rows = 0, max_rows = 0, group = 0;
  ContextAttention attention = ContextAttention::kAllGather;
  int64_t kv_seqs = 0;  // the gathered rows' sequences (Ulysses attends over them)
};

}  // namespace prl
