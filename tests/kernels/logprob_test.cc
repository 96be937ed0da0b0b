#include "kernels/logprob.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

constexpr int64_t R = 9, V = 37, C = 6;

struct HeadCase {
  Vec h, W;
  std::vector<int32_t> targets;
  explicit HeadCase(std::mt19937_64& rng) : h(RandomVec(R * C, rng)), W(RandomVec(V * C, rng)) {
    std::uniform_int_distribution<int32_t> tok(0, V - 1);
    for (int64_t r = 0; r < R; ++r) targets.push_back(tok(rng));
  }
};

struct HeadOutput {
  std::vector<float> logprob, lse;
};

HeadOutput RunForward(const HeadCase& hc, float temperature, int64_t chunk_rows) {
  std::vector<float> h = ToF32(hc.h), W = ToF32(hc.W), scratch(chunk_rows * V);
  std::vector<int32_t> targets = hc.targets;
  HeadOutput o{std::vector<float>(R), std::vector<float>(R)};
  kernels::LogprobForward(View(o.logprob, {R}), View(o.lse, {R}), View(h, {R, C}), View(W, {V, C}),
                          View(targets, {R}), temperature, View(scratch, {chunk_rows, V}));
  return o;
}

TEST(LogprobTest, ForwardMatchesFloat64ReferenceAtSeveralTemperatures) {
  std::mt19937_64 rng(17);
  const HeadCase hc(rng);
  for (float temperature : {1.0f, 0.7f, 1.6f}) {
    const HeadOutput o = RunForward(hc, temperature, 4);
    EXPECT_LT(
        RelativeError(ToF64(o.logprob), LogprobRef(hc.h, hc.W, hc.targets, R, V, C, temperature)),
        1e-6)
        << "temperature " << temperature;
  }
}

// The rows' softmax entropies against a float64 reference written from the definition,
// -sum_v p_v log p_v with p = softmax(h W^T / T), at several temperatures and chunk sizes;
// a uniform row (W = 0) has entropy log V.
TEST(LogprobTest, EntropyMatchesTheFloat64DefinitionAndIsLogVForAUniformRow) {
  std::mt19937_64 rng(23);
  const HeadCase hc(rng);
  for (float temperature : {1.0f, 0.6f, 1.7f}) {
    for (int64_t chunk : {int64_t{1}, int64_t{4}, R}) {
      std::vector<float> h = ToF32(hc.h), W = ToF32(hc.W), scratch(chunk * V);
      std::vector<int32_t> targets = hc.targets;
      std::vector<float> logprob(R), lse(R), entropy(R, -1.0f);
      const Tensor entropy_view = View(entropy, {R});
      kernels::LogprobForward(View(logprob, {R}), View(lse, {R}), View(h, {R, C}),
                              View(W, {V, C}), View(targets, {R}), temperature,
                              View(scratch, {chunk, V}), kernels::ReductionOrder::kFast,
                              &entropy_view);
      for (int64_t r = 0; r < R; ++r) {
        std::vector<double> z(V);
        double max_z = -1e300;
        for (int64_t v = 0; v < V; ++v) {
          double dot = 0;
          for (int64_t c = 0; c < C; ++c) dot += hc.h[r * C + c] * hc.W[v * C + c];
          z[v] = dot / temperature;
          max_z = std::max(max_z, z[v]);
        }
        double total = 0;
        for (double x : z) total += std::exp(x - max_z);
        double want = 0;
        for (double x : z) {
          const double p = std::exp(x - max_z) / total;
          want -= p * std::log(p);
        }
        EXPECT_NEAR(entropy[r], want, 1e-5 * std::max(1.0, want))
            << "row " << r << ", temperature " << temperature << ", chunk " << chunk;
      }
    }
  }
  std::vector<float> h = ToF32(hc.h), W(V * C, 0.0f), scratch(R * V), logprob(R), lse(R),
                     entropy(R);
  std::vector<int32_t> targets = hc.targets;
  const Tensor entropy_view = View(entropy, {R});
  kernels::LogprobForward(View(logprob, {R}), View(lse, {R}), View(h, {R, C}), View(W, {V, C}),
                          View(targets, {R}), 1.0f, View(scratch, {R, V}),
                          kernels::ReductionOrder::kFast, &entropy_view);
  for (int64_t r = 0; r < R; ++r) EXPECT_NEAR(entropy[r], std::log(static_cast<double>(V)), 1e-5);
}

TEST(LogprobTest, ResultsDoNotDependOnTheChunkSize) {
  std::mt19937_64 rng(18);
  const HeadCase hc(rng);
  const HeadOutput whole = RunForward(hc, 1.0f, R);
  for (int64_t chunk : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
    const HeadOutput o = RunForward(hc, 1.0f, chunk);
    for (int64_t r = 0; r < R; ++r) EXPECT_NEAR(o.logprob[r], whole.logprob[r], 1e-6);
  }
}

TEST(LogprobTest, BackwardMatchesFiniteDifferencesForEveryChunkSize) {
  std::mt19937_64 rng(19);
  const HeadCase hc(rng);
  const Vec dlogprob = RandomVec(R, rng), prior_dW = RandomVec(V * C, rng);
  constexpr float kTemperature = 0.8f;
  const Vec fd_h = FiniteDifferenceGradient(
      [&](const Vec& v) {
        return Dot(dlogprob, LogprobRef(v, hc.W, hc.targets, R, V, C, kTemperature));
      },
      hc.h);
  Vec fd_W = FiniteDifferenceGradient(
      [&](const Vec& v) {
        return Dot(dlogprob, LogprobRef(hc.h, v, hc.targets, R, V, C, kTemperature));
      },
      hc.W);
  for (size_t i = 0; i < fd_W.size(); ++i) fd_W[i] += prior_dW[i];
  for (int64_t chunk : {int64_t{1}, int64_t{4}, R}) {
    HeadOutput o = RunForward(hc, kTemperature, chunk);
    std::vector<float> h = ToF32(hc.h), W = ToF32(hc.W), dl = ToF32(dlogprob);
    std::vector<float> scratch(chunk * V), dh(R * C, 8.0f), dW = ToF32(prior_dW);
    std::vector<int32_t> targets = hc.targets;
    kernels::LogprobBackward(View(dh, {R, C}), View(dW, {V, C}), View(dl, {R}), View(h, {R, C}),
                             View(W, {V, C}), View(targets, {R}), View(o.lse, {R}), kTemperature,
                             View(scratch, {chunk, V}));
    EXPECT_LT(RelativeError(ToF64(dh), fd_h), 1e-5) << "chunk " << chunk;
    EXPECT_LT(RelativeError(ToF64(dW), fd_W), 1e-5) << "chunk " << chunk;
  }
}

// The backward reading the logits the forward left in its one chunk (logits_kept) gives the
// recomputing backward's gradients bit for bit, in both reduction orders and at temperatures
// other than 1 (the CPU forward keeps the scaled logits the backward would compute).
TEST(LogprobTest, TheBackwardFromTheForwardsKeptLogitsIsTheRecomputingBackwardBitForBit) {
  std::mt19937_64 rng(23);
  const HeadCase hc(rng);
  const Vec dlogprob = RandomVec(R, rng), prior_dW = RandomVec(V * C, rng);
  for (const auto order :
       {kernels::ReductionOrder::kFast, kernels::ReductionOrder::kBatchInvariant}) {
    for (const float temperature : {1.0f, 0.7f}) {
      std::vector<float> dh[2], dW[2];
      for (const bool kept : {false, true}) {
        std::vector<float> h = ToF32(hc.h), W = ToF32(hc.W), dl = ToF32(dlogprob);
        std::vector<float> scratch(R * V), logprob(R), lse(R);
        std::vector<int32_t> targets = hc.targets;
        kernels::LogprobForward(View(logprob, {R}), View(lse, {R}), View(h, {R, C}),
                                View(W, {V, C}), View(targets, {R}), temperature,
                                View(scratch, {R, V}), order);
        if (!kept) std::fill(scratch.begin(), scratch.end(), 1e30f);  // nothing to read
        dh[kept].assign(R * C, 8.0f);
        dW[kept] = ToF32(prior_dW);
        kernels::LogprobBackward(View(dh[kept], {R, C}), View(dW[kept], {V, C}), View(dl, {R}),
                                 View(h, {R, C}), View(W, {V, C}), View(targets, {R}),
                                 View(lse, {R}), temperature, View(scratch, {R, V}), order, kept);
      }
      EXPECT_EQ(dh[0], dh[1]) << "temperature " << temperature;
      EXPECT_EQ(dW[0], dW[1]) << "temperature " << temperature;
    }
  }
}

TEST(LogprobTest, ChunkRowsFollowTheMemoryBudget) {
  EXPECT_EQ(kernels::LogprobChunkRows(1000, 4000 * 10), 10);
  EXPECT_EQ(kernels::LogprobChunkRows(151936, 1), 1);  // never zero rows
}

}  // namespace
}  // namespace prl::testing
