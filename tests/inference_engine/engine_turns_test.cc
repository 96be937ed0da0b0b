// Multi-turn requests (inference_engine/engine_turns.cc): a paused sample keeps its KV cache, so
// the next turn computes only the reply and gives exactly what a fresh request over the whole
// conversation gives; the behaviour log-probs of an episode's model tokens are the learner's;
// a pool that runs short takes a paused sample's blocks first, and it recomputes them.
#include <gtest/gtest.h>

#include "inference_engine/engine.h"
#include "tests/inference_engine/engine_testing.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

using kernels::ReductionOrder;

EngineOptions InvariantOptions(int64_t kv_blocks = 0) {
  EngineOptions o;
  o.block_size = 4;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 64;
  o.kv_cache_bytes =
      kv_blocks > 0 ? kv_blocks * KvCache::BytesPerBlock(TinyEngineConfig(), 4) : int64_t{16} << 20;
  o.batch_invariant = true;
  o.enable_prefix_caching = false;  // what is kept is kept by the pause, not found again
  return o;
}

// Steps until nothing is running or waiting (paused samples wait for the caller).
void RunUntilIdle(Engine& engine) {
  for (int i = 0; i < 100000; ++i) {
    const EngineStats s = engine.Stats();
    if (s.num_running == 0 && s.num_waiting == 0) return;
    ASSERT_TRUE(engine.Step().ok());
  }
  FAIL() << "the engine did not go idle";
}

SamplingParams Episode(float temperature, int32_t n = 1) {
  SamplingParams p;
  p.n = n;
  p.temperature = temperature;
  p.max_tokens = 6;
  p.seed = 11;
  p.multi_turn = true;
  return p;
}

// Two turns of one sample, the reply between them; returns the finished output.
RequestOutput TwoTurns(Engine& engine, const std::vector<int32_t>& prompt,
                       const SamplingParams& params, const std::vector<int32_t>& reply,
                       std::vector<TurnOutput>* turns) {
  const uint64_t id = *engine.AddRequest(prompt, params);
  RunUntilIdle(engine);
  std::vector<TurnOutput> first = engine.TakeTurns();
  EXPECT_EQ(first.size(), static_cast<size_t>(params.n));
  for (const TurnOutput& t : first) {
    EXPECT_TRUE(engine.Continue(id, t.sample_index, reply, 5).ok());
  }
  RunUntilIdle(engine);
  std::vector<TurnOutput> second = engine.TakeTurns();
  EXPECT_EQ(second.size(), static_cast<size_t>(params.n));
  for (const TurnOutput& t : second) EXPECT_TRUE(engine.FinishSample(id, t.sample_index).ok());
  turns->insert(turns->end(), first.begin(), first.end());
  turns->insert(turns->end(), second.begin(), second.end());
  std::vector<RequestOutput> done = engine.TakeFinished();
  EXPECT_EQ(done.size(), 1u);
  return done.empty() ? RequestOutput() : done[0];
}

TEST(EngineTurnsTest, TheNextTurnComputesOnlyTheReplyAndEqualsAFreshRequestBitForBit) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 21);
  const std::vector<int32_t> prompt = {3, 9, 27, 17, 51, 42, 8, 1, 30};
  const std::vector<int32_t> reply = {60, 61, 62, 63, 5};
  auto engine = *Engine::Create(weights, 0, InvariantOptions());
  std::vector<TurnOutput> turns;
  const RequestOutput out = TwoTurns(*engine, prompt, Episode(0.0f), reply, &turns);
  ASSERT_EQ(turns.size(), 2u);
  ASSERT_EQ(out.samples.size(), 1u);
  const SampleOutput& s = out.samples[0];
  // The completion: turn 1, the reply, turn 2, with their sources, log-probs and versions.
  std::vector<int32_t> expected = turns[0].tokens;
  expected.insert(expected.end(), reply.begin(), reply.end());
  expected.insert(expected.end(), turns[1].tokens.begin(), turns[1].tokens.end());
  EXPECT_EQ(s.tokens, expected);
  ASSERT_EQ(s.sources.size(), expected.size());
  for (size_t t = 0; t < expected.size(); ++t) {
    const bool env = t >= turns[0].tokens.size() && t < turns[0].tokens.size() + reply.size();
    EXPECT_EQ(s.sources[t], env ? 1 : 0) << t;
    if (env) {
      EXPECT_EQ(s.logprobs[t], 0.0f) << t;
    }
  }
  const EngineStats st = engine->Stats();
  EXPECT_EQ(st.turns_continued, 1);
  EXPECT_EQ(st.turn_kept_tokens, st.turn_context_tokens) << "nothing computed again";
  EXPECT_EQ(st.turn_context_tokens,
            static_cast<int64_t>(prompt.size() + turns[0].tokens.size()) - 1);
  EXPECT_EQ(st.prefill_tokens, static_cast<int64_t>(prompt.size() + 1 + reply.size()))
      << "the prompt once, then the first turn's last token and the reply";

  // A fresh request over the whole conversation gives the second turn (greedy, same bits).
  std::vector<int32_t> conversation = prompt;
  conversation.insert(conversation.end(), turns[0].tokens.begin(), turns[0].tokens.end());
  conversation.insert(conversation.end(), reply.begin(), reply.end());
  SamplingParams fresh = Episode(0.0f);
  fresh.multi_turn = false;
  fresh.max_tokens = 5;
  auto other = *Engine::Create(weights, 0, InvariantOptions());
  const std::vector<RequestOutput> ref = RunJobs(*other, {Job{conversation, fresh}});
  ASSERT_EQ(ref[0].samples[0].tokens, turns[1].tokens);
  const size_t off = turns[0].tokens.size() + reply.size();
  for (size_t t = 0; t < turns[1].tokens.size(); ++t) {
    EXPECT_EQ(s.logprobs[off + t], ref[0].samples[0].logprobs[t])
        << "token " << t << " bit for bit";
  }
}

// Context after the prompt (SamplingParams::context_after_prompt: a forced tool call's
// opening) is computed with the prompt but never sampled: the first turn is what a fresh request
// over prompt + context samples, bit for bit; the completion holds the context first (source 1,
// log-prob 0) and the prompt stays the prompt. A single-turn request cannot carry it.
TEST(EngineTurnsTest, ContextAfterThePromptIsComputedNeverSampledAndLeavesThePromptAsItWas) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 22);
  const std::vector<int32_t> prompt = {3, 9, 27, 17, 51, 42, 8, 1, 30};
  const std::vector<int32_t> context = {60, 61, 62, 63, 5};
  auto engine = *Engine::Create(weights, 0, InvariantOptions());
  SamplingParams p = Episode(0.0f);
  p.context_after_prompt = context;
  const uint64_t id = *engine->AddRequest(prompt, p);
  RunUntilIdle(*engine);
  std::vector<TurnOutput> turns = engine->TakeTurns();
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0].tokens.size(), static_cast<size_t>(p.max_tokens))
      << "max_tokens counts only the sampled tokens";
  ASSERT_TRUE(engine->FinishSample(id, 0).ok());
  const std::vector<RequestOutput> done = engine->TakeFinished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].prompt, prompt);
  const SampleOutput& s = done[0].samples[0];
  std::vector<int32_t> expected = context;
  expected.insert(expected.end(), turns[0].tokens.begin(), turns[0].tokens.end());
  EXPECT_EQ(s.tokens, expected);
  ASSERT_EQ(s.sources.size(), expected.size());
  for (size_t t = 0; t < expected.size(); ++t) {
    EXPECT_EQ(s.sources[t], t < context.size() ? 1 : 0) << t;
    if (t < context.size()) {
      EXPECT_EQ(s.logprobs[t], 0.0f) << t;
    }
  }
  EXPECT_EQ(engine->Stats().prefill_tokens, static_cast<int64_t>(prompt.size() + context.size()));

  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), context.begin(), context.end());
  SamplingParams fresh = Episode(0.0f);
  fresh.multi_turn = false;
  auto other = *Engine::Create(weights, 0, InvariantOptions());
  const std::vector<RequestOutput> ref = RunJobs(*other, {Job{whole, fresh}});
  ASSERT_EQ(ref[0].samples[0].tokens, turns[0].tokens);
  for (size_t t = 0; t < turns[0].tokens.size(); ++t) {
    EXPECT_EQ(s.logprobs[context.size() + t], ref[0].samples[0].logprobs[t]) << t;
  }

  SamplingParams single = Episode(0.0f);
  single.multi_turn = false;
  single.context_after_prompt = context;
  const absl::StatusOr<uint64_t> refused = engine->AddRequest(prompt, single);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("context_after_prompt"), std::string::npos)
      << refused.status();
  SamplingParams bad_id = Episode(0.0f);
  bad_id.context_after_prompt = {5, static_cast<int32_t>(c.vocab_size)};
  const absl::StatusOr<uint64_t> out_of_range = engine->AddRequest(prompt, bad_id);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("context_after_prompt[1] = "), std::string::npos)
      << out_of_range.status();
}

// The learner scores the whole episode (prompt, then every completion token, the reply
// included as context): its log-probs of the model's tokens are the behaviour log-probs.
TEST(EngineTurnsTest, AnEpisodesBehaviourLogprobsAreTheLearnersForEveryModelToken) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 22);
  auto engine = *Engine::Create(weights, 0, InvariantOptions());
  std::vector<TurnOutput> turns;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  const RequestOutput out = TwoTurns(*engine, prompt, Episode(0.9f, /*n=*/3), {40, 41, 42}, &turns);
  ASSERT_EQ(out.samples.size(), 3u);
  for (const SampleOutput& s : out.samples) {
    const std::vector<float> score =
        ScoreCompletion(*weights, prompt, s.tokens, 0.9f, ReductionOrder::kBatchInvariant);
    ASSERT_EQ(score.size(), s.tokens.size());
    int model_tokens = 0;
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      if (s.sources[t] != 0) continue;
      ++model_tokens;
      EXPECT_EQ(s.logprobs[t], score[t]) << "sample " << s.sample_index << " token " << t;
    }
    EXPECT_GT(model_tokens, 1);
  }
}

// A pool too small for a paused episode and a new request at once: the paused sample's blocks
// go first (no running sequence is preempted), and it computes them again when it goes on,
// with the same result.
TEST(EngineTurnsTest, APausedSamplesBlocksAreTakenFirstAndRecomputedTheSame) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 23);
  const std::vector<int32_t> prompt(30, 7), reply = {9, 9, 9};
  std::vector<TurnOutput> unpressed_turns;
  auto roomy = *Engine::Create(weights, 0, InvariantOptions());
  const RequestOutput unpressed = TwoTurns(*roomy, prompt, Episode(0.0f), reply, &unpressed_turns);

  auto engine = *Engine::Create(weights, 0, InvariantOptions(/*kv_blocks=*/12));
  const uint64_t id = *engine->AddRequest(prompt, Episode(0.0f));
  RunUntilIdle(*engine);
  ASSERT_EQ(engine->TakeTurns().size(), 1u);
  SamplingParams big;
  big.max_tokens = 10;
  ASSERT_TRUE(engine->AddRequest(std::vector<int32_t>(34, 3), big).ok());
  RunUntilIdle(*engine);  // (the episode's request stays unfinished: it is paused)
  ASSERT_EQ(engine->TakeFinished().size(), 1u);
  EXPECT_EQ(engine->Stats().paused_evictions, 1);
  EXPECT_EQ(engine->Stats().preemptions, 0);
  ASSERT_TRUE(engine->Continue(id, 0, reply, 5).ok());
  RunUntilIdle(*engine);
  const std::vector<TurnOutput> second = engine->TakeTurns();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].tokens, unpressed_turns[1].tokens);
  EXPECT_EQ(engine->Stats().turn_kept_tokens, 0) << "its blocks were taken: all computed again";
  ASSERT_TRUE(engine->FinishSample(id, 0).ok());
  EXPECT_EQ(engine->TakeFinished()[0].samples[0].logprobs, unpressed.samples[0].logprobs);
  EXPECT_EQ(engine->Stats().free_blocks, engine->Stats().total_blocks) << "nothing leaked";
}

// A turn reports its tokens' log-probs and versions (what the OpenAI endpoint returns), and
// the alternatives asked for; the next turn may sample with its own parameters.
TEST(EngineTurnsTest, TurnsReportLogprobsAndAlternativesAndTakeTheirOwnSampling) {
  const ModelConfig c = TinyEngineConfig();
  auto weights = TinyWeights(c, 25);
  auto engine = *Engine::Create(weights, 3, InvariantOptions());
  SamplingParams p = Episode(0.8f);
  p.top_logprobs = 4;
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const uint64_t id = *engine->AddRequest(prompt, p);
  RunUntilIdle(*engine);
  std::vector<TurnOutput> first = engine->TakeTurns();
  ASSERT_EQ(first.size(), 1u);
  const TurnOutput& t = first[0];
  ASSERT_EQ(t.logprobs.size(), t.tokens.size());
  ASSERT_EQ(t.versions, std::vector<int64_t>(t.tokens.size(), 3));
  ASSERT_EQ(t.alternatives.size(), t.tokens.size());
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    ASSERT_EQ(t.alternatives[i].size(), 4u);
    for (const auto& [alt, lp] : t.alternatives[i]) {
      if (alt == t.tokens[i]) {
        EXPECT_EQ(lp, t.logprobs[i]) << "token " << i;
      }
    }
  }
  // Greedy for the next turn: its log-probs are the untransformed softmax's, as a fresh greedy
  // request over the conversation gives; without alternatives.
  const std::vector<int32_t> reply = {20, 21};
  TurnSampling greedy;
  greedy.temperature = 0.0f;
  ASSERT_TRUE(engine->Continue(id, 0, reply, 4, greedy).ok());
  RunUntilIdle(*engine);
  std::vector<TurnOutput> second = engine->TakeTurns();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_TRUE(second[0].alternatives.empty());
  std::vector<int32_t> conversation = prompt;
  conversation.insert(conversation.end(), t.tokens.begin(), t.tokens.end());
  conversation.insert(conversation.end(), reply.begin(), reply.end());
  SamplingParams fresh = Episode(0.0f);
  fresh.multi_turn = false;
  fresh.max_tokens = 4;
  auto other = *Engine::Create(weights, 3, InvariantOptions());
  const std::vector<RequestOutput> ref = RunJobs(*other, {Job{conversation, fresh}});
  EXPECT_EQ(second[0].tokens, ref[0].samples[0].tokens);
  EXPECT_EQ(second[0].logprobs, ref[0].samples[0].logprobs);
  // A request of several samples shares its parameters: no turn of its own.
  SamplingParams pair = Episode(1.0f, 2);
  const uint64_t two = *engine->AddRequest(prompt, pair);
  RunUntilIdle(*engine);
  ASSERT_EQ(engine->TakeTurns().size(), 2u);
  using ::prl::testing::IsError;
  EXPECT_TRUE(IsError(engine->Continue(two, 0, reply, 4, greedy),
                      absl::StatusCode::kFailedPrecondition, {"needs a request of one sample"}));
  TurnSampling bad;
  bad.top_p = 0.0f;
  EXPECT_TRUE(IsError(engine->Continue(id, 0, reply, 4, bad), absl::StatusCode::kInvalidArgument,
                      {"top_p must be in (0, 1]"}));
}

TEST(EngineTurnsTest, TurnCallsOutOfPlaceAreErrorsNamingTheSample) {
  const ModelConfig c = TinyEngineConfig();
  auto engine = *Engine::Create(TinyWeights(c, 24), 0, InvariantOptions());
  SamplingParams p = Episode(1.0f, 2);
  p.max_tokens = 50;
  const uint64_t id = *engine->AddRequest({1, 2, 3}, p);
  ASSERT_TRUE(engine->Step().ok());  // prefill and the first token
  ASSERT_TRUE(engine->Step().ok());
  using ::prl::testing::IsError;
  EXPECT_TRUE(IsError(engine->Continue(id, 0, {5}, 4), absl::StatusCode::kFailedPrecondition,
                      {"sample 0: not paused between turns"}));
  // The caller saw a stop string: the turn ends now, with the tokens it has.
  absl::StatusOr<TurnOutput> ended = engine->EndTurn(id, 1);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->tokens.size(), 2u);
  EXPECT_EQ(ended->reason, FinishReason::kStop);
  EXPECT_TRUE(IsError(engine->EndTurn(id, 1).status(), absl::StatusCode::kFailedPrecondition,
                      {"no turn is running"}));
  EXPECT_TRUE(IsError(engine->Continue(id, 1, {5}, 1000), absl::StatusCode::kOutOfRange,
                      {"exceeds the 512 tokens a sequence may hold"}));
  EXPECT_TRUE(IsError(engine->Continue(id, 1, {64}, 4), absl::StatusCode::kInvalidArgument,
                      {"tokens[0] = 64 is not a token id"}));
  EXPECT_TRUE(IsError(engine->Continue(id, 2, {5}, 4), absl::StatusCode::kInvalidArgument,
                      {"sample 2 is not in [0, 2)"}));
  SamplingParams single;
  const uint64_t plain = *engine->AddRequest({1}, single);
  EXPECT_TRUE(IsError(engine->FinishSample(plain, 0), absl::StatusCode::kFailedPrecondition,
                      {"not multi-turn"}));
  EXPECT_TRUE(engine->Abort(id)) << "a paused sample is aborted like any other";
  EXPECT_TRUE(engine->Abort(plain));
  EXPECT_EQ(engine->Stats().free_blocks, engine->Stats().total_blocks);
}

}  // namespace
}  // namespace prl::testing
