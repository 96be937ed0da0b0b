#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/status_testing.h"

namespace prl {
namespace {

using ::prl::testing::IsError;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Verbatim from the Hugging Face hub.
constexpr char kQwen25HalfB[] = R"({
  "architectures": [
    "Qwen2ForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)";

constexpr char kLlama32OneB[] = R"({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)";

// Qwen/Qwen3-0.6B's config.json on the Hugging Face hub: head_dim 128 != hidden / heads = 64,
// no attention biases, the sliding-window keys present but off.
constexpr char kQwen3ZeroSixB[] = R"({
  "architectures": [
    "Qwen3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)";

// Qwen/Qwen3-30B-A3B's config.json.
constexpr char kQwen3MoeA3B[] = R"({
  "architectures": [
    "Qwen3MoeForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)";

constexpr char kSource[] = "models/x/config.json";

ModelConfig Parse(absl::string_view text) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text, kSource);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.value_or(ModelConfig{});
}

// `base` with `edit` applied to its JSON, parsed.
template <typename Edit>
absl::Status ParseEdited(const char* base, Edit edit) {
  nlohmann::json j = nlohmann::json::parse(base);
  edit(j);
  return ParseModelConfig(j.dump(), kSource).status();
}

// ---- Real configs --------------------------------------------------------------------------

TEST(ParseModelConfigTest, ParsesTheQwen25HalfBConfigVerbatim) {
  const ModelConfig c = Parse(kQwen25HalfB);
  EXPECT_EQ(c.arch, Architecture::kQwen2);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_attention_heads, 14);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // hidden_size / heads: the config has no head_dim
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.q_dim(), 896);
  EXPECT_EQ(c.kv_dim(), 128);
  EXPECT_EQ(c.qkv_dim(), 1152);
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(c.passthrough, (std::vector<Pair>{{"bos_token_id", "151643"},
                                              {"eos_token_id", "151643"},
                                              {"initializer_range", "0.02"},
                                              {"max_window_layers", "24"},
                                              {"sliding_window", "32768"},
                                              {"torch_dtype", R"("bfloat16")"},
                                              {"transformers_version", R"("4.40.1")"},
                                              {"use_cache", "true"}}));
}

TEST(ParseModelConfigTest, ParsesTheLlama32OneBConfigVerbatim) {
  const ModelConfig c = Parse(kLlama32OneB);
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  ASSERT_FALSE(c.passthrough.empty());
  EXPECT_EQ(c.passthrough.front(), (std::pair<std::string, std::string>{"bos_token_id", "128000"}));
}

TEST(ParseModelConfigTest, ParsesTheQwen3ZeroSixBConfigVerbatim) {
  const ModelConfig c = Parse(kQwen3ZeroSixB);
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 2048);  // != hidden_size: o_proj is (1024, 2048)
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(c.passthrough, (std::vector<Pair>{{"bos_token_id", "151643"},
                                              {"eos_token_id", "151645"},
                                              {"initializer_range", "0.02"},
                                              {"max_window_layers", "28"},
                                              {"sliding_window", "null"},
                                              {"torch_dtype", R"("bfloat16")"},
                                              {"transformers_version", R"("4.51.0")"},
                                              {"use_cache", "true"}}));
}

TEST(ParseModelConfigTest, Qwen3AttentionBiasPutsBiasesOnQKVAndO) {
  nlohmann::json j = nlohmann::json::parse(kQwen3ZeroSixB);
  j["attention_bias"] = true;
  const ModelConfig c = Parse(j.dump());
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.qk_norm);
}

TEST(ParseModelConfigTest, Qwen3HeadDimDefaultsTo128AsQwen3Config) {
  nlohmann::json j = nlohmann::json::parse(kQwen3ZeroSixB);
  j.erase("head_dim");
  j["hidden_size"] = 512;  // hidden / heads = 32: the default must not be that
  EXPECT_EQ(Parse(j.dump()).head_dim, 128);
}

TEST(ParameterCountTest, MatchesThePublishedSizesOfRealModels) {
  // Qwen2.5-0.5B: 494,032,768 parameters; Llama-3.2-1B: 1,235,814,400 (both tied).
  EXPECT_EQ(ParameterCount(Parse(kQwen25HalfB)), 494'032'768);
  EXPECT_EQ(ParameterCount(Parse(kLlama32OneB)), 1'235'814'400);
  // Qwen3-0.6B: "0.6B, 0.44B non-embedding": 28 layers of 15,730,944 (q/k norms 2 x 128 each)
  // + the final norm = 440,467,456, and the tied 151936 x 1024 embedding.
  EXPECT_EQ(ParameterCount(Parse(kQwen3ZeroSixB)), 440'467'456 + 151'936 * 1024);
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.decoder_sparse_step, b.decoder_sparse_step);
  EXPECT_EQ(a.mlp_only_layers, b.mlp_only_layers);
  EXPECT_EQ(a.router_aux_loss_coef, b.router_aux_loss_coef);
  EXPECT_EQ(a.passthrough, b.passthrough);
}

TEST(ModelConfigToJsonTest, SerialisedConfigParsesBackIdentically) {
  std::vector<std::string> sources = {kQwen25HalfB, kLlama32OneB, kQwen3ZeroSixB};
  nlohmann::json qwen3_bias = nlohmann::json::parse(kQwen3ZeroSixB);
  qwen3_bias["attention_bias"] = true;
  sources.push_back(qwen3_bias.dump());
  nlohmann::json moe = nlohmann::json::parse(kQwen3MoeA3B);
  moe["norm_topk_prob"] = false;
  moe["decoder_sparse_step"] = 2;
  moe["mlp_only_layers"] = {5, 7};
  sources.push_back(kQwen3MoeA3B);
  sources.push_back(moe.dump());
  // A linear-scaled, untied variant with an odd rms_norm_eps.
  nlohmann::json linear = nlohmann::json::parse(kLlama32OneB);
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.5}};
  linear["tie_word_embeddings"] = false;
  linear["rms_norm_eps"] = 1.2345678901234567e-7;
  linear["pad_token_id"] = nullptr;
  linear["eos_token_id"] = {128001, 128008, 128009};
  sources.push_back(linear.dump());
  for (const std::string& source : sources) {
    const ModelConfig original = Parse(source);
    const std::string json = ModelConfigToJson(original);
    SCOPED_TRACE(json);
    const ModelConfig back = Parse(json);
    ExpectSameConfig(back, original);
    EXPECT_EQ(ModelConfigToJson(back), json);  // a fixed point
  }
}

TEST(ModelConfigToJsonTest, PassthroughKeysAreWrittenVerbatim) {
  const nlohmann::json j = nlohmann::json::parse(ModelConfigToJson(Parse(kLlama32OneB)));
  EXPECT_EQ(j["bos_token_id"], 128000);
  EXPECT_EQ(j["eos_token_id"], 128001);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["transformers_version"], "4.45.0.dev0");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
}

// ---- Rejected configs ----------------------------------------------------------------------

TEST(ParseModelConfigTest, UnsupportedRopeScalingTypeIsAnErrorNamingRopeType) {
  const absl::Status s = ParseEdited(kLlama32OneB, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'rope_scaling.rope_type'", "'yarn'"}));
}

TEST(ParseModelConfigTest, RopeScalingKeyForeignToItsTypeIsAnErrorNamingIt) {
  const absl::Status s = ParseEdited(kLlama32OneB, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"low_freq_factor", 1.0}};
  });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'rope_scaling.low_freq_factor'"}));
}

TEST(ParseModelConfigTest, DisagreeingRopeTypeAndLegacyTypeAreAnError) {
  const absl::Status s = ParseEdited(kLlama32OneB, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"type", "dynamic"}, {"factor", 4.0}};
  });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'rope_scaling.rope_type'", "disagree"}));
  const absl::Status legacy = ParseEdited(kLlama32OneB, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  });
  EXPECT_TRUE(legacy.ok()) << legacy;
}

TEST(ParseModelConfigTest, LayerTypesMustBeAListOfFullAttention) {
  EXPECT_TRUE(IsError(
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["layer_types"] = "full_attention"; }),
      kInvalid, {"'layer_types'", "list"}));
  EXPECT_TRUE(IsError(ParseEdited(kQwen25HalfB,
                                  [](nlohmann::json& j) {
                                    j["layer_types"] = {"full_attention", "sliding_attention"};
                                  }),
                      kInvalid, {"'layer_types'", "sliding_attention"}));
}

TEST(ParseModelConfigTest, UnknownTopLevelKeyIsAnErrorNamingIt) {
  const absl::Status s =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["partial_rotary_factor"] = 0.5; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'partial_rotary_factor'", "not supported"}));
}

TEST(ParseModelConfigTest, MissingRequiredKeyIsAnErrorNamingIt) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    SCOPED_TRACE(key);
    const absl::Status s = ParseEdited(kQwen25HalfB, [&](nlohmann::json& j) { j.erase(key); });
    EXPECT_TRUE(IsError(s, kInvalid, {kSource, absl::StrCat("'", key, "'"), "missing"}));
  }
}

TEST(ParseModelConfigTest, NonSiluActivationIsAnError) {
  const absl::Status s =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["hidden_act"] = "gelu"; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'hidden_act'", "gelu"}));
}

TEST(ParseModelConfigTest, SlidingWindowAttentionIsAnError) {
  const absl::Status s =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["use_sliding_window"] = true; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'use_sliding_window'"}));
}

TEST(ParseModelConfigTest, Qwen3SlidingWindowAndUnknownRopeScalingAreErrorsNamingTheKey) {
  EXPECT_TRUE(IsError(ParseEdited(kQwen3ZeroSixB,
                                  [](nlohmann::json& j) {
                                    j["use_sliding_window"] = true;
                                    j["sliding_window"] = 4096;
                                  }),
                      kInvalid, {kSource, "'use_sliding_window'"}));
  EXPECT_TRUE(IsError(ParseEdited(kQwen3ZeroSixB,
                                  [](nlohmann::json& j) {
                                    j["rope_scaling"] = {
                                        {"rope_type", "yarn"},
                                        {"factor", 4.0},
                                        {"original_max_position_embeddings", 32768}};
                                  }),
                      kInvalid, {kSource, "'rope_scaling.rope_type'", "'yarn'"}));
  EXPECT_TRUE(IsError(ParseEdited(kQwen3ZeroSixB,
                                  [](nlohmann::json& j) {
                                    j["layer_types"] = {"full_attention", "sliding_attention"};
                                  }),
                      kInvalid, {kSource, "'layer_types'", "sliding_attention"}));
  // transformers 5 writes RoPE under rope_parameters: not read by prl, so refused by name.
  EXPECT_TRUE(
      IsError(ParseEdited(kQwen3ZeroSixB,
                          [](nlohmann::json& j) {
                            j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
                          }),
              kInvalid, {kSource, "'rope_parameters'", "not supported"}));
}

TEST(ParseModelConfigTest, ParsesTheQwen3MoeA3BConfigVerbatim) {
  const ModelConfig c = Parse(kQwen3MoeA3B);
  EXPECT_EQ(c.arch, Architecture::kQwen3Moe);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_EQ(c.router_aux_loss_coef, 0.001);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_moe_layers(), 48);
  EXPECT_FALSE(c.has_dense_mlp());
}

TEST(ParameterCountTest, Qwen3MoeA3BHas30Point5BParametersAnd3Point3BActive) {
  // The model card: 30.5B in total, 29.9B non-embedding, 3.3B activated.
  const ModelConfig c = Parse(kQwen3MoeA3B);
  EXPECT_EQ(ParameterCount(c), 30'532'122'624);
  EXPECT_EQ(ParameterCount(c) - 2 * 151'936 * 2048, 29'909'792'768);
  EXPECT_EQ(ActiveParameterCount(c), 3'353'032'704);
  EXPECT_EQ(ActiveParameterCount(Parse(kQwen3ZeroSixB)), ParameterCount(Parse(kQwen3ZeroSixB)));
}

TEST(ParseModelConfigTest, MoeLayersFollowTransformersSparseStepAndMlpOnlyLayers) {
  nlohmann::json j = nlohmann::json::parse(kQwen3MoeA3B);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 1};
  const ModelConfig c = Parse(j.dump());
  // (l + 1) % 2 == 0 gives layers 1, 3, 5; 1 and 3 stay dense.
  std::vector<bool> moe;
  for (int64_t l = 0; l < 6; ++l) moe.push_back(c.IsMoeLayer(l));
  EXPECT_EQ(moe, (std::vector<bool>{false, false, false, false, false, true}));
  EXPECT_EQ(c.mlp_only_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(c.has_dense_mlp());
}

TEST(ParseModelConfigTest, Qwen3MoeDefaultsAreQwen3MoeConfigs) {
  nlohmann::json j = nlohmann::json::parse(kQwen3MoeA3B);
  for (const char* key : {"head_dim", "num_experts", "num_experts_per_tok", "norm_topk_prob",
                          "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers"}) {
    j.erase(key);
  }
  const ModelConfig c = Parse(j.dump());
  EXPECT_EQ(c.head_dim, 2048 / 32);  // hidden / heads, unlike Qwen3's 128
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.decoder_sparse_step, 1);
}

TEST(ParseModelConfigTest, MoeValuesPrlDoesNotImplementAreErrorsNamingTheKey) {
  auto edited = [](const char* key, nlohmann::json value) {
    return ParseEdited(kQwen3MoeA3B, [&](nlohmann::json& j) { j[key] = value; });
  };
  EXPECT_TRUE(IsError(edited("num_experts", 257), kInvalid, {"'num_experts'", "1..256", "257"}));
  EXPECT_TRUE(
      IsError(edited("num_experts_per_tok", 129), kInvalid, {"'num_experts_per_tok'", "129"}));
  EXPECT_TRUE(IsError(edited("output_router_logits", true), kInvalid,
                      {"'output_router_logits'", "load-balancing"}));
  EXPECT_TRUE(IsError(edited("mlp_only_layers", {48}), kInvalid, {"'mlp_only_layers'", "48"}));
  EXPECT_TRUE(IsError(edited("mlp_only_layers", "all"), kInvalid, {"'mlp_only_layers'"}));
  EXPECT_TRUE(IsError(edited("decoder_sparse_step", 0), kInvalid, {"'decoder_sparse_step'"}));
  EXPECT_TRUE(IsError(edited("moe_intermediate_size", 0), kInvalid, {"'moe_intermediate_size'"}));
}

TEST(ParseModelConfigTest, MoeKeysInADenseConfigAreErrorsNamingTheKey) {
  const absl::Status s =
      ParseEdited(kQwen3ZeroSixB, [](nlohmann::json& j) { j["num_experts"] = 8; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'num_experts'", "Qwen3ForCausalLM"}));
  const absl::Status mixed = ParseEdited(kQwen3MoeA3B, [](nlohmann::json& j) {
    j["architectures"] = {"Qwen3ForCausalLM"};  // model_type still qwen3_moe
  });
  EXPECT_TRUE(IsError(mixed, kInvalid, {"'architectures' and 'model_type' disagree"}));
}

TEST(ValidateModelConfigTest, ArchitectureFlagsMustAgreeWithTheArchitecture) {
  ModelConfig c = Parse(kQwen3ZeroSixB);
  c.qk_norm = false;  // a Qwen3 without its q/k norms would load and silently differ
  EXPECT_TRUE(
      IsError(ValidateModelConfig(c), kInvalid, {"qk_norm", "expected true", "found false"}));
  c = Parse(kQwen3ZeroSixB);
  c.o_bias = true;  // o bias without q/k/v biases: not an attention_bias value
  EXPECT_TRUE(IsError(ValidateModelConfig(c), kInvalid, {"'attention_bias'"}));
  c = Parse(kQwen25HalfB);
  c.o_bias = true;
  EXPECT_TRUE(IsError(ValidateModelConfig(c), kInvalid, {"'attention_bias'", "Qwen2ForCausalLM"}));
}

TEST(ParseModelConfigTest, LlamaAttentionBiasIsAnError) {
  const absl::Status s =
      ParseEdited(kLlama32OneB, [](nlohmann::json& j) { j["attention_bias"] = true; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'attention_bias'"}));
}

TEST(ParseModelConfigTest, MlpBiasAndAttentionDropoutAreErrors) {
  EXPECT_TRUE(IsError(ParseEdited(kLlama32OneB, [](nlohmann::json& j) { j["mlp_bias"] = true; }),
                      kInvalid, {kSource, "'mlp_bias'"}));
  EXPECT_TRUE(
      IsError(ParseEdited(kLlama32OneB, [](nlohmann::json& j) { j["attention_dropout"] = 0.1; }),
              kInvalid, {kSource, "'attention_dropout'"}));
}

TEST(ParseModelConfigTest, KvHeadsNotDividingHeadsIsAnError) {
  const absl::Status s =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["num_key_value_heads"] = 4; });
  EXPECT_TRUE(
      IsError(s, kInvalid, {kSource, "'num_key_value_heads'", "4 does not divide", "= 14"}));
}

TEST(ParseModelConfigTest, OddHeadDimIsAnError) {
  const absl::Status s = ParseEdited(kLlama32OneB, [](nlohmann::json& j) { j["head_dim"] = 63; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'head_dim'", "63"}));
}

TEST(ParseModelConfigTest, NonIntegerHiddenSizeIsAnError) {
  for (const nlohmann::json& value : {nlohmann::json(896.5), nlohmann::json("896")}) {
    SCOPED_TRACE(value.dump());
    const absl::Status s =
        ParseEdited(kQwen25HalfB, [&](nlohmann::json& j) { j["hidden_size"] = value; });
    EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'hidden_size'", "expected an integer"}));
  }
  // A float with an integral value is what some exporters write: accepted.
  const absl::Status integral =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["hidden_size"] = 896.0; });
  EXPECT_TRUE(integral.ok()) << integral;
}

TEST(ParseModelConfigTest, NonPositiveSizeIsAnErrorNamingIt) {
  const absl::Status s =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["intermediate_size"] = 0; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'intermediate_size'", "positive"}));
}

TEST(ParseModelConfigTest, ArchitecturesAndModelTypeDisagreeingIsAnError) {
  const absl::Status s =
      ParseEdited(kQwen25HalfB, [](nlohmann::json& j) { j["model_type"] = "llama"; });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'architectures' and 'model_type' disagree"}));
}

TEST(ParseModelConfigTest, UnsupportedArchitectureIsAnErrorNamingIt) {
  const absl::Status s = ParseEdited(kQwen25HalfB, [](nlohmann::json& j) {
    j["architectures"] = {"MistralForCausalLM"};
    j.erase("model_type");
  });
  EXPECT_TRUE(IsError(s, kInvalid, {kSource, "'architectures'", "MistralForCausalLM"}));
}

TEST(ParseModelConfigTest, MalformedJsonIsAnErrorNamingTheSource) {
  EXPECT_TRUE(IsError(ParseModelConfig(R"({"hidden_size": 8,)", kSource).status(), kInvalid,
                      {kSource, "malformed JSON"}));
  EXPECT_TRUE(IsError(ParseModelConfig("[1, 2]", kSource).status(), kInvalid,
                      {kSource, "expected a JSON object"}));
}

}  // namespace
}  // namespace prl
