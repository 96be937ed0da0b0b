// The sampler: exact distributions (frequencies vs float64 probabilities), the behaviour
// log-prob of the transformed distribution, greedy, determinism in (seed, stream, index).
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/philox.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

using kernels::SamplingRow;

// Philox4x32-10 known-answer tests from the Random123 distribution (kat_vectors).
TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(Philox4x32({0, 0}, {0, 0, 0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0xa4093822, 0x299f31d0}, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Float64 probabilities of the transformed distribution (temperature, top-k, top-p).
std::vector<double> TransformedProbs(const std::vector<float>& logits, const SamplingRow& p) {
  const int64_t V = logits.size();
  std::vector<double> z(V);
  for (int64_t v = 0; v < V; ++v) z[v] = double{logits[v] * (1.0f / p.temperature)};
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, V) : V;
  const double m = z[order[0]];
  double topk_mass = 0.0;
  for (int64_t i = 0; i < k; ++i) topk_mass += std::exp(z[order[i]] - m);
  int64_t kept = 0;
  double mass = 0.0;
  while (kept < k) {
    mass += std::exp(z[order[kept]] - m);
    ++kept;
    if (mass >= p.top_p * topk_mass) break;
  }
  std::vector<double> probs(V, 0.0);
  for (int64_t i = 0; i < kept; ++i) probs[order[i]] = std::exp(z[order[i]] - m) / mass;
  return probs;
}

struct Draws {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Draws Sample(std::vector<float> logits, const SamplingRow& base, int64_t n) {
  const int64_t V = logits.size();
  std::vector<float> all(n * V);
  std::vector<SamplingRow> rows(n, base);
  for (int64_t i = 0; i < n; ++i) {
    std::copy(logits.begin(), logits.end(), all.begin() + i * V);
    rows[i].index = i;
  }
  Draws d{std::vector<int32_t>(n), std::vector<float>(n)};
  kernels::SampleTokens(View(d.tokens, {n}), View(d.logprobs, {n}), View(all, {n, V}), rows);
  return d;
}

class SamplerDistributionTest : public ::testing::TestWithParam<SamplingRow> {};

// Frequencies over 40k draws match the float64 probabilities (4.5 sigma bands), nothing
// outside the kept set is drawn, and each draw's log-prob is that of the kept distribution.
TEST_P(SamplerDistributionTest, FrequenciesAndLogprobsMatchTheTransformedDistribution) {
  const SamplingRow p = GetParam();
  std::vector<float> logits = {2.0f, 1.5f, 1.5f, 0.3f, -1.0f, 0.0f, 3.1f, -2.5f, 1.0f, 0.7f};
  const std::vector<double> probs = TransformedProbs(logits, p);
  constexpr int64_t kDraws = 40000;
  const Draws d = Sample(logits, p, kDraws);
  std::map<int32_t, int64_t> counts;
  for (int64_t i = 0; i < kDraws; ++i) {
    ++counts[d.tokens[i]];
    ASSERT_GT(probs[d.tokens[i]], 0.0) << "token outside the kept set";
    ASSERT_NEAR(d.logprobs[i], std::log(probs[d.tokens[i]]), 2e-6);
  }
  for (size_t v = 0; v < probs.size(); ++v) {
    const double expected = probs[v] * kDraws;
    const double sigma = std::sqrt(kDraws * probs[v] * (1 - probs[v])) + 1e-9;
    EXPECT_NEAR(counts[v], expected, 4.5 * sigma + 1) << "token " << v;
  }
}

SamplingRow Row(float temperature, float top_p, int32_t top_k) {
  SamplingRow r;
  r.temperature = temperature;
  r.top_p = top_p;
  r.top_k = top_k;
  r.seed = 1234;
  return r;
}

INSTANTIATE_TEST_SUITE_P(Transforms, SamplerDistributionTest,
                         ::testing::Values(Row(1.0f, 1.0f, 0), Row(0.6f, 1.0f, 0),
                                           Row(1.3f, 1.0f, 3), Row(1.0f, 0.8f, 0),
                                           Row(0.9f, 0.5f, 4), Row(1.0f, 1.0f, 1)));

// TopLogprobs lists the most likely tokens of the distribution the sampler draws from, with the
// float64 reference's log-probs, most likely first; a drawn token's log-prob is its entry.
TEST_P(SamplerDistributionTest, TopLogprobsAreTheTransformedDistributionsMostLikely) {
  const SamplingRow p = GetParam();
  const std::vector<float> logits = {2.0f, 1.5f, 1.5f, 0.3f, -1.0f, 0.0f, 3.1f, -2.5f, 1.0f, 0.7f};
  const std::vector<double> probs = TransformedProbs(logits, p);
  const auto top = kernels::TopLogprobs(logits, p, 5);
  int64_t kept = 0;
  for (double q : probs) kept += q > 0 ? 1 : 0;
  ASSERT_EQ(static_cast<int64_t>(top.size()), std::min<int64_t>(5, kept));
  for (size_t i = 0; i < top.size(); ++i) {
    EXPECT_NEAR(top[i].second, std::log(probs[top[i].first]), 2e-6) << "entry " << i;
    if (i > 0) {
      EXPECT_TRUE(top[i - 1].second > top[i].second ||
                  (top[i - 1].second == top[i].second && top[i - 1].first < top[i].first));
    }
  }
  // Nothing left out is likelier than the last one listed.
  for (size_t v = 0; v < probs.size(); ++v) {
    const bool listed = std::any_of(top.begin(), top.end(), [&](const auto& e) {
      return e.first == static_cast<int32_t>(v);
    });
    if (!listed) {
      EXPECT_LE(probs[v], std::exp(double{top.back().second}) + 1e-9) << v;
    }
  }
  const Draws d = Sample(logits, p, 200);
  for (int64_t i = 0; i < 200; ++i) {
    for (const auto& [id, lp] : top) {
      if (id == d.tokens[i]) {
        EXPECT_EQ(lp, d.logprobs[i]) << "draw " << i;
      }
    }
  }
}

TEST(SamplerTest, GreedyTopLogprobsAreTheUntransformedSoftmax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  const auto top = kernels::TopLogprobs(logits, Row(0.0f, 1.0f, 0), 3);
  double lse = 0;
  for (float l : logits) lse += std::exp(double{l});
  lse = std::log(lse);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);  // ties by the lower id, as the argmax
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 0);
  EXPECT_NEAR(top[2].second, 0.5 - lse, 1e-6);
}

TEST(SamplerTest, GreedyTakesTheFirstArgmaxWithItsUntransformedLogprob) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  const Draws d = Sample(logits, Row(0.0f, 0.3f, 2), 3);
  double z = 0.0;
  for (float l : logits) z += std::exp(double{l});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(d.tokens[i], 1);
    EXPECT_NEAR(d.logprobs[i], 2.0 - std::log(z), 1e-6);
  }
}

TEST(SamplerTest, DrawsDependOnlyOnSeedStreamAndIndex) {
  std::vector<float> logits(50);
  for (int v = 0; v < 50; ++v) logits[v] = std::sin(v * 1.7f);
  SamplingRow p = Row(1.0f, 1.0f, 0);
  const Draws a = Sample(logits, p, 200);
  const Draws b = Sample(logits, p, 200);
  EXPECT_EQ(a.tokens, b.tokens);
  // A row drawn alone equals the same row drawn inside a batch.
  SamplingRow single = p;
  single.index = 137;
  std::vector<int32_t> token(1);
  std::vector<float> logprob(1);
  kernels::SampleTokens(View(token, {1}), View(logprob, {1}), View(logits, {1, 50}), {&single, 1});
  EXPECT_EQ(token[0], a.tokens[137]);
  EXPECT_EQ(logprob[0], a.logprobs[137]);
  p.seed = 4321;
  EXPECT_NE(Sample(logits, p, 200).tokens, a.tokens);
  p.seed = 1234;
  p.stream = 1;
  EXPECT_NE(Sample(logits, p, 200).tokens, a.tokens);
}

TEST(SamplerTest, TopPOverALargeVocabularyKeepsTheNucleus) {
  // 152k-token vocabulary whose nucleus is wider than the first sorted prefix (256).
  constexpr int64_t V = 151936;
  std::vector<float> logits(V, -30.0f);
  for (int v = 0; v < 1000; ++v) logits[v * 97] = 5.0f - v * 0.001f;
  const SamplingRow p = Row(1.0f, 0.9f, 0);
  const Draws d = Sample(logits, p, 64);
  for (int32_t t : d.tokens) {
    EXPECT_EQ(t % 97, 0);
    EXPECT_LT(t / 97, 1000);
  }
}

}  // namespace
}  // namespace prl::testing
