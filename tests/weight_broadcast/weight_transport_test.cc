// The model fingerprint that publishers and subscribers compare: it survives config.json (the
// gRPC transport sends the publisher's config as JSON) and a mismatch names the field.
#include "weight_broadcast/weight_transport.h"

#include <gtest/gtest.h>

#include "model/presets.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

TEST(ModelFingerprint, SurvivesConfigJson) {
  for (const std::string& name : PresetNames()) {
    const ModelConfig config = *PresetConfig(name);
    auto parsed = ParseModelConfig(ModelConfigToJson(config), name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(ModelFingerprint(*parsed), ModelFingerprint(config)) << name;
  }
}

TEST(ModelFingerprint, CoversEveryFieldOfTheMath) {
  const ModelConfig base = *PresetConfig("tiny");
  std::vector<std::pair<std::string, ModelConfig>> changed;
  auto change = [&](const std::string& field, auto mutate) {
    ModelConfig c = base;
    mutate(c);
    changed.push_back({field, c});
  };
  change("architecture", [](ModelConfig& c) { c.arch = Architecture::kLlama; });
  change("hidden_size", [](ModelConfig& c) { c.hidden_size *= 2; });
  change("intermediate_size", [](ModelConfig& c) { c.intermediate_size += 1; });
  change("num_hidden_layers", [](ModelConfig& c) { c.num_hidden_layers += 1; });
  change("num_attention_heads", [](ModelConfig& c) { c.num_attention_heads *= 2; });
  change("num_key_value_heads", [](ModelConfig& c) { c.num_key_value_heads = 1; });
  change("head_dim", [](ModelConfig& c) { c.head_dim *= 2; });
  change("vocab_size", [](ModelConfig& c) { c.vocab_size += 1; });
  change("max_position_embeddings", [](ModelConfig& c) { c.max_position_embeddings += 1; });
  change("rms_norm_eps", [](ModelConfig& c) { c.rms_norm_eps = 1e-5; });
  change("rope_theta", [](ModelConfig& c) { c.rope_theta += 1e-9; });
  change("rope_scaling", [](ModelConfig& c) { c.rope_scaling.type = RopeScaling::Type::kLinear; });
  change("tie_word_embeddings", [](ModelConfig& c) { c.tie_word_embeddings ^= true; });
  change("qkv_bias", [](ModelConfig& c) { c.qkv_bias ^= true; });
  for (const auto& [field, config] : changed) {
    EXPECT_TRUE(IsError(CheckSameModel(ModelFingerprint(base), ModelFingerprint(config), "here"),
                        absl::StatusCode::kFailedPrecondition,
                        {"here: model config mismatch: ", field + " is "}))
        << field;
  }
  EXPECT_TRUE(CheckSameModel(ModelFingerprint(base), ModelFingerprint(base), "here").ok());
}

// Qwen3's q/k norms follow from its architecture and its o_proj bias from attention_bias,
// which also sets qkv_bias: the fingerprint's architecture and qkv_bias tell every variant
// apart.
TEST(ModelFingerprint, TellsQwen3FromQwen2AndQwen3WithAttentionBiasFromWithout) {
  const ModelConfig qwen3 = *PresetConfig("tiny-qwen3");
  ModelConfig qwen2 = qwen3;
  SetArchitecture(Architecture::kQwen2, false, &qwen2);
  ModelConfig biased = qwen3;
  SetArchitecture(Architecture::kQwen3, /*attention_bias=*/true, &biased);
  EXPECT_TRUE(IsError(CheckSameModel(ModelFingerprint(qwen3), ModelFingerprint(qwen2), "here"),
                      absl::StatusCode::kFailedPrecondition,
                      {"architecture is Qwen3ForCausalLM in the published model"}));
  EXPECT_TRUE(IsError(CheckSameModel(ModelFingerprint(qwen3), ModelFingerprint(biased), "here"),
                      absl::StatusCode::kFailedPrecondition, {"qkv_bias is false"}));
}

// Qwen3-MoE models of one layout but other routing (top-k, renormalisation) differ.
TEST(ModelFingerprint, TellsQwen3MoeRoutingVariantsApartAndLeavesDenseFingerprintsAlone) {
  const ModelConfig moe = *PresetConfig("tiny-qwen3-moe");
  ModelConfig top1 = moe;
  top1.num_experts_per_tok = 1;
  EXPECT_TRUE(IsError(CheckSameModel(ModelFingerprint(moe), ModelFingerprint(top1), "here"),
                      absl::StatusCode::kFailedPrecondition, {"num_experts_per_tok is 2"}));
  ModelConfig raw = moe;
  raw.norm_topk_prob = false;
  EXPECT_TRUE(IsError(CheckSameModel(ModelFingerprint(moe), ModelFingerprint(raw), "here"),
                      absl::StatusCode::kFailedPrecondition, {"norm_topk_prob is true"}));
  EXPECT_EQ(ModelFingerprint(*PresetConfig("tiny")).find("experts"), std::string::npos);
}

}  // namespace
}  // namespace prl::testing
