// Shared fixtures for the engine tests: a tiny random model (dense or Qwen3-MoE), a driver that
// runs requests to completion, and the learner-path log-probs and MoE routes of sequences.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "inference_engine/engine.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl::testing {

inline ModelConfig TinyEngineConfig(int64_t vocab = 64) {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen2, /*attention_bias=*/false, &c);
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = vocab;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  return c;
}

// The same as Qwen3 with attention biases (q/k/v and o_proj) and head_dim 16 != hidden / heads.
inline ModelConfig TinyQwen3EngineConfig(int64_t vocab = 64) {
  ModelConfig c = TinyEngineConfig(vocab);
  SetArchitecture(Architecture::kQwen3, /*attention_bias=*/true, &c);
  c.head_dim = 16;
  return c;
}

// Weights with enough spread that sampling is far from uniform and from greedy. Norm weights
// are 1 and biases 0 as a fresh model has them; with spread_norms_and_biases they are moved
// away from that (uniform +-0.3), so that a step that skipped or misplaced one (a q/k norm,
// an o_proj bias) shows.
inline std::shared_ptr<const ParameterSet> TinyWeights(const ModelConfig& c, uint64_t seed,
                                                       float std = 0.35f,
                                                       bool spread_norms_and_biases = false) {
  auto set = std::make_shared<ParameterSet>(*ParameterSet::Allocate(c, Device::Cpu(), false));
  InitializeParameters(*set, seed, std);
  if (spread_norms_and_biases) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (const ParamEntry& e : set->layout.entries()) {
      if (!e.name.ends_with("norm.weight") && !e.name.ends_with(".bias")) continue;
      for (int64_t i = 0; i < e.numel; ++i) set->data()[e.offset + i] += u(rng);
    }
  }
  return set;
}

// How far a default-mode (fast) behaviour log-prob may sit from the same token's log-prob
// under another batch shape or the learner path: both are float32 with OpenBLAS choosing the
// summation order per shape and CPU. Measured on 5,818 tokens under OpenBLAS's SkylakeX,
// Haswell, Zen, Sandybridge and Core2 kernels: worst 1.9e-5, mean 1e-6. 1e-4 keeps a 5x margin
// and is an importance ratio within 1 +- 1e-4; the bugs it is there for (a wrong position,
// temperature or weight version) move log-probs by 1e-2 or more. Batch-invariant mode is
// compared bit for bit instead.
inline constexpr double kFastLogprobTolerance = 1e-4;

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

inline std::vector<Job> RandomJobs(int count, int64_t vocab, uint64_t seed, int max_prompt = 40,
                                   int max_tokens = 24, int max_n = 4) {
  std::mt19937_64 rng(seed);
  std::vector<Job> jobs;
  for (int i = 0; i < count; ++i) {
    Job j;
    const int len = 1 + static_cast<int>(rng() % max_prompt);
    for (int t = 0; t < len; ++t) j.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    j.params.n = 1 + static_cast<int32_t>(rng() % max_n);
    j.params.max_tokens = 1 + static_cast<int32_t>(rng() % max_tokens);
    j.params.temperature = (rng() % 5 == 0) ? 0.0f : 0.7f + 0.1f * (rng() % 6);
    j.params.top_p = (rng() % 3 == 0) ? 0.9f : 1.0f;
    j.params.top_k = (rng() % 4 == 0) ? 20 : 0;
    j.params.seed = rng();
    if (rng() % 3 == 0) j.params.stop_token_ids = {static_cast<int32_t>(rng() % vocab)};
    jobs.push_back(j);
  }
  return jobs;
}

// RandomJobs with unfiltered sampling (no top-k / top-p, temperature > 0): their behaviour
// log-probs are the model's, which the learner's are compared with.
inline std::vector<Job> UnfilteredJobs(const ModelConfig& c, int count, uint64_t seed,
                                       int max_prompt = 40) {
  std::vector<Job> jobs = RandomJobs(count, c.vocab_size, seed, max_prompt);
  for (Job& j : jobs) {
    j.params.top_p = 1.0f;
    j.params.top_k = 0;
    if (j.params.temperature == 0.0f) j.params.temperature = 1.0f;
  }
  return jobs;
}

// A CPU LoRA adapter for the engine tests (A as peft makes it); trained: B random (std 0.5), so
// that it changes what the model samples; else B = 0 (the identity on the base).
inline std::shared_ptr<const LoraSet> TestAdapter(const ModelConfig& c, bool trained,
                                                  int64_t rank = 4,
                                                  std::vector<std::string> targets = {"all-linear"},
                                                  uint64_t seed = 5) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 2.0 * static_cast<double>(rank);
  l.target_modules = std::move(targets);
  auto set = std::make_shared<LoraSet>(*LoraSet::Allocate(c, l, Device::Cpu(), false));
  InitializeLora(*set, seed);
  if (trained) {
    std::mt19937_64 rng(seed + 1);
    std::normal_distribution<float> n(0.0f, 0.5f);
    for (const LoraEntry& e : set->layout.entries()) {
      if (e.is_a) continue;
      for (int64_t i = 0; i < e.numel; ++i) set->data()[e.offset + i] = n(rng);
    }
  }
  return set;
}

// A copy of host weights on cuda:0 (the CUDA engine tests; a failed copy fails the test).
inline std::shared_ptr<const ParameterSet> OnGpu(const ParameterSet& host) {
  auto set =
      std::make_shared<ParameterSet>(*ParameterSet::Allocate(host.config, Device::Cuda(0), false));
  EXPECT_TRUE(
      CopyBytes(set->data(), Device::Cuda(0), host.data(), Device::Cpu(), host.buffer.bytes())
          .ok());
  return set;
}

// Runs the jobs (all queued up front) to completion; outputs by job index.
inline std::vector<RequestOutput> RunJobs(Engine& engine, const std::vector<Job>& jobs) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StatusOr<uint64_t> id = engine.AddRequest(jobs[i].prompt, jobs[i].params);
    EXPECT_TRUE(id.ok()) << id.status();
    index[*id] = i;
  }
  std::vector<RequestOutput> out(jobs.size());
  int guard = 0;
  while (engine.HasUnfinishedRequests()) {
    EXPECT_TRUE(engine.Step().ok());
    for (RequestOutput& r : engine.TakeFinished()) out[index.at(r.request_id)] = std::move(r);
    if (++guard > 100000) {
      ADD_FAILURE() << "engine did not finish";
      break;
    }
  }
  for (RequestOutput& r : engine.TakeFinished()) out[index.at(r.request_id)] = std::move(r);
  return out;
}

// Learner-path log-probs of completion[i] given prompt + completion[:i] at temperature T.
inline std::vector<float> ScoreCompletion(const ParameterSet& weights,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& completion, float temperature,
                                          kernels::ReductionOrder order) {
  TransformerOptions options;
  options.reduction_order = order;
  Transformer model(weights.config, Device::Cpu(), options);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), completion.begin(), completion.end());
  PackedBatch batch;
  batch.AddScored(seq, static_cast<int64_t>(prompt.size()));
  std::vector<float> lp(batch.num_tokens());
  EXPECT_TRUE(model.Forward(weights.params, batch, temperature, absl::MakeSpan(lp), false).ok());
  return std::vector<float>(lp.begin() + prompt.size() - 1, lp.end());
}

// 2 MoE layers of 6 experts (top 2, renormalised) and a dense one between them.
inline ModelConfig TinyMoeConfig() {
  ModelConfig c = TinyEngineConfig();
  SetArchitecture(Architecture::kQwen3Moe, /*attention_bias=*/false, &c);
  c.head_dim = 16;
  c.num_hidden_layers = 3;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  return c;
}

inline EngineOptions InvariantOptions(const ModelConfig& c, int64_t kv_blocks,
                                      bool prefix_caching) {
  EngineOptions o;
  o.block_size = 4;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 48;  // long prompts are chunked
  o.kv_cache_bytes = kv_blocks * KvCache::BytesPerBlock(c, 4);
  o.batch_invariant = true;
  o.enable_prefix_caching = prefix_caching;
  return o;
}

// The learner's routes (Transformer::recomputed_routes, batch-invariant) at the positions
// that predict each completion token.
inline std::vector<uint8_t> LearnerRoutes(const ParameterSet& weights,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& completion) {
  Transformer model(weights.config, Device::Cpu(),
                    {.reduction_order = kernels::ReductionOrder::kBatchInvariant});
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), completion.begin(), completion.end());
  PackedBatch batch;
  batch.AddScored(seq, static_cast<int64_t>(prompt.size()));
  std::vector<float> lp(batch.num_tokens());
  EXPECT_TRUE(model.Forward(weights.params, batch, 1.0f, absl::MakeSpan(lp), false).ok());
  const int64_t LK = weights.config.num_moe_layers() * weights.config.num_experts_per_tok;
  const absl::Span<const uint8_t> all = model.recomputed_routes();
  return std::vector<uint8_t>(all.begin() + (prompt.size() - 1) * LK, all.end());
}

inline void ExpectRoutesAreTheLearners(const ParameterSet& weights,
                                       const std::vector<int32_t>& prompt, const SampleOutput& s) {
  const ModelConfig& c = weights.config;
  EXPECT_EQ(s.route_layers, c.num_moe_layers());
  EXPECT_EQ(s.route_top_k, c.num_experts_per_tok);
  ASSERT_EQ(static_cast<int64_t>(s.routes.size()),
            static_cast<int64_t>(s.tokens.size()) * c.num_moe_layers() * c.num_experts_per_tok);
  EXPECT_EQ(s.routes, LearnerRoutes(weights, prompt, s.tokens))
      << "sample " << s.sample_index << " of a " << prompt.size() << "-token prompt";
}

}  // namespace prl::testing
