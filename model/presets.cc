#include "model/presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace prl {

namespace {
ModelConfig Qwen2(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t intermediate, int64_t vocab, int64_t max_positions, double rope_theta) {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen2, /*attention_bias=*/false, &c);
  c.hidden_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  c.max_position_embeddings = max_positions;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = rope_theta;
  c.tie_word_embeddings = true;
  return c;
}

// Qwen3 dense: head_dim is given (128 in every released size, whatever hidden / heads is), no
// attention biases, rope_theta 1e6, max_position_embeddings 40960 (the released configs).
ModelConfig Qwen3(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  int64_t intermediate, int64_t vocab, bool tied) {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen3, /*attention_bias=*/false, &c);
  c.hidden_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = tied;
  return c;
}
// Qwen3-MoE: Qwen3's attention and a sparse MoE MLP in every layer (decoder_sparse_step 1,
// no mlp_only_layers), renormalised top-k, as the released Qwen3-30B-A3B config.json.
ModelConfig Qwen3Moe(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, int64_t intermediate, int64_t experts, int64_t top_k,
                     int64_t moe_intermediate, int64_t vocab, bool tied) {
  ModelConfig c = Qwen3(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied);
  SetArchitecture(Architecture::kQwen3Moe, /*attention_bias=*/false, &c);
  c.num_experts = experts;
  c.num_experts_per_tok = top_k;
  c.moe_intermediate_size = moe_intermediate;
  c.norm_topk_prob = true;
  return c;
}
}  // namespace

std::vector<std::string> PresetNames() {
  return {"tiny",       "tiny-long",  "40m",      "qwen2.5-0.5b",   "qwen2.5-1.5b", "tiny-qwen3",
          "qwen3-0.6b", "qwen3-1.7b", "qwen3-8b", "tiny-qwen3-moe", "qwen3-30b-a3b"};
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  if (name == "tiny") return Qwen2(64, 2, 4, 2, 176, 512, 1024, 10000.0);
  // Long sequences on the CPU (prl bench learner --seq-len up to 32768): narrow, but as deep as
  // a small released model, so activations, not the head, dominate a pass.
  if (name == "tiny-long") return Qwen2(128, 12, 4, 2, 384, 2048, 32768, 1000000.0);
  if (name == "40m") return Qwen2(512, 8, 8, 4, 1408, 32000, 4096, 10000.0);
  if (name == "qwen2.5-0.5b") return Qwen2(896, 24, 14, 2, 4864, 151936, 32768, 1000000.0);
  if (name == "qwen2.5-1.5b") return Qwen2(1536, 28, 12, 2, 8960, 151936, 32768, 1000000.0);
  if (name == "tiny-qwen3") {
    // head_dim 32 != hidden / heads = 16, as in the real sizes (128 != 1024 / 16).
    ModelConfig c = Qwen3(64, 2, 4, 2, 32, 176, 512, /*tied=*/true);
    c.max_position_embeddings = 1024;
    c.rope_theta = 10000.0;
    return c;
  }
  if (name == "qwen3-0.6b") return Qwen3(1024, 28, 16, 8, 128, 3072, 151936, /*tied=*/true);
  if (name == "qwen3-1.7b") return Qwen3(2048, 28, 16, 8, 128, 6144, 151936, /*tied=*/true);
  if (name == "qwen3-8b") return Qwen3(4096, 36, 32, 8, 128, 12288, 151936, /*tied=*/false);
  if (name == "tiny-qwen3-moe") {
    // tiny-qwen3's attention; 8 experts of width 64, top 2 (about 1/4 of the MLP active).
    ModelConfig c = Qwen3Moe(64, 2, 4, 2, 32, 176, 8, 2, 64, 512, /*tied=*/true);
    c.max_position_embeddings = 1024;
    c.rope_theta = 10000.0;
    return c;
  }
  if (name == "qwen3-30b-a3b") {
    return Qwen3Moe(2048, 48, 32, 4, 128, 6144, 128, 8, 768, 151936, /*tied=*/false);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model preset '", name, "' (expected ",
                                                 absl::StrJoin(PresetNames(), ", "), ")"));
}

}  // namespace prl
