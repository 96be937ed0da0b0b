// A trajectory of 32k tokens through the engine: its prompt prefilled in chunks, every sampled
// token kept, in a KV pool that holds one such sequence but not two, so that one is preempted
// and recomputed; each sample is bit for bit what it is in a pool for both, and its behaviour
// log-probs are the learner's score of the whole 32k-token sequence (positions, RoPE and
// attention at the far end of the context included).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "inference_engine/engine.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

constexpr int64_t kLength = 32768;  // prompt + completion
constexpr int64_t kPrompt = 28672;  // 14 chunks of max_num_batched_tokens
constexpr int32_t kBlock = 16;

ModelConfig LongConfig() {
  ModelConfig c = TinyEngineConfig();
  c.num_hidden_layers = 1;
  c.max_position_embeddings = kLength;
  c.rope_theta = 1000000.0;
  return c;
}

EngineOptions LongOptions(const ModelConfig& c, int64_t sequences_in_pool) {
  EngineOptions o;
  o.block_size = kBlock;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 2048;
  o.batch_invariant = true;
  o.kv_cache_bytes =
      sequences_in_pool * (kLength / kBlock) * KvCache::BytesPerBlock(c, kBlock) * 3 / 2;
  return o;
}

Job LongJob(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Job j;
  j.prompt.resize(kPrompt);
  for (int32_t& t : j.prompt) t = static_cast<int32_t>(rng() % 64);
  j.params.n = 1;
  j.params.temperature = 1.0f;
  j.params.top_p = 1.0f;
  j.params.top_k = 0;
  j.params.seed = seed;
  j.params.max_tokens = static_cast<int32_t>(kLength - kPrompt);
  return j;
}

TEST(EngineLongSequenceTest, A32kTokenTrajectoryIsKeptWholeThroughChunkedPrefillAndPreemption) {
  const ModelConfig c = LongConfig();
  const std::shared_ptr<const ParameterSet> weights = TinyWeights(c, 3);
  const std::vector<Job> jobs = {LongJob(1), LongJob(2)};

  // One pool for 1.5 sequences: the two cannot both finish without one being preempted.
  auto shared = *Engine::Create(weights, 0, LongOptions(c, 1));
  EXPECT_EQ(shared->max_sequence_tokens(), kLength) << "one whole sequence fits";
  const std::vector<RequestOutput> together = RunJobs(*shared, jobs);
  EXPECT_GT(shared->Stats().preemptions, 0) << "the pool must force a preemption";

  // The same requests in a pool for both: no preemption.
  auto roomy = *Engine::Create(weights, 0, LongOptions(c, 2));
  const std::vector<RequestOutput> apart = RunJobs(*roomy, jobs);
  EXPECT_EQ(roomy->Stats().preemptions, 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    ASSERT_EQ(together[i].samples.size(), 1u);
    const SampleOutput& s = together[i].samples[0];
    ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), kLength - kPrompt) << "every token kept";
    ASSERT_EQ(s.logprobs.size(), s.tokens.size());
    EXPECT_EQ(s.tokens, apart[i].samples[0].tokens) << "preempted and recomputed, unchanged";
    EXPECT_EQ(s.logprobs, apart[i].samples[0].logprobs);
  }
  // The learner scores the whole 32k-token sequence as the engine sampled it.
  const SampleOutput& s = together[0].samples[0];
  const std::vector<float> score = ScoreCompletion(*weights, jobs[0].prompt, s.tokens, 1.0f,
                                                   kernels::ReductionOrder::kBatchInvariant);
  ASSERT_EQ(score.size(), s.logprobs.size());
  EXPECT_EQ(score, s.logprobs);
}

}  // namespace
}  // namespace prl::testing
