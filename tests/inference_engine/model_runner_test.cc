// Paged incremental decoding equals the learner's full-sequence forward: every logit row
// (as log-softmax, which fixes logits up to their irrelevant per-row constant) within 1e-5,
// for block sizes 1, 16 and 64, one-shot and chunked prefills, token-by-token decoding; for
// Qwen2 and for Qwen3, whose keys must be cached after their per-head norm and RoPE.
#include "inference_engine/model_runner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

// (T, V) log-softmax of every position of `tokens` from the learner path: V copies of the
// sequence, copy v scoring token v at every position.
std::vector<double> LearnerLogSoftmax(const ParameterSet& w, const std::vector<int32_t>& tokens) {
  const int64_t V = w.config.vocab_size, T = static_cast<int64_t>(tokens.size());
  PackedBatch batch;
  for (int64_t v = 0; v < V; ++v)
    batch.Add(tokens, std::vector<int32_t>(T, static_cast<int32_t>(v)));
  Transformer model(w.config, Device::Cpu());
  std::vector<float> lp(batch.num_tokens());
  EXPECT_TRUE(model.Forward(w.params, batch, 1.0f, absl::MakeSpan(lp), false).ok());
  std::vector<double> out(T * V);
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t t = 0; t < T; ++t) out[t * V + v] = lp[v * T + t];
  }
  return out;
}

void ExpectPagedMatchesLearner(const ModelConfig& c, int32_t block_size,
                               const std::vector<int64_t>& chunks) {
  // The two paths differ only in fp32 summation order, so their difference scales with the
  // values: weights of std 0.25 give log-probs in about [-9, -1] and differences of a few 1e-6
  // (up to 1.2e-5 in the -O1 build of scripts/sanitize.sh asan: other vectorisation, other
  // orders): the bound is 1e-5 plus 4e-6 of the log-prob's magnitude (3e-5 at -5).
  auto weights = TinyWeights(c, 21, 0.25f, /*spread_norms_and_biases=*/c.qk_norm);
  std::vector<int32_t> tokens;
  for (int64_t n : chunks) {
    for (int64_t i = 0; i < n; ++i)
      tokens.push_back(static_cast<int32_t>((tokens.size() * 11 + 5) % 48));
  }
  const std::vector<double> reference = LearnerLogSoftmax(*weights, tokens);

  KvCache cache =
      *KvCache::Allocate(c, 128 * KvCache::BytesPerBlock(c, block_size), block_size, Device::Cpu());
  BlockManager blocks(static_cast<int32_t>(cache.num_blocks), block_size, false);
  ModelRunner runner(c, &cache, ModelRunnerOptions{});
  Request request;
  Sequence seq;
  seq.request = &request;
  seq.tokens = tokens;
  for (int64_t n : chunks) {
    while (static_cast<int64_t>(seq.block_table.size()) * block_size <
           seq.num_computed_tokens + n) {
      const int32_t block = blocks.Allocate();
      ASSERT_GE(block, 0) << "test pool too small";
      seq.block_table.push_back(block);
    }
    SchedulerOutput step;
    step.chunks.push_back({&seq, n, true});
    step.num_tokens = n;
    Tensor logits;
    ASSERT_TRUE(runner.Execute(weights->params, step, &logits).ok());
    const int64_t pos = seq.num_computed_tokens + n - 1, V = c.vocab_size;
    double m = -1e30, z = 0.0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double{logits.f32()[v]});
    for (int64_t v = 0; v < V; ++v) z += std::exp(logits.f32()[v] - m);
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_NEAR(logits.f32()[v] - m - std::log(z), reference[pos * V + v],
                  1e-5 + 4e-6 * std::abs(reference[pos * V + v]))
          << "block size " << block_size << " position " << pos << " token " << v;
    }
    seq.num_computed_tokens += n;
  }
}

// (block size, Qwen3 rather than Qwen2)
class PagedDecodingTest : public ::testing::TestWithParam<std::tuple<int32_t, bool>> {
 protected:
  ModelConfig config() const {
    return std::get<1>(GetParam()) ? TinyQwen3EngineConfig(48) : TinyEngineConfig(48);
  }
};

TEST_P(PagedDecodingTest, OneShotPrefillThenDecodeMatchesTheFullForward) {
  std::vector<int64_t> chunks = {45};
  chunks.insert(chunks.end(), 30, 1);
  ExpectPagedMatchesLearner(config(), std::get<0>(GetParam()), chunks);
}

TEST_P(PagedDecodingTest, ChunkedPrefillThenDecodeMatchesTheFullForward) {
  std::vector<int64_t> chunks = {7, 16, 1, 33, 2};
  chunks.insert(chunks.end(), 20, 1);
  ExpectPagedMatchesLearner(config(), std::get<0>(GetParam()), chunks);
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, PagedDecodingTest,
                         ::testing::Combine(::testing::Values(1, 16, 64), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat("Block", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "Qwen3" : "Qwen2");
                         });

}  // namespace
}  // namespace prl::testing
