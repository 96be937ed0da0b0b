#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl {

namespace {

using Json = nlohmann::json;

// Keys that never change the math (ids, dtype hints, bookkeeping); kept verbatim on save.
const std::set<absl::string_view>& PassthroughKeys() {
  static const auto* keys = new std::set<absl::string_view>{
      "_name_or_path",        "bos_token_id",      "eos_token_id",
      "pad_token_id",         "torch_dtype",       "dtype",
      "transformers_version", "use_cache",         "initializer_range",
      "tokenizer_class",      "sliding_window",    "max_window_layers",
      "pretraining_tp",       "output_attentions", "output_hidden_states",
      "return_dict"};
  return *keys;
}

class Reader {
 public:
  Reader(const Json& root, absl::string_view source) : root_(root), source_(source) {}

  absl::Status Error(absl::string_view key, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": key '", key, "': ", message));
  }

  bool Has(absl::string_view key) const {
    auto it = root_.find(key);
    return it != root_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(absl::string_view key, std::optional<int64_t> fallback) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(key, "missing (required)");
    }
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_number_float()) {
      const double d = it->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15) {
        return static_cast<int64_t>(d);
      }
    }
    return Error(key, absl::StrCat("expected an integer, found ", it->dump()));
  }

  absl::StatusOr<double> Double(absl::string_view key, std::optional<double> fallback) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(key, "missing (required)");
    }
    if (!it->is_number()) return Error(key, absl::StrCat("expected a number, found ", it->dump()));
    return it->get<double>();
  }

  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      return Error(key, absl::StrCat("expected true or false, found ", it->dump()));
    }
    return it->get<bool>();
  }

 private:
  const Json& root_;
  absl::string_view source_;
};

constexpr Architecture kArchitectures[] = {Architecture::kLlama, Architecture::kQwen2,
                                           Architecture::kQwen3, Architecture::kQwen3Moe};

// Qwen3MoeConfig's keys; refused, naming the key, in a config of another architecture.
const std::set<absl::string_view>& MoeKeys() {
  static const auto* keys = new std::set<absl::string_view>{
      "num_experts",          "num_experts_per_tok", "moe_intermediate_size",
      "norm_topk_prob",       "decoder_sparse_step", "mlp_only_layers",
      "router_aux_loss_coef", "output_router_logits"};
  return *keys;
}

absl::StatusOr<Architecture> ParseArchitecture(const Json& root, absl::string_view source) {
  std::optional<Architecture> from_arch, from_type;
  if (auto it = root.find("architectures"); it != root.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": key 'architectures': expected one class name, found ", it->dump()));
    }
    const std::string name = (*it)[0].get<std::string>();
    for (Architecture arch : kArchitectures) {
      if (name == ArchitectureName(arch)) from_arch = arch;
    }
    if (!from_arch) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": key 'architectures': '", name,
          "' is not supported (expected LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or "
          "Qwen3MoeForCausalLM)"));
    }
  }
  if (auto it = root.find("model_type"); it != root.end() && !it->is_null()) {
    const std::string type = it->is_string() ? it->get<std::string>() : it->dump();
    for (Architecture arch : kArchitectures) {
      if (type == ModelTypeName(arch)) from_type = arch;
    }
    if (!from_type) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key 'model_type': '", type,
                       "' is not supported (expected llama, qwen2, qwen3 or qwen3_moe)"));
    }
  }
  if (from_arch && from_type && *from_arch != *from_type) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": keys 'architectures' and 'model_type' disagree"));
  }
  if (from_arch) return *from_arch;
  if (from_type) return *from_type;
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": neither 'architectures' nor 'model_type' is given"));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& root, absl::string_view source) {
  RopeScaling scaling;
  auto it = root.find("rope_scaling");
  if (it == root.end() || it->is_null()) return scaling;
  const std::string key = "rope_scaling";
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key 'rope_scaling': expected an object or null"));
  }
  const Json& rs = *it;
  // transformers accepts the legacy key "type" as well as "rope_type".
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto found = rs.find(key);
    if (found == rs.end()) continue;
    if (!found->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key 'rope_scaling.", key, "' must be a string"));
    }
    if (!type.empty() && type != found->get<std::string>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": keys 'rope_scaling.rope_type' and 'rope_scaling.type' disagree"));
    }
    type = found->get<std::string>();
  }
  std::set<std::string> allowed = {"rope_type", "type"};
  if (type == "default") {
    // Plain RoPE.
  } else if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    allowed.insert("factor");
  } else if (type == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key 'rope_scaling.rope_type': '", type,
                     "' is not supported (supported: default, linear, llama3)"));
  }
  for (const auto& [k, v] : rs.items()) {
    if (!allowed.count(k)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": key 'rope_scaling.", k, "' is not supported for rope_type '", type, "'"));
    }
  }
  Reader reader(rs, absl::StrCat(source, " rope_scaling"));
  if (scaling.type != RopeScaling::Type::kNone) {
    PRL_ASSIGN_OR_RETURN(scaling.factor, reader.Double("factor", std::nullopt));
    if (!(scaling.factor >= 1.0)) return reader.Error("factor", "expected >= 1");
  }
  if (scaling.type == RopeScaling::Type::kLlama3) {
    PRL_ASSIGN_OR_RETURN(scaling.low_freq_factor, reader.Double("low_freq_factor", std::nullopt));
    PRL_ASSIGN_OR_RETURN(scaling.high_freq_factor, reader.Double("high_freq_factor", std::nullopt));
    PRL_ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                         reader.Int("original_max_position_embeddings", std::nullopt));
    if (!(scaling.high_freq_factor > scaling.low_freq_factor) ||
        scaling.original_max_position_embeddings <= 0) {
      return reader.Error("high_freq_factor",
                          "expected high_freq_factor > low_freq_factor and a positive "
                          "original_max_position_embeddings");
    }
  }
  return scaling;
}

// Keys whose only supported value is the one that leaves the math unchanged.
absl::Status CheckNeutralKeys(const Json& root, const Reader& reader, Architecture arch) {
  if (auto it = root.find("hidden_act"); it != root.end() && !it->is_null()) {
    if (*it != "silu") {
      return reader.Error("hidden_act", absl::StrCat("only silu is supported, found ", it->dump()));
    }
  }
  PRL_ASSIGN_OR_RETURN(const double dropout, reader.Double("attention_dropout", 0.0));
  if (dropout != 0.0) return reader.Error("attention_dropout", "only 0.0 is supported");
  PRL_ASSIGN_OR_RETURN(const bool sliding, reader.Bool("use_sliding_window", false));
  if (sliding)
    return reader.Error("use_sliding_window", "sliding-window attention is not supported");
  PRL_ASSIGN_OR_RETURN(const bool mlp_bias, reader.Bool("mlp_bias", false));
  if (mlp_bias) return reader.Error("mlp_bias", "MLP biases are not supported");
  // Qwen2 has no such key (its q/k/v biases are unconditional; transformers ignores it);
  // Qwen3 reads it in ParseModelConfig.
  PRL_ASSIGN_OR_RETURN(const bool attention_bias, reader.Bool("attention_bias", false));
  if (attention_bias && arch == Architecture::kLlama) {
    return reader.Error("attention_bias", "Llama attention biases (q/k/v/o) are not supported");
  }
  if (auto it = root.find("layer_types"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return reader.Error("layer_types", "expected a list of layer types");
    for (const Json& t : *it) {
      if (t != "full_attention") {
        return reader.Error(
            "layer_types",
            absl::StrCat("only full_attention layers are supported, found ", t.dump()));
      }
    }
  }
  return absl::OkStatus();
}

// Qwen3MoeConfig's keys, with its defaults.
absl::Status ParseMoeKeys(const Json& root, const Reader& reader, ModelConfig* c) {
  PRL_ASSIGN_OR_RETURN(c->num_experts, reader.Int("num_experts", 128));
  PRL_ASSIGN_OR_RETURN(c->num_experts_per_tok, reader.Int("num_experts_per_tok", 8));
  PRL_ASSIGN_OR_RETURN(c->moe_intermediate_size, reader.Int("moe_intermediate_size", 768));
  PRL_ASSIGN_OR_RETURN(c->norm_topk_prob, reader.Bool("norm_topk_prob", false));
  PRL_ASSIGN_OR_RETURN(c->decoder_sparse_step, reader.Int("decoder_sparse_step", 1));
  PRL_ASSIGN_OR_RETURN(c->router_aux_loss_coef, reader.Double("router_aux_loss_coef", 0.001));
  PRL_ASSIGN_OR_RETURN(const bool router_logits, reader.Bool("output_router_logits", false));
  if (router_logits) {
    return reader.Error("output_router_logits",
                        "true makes transformers return the router logits for its "
                        "load-balancing loss; prl's learner computes that loss itself when "
                        "learner.router_aux_loss_coef > 0 (expected false)");
  }
  c->mlp_only_layers.clear();
  if (auto it = root.find("mlp_only_layers"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return reader.Error("mlp_only_layers", "expected a list of layer indices");
    for (const Json& v : *it) {
      if (!v.is_number_integer()) {
        return reader.Error("mlp_only_layers",
                            absl::StrCat("expected integer layer indices, found ", v.dump()));
      }
      c->mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  std::sort(c->mlp_only_layers.begin(), c->mlp_only_layers.end());
  c->mlp_only_layers.erase(std::unique(c->mlp_only_layers.begin(), c->mlp_only_layers.end()),
                           c->mlp_only_layers.end());
  return absl::OkStatus();
}

}  // namespace

absl::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
  }
  return "?";
}

absl::string_view ModelTypeName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
  }
  return "?";
}

void SetArchitecture(Architecture arch, bool attention_bias, ModelConfig* c) {
  c->arch = arch;
  // Qwen3Attention (Qwen3MoeAttention is the same): attention_bias puts a bias on q, k, v and
  // o_proj alike.
  const bool qwen3 = arch == Architecture::kQwen3 || arch == Architecture::kQwen3Moe;
  c->qkv_bias = arch == Architecture::kQwen2 || (qwen3 && attention_bias);
  c->o_bias = qwen3 && attention_bias;
  c->qk_norm = qwen3;
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  for (int64_t dense : mlp_only_layers) {
    if (dense == layer) return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += IsMoeLayer(l) ? 1 : 0;
  return n;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  static const std::set<absl::string_view> kMathKeys = {"architectures",
                                                        "model_type",
                                                        "hidden_size",
                                                        "intermediate_size",
                                                        "num_hidden_layers",
                                                        "num_attention_heads",
                                                        "num_key_value_heads",
                                                        "head_dim",
                                                        "vocab_size",
                                                        "max_position_embeddings",
                                                        "rms_norm_eps",
                                                        "rope_theta",
                                                        "rope_scaling",
                                                        "tie_word_embeddings",
                                                        "hidden_act",
                                                        "attention_bias",
                                                        "mlp_bias",
                                                        "attention_dropout",
                                                        "use_sliding_window",
                                                        "layer_types"};
  ModelConfig config;
  for (const auto& [key, value] : root.items()) {
    if (kMathKeys.count(key) || MoeKeys().count(key)) continue;
    if (PassthroughKeys().count(key)) {
      config.passthrough.emplace_back(key, value.dump());
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": key '", key, "' is not supported by prl (it may change the model's math)"));
  }

  Reader reader(root, source);
  PRL_ASSIGN_OR_RETURN(config.arch, ParseArchitecture(root, source));
  PRL_RETURN_IF_ERROR(CheckNeutralKeys(root, reader, config.arch));
  const bool moe = config.arch == Architecture::kQwen3Moe;
  for (const auto& [key, value] : root.items()) {
    if (!moe && MoeKeys().count(key)) {
      return reader.Error(
          key, absl::StrCat("a Qwen3-MoE key, not one of ", ArchitectureName(config.arch)));
    }
  }
  PRL_ASSIGN_OR_RETURN(config.hidden_size, reader.Int("hidden_size", std::nullopt));
  PRL_ASSIGN_OR_RETURN(config.intermediate_size, reader.Int("intermediate_size", std::nullopt));
  PRL_ASSIGN_OR_RETURN(config.num_hidden_layers, reader.Int("num_hidden_layers", std::nullopt));
  PRL_ASSIGN_OR_RETURN(config.num_attention_heads, reader.Int("num_attention_heads", std::nullopt));
  PRL_ASSIGN_OR_RETURN(config.num_key_value_heads,
                       reader.Int("num_key_value_heads", config.num_attention_heads));
  PRL_ASSIGN_OR_RETURN(config.vocab_size, reader.Int("vocab_size", std::nullopt));
  // transformers' defaults for keys a config.json may leave out.
  const int64_t default_positions = config.arch == Architecture::kLlama ? 2048 : 32768;
  PRL_ASSIGN_OR_RETURN(config.max_position_embeddings,
                       reader.Int("max_position_embeddings", default_positions));
  PRL_ASSIGN_OR_RETURN(config.rms_norm_eps, reader.Double("rms_norm_eps", 1e-6));
  PRL_ASSIGN_OR_RETURN(config.rope_theta, reader.Double("rope_theta", 10000.0));
  PRL_ASSIGN_OR_RETURN(config.tie_word_embeddings, reader.Bool("tie_word_embeddings", false));
  PRL_ASSIGN_OR_RETURN(config.rope_scaling, ParseRopeScaling(root, source));
  if (config.num_attention_heads <= 0) {
    return reader.Error("num_attention_heads", "expected a positive integer");
  }
  // Qwen3Config defaults head_dim to 128; Llama, Qwen2 and Qwen3MoeConfig (which reads
  // head_dim with that fallback) to hidden_size / heads.
  const int64_t default_head_dim =
      config.arch == Architecture::kQwen3 ? 128 : config.hidden_size / config.num_attention_heads;
  PRL_ASSIGN_OR_RETURN(config.head_dim, reader.Int("head_dim", default_head_dim));
  PRL_ASSIGN_OR_RETURN(const bool attention_bias, reader.Bool("attention_bias", false));
  SetArchitecture(config.arch, attention_bias, &config);
  if (moe) PRL_RETURN_IF_ERROR(ParseMoeKeys(root, reader, &config));
  absl::Status valid = ValidateModelConfig(config);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  }
  return config;
}

namespace {

absl::Status ValidateMoe(const ModelConfig& c) {
  if (c.arch != Architecture::kQwen3Moe) {
    if (c.num_experts != 0) {
      return absl::InvalidArgumentError(absl::StrCat("key 'num_experts': expected 0 for ",
                                                     ArchitectureName(c.arch), ", found ",
                                                     c.num_experts));
    }
    return absl::OkStatus();
  }
  if (c.num_experts < 1 || c.num_experts > kMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat("key 'num_experts': expected 1..", kMaxExperts,
                                                   " (routes store expert ids as uint8), found ",
                                                   c.num_experts));
  }
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'num_experts_per_tok': expected 1..num_experts = ", c.num_experts,
                     ", found ", c.num_experts_per_tok));
  }
  if (c.moe_intermediate_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'moe_intermediate_size': expected a positive integer, found ",
                     c.moe_intermediate_size));
  }
  if (c.decoder_sparse_step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'decoder_sparse_step': expected a positive integer, found ", c.decoder_sparse_step));
  }
  for (size_t i = 0; i < c.mlp_only_layers.size(); ++i) {
    const int64_t l = c.mlp_only_layers[i];
    if (l < 0 || l >= c.num_hidden_layers || (i > 0 && l <= c.mlp_only_layers[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key 'mlp_only_layers': expected distinct layer indices in [0, num_hidden_layers = ",
          c.num_hidden_layers, "), found ", l));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  const std::pair<const char*, int64_t> positive[] = {
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [name, value] : positive) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", name, "': expected a positive integer, found ", value));
    }
  }
  // The per-architecture flags are derived from config.json; a hand-built config must agree.
  auto word = [](bool b) { return b ? "true" : "false"; };
  const bool qwen3 = c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe;
  if (c.qk_norm != qwen3) {
    return absl::InvalidArgumentError(absl::StrCat("qk_norm: expected ", word(qwen3), " for ",
                                                   ArchitectureName(c.arch), ", found ",
                                                   word(c.qk_norm)));
  }
  PRL_RETURN_IF_ERROR(ValidateMoe(c));
  if (qwen3 ? c.o_bias != c.qkv_bias : c.o_bias) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'attention_bias': an o_proj bias exists only in Qwen3, together with the q/k/v "
        "biases; found qkv_bias = ",
        word(c.qkv_bias), ", o_bias = ", word(c.o_bias), " for ", ArchitectureName(c.arch)));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'num_key_value_heads': ", c.num_key_value_heads,
                     " does not divide num_attention_heads = ", c.num_attention_heads));
  }
  if (c.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'head_dim': at most 256 supported, found ", c.head_dim));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'head_dim': RoPE needs an even head size, found ", c.head_dim));
  }
  if (c.vocab_size > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'vocab_size': at most 2^31-1 supported, found ", c.vocab_size));
  }
  if (c.max_position_embeddings > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'max_position_embeddings': at most 2^30 supported, found ",
                     c.max_position_embeddings));
  }
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'rms_norm_eps': expected a positive number, found ", c.rms_norm_eps));
  }
  if (!(c.rope_theta > 1.0) || !std::isfinite(c.rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'rope_theta': expected a number > 1, found ", c.rope_theta));
  }
  return absl::OkStatus();
}

std::string ModelConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {std::string(ArchitectureName(c.arch))};
  j["model_type"] = std::string(ModelTypeName(c.arch));
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (c.arch == Architecture::kLlama) j["attention_bias"] = false;
  if (c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe) {
    j["attention_bias"] = c.o_bias;
  }
  if (c.arch == Architecture::kQwen3Moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = false;
  }
  for (const auto& [key, text] : c.passthrough) j[key] = nlohmann::ordered_json::parse(text);
  return j.dump(2) + "\n";
}

}  // namespace prl
