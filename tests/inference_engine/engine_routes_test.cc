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

// Context after the prompt (a forced tool call's opening, SamplingParams::context_after_prompt)
// is prefilled with the prompt; its positions' routes are recorded as a reply's are, forked
// samples included.
TEST(EngineRoutesTest, ContextAfterThePromptHasItsRoutesAndTheyAreTheLearners) {
  const ModelConfig c = TinyMoeConfig();
  auto weights = TinyWeights(c, 33);
  auto engine = *Engine::Create(weights, 0, InvariantOptions(c, 4096, false));
  const std::vector<int32_t> prompt = {3, 9, 27, 17, 51, 42, 8};
  SamplingParams p;
  p.n = 2;
  p.temperature = 0.9f;
  p.max_tokens = 4;
  p.seed = 5;
  p.multi_turn = true;
  p.context_after_prompt = {60, 61, 62};
  const uint64_t id = *engine->AddRequest(prompt, p);
  while (engine->Stats().num_running + engine->Stats().num_waiting > 0) {
    ASSERT_TRUE(engine->Step().ok());
  }
  for (const TurnOutput& t : engine->TakeTurns()) {
    ASSERT_TRUE(engine->FinishSample(id, t.sample_index).ok());
  }
  const std::vector<RequestOutput> done = engine->TakeFinished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].prompt, prompt);
  for (const SampleOutput& s : done[0].samples) {
    ASSERT_GT(s.tokens.size(), 3u);
    EXPECT_EQ(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + 3),
              (std::vector<int32_t>{60, 61, 62}));
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
