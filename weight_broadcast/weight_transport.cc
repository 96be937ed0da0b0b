#include "weight_broadcast/weight_transport.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"

namespace prl {

namespace {

std::string Exact(double x) { return absl::StrFormat("%.17g", x); }

absl::string_view RopeTypeName(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kNone:
      return "none";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
  }
  return "unknown";
}

std::vector<std::pair<absl::string_view, absl::string_view>> Fields(absl::string_view text) {
  std::vector<std::pair<absl::string_view, absl::string_view>> fields;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(word, absl::MaxSplits('=', 1));
    fields.push_back(kv);
  }
  return fields;
}

}  // namespace

std::string ModelFingerprint(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  std::string rope(RopeTypeName(r.type));
  if (r.type != RopeScaling::Type::kNone) absl::StrAppend(&rope, ",factor:", Exact(r.factor));
  if (r.type == RopeScaling::Type::kLlama3) {
    absl::StrAppend(&rope, ",low_freq_factor:", Exact(r.low_freq_factor),
                    ",high_freq_factor:", Exact(r.high_freq_factor),
                    ",original_max_position_embeddings:", r.original_max_position_embeddings);
  }
  // Qwen3-MoE's keys (a dense model's fingerprint is what it was before they existed).
  std::string moe;
  if (c.has_moe()) {
    moe =
        absl::StrCat(" num_experts=", c.num_experts, " num_experts_per_tok=", c.num_experts_per_tok,
                     " moe_intermediate_size=", c.moe_intermediate_size,
                     " norm_topk_prob=", c.norm_topk_prob ? "true" : "false",
                     " decoder_sparse_step=", c.decoder_sparse_step, " mlp_only_layers=[",
                     absl::StrJoin(c.mlp_only_layers, ","), "]");
  }
  return absl::StrCat(
      "architecture=", ArchitectureName(c.arch), " hidden_size=", c.hidden_size,
      " intermediate_size=", c.intermediate_size, " num_hidden_layers=", c.num_hidden_layers,
      " num_attention_heads=", c.num_attention_heads,
      " num_key_value_heads=", c.num_key_value_heads, " head_dim=", c.head_dim,
      " vocab_size=", c.vocab_size, " max_position_embeddings=", c.max_position_embeddings,
      " rms_norm_eps=", Exact(c.rms_norm_eps), " rope_theta=", Exact(c.rope_theta),
      " rope_scaling=", rope, " tie_word_embeddings=", c.tie_word_embeddings ? "true" : "false",
      " qkv_bias=", c.qkv_bias ? "true" : "false", moe);
}

std::string WeightFingerprint(const WeightSpec& spec) {
  std::string fingerprint = ModelFingerprint(spec.model);
  if (spec.adapter.has_value()) {
    const LoraConfig& l = *spec.adapter;
    absl::StrAppend(&fingerprint, " lora_r=", l.rank, " lora_alpha=", Exact(l.alpha),
                    " lora_rslora=", l.rslora ? "true" : "false",
                    " lora_targets=", absl::StrJoin(l.target_modules, ","));
  }
  return fingerprint;
}

absl::Status ValidateWeightSpec(const WeightSpec& spec) {
  PRL_RETURN_IF_ERROR(ValidateModelConfig(spec.model));
  if (spec.adapter.has_value()) PRL_RETURN_IF_ERROR(ValidateLoraConfig(*spec.adapter, spec.model));
  return absl::OkStatus();
}

int64_t WeightBytes(const WeightSpec& spec) {
  if (!spec.adapter.has_value()) return ParameterLayout(spec.model).num_elements() * 4;
  absl::StatusOr<LoraLayout> layout = LoraLayout::Make(spec.model, *spec.adapter);
  return layout.ok() ? layout->num_elements() * 4 : 0;
}

WeightView WeightView::Of(const ParameterSet& weights) {
  return {ModelFingerprint(weights.config), weights.data(), weights.buffer.device(),
          weights.buffer.bytes()};
}

WeightView WeightView::Of(const LoraSet& adapter) {
  return {WeightFingerprint(WeightSpec(adapter.model, adapter.lora)), adapter.data(),
          adapter.buffer.device(), adapter.buffer.bytes()};
}

absl::Status CheckSameModel(absl::string_view published, absl::string_view local,
                            absl::string_view where) {
  if (published == local) return absl::OkStatus();
  const auto theirs = Fields(published);
  const auto ours = Fields(local);
  for (size_t i = 0; i < std::max(theirs.size(), ours.size()); ++i) {
    const absl::string_view key = i < theirs.size() ? theirs[i].first : ours[i].first;
    absl::string_view a = "(absent)", b = "(absent)";
    for (const auto& [k, v] : theirs) {
      if (k == key) a = v;
    }
    for (const auto& [k, v] : ours) {
      if (k == key) b = v;
    }
    if (a != b) {
      if (absl::StartsWith(key, "lora_")) {
        return absl::FailedPreconditionError(absl::StrCat(
            where, ": LoRA adapter mismatch: ", key, " is ", a, " in the published versions but ",
            b, " here (a LoRA learner publishes its adapter alone: actors and learner need the "
            "same learner.lora_* settings)"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": model config mismatch: ", key, " is ", a, " in the published model but ", b,
          " in this process's model config (actors must load the learner's config.json)"));
    }
  }
  // Same fields and values in another order: a different prl build.
  return absl::FailedPreconditionError(
      absl::StrCat(where, ": model fingerprints differ in form: published '", published,
                   "', here '", local, "' (publisher and subscriber run different prl versions?)"));
}

}  // namespace prl
