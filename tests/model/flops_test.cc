// FLOP counts against an independent count: 2 FLOPs per weight of every layer GEMM (the
// 2-D tensors of the parameter layout) per token, so that a shape whose head_dim is not
// hidden / heads (Qwen3: q_proj (H D, C), o_proj (C, H D)) is counted by its real matrices.
#include "model/flops.h"

#include <gtest/gtest.h>

#include "model/parameters.h"
#include "model/presets.h"

namespace prl {
namespace {

// 2 x the elements of every layer matrix: the GEMM FLOPs of one token.
double LayerGemmFlopsPerToken(const ModelConfig& c) {
  double weights = 0.0;
  const ParameterLayout layout(c);
  for (const ParamEntry& e : layout.entries()) {
    if (e.name.starts_with("model.layers.") && e.shape.size() == 2) weights += e.numel;
  }
  return 2.0 * weights;
}

TEST(ForwardFlopsTest, LayerGemmsCountEveryWeightOfTheLayoutTwicePerToken) {
  for (const char* preset : {"qwen2.5-0.5b", "qwen3-0.6b", "qwen3-8b", "tiny-qwen3"}) {
    SCOPED_TRACE(preset);
    const ModelConfig c = *PresetConfig(preset);
    const double T = 1000.0;
    // One token per sequence: attention sees one key, 4 D FLOPs per query head.
    const std::vector<int64_t> lens(static_cast<size_t>(T), 1);
    const double attention = 4.0 * c.head_dim * c.num_attention_heads * c.num_hidden_layers * T;
    const double head = 2.0 * 7 * c.hidden_size * c.vocab_size;
    EXPECT_DOUBLE_EQ(ForwardFlops(c, lens, 7), T * LayerGemmFlopsPerToken(c) + attention + head);
  }
}

TEST(ForwardFlopsTest, Qwen3ZeroSixBHasTheAttentionWidthOfItsHeadsNotOfItsHiddenSize) {
  const ModelConfig c = *PresetConfig("qwen3-0.6b");
  // Per layer and token: q/k/v (2048 + 2 x 1024) x 1024, o 1024 x 2048, MLP 3 x 1024 x 3072.
  const double per_token = 2.0 * 28 * (4096.0 * 1024 + 1024.0 * 2048 + 3.0 * 1024 * 3072);
  EXPECT_DOUBLE_EQ(ForwardFlops(c, {1}, 0), per_token + 4.0 * 128 * 16 * 28);
}

// A MoE layer counts the router and the K experts a token is routed to: its GEMM FLOPs are
// 2 x (the layer's matrices less the E - K experts it skips) per token.
TEST(ForwardFlopsTest, MoeLayersCountTheRouterAndTheActiveExpertsOnly) {
  for (const char* preset : {"tiny-qwen3-moe", "qwen3-30b-a3b"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = *PresetConfig(preset);
    c.mlp_only_layers = {0};  // a dense layer beside the MoE ones
    const double skipped = 2.0 * c.num_moe_layers() * (c.num_experts - c.num_experts_per_tok) *
                           3.0 * c.hidden_size * c.moe_intermediate_size;
    const double attention = 4.0 * c.head_dim * c.num_attention_heads * c.num_hidden_layers;
    EXPECT_NEAR(ForwardFlops(c, {1}, 0), LayerGemmFlopsPerToken(c) - skipped + attention,
                1e-9 * ForwardFlops(c, {1}, 0));
  }
  // Qwen3-30B-A3B: 2 FLOPs per active non-embedding parameter (3.35B active, two 311M
  // embedding matrices, the norms' 2 x 128 + 2 x 2048 per layer not in GEMMs), no head.
  const ModelConfig a3b = *PresetConfig("qwen3-30b-a3b");
  const double gemm_params =
      ActiveParameterCount(a3b) - 2.0 * 151936 * 2048 - 48.0 * (2 * 128 + 2 * 2048) - 2048;
  EXPECT_NEAR(ForwardFlops(a3b, {1}, 0) - 4.0 * 128 * 32 * 48, 2.0 * gemm_params, 1.0);
}

}  // namespace
}  // namespace prl
