// ModelConfig: the architecture hyper-parameters of a Llama / Qwen2 / Qwen3 / Qwen3-MoE decoder,
// read from and written to a Hugging Face `config.json` (docs/models.md lists the keys).
//
// Parsing is strict: every key of config.json is either understood, or known to be irrelevant
// to the math (ids, dtype hints, bookkeeping); anything else, or a value we do not implement
// (a rope scaling type, sliding windows, a non-SiLU activation), is an error naming the key,
// so that a checkpoint is never run with silently different math.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prl {

// kQwen3Moe is Qwen3's attention with a sparse mixture-of-experts MLP in the layers
// ModelConfig::IsMoeLayer names (model/moe_layer.h).
enum class Architecture { kLlama, kQwen2, kQwen3, kQwen3Moe };

absl::string_view ArchitectureName(Architecture arch);  // "LlamaForCausalLM", ...
absl::string_view ModelTypeName(Architecture arch);     // config.json's model_type: "llama", ...

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only (transformers' _compute_llama3_parameters):
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::kQwen2;
  int64_t hidden_size = 0;              // C
  int64_t intermediate_size = 0;        // I
  int64_t num_hidden_layers = 0;        // L
  int64_t num_attention_heads = 0;      // H
  int64_t num_key_value_heads = 0;      // KV (GQA when < H)
  int64_t head_dim = 0;                 // D; may differ from hidden_size / H (Qwen3: 128)
  int64_t vocab_size = 0;               // V
  int64_t max_position_embeddings = 0;  // longest sequence the model accepts
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  // q/k/v projection biases: always present in Qwen2, never in Llama (attention_bias=true,
  // which also adds an o_proj bias, is rejected); in Qwen3 iff attention_bias.
  bool qkv_bias = false;
  // o_proj bias (C): Qwen3 with attention_bias = true (together with qkv_bias).
  bool o_bias = false;
  // Qwen3: RMSNorm of every query and key head (weights self_attn.q_norm / k_norm, (D) each,
  // eps rms_norm_eps) after the projections and before RoPE.
  bool qk_norm = false;
  // Qwen3-MoE (arch kQwen3Moe) only; num_experts == 0 everywhere else. A MoE layer's MLP is a
  // softmax router over E experts (mlp.gate.weight (E, C)), the top K kept (renormalised to sum
  // 1 iff norm_topk_prob), each expert a SwiGLU of width moe_intermediate_size; the other
  // layers keep the dense MLP of width intermediate_size.
  int64_t num_experts = 0;            // E, at most 256 (a route is a uint8 expert id)
  int64_t num_experts_per_tok = 0;    // K
  int64_t moe_intermediate_size = 0;  // Im
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;  // layers that stay dense, sorted, unique
  // Read and written back, never used: transformers adds the load-balancing loss only with
  // output_router_logits (refused when true), and RL trains without it (docs/models.md).
  double router_aux_loss_coef = 0.001;
  // Keys that do not change the math but that a real checkpoint carries (bos/eos token ids,
  // torch_dtype, ...), kept verbatim as (key, JSON text) so that saving round-trips them.
  std::vector<std::pair<std::string, std::string>> passthrough;

  int64_t q_dim() const { return num_attention_heads * head_dim; }   // H * D
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }  // KV * D
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }         // (H + 2 KV) * D
  // transformers' Qwen3MoeDecoderLayer: layer_idx not in mlp_only_layers and num_experts > 0
  // and (layer_idx + 1) % decoder_sparse_step == 0.
  bool IsMoeLayer(int64_t layer) const;
  int64_t num_moe_layers() const;
  bool has_moe() const { return num_moe_layers() > 0; }
  bool has_dense_mlp() const { return num_moe_layers() < num_hidden_layers; }
};

// The largest num_experts a config may have: routes store expert ids as uint8.
inline constexpr int64_t kMaxExperts = 256;

// Sets config->arch and the flags transformers derives from it: qkv_bias (Qwen2 always,
// Qwen3 iff attention_bias, Llama never), o_bias (Qwen3 iff attention_bias) and qk_norm
// (Qwen3). attention_bias only matters for Qwen3.
void SetArchitecture(Architecture arch, bool attention_bias, ModelConfig* config);

// Parses config.json text. `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text, absl::string_view source);
// Checks the internal consistency of a config (positive sizes, H % KV == 0, even head_dim...).
absl::Status ValidateModelConfig(const ModelConfig& config);
// Serialises to config.json text in transformers' layout.
std::string ModelConfigToJson(const ModelConfig& config);

// RoPE inverse frequencies (D/2), fp32 as transformers computes them, scaling applied.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

// Number of parameters (tied embeddings counted once).
int64_t ParameterCount(const ModelConfig& config);
// Parameters one token computes with: ParameterCount less, in every MoE layer, the E - K
// experts it is not routed to (the router counts in full).
int64_t ActiveParameterCount(const ModelConfig& config);

}  // namespace prl
