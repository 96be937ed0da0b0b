#include "model/flops.h"

namespace prl {

double ForwardFlops(const ModelConfig& c, const std::vector<int64_t>& seq_lens, int64_t head_rows) {
  const double C = c.hidden_size, I = c.intermediate_size;
  // Per token and layer: qkv, o_proj, and the MLP: gate|up and down projections, or in a MoE
  // layer the router and the K experts the token is routed to (active parameters only).
  const double attention_gemm = 2.0 * (C * c.qkv_dim() + c.q_dim() * C);
  const double dense_mlp = 2.0 * 3.0 * C * I;
  const double moe_mlp =
      2.0 * (C * c.num_experts + c.num_experts_per_tok * 3.0 * C * c.moe_intermediate_size);
  const double moe_layers = static_cast<double>(c.num_moe_layers());
  const double layer_gemm =
      attention_gemm +
      (moe_layers * moe_mlp + (c.num_hidden_layers - moe_layers) * dense_mlp) / c.num_hidden_layers;
  double tokens = 0.0;
  double attention = 0.0;
  for (int64_t len : seq_lens) {
    tokens += static_cast<double>(len);
    // QK^T and PV: 2 * 2 * D FLOPs per (query head, visible key) pair; len(len+1)/2 pairs.
    const double pairs = 0.5 * static_cast<double>(len) * static_cast<double>(len + 1);
    attention += 4.0 * c.head_dim * c.num_attention_heads * pairs;
  }
  const double layers = c.num_hidden_layers * (tokens * layer_gemm + attention);
  const double head = 2.0 * static_cast<double>(head_rows) * C * c.vocab_size;
  return layers + head;
}

}  // namespace prl
