// What follows from a ModelConfig (model/config.h): RoPE's inverse frequencies and the
// parameter counts (all, and those one token computes with).
#include <cmath>
#include <numbers>
#include <vector>

#include "model/config.h"

namespace prl {

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv_freq(half);
  const float base = static_cast<float>(c.rope_theta);
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, D, 2).float() / D)), all in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq) f /= static_cast<float>(rs.factor);
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    // transformers' _compute_llama3_parameters, in the same fp32 arithmetic.
    const float factor = static_cast<float>(rs.factor);
    const float low = static_cast<float>(rs.low_freq_factor);
    const float high = static_cast<float>(rs.high_freq_factor);
    const float old_len = static_cast<float>(rs.original_max_position_embeddings);
    // Python computes the thresholds in double; torch compares them to fp32 tensors in fp32.
    const float low_freq_wavelen = static_cast<float>(
        static_cast<double>(rs.original_max_position_embeddings) / rs.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(
        static_cast<double>(rs.original_max_position_embeddings) / rs.high_freq_factor);
    for (float& f : inv_freq) {
      const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (old_len / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  return inv_freq;
}

namespace {

// experts_per_moe_layer: E for the stored parameters, K for those one token computes with.
int64_t CountParameters(const ModelConfig& c, int64_t experts_per_moe_layer) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const int64_t attention = 2 * C + c.qkv_dim() * C + (c.qkv_bias ? c.qkv_dim() : 0) +
                            C * c.q_dim() + (c.o_bias ? C : 0) + (c.qk_norm ? 2 * c.head_dim : 0);
  const int64_t moe_layers = c.num_moe_layers();
  const int64_t dense_mlp = 3 * I * C;
  const int64_t moe_mlp =
      c.num_experts * C + experts_per_moe_layer * 3 * c.moe_intermediate_size * C;
  return c.vocab_size * C * (c.tie_word_embeddings ? 1 : 2) + c.num_hidden_layers * attention +
         (c.num_hidden_layers - moe_layers) * dense_mlp + moe_layers * moe_mlp + C;
}

}  // namespace

int64_t ParameterCount(const ModelConfig& c) { return CountParameters(c, c.num_experts); }

int64_t ActiveParameterCount(const ModelConfig& c) {
  return CountParameters(c, c.num_experts_per_tok);
}

}  // namespace prl
