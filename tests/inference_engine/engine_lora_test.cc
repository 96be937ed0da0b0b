// A LoRA adapter in the engine (Engine::SetAdapter, model/lora.h; CPU): in the batch-invariant
// mode a request's behaviour log-probs equal the learner's (the Transformer with the same
// adapter) bit for bit, with many requests batched, long prompts chunked and a KV pool small
// enough to preempt; a trained adapter changes what the model samples, a fresh one (B = 0)
// does not, and removing it brings the base model back.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "inference_engine/engine.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

std::shared_ptr<const LoraSet> Adapter(const ModelConfig& c, bool trained) {
  LoraConfig l;
  l.rank = 4;
  l.alpha = 8;
  l.target_modules = {"all-linear"};
  auto set = std::make_shared<LoraSet>(*LoraSet::Allocate(c, l, Device::Cpu(), false));
  InitializeLora(*set, 5);
  if (trained) {
    std::mt19937_64 rng(6);
    std::normal_distribution<float> n(0.0f, 0.5f);
    for (const LoraEntry& e : set->layout.entries()) {
      if (e.is_a) continue;
      for (int64_t i = 0; i < e.numel; ++i) set->data()[e.offset + i] = n(rng);
    }
  }
  return set;
}

// The learner's log-probs of a completion with the adapter (batch-invariant order).
std::vector<float> LearnerLogprobs(const ParameterSet& weights, const LoraSet& adapter,
                                   const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& completion, float temperature) {
  Transformer model(weights.config, Device::Cpu(),
                    {.reduction_order = kernels::ReductionOrder::kBatchInvariant});
  ModelParams params = weights.params;
  params.lora = &adapter.params;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), completion.begin(), completion.end());
  PackedBatch batch;
  batch.AddScored(seq, static_cast<int64_t>(prompt.size()));
  std::vector<float> lp(batch.num_tokens());
  EXPECT_TRUE(model.Forward(params, batch, temperature, absl::MakeSpan(lp), false).ok());
  return std::vector<float>(lp.begin() + prompt.size() - 1, lp.end());
}

TEST(EngineLoraTest, BehaviourLogprobsWithAnAdapterAreTheLearnersBitForBit) {
  const ModelConfig c = TinyQwen3EngineConfig();
  auto weights = TinyWeights(c, 11);
  auto adapter = Adapter(c, /*trained=*/true);
  for (const int64_t kv_blocks : {int64_t{4096}, int64_t{40}}) {
    SCOPED_TRACE(kv_blocks);
    auto engine = *Engine::Create(weights, 0, InvariantOptions(c, kv_blocks, true));
    ASSERT_TRUE(engine->SetAdapter(adapter).ok());
    // Unfiltered sampling (no top-k / top-p), whose behaviour log-probs are the model's.
    std::vector<Job> jobs = RandomJobs(10, c.vocab_size, 5, /*max_prompt=*/70);
    for (Job& j : jobs) {
      j.params.top_p = 1.0f;
      j.params.top_k = 0;
      if (j.params.temperature == 0.0f) j.params.temperature = 1.0f;
    }
    const std::vector<RequestOutput> out = RunJobs(*engine, jobs);
    int64_t tokens = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      for (const SampleOutput& s : out[i].samples) {
        const std::vector<float> want = LearnerLogprobs(*weights, *adapter, jobs[i].prompt,
                                                        s.tokens, jobs[i].params.temperature);
        ASSERT_EQ(want.size(), s.logprobs.size());
        for (size_t t = 0; t < want.size(); ++t) {
          ASSERT_EQ(want[t], s.logprobs[t]) << "request " << i << " token " << t;
        }
        tokens += static_cast<int64_t>(want.size());
      }
    }
    EXPECT_GT(tokens, 0);
  }
}

TEST(EngineLoraTest, ATrainedAdapterChangesTheSamplesAFreshOneAndNoneDoNot) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 12);
  const std::vector<Job> jobs = RandomJobs(6, c.vocab_size, 7, /*max_prompt=*/30);
  auto run = [&](std::shared_ptr<const LoraSet> adapter, bool remove_after_set) {
    auto engine = *Engine::Create(weights, 0, InvariantOptions(c, 4096, true));
    EXPECT_TRUE(engine->SetAdapter(adapter).ok());
    if (remove_after_set) EXPECT_TRUE(engine->SetAdapter(nullptr).ok());
    std::vector<std::vector<float>> logprobs;
    for (const RequestOutput& r : RunJobs(*engine, jobs)) {
      for (const SampleOutput& s : r.samples) logprobs.push_back(s.logprobs);
    }
    return logprobs;
  };
  const auto base = run(nullptr, false);
  EXPECT_EQ(run(Adapter(c, /*trained=*/false), false), base) << "B = 0 adds exactly zero";
  EXPECT_EQ(run(Adapter(c, /*trained=*/true), true), base) << "removed";
  EXPECT_NE(run(Adapter(c, /*trained=*/true), false), base) << "a trained adapter";
}

}  // namespace
}  // namespace prl::testing
