// A LoRA adapter in the engine (Engine::SetAdapter, model/lora.h; CPU): in the batch-invariant
// mode a request's behaviour log-probs equal the learner's (the Transformer with the same
// adapter) bit for bit, with many requests batched, long prompts chunked and a KV pool small
// enough to preempt; a trained adapter changes what the model samples, a fresh one (B = 0)
// does not, and removing it brings the base model back.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <random>
#include <vector>

#include "inference_engine/engine.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

// The learner's log-probs of a completion with the adapter (batch-invariant order; null: none).
std::vector<float> LearnerLogprobs(const ParameterSet& weights, const LoraSet* adapter,
                                   const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& completion, float temperature) {
  Transformer model(weights.config, Device::Cpu(),
                    {.reduction_order = kernels::ReductionOrder::kBatchInvariant});
  ModelParams params = weights.params;
  params.lora = adapter != nullptr ? &adapter->params : nullptr;
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
  auto adapter = TestAdapter(c, /*trained=*/true);
  for (const int64_t kv_blocks : {int64_t{4096}, int64_t{40}}) {
    SCOPED_TRACE(kv_blocks);
    auto engine = *Engine::Create(weights, 0, InvariantOptions(c, kv_blocks, true));
    ASSERT_TRUE(engine->SetAdapter(adapter).ok());
    const std::vector<Job> jobs = UnfilteredJobs(c, 10, 5, /*max_prompt=*/70);
    const std::vector<RequestOutput> out = RunJobs(*engine, jobs);
    int64_t tokens = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      for (const SampleOutput& s : out[i].samples) {
        const std::vector<float> want = LearnerLogprobs(*weights, adapter.get(), jobs[i].prompt,
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
  EXPECT_EQ(run(TestAdapter(c, /*trained=*/false), false), base) << "B = 0 adds exactly zero";
  EXPECT_EQ(run(TestAdapter(c, /*trained=*/true), true), base) << "removed";
  EXPECT_NE(run(TestAdapter(c, /*trained=*/true), false), base) << "a trained adapter";
}

// A LoRA learner's actor: versions arrive as adapters (Engine::SwapAdapter). The swap waits for
// the next Step, after which the engine reports the adapter's version, and what it samples
// from then on is what an engine given that adapter from the start samples, bit for bit.
TEST(EngineLoraTest, ASwappedAdapterTakesOverAtTheNextStepWithItsVersion) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 13);
  auto first = TestAdapter(c, /*trained=*/true, 4, {"all-linear"}, 5);
  auto second = TestAdapter(c, /*trained=*/true, 4, {"all-linear"}, 9);
  const std::vector<Job> jobs = RandomJobs(5, c.vocab_size, 8, /*max_prompt=*/30);
  auto logprobs_of = [&](Engine& engine) {
    std::vector<std::vector<float>> out;
    for (const RequestOutput& r : RunJobs(engine, jobs)) {
      for (const SampleOutput& s : r.samples) out.push_back(s.logprobs);
    }
    return out;
  };
  auto fresh = *Engine::Create(weights, 0, InvariantOptions(c, 4096, true));
  ASSERT_TRUE(fresh->SetAdapter(second).ok());
  const auto want = logprobs_of(*fresh);

  auto engine = *Engine::Create(weights, 0, InvariantOptions(c, 4096, true));
  ASSERT_TRUE(engine->SetAdapter(first).ok());
  const auto before = logprobs_of(*engine);
  EXPECT_NE(before, want) << "two adapters that sample differently";
  ASSERT_TRUE(engine->SwapAdapter(second, 7).ok());
  EXPECT_EQ(engine->Stats().weight_version, 0) << "staged, not applied before a Step";
  EXPECT_EQ(logprobs_of(*engine), want);
  EXPECT_EQ(engine->Stats().weight_version, 7);
  EXPECT_EQ(engine->SwapAdapter(nullptr, 8).code(), absl::StatusCode::kInvalidArgument);
}

// Requests naming three adapters (of other ranks and targets) and none, batched together, the
// same prompts under different adapters (prefix caching on: each adapter's K/V apart), a pool
// small enough to preempt: each request's log-probs are the learner's with its own adapter, bit
// for bit, i.e. what it would get alone (the batch-invariant mode).
TEST(EngineLoraTest, ABatchOfSeveralAdaptersGivesEachRequestItsOwnAdaptersBits) {
  const ModelConfig c = TinyQwen3EngineConfig();
  auto weights = TinyWeights(c, 13);
  const std::vector<std::string> names = {"a", "b", "c", ""};
  const std::vector<std::shared_ptr<const LoraSet>> sets = {
      TestAdapter(c, true, 4, {"all-linear"}, 21),
      TestAdapter(c, true, 2, {"q_proj", "v_proj"}, 22),
      TestAdapter(c, true, 8, {"gate_proj", "up_proj", "down_proj"}, 23), nullptr};
  std::vector<Job> jobs = UnfilteredJobs(c, 6, 9, /*max_prompt=*/70);
  const size_t distinct = jobs.size();
  for (size_t i = 0; i < distinct; ++i) jobs.push_back(jobs[i]);  // each prompt twice
  for (const int64_t kv_blocks : {int64_t{4096}, int64_t{48}}) {
    SCOPED_TRACE(kv_blocks);
    auto engine = *Engine::Create(weights, 0, InvariantOptions(c, kv_blocks, true));
    for (int a = 0; a < 3; ++a) ASSERT_TRUE(engine->AddAdapter(names[a], sets[a]).ok());
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const absl::StatusOr<uint64_t> id =
          engine->AddRequest(jobs[i].prompt, jobs[i].params, names[i % names.size()]);
      ASSERT_TRUE(id.ok()) << id.status();
      index[*id] = i;
    }
    std::vector<RequestOutput> out(jobs.size());
    while (engine->HasUnfinishedRequests()) {
      ASSERT_TRUE(engine->Step().ok());
      for (RequestOutput& r : engine->TakeFinished()) out[index.at(r.request_id)] = std::move(r);
    }
    int64_t tokens = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const LoraSet* adapter = sets[i % sets.size()].get();
      for (const SampleOutput& s : out[i].samples) {
        const std::vector<float> want = LearnerLogprobs(*weights, adapter, jobs[i].prompt,
                                                        s.tokens, jobs[i].params.temperature);
        ASSERT_EQ(want.size(), s.logprobs.size());
        for (size_t t = 0; t < want.size(); ++t) {
          ASSERT_EQ(want[t], s.logprobs[t])
              << "request " << i << " (adapter '" << names[i % names.size()] << "') token " << t;
        }
        tokens += static_cast<int64_t>(want.size());
      }
    }
    EXPECT_GT(tokens, 0);
  }
}

TEST(EngineLoraTest, SlotsEvictTheLeastRecentlyUsedIdleAdapterAndNeverOneInUse) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 14);
  EngineOptions o = InvariantOptions(c, 4096, true);
  o.max_adapters = 2;
  auto engine = *Engine::Create(weights, 0, o);
  auto adapter = TestAdapter(c, true);
  SamplingParams p;
  p.max_tokens = 4;
  ASSERT_TRUE(engine->AddAdapter("a", adapter).ok());
  ASSERT_TRUE(engine->AddAdapter("b", adapter).ok());
  const absl::StatusOr<uint64_t> unknown = engine->AddRequest({1, 2, 3}, p, "z");
  EXPECT_EQ(unknown.status().message(),
            "adapter: 'z' is not one of the engine's adapters (AddAdapter)");
  ASSERT_TRUE(engine->AddRequest({1, 2, 3}, p, "a").ok());  // a in use from here
  ASSERT_TRUE(engine->AddAdapter("c", adapter).ok());       // evicts b, idle
  EXPECT_EQ(engine->adapters(), (std::vector<std::string>{"a", "c"}));
  ASSERT_TRUE(engine->AddRequest({4, 5}, p, "c").ok());  // both in use
  const absl::Status full = engine->AddAdapter("d", adapter);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(engine->RemoveAdapter("a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->RemoveAdapter("b").code(), absl::StatusCode::kNotFound);
  ModelConfig wider = c;  // an adapter made for another model
  wider.intermediate_size *= 2;
  EXPECT_EQ(engine->SetAdapter(TestAdapter(wider, true)).code(),
            absl::StatusCode::kInvalidArgument);
  EngineOptions too_many = o;
  too_many.max_adapters = -1;
  EXPECT_EQ(Engine::Create(weights, 0, too_many).status().message(),
            "engine: max_adapters must be in [0, 1024], found -1");
  while (engine->HasUnfinishedRequests()) ASSERT_TRUE(engine->Step().ok());
  engine->TakeFinished();
  ASSERT_TRUE(engine->AddRequest({6}, p, "c").ok());  // c used last: a is the LRU
  ASSERT_TRUE(engine->AddAdapter("d", adapter).ok());
  EXPECT_EQ(engine->adapters(), (std::vector<std::string>{"d", "c"}));
  while (engine->HasUnfinishedRequests()) ASSERT_TRUE(engine->Step().ok());
  EXPECT_TRUE(engine->RemoveAdapter("c").ok());
  EXPECT_EQ(engine->adapters(), (std::vector<std::string>{"d"}));
}

}  // namespace
}  // namespace prl::testing

namespace prl::testing {
namespace {

// A run of adapters (docs/tenants.md): each adapter has its own version (AddAdapter's), and the
// tokens its requests sample carry it; a request of no adapter carries the weights' version; a
// new version of one adapter moves only its own requests' later tokens.
TEST(EngineLoraTest, EachAdaptersTokensCarryItsOwnVersion) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 14);
  auto engine = *Engine::Create(weights, 5, InvariantOptions(c, 4096, true));
  ASSERT_TRUE(engine->AddAdapter("a", TestAdapter(c, true, 4, {"all-linear"}, 31), 3).ok());
  ASSERT_TRUE(engine->AddAdapter("b", TestAdapter(c, true, 4, {"all-linear"}, 32), 7).ok());
  EXPECT_EQ(engine->AdapterVersion("a"), 3);
  EXPECT_EQ(engine->AdapterVersion("z"), std::nullopt);
  std::vector<Job> jobs = UnfilteredJobs(c, 3, 11, /*max_prompt=*/70);
  std::map<uint64_t, std::string> adapter_of;
  const std::vector<std::string> names = {"a", "b", ""};
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].params.max_tokens = 6;
    jobs[i].params.stop_token_ids.clear();
    adapter_of[*engine->AddRequest(jobs[i].prompt, jobs[i].params, names[i])] = names[i];
  }
  ASSERT_TRUE(engine->Step().ok());
  ASSERT_TRUE(engine->AddAdapter("b", TestAdapter(c, true, 4, {"all-linear"}, 33), 8).ok());
  std::vector<RequestOutput> out;
  while (engine->HasUnfinishedRequests()) {
    ASSERT_TRUE(engine->Step().ok());
    for (RequestOutput& r : engine->TakeFinished()) out.push_back(std::move(r));
  }
  ASSERT_EQ(out.size(), 3u);
  for (const RequestOutput& r : out) {
    const std::string& name = adapter_of.at(r.request_id);
    for (const SampleOutput& s : r.samples) {
      ASSERT_EQ(s.versions.size(), 6u);
      for (size_t t = 0; t < s.versions.size(); ++t) {
        if (name == "b") {  // 7 until the new version, 8 after (the last tokens at least)
          EXPECT_TRUE(s.versions[t] == 7 || s.versions[t] == 8) << s.versions[t];
          if (t > 0) EXPECT_GE(s.versions[t], s.versions[t - 1]);
        } else {
          EXPECT_EQ(s.versions[t], name == "a" ? 3 : 5) << "adapter '" << name << "' token " << t;
        }
      }
      if (name == "b") EXPECT_EQ(s.versions.back(), 8);
    }
  }
}

}  // namespace
}  // namespace prl::testing
