// Where every parameter lives: one contiguous fp32 buffer per model (llm.c style), laid out
// so that a transformer block is one contiguous byte range (the unit FSDP shards and gathers)
// and so that q|k|v and gate|up are each one matrix (one GEMM each), while every Hugging Face
// tensor is still a plain view into it.
//
// Buffer order: embed_tokens; for each layer: input_layernorm, q_proj, k_proj, v_proj,
// [q/k/v biases], o_proj, [o_proj bias], [q_norm, k_norm], post_attention_layernorm, then a
// dense MLP (gate_proj, up_proj, down_proj) or, in a Qwen3-MoE layer (ModelConfig::IsMoeLayer),
// the router mlp.gate, every expert's gate_proj and up_proj (expert 0, 1, ...), then every
// expert's down_proj; norm; lm_head (untied only). So each expert's gate|up is one (2 Im, C)
// matrix and the experts' matrices are (E, ...) stacks. A gradient buffer uses the same layout.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "model/config.h"

namespace prl {

// One transformer block's parameters (or gradients) as views.
struct LayerParams {
  Tensor input_norm;      // (C)
  Tensor qkv_weight;      // (QKV, C): rows [0, H D) q_proj, then k_proj, then v_proj
  Tensor qkv_bias;        // (QKV), undefined when the architecture has none (Llama)
  Tensor o_weight;        // (C, H D)
  Tensor o_bias;          // (C), undefined unless config.o_bias (Qwen3 with attention_bias)
  Tensor q_norm;          // (D) per-head query RMSNorm, undefined unless config.qk_norm (Qwen3)
  Tensor k_norm;          // (D) per-head key RMSNorm, likewise
  Tensor post_norm;       // (C)
  Tensor gate_up_weight;  // (2 I, C): rows [0, I) gate_proj, [I, 2 I) up_proj; dense MLP only
  Tensor down_weight;     // (C, I); dense MLP only
  // A MoE layer's MLP (undefined elsewhere): the router mlp.gate.weight and the experts
  // mlp.experts.{e}.{gate,up,down}_proj.weight.
  Tensor router_weight;    // (E, C)
  Tensor experts_gate_up;  // (E, 2 Im, C): expert e's rows [0, Im) gate_proj, [Im, 2 Im) up_proj
  Tensor experts_down;     // (E, C, Im)

  bool is_moe() const { return router_weight.defined(); }
};

struct LoraParams;   // model/lora.h
struct LoraSegment;  // model/lora.h

struct ModelParams {
  Tensor embed;  // (V, C)
  std::vector<LayerParams> layers;
  Tensor final_norm;  // (C)
  Tensor lm_head;     // (V, C); the same memory as embed when embeddings are tied
  // LoRA adapters on top of these weights (model/lora.h), or null. In a gradient ModelParams
  // passed to Transformer::Backward: where the adapters' gradients accumulate.
  const LoraParams* lora = nullptr;
  // Instead of `lora`: several adapters, each on its segment of the batch's tokens (CPU only
  // for now; Transformer::Forward checks them). Not owned; the gradient ModelParams of
  // Backward names the same segments, with each adapter's gradients.
  absl::Span<const LoraSegment> lora_segments;
};

// A copy of a parameter set's weights in `dtype` (BF16: the compute weights of the bf16 mode,
// beside the fp32 master weights), with views in the same layout. On the device of `source`.
struct ComputeParams {
  Buffer buffer;
  ModelParams params;
};
absl::StatusOr<ComputeParams> ToComputeDType(const struct ParameterSet& source, DType dtype);

// A Hugging Face tensor inside the parameter buffer.
struct ParamEntry {
  std::string name;            // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape
  int64_t offset = 0;          // first element, in floats from the buffer start
  int64_t numel = 0;
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const ModelConfig& config);

  int64_t num_elements() const { return num_elements_; }
  // Every HF tensor of the model, in buffer order (no gaps, no overlaps).
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry* Find(absl::string_view name) const;
  // Element ranges [begin, end) of the FSDP units: the embedding, each layer, then the final
  // norm together with the untied head.
  const std::vector<std::pair<int64_t, int64_t>>& unit_ranges() const { return unit_ranges_; }
  // Views of a buffer laid out like this (parameters or gradients).
  ModelParams Bind(float* base, Device device) const;
  // Rebinds only unit `unit`'s views in *params to a buffer holding just that unit
  // (unit_base = its first element); for a tied embedding, lm_head too.
  void BindUnit(int unit, float* unit_base, Device device, ModelParams* params) const;
  // The same for a buffer of `dtype` elements (the BF16 compute copy of a unit or a model).
  void BindUnit(int unit, void* unit_base, DType dtype, Device device, ModelParams* params) const;
  ModelParams Bind(void* base, DType dtype, Device device) const;
  int num_units() const { return static_cast<int>(unit_ranges_.size()); }

 private:
  ModelConfig config_;
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> entries_ index (E x L experts)
  std::vector<std::pair<int64_t, int64_t>> unit_ranges_;
  int64_t num_elements_ = 0;
};

// A full set of parameters (or gradients): the buffer, its layout and its views.
struct ParameterSet {
  ModelConfig config;
  ParameterLayout layout;
  Buffer buffer;
  ModelParams params;

  static absl::StatusOr<ParameterSet> Allocate(const ModelConfig& config, Device device,
                                               bool zeroed);
  float* data() const { return static_cast<float*>(buffer.data()); }
  // The HF tensor `entry` as a view of this set.
  Tensor View(const ParamEntry& entry) const;
};

// Fills parameters the way transformers initialises a fresh model: weights ~ N(0, std^2),
// RMSNorm weights 1, biases 0. Deterministic in `seed` alone (one counter-based stream per
// tensor), so `prl model init` gives identical files on every machine.
void InitializeParameters(const ParameterSet& set, uint64_t seed, float std = 0.02f);

}  // namespace prl
