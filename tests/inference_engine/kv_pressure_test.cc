// Agentic episodes under KV-cache pressure (inference_engine/scheduler.h): a pool of about 256
// tokens, prefix caching on, 32 groups of 4 samples whose episodes run 4 turns with replies of
// 20-34 tokens, all queued at once. Every request ends — a step that schedules nothing while
// requests are unfinished and no turn waits for its answer is a deadlock — and with Qwen3-MoE
// every sample keeps the routes of every token,
// also where a sample whose blocks were taken back resumes through blocks of the prefix cache
// that another sample computed (they are the learner's routes bit for bit).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "inference_engine/engine.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

constexpr int kGroups = 32, kSamples = 4, kTurns = 4;

struct PressureRun {
  std::vector<std::vector<int32_t>> prompts;  // by group
  std::vector<RequestOutput> outputs;         // by group
  EngineStats stats;
};

// Queues every group, then answers each turn a step after it ended: a reply of 20-34 tokens that
// depends on the group and the turn only (samples that sampled alike continue alike), until the
// 4th turn.
PressureRun RunEpisodes(const ParameterSet& weights, const EngineOptions& options,
                        float temperature) {
  auto engine =
      *Engine::Create(std::shared_ptr<const ParameterSet>(&weights, [](auto*) {}), 0, options);
  const int64_t vocab = weights.config.vocab_size;
  PressureRun run;
  std::map<uint64_t, int> group_of;
  std::mt19937_64 rng(11);
  for (int g = 0; g < kGroups; ++g) {
    std::vector<int32_t> prompt(8 + rng() % 9);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
    SamplingParams p;
    p.n = kSamples;
    p.temperature = temperature;
    p.max_tokens = 6;
    p.seed = 100 + g;
    p.multi_turn = true;
    absl::StatusOr<uint64_t> id = engine->AddRequest(prompt, p);
    EXPECT_TRUE(id.ok()) << id.status();
    group_of[*id] = g;
    run.prompts.push_back(std::move(prompt));
  }
  run.outputs.resize(kGroups);
  std::map<std::pair<uint64_t, int32_t>, int> turns;
  // Turns are answered one step after they ended (as an environment would, a little later): the
  // samples stay paused for a step, holding their blocks, while others run.
  std::vector<TurnOutput> answering;
  while (engine->HasUnfinishedRequests()) {
    const int64_t steps = engine->Stats().steps;
    EXPECT_TRUE(engine->Step().ok());
    std::vector<TurnOutput> ended = engine->TakeTurns();
    ended.swap(answering);
    if (engine->Stats().steps == steps && ended.empty() && answering.empty()) {
      const EngineStats s = engine->Stats();
      ADD_FAILURE() << "no progress with " << s.unfinished_requests
                    << " requests unfinished: " << s.num_waiting << " waiting, " << s.paused_samples
                    << " paused, " << s.free_blocks << " of " << s.total_blocks << " blocks free";
      break;
    }
    for (const TurnOutput& t : ended) {
      const int turn = ++turns[{t.request_id, t.sample_index}];
      if (turn >= kTurns) {
        EXPECT_TRUE(engine->FinishSample(t.request_id, t.sample_index).ok());
        continue;
      }
      std::mt19937_64 reply_rng(1000 * group_of.at(t.request_id) + turn);
      std::vector<int32_t> reply(20 + reply_rng() % 15);
      for (int32_t& r : reply) r = static_cast<int32_t>(reply_rng() % vocab);
      const absl::Status continued =
          engine->Continue(t.request_id, t.sample_index, reply, options.block_size);
      EXPECT_TRUE(continued.ok()) << continued;
    }
    for (RequestOutput& r : engine->TakeFinished()) {
      run.outputs[group_of.at(r.request_id)] = std::move(r);
    }
  }
  run.stats = engine->Stats();
  return run;
}

// `blocks` of 8 tokens of KV: a few sequences' worth (the longest is 148 tokens), far too little
// for 128.
EngineOptions PressureOptions(const ModelConfig& c, bool batch_invariant, int64_t blocks) {
  EngineOptions o;
  o.block_size = 8;
  o.kv_cache_bytes = blocks * KvCache::BytesPerBlock(c, 8);
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 64;
  o.enable_prefix_caching = true;
  o.batch_invariant = batch_invariant;
  return o;
}

// Greedy: the samples of a group share their blocks, so the pool holds many sequences at once
// and resumed samples wait with theirs (the deadlock: a sequence ahead of them that does not fit
// while nothing runs).
TEST(KvPressureTest, EveryEpisodeEndsUnderKvPressureWithPrefixCaching) {
  ModelConfig c = TinyEngineConfig();
  c.num_hidden_layers = 4;
  auto weights = TinyWeights(c, 41);
  const PressureRun run = RunEpisodes(*weights, PressureOptions(c, false, 20), 0.0f);
  EXPECT_GT(run.stats.paused_evictions + run.stats.preemptions, 0) << "no pressure";
  for (int g = 0; g < kGroups; ++g) {
    ASSERT_EQ(run.outputs[g].samples.size(), size_t{kSamples}) << "group " << g;
    for (const SampleOutput& s : run.outputs[g].samples) {
      EXPECT_NE(s.finish_reason, FinishReason::kAbort);
      EXPECT_GT(s.tokens.size(), 60u) << "four turns and three replies";
    }
  }
}

// Greedy samples of a group sample alike and get the same replies: one that resumes after its
// blocks were taken back finds its reply's blocks in the prefix cache, computed by a sibling.
TEST(KvPressureTest, MoeRoutesSurviveResumingThroughThePrefixCache) {
  const ModelConfig c = TinyMoeConfig();
  auto weights = TinyWeights(c, 42);
  // (Greedy samples share their blocks: a smaller pool to put them under pressure.)
  const PressureRun run = RunEpisodes(*weights, PressureOptions(c, true, 20), 0.0f);
  EXPECT_GT(run.stats.paused_evictions, 0) << "no paused sample lost its blocks";
  EXPECT_GT(run.stats.prefix_cache_hit_tokens, 0);
  for (int g = 0; g < kGroups; ++g) {
    ASSERT_EQ(run.outputs[g].samples.size(), size_t{kSamples}) << "group " << g;
    for (const SampleOutput& s : run.outputs[g].samples) {
      SCOPED_TRACE(::testing::Message() << "group " << g << " sample " << s.sample_index);
      ExpectRoutesAreTheLearners(*weights, run.prompts[g], s);
    }
  }
}

}  // namespace
}  // namespace prl::testing
