// The model tests' shared pieces: tiny configs of every architecture, a fixture of random
// parameters and sequences, a scoring pass, and unit hooks that poison a unit outside its
// window as FSDP does.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl {

// Qwen3 gets head_dim 16 != hidden / heads = 8, as its real sizes have (128 != 1024 / 16).
inline ModelConfig TinyConfig(Architecture arch, bool tied, int64_t kv_heads,
                       bool attention_bias = false) {
  ModelConfig c;
  SetArchitecture(arch, attention_bias, &c);
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.head_dim = arch == Architecture::kQwen3 || arch == Architecture::kQwen3Moe ? 16 : 8;
  if (arch == Architecture::kQwen3Moe) {
    // Tied: both layers MoE, renormalised top-2 of 4; untied: layer 1 dense
    // (mlp_only_layers), raw top-3 of 5.
    c.num_experts = tied ? 4 : 5;
    c.num_experts_per_tok = tied ? 2 : 3;
    c.moe_intermediate_size = 24;
    c.norm_topk_prob = tied;
    if (!tied) c.mlp_only_layers = {1};
    // No dense layer, and a dense width (unused) wider than q|k|v: the backward must not lay
    // out the dense MLP's gradients (its scratch is sized for the attention only).
    if (tied) c.intermediate_size = 96;
  }
  c.vocab_size = 50;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  return c;
}

struct Fixture {
  ModelConfig config;
  ParameterSet params;
  std::vector<std::vector<int32_t>> sequences;

  static Fixture Make(const ModelConfig& config, uint64_t seed) {
    Fixture f{config, *ParameterSet::Allocate(config, Device::Cpu(), false), {}};
    InitializeParameters(f.params, seed, 0.2f);
    // Norm weights and biases away from their 1 / 0 init, so their gradients matter.
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (const ParamEntry& e : f.params.layout.entries()) {
      if (e.name.ends_with("norm.weight") || e.name.ends_with(".bias")) {
        for (int64_t i = 0; i < e.numel; ++i) f.params.data()[e.offset + i] += u(rng);
      }
    }
    std::uniform_int_distribution<int32_t> tok(0, config.vocab_size - 1);
    for (int len : {2, 17, 70, 5}) {
      std::vector<int32_t> s(len);
      for (auto& t : s) t = tok(rng);
      f.sequences.push_back(s);
    }
    return f;
  }

  PackedBatch Batch(size_t first, size_t last) const {
    PackedBatch b;
    for (size_t i = first; i < last; ++i) b.AddScored(sequences[i], 1);
    return b;
  }
};

// Runs forward (+ backward of -sum logprob when grads is given) and returns the logprobs.
inline std::vector<float> Score(Transformer& model, const Fixture& f, const PackedBatch& batch,
                         ParameterSet* grads) {
  std::vector<float> logprobs(batch.num_tokens());
  EXPECT_TRUE(
      model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(logprobs), grads != nullptr).ok());
  if (grads != nullptr) {
    std::vector<float> d(batch.num_tokens());
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      d[t] = batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -1.0f;
    }
    EXPECT_TRUE(model.Backward(f.params.params, d, grads->params).ok());
  }
  return logprobs;
}

// Hooks that hold each unit in its own buffer only between Acquire and Release, NaN
// otherwise, as FSDP does with gathered units: a pass that read a unit outside its window, or
// missed a gradient, would produce NaNs or different numbers.
class PoisoningHooks : public UnitHooks {
 public:
  PoisoningHooks(const ParameterSet& source, ModelParams* params, ModelParams* grads)
      : source_(source), params_(params), grads_(grads) {
    const ParameterLayout& layout = source.layout;
    for (const auto& [begin, end] : layout.unit_ranges()) {
      units_.emplace_back(end - begin, std::nanf(""));
      grad_units_.emplace_back(end - begin, 0.0f);
    }
    params->layers.resize(source.config.num_hidden_layers);
    grads->layers.resize(source.config.num_hidden_layers);
    for (int u = 0; u < layout.num_units(); ++u) {
      layout.BindUnit(u, units_[u].data(), Device::Cpu(), params);
      layout.BindUnit(u, grad_units_[u].data(), Device::Cpu(), grads);
    }
  }
  absl::Status Acquire(int unit, Pass pass, bool need_params) override {
    const auto [begin, end] = source_.layout.unit_ranges()[unit];
    if (need_params) {
      std::copy(source_.data() + begin, source_.data() + end, units_[unit].begin());
      ++holders_[unit];
    }
    if (pass == Pass::kBackward) backward_units_.insert(unit);
    return absl::OkStatus();
  }
  absl::Status Release(int unit, Pass pass, bool gradient_done) override {
    if (holders_[unit] > 0 && --holders_[unit] == 0) {
      std::fill(units_[unit].begin(), units_[unit].end(), std::nanf(""));
    }
    if (pass == Pass::kBackward && gradient_done) done_.push_back(unit);
    return absl::OkStatus();
  }
  // The gradient, in the full layout.
  std::vector<float> Gradient() const {
    std::vector<float> g;
    for (const auto& u : grad_units_) g.insert(g.end(), u.begin(), u.end());
    return g;
  }
  std::vector<int> done_;

 private:
  const ParameterSet& source_;
  ModelParams* params_;
  ModelParams* grads_;
  std::vector<std::vector<float>> units_, grad_units_;
  std::map<int, int> holders_;
  std::set<int> backward_units_;
};

// A test model: (architecture, tied embeddings, KV heads, attention_bias) for TinyConfig.
using ArchitectureCase = std::tuple<Architecture, bool, int, bool>;
// "qwen2TiedKv2", "qwen3UntiedKv1AttentionBias", ...: a parameterised test's name.
inline std::string ArchitectureCaseName(const ArchitectureCase& c) {
  return absl::StrCat(ModelTypeName(std::get<0>(c)), std::get<1>(c) ? "Tied" : "Untied", "Kv",
                      std::get<2>(c), std::get<3>(c) ? "AttentionBias" : "");
}
// One of each architecture, the MoE ones tied with every layer sparse and untied with a dense
// layer between: the suites that need not run all of TransformerTest's.
inline auto ArchitectureCases() {
  return ::testing::Values(ArchitectureCase{Architecture::kQwen2, true, 2, false},
                           ArchitectureCase{Architecture::kLlama, false, 1, false},
                           ArchitectureCase{Architecture::kQwen3, false, 1, true},
                           ArchitectureCase{Architecture::kQwen3Moe, true, 2, false},
                           ArchitectureCase{Architecture::kQwen3Moe, false, 1, true});
}

// Score's forward and backward of -sum logprob with FSDP-like hooks: params and grads are the
// views `hooks` binds. Returns the log-probs.
inline std::vector<float> ScoreThroughHooks(Transformer& model, const PackedBatch& batch,
                                            PoisoningHooks& hooks, const ModelParams& params,
                                            const ModelParams& grads) {
  std::vector<float> logprobs(batch.num_tokens()), d(batch.num_tokens());
  EXPECT_TRUE(model.Forward(params, batch, 1.0f, absl::MakeSpan(logprobs), true, &hooks).ok());
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    d[t] = batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -1.0f;
  }
  EXPECT_TRUE(model.Backward(params, d, grads, &hooks).ok());
  return logprobs;
}

}  // namespace prl
