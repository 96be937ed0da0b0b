#include "model/presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace prl {

namespace {
ModelConfig Qwen2(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t intermediate, int64_t vocab, int64_t max_positions, double rope_theta) {
  ModelConfig c;
  c.arch = Architecture::kQwen2;
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
  c.qkv_bias = true;
  return c;
}
}  // namespace

std::vector<std::string> PresetNames() { return {"tiny", "40m", "qwen2.5-0.5b", "qwen2.5-1.5b"}; }

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  if (name == "tiny") return Qwen2(64, 2, 4, 2, 176, 512, 1024, 10000.0);
  if (name == "40m") return Qwen2(512, 8, 8, 4, 1408, 32000, 4096, 10000.0);
  if (name == "qwen2.5-0.5b") return Qwen2(896, 24, 14, 2, 4864, 151936, 32768, 1000000.0);
  if (name == "qwen2.5-1.5b") return Qwen2(1536, 28, 12, 2, 8960, 151936, 32768, 1000000.0);
  return absl::InvalidArgumentError(absl::StrCat("unknown model preset '", name, "' (expected ",
                                                 absl::StrJoin(PresetNames(), ", "), ")"));
}

}  // namespace prl
