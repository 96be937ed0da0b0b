// Qwen3-MoE in the engine: it decodes and prefills through the shared decoder layer, and it
// records, per completion token, the experts of every MoE layer at the position that predicts
// it (SampleOutput::routes). In the fp32 CPU batch-invariant mode those are the learner's
// recomputed routes bit for bit, whatever the batching, chunking, forking, preemption or
// turns.
#include <gtest/gtest.h>

#include "inference_engine/engine.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

using kernels::ReductionOrder;

// 2 MoE layers of 6 experts (top 2, renormalised) and a dense one between them.
ModelConfig TinyMoeConfig() {
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

EngineOptions InvariantOptions(const ModelConfig& c, int64_t kv_blocks, bool prefix_caching) {
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
std::vector<uint8_t> LearnerRoutes(const ParameterSet& weights, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& completion) {
  Transformer model(weights.config, Device::Cpu(),
                    {.reduction_order = ReductionOrder::kBatchInvariant});
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

void ExpectRoutesAreTheLearners(const ParameterSet& weights, const std::vector<int32_t>& prompt,
                                const SampleOutput& s) {
  const ModelConfig& c = weights.config;
  EXPECT_EQ(s.route_layers, c.num_moe_layers());
  EXPECT_EQ(s.route_top_k, c.num_experts_per_tok);
  ASSERT_EQ(static_cast<int64_t>(s.routes.size()),
            static_cast<int64_t>(s.tokens.size()) * c.num_moe_layers() * c.num_experts_per_tok);
  EXPECT_EQ(s.routes, LearnerRoutes(weights, prompt, s.tokens))
      << "sample " << s.sample_index << " of a " << prompt.size() << "-token prompt";
}

// Many requests at once (n up to 4 forked from one prefill, chunked prompts), with a pool
// large enough and one so small that sequences are preempted and recomputed.
TEST(EngineRoutesTest, RecordedRoutesAreTheLearnersBitForBit) {
  const ModelConfig c = TinyMoeConfig();
  auto weights = TinyWeights(c, 31);
  for (const int64_t kv_blocks : {int64_t{4096}, int64_t{40}}) {
    SCOPED_TRACE(kv_blocks);
    auto engine = *Engine::Create(weights, 0, InvariantOptions(c, kv_blocks, true));
    const std::vector<Job> jobs = RandomJobs(10, c.vocab_size, 5, /*max_prompt=*/70);
    const std::vector<RequestOutput> out = RunJobs(*engine, jobs);
    if (kv_blocks == 40) {
      EXPECT_GT(engine->Stats().preemptions, 0);
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      for (const SampleOutput& s : out[i].samples) {
        ExpectRoutesAreTheLearners(*weights, jobs[i].prompt, s);
      }
    }
  }
}

// An episode: the prefill of the environment's reply records the routes of the positions
// that predict the reply's tokens and the next turn's first token.
TEST(EngineRoutesTest, AnEpisodesRoutesCoverTheReplyAndAreTheLearners) {
  const ModelConfig c = TinyMoeConfig();
  auto weights = TinyWeights(c, 32);
  auto engine = *Engine::Create(weights, 0, InvariantOptions(c, 4096, false));
  const std::vector<int32_t> prompt = {3, 9, 27, 17, 51, 42, 8};
  SamplingParams p;
  p.n = 2;
  p.temperature = 0.9f;
  p.max_tokens = 5;
  p.seed = 3;
  p.multi_turn = true;
  const uint64_t id = *engine->AddRequest(prompt, p);
  auto run = [&] {
    while (engine->Stats().num_running + engine->Stats().num_waiting > 0) {
      ASSERT_TRUE(engine->Step().ok());
    }
  };
  run();
  for (const TurnOutput& t : engine->TakeTurns()) {
    ASSERT_TRUE(engine->Continue(id, t.sample_index, {60, 61, 62}, 4).ok());
  }
  run();
  for (const TurnOutput& t : engine->TakeTurns()) {
    ASSERT_TRUE(engine->FinishSample(id, t.sample_index).ok());
  }
  const std::vector<RequestOutput> done = engine->TakeFinished();
  ASSERT_EQ(done.size(), 1u);
  for (const SampleOutput& s : done[0].samples) {
    EXPECT_GT(s.tokens.size(), 4u);
    ExpectRoutesAreTheLearners(*weights, prompt, s);
  }
}

TEST(EngineRoutesTest, ADenseModelRecordsNoRoutes) {
  const ModelConfig c = TinyEngineConfig();
  auto engine = *Engine::Create(TinyWeights(c, 33), 0, InvariantOptions(c, 4096, true));
  const std::vector<RequestOutput> out = RunJobs(*engine, RandomJobs(2, c.vocab_size, 6));
  for (const RequestOutput& r : out) {
    for (const SampleOutput& s : r.samples) {
      EXPECT_TRUE(s.routes.empty());
      EXPECT_EQ(s.route_layers, 0);
    }
  }
}

}  // namespace
}  // namespace prl::testing
