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

}  // namespace
}  // namespace prl
