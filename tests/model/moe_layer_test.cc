#include "model/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace prl {
namespace {

// One MoE layer (layer 0 of a 1-layer Qwen3-MoE): 6 experts, top 3, width 5, hidden 8.
ModelConfig MoeConfig(bool norm_topk_prob) {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen3Moe, false, &c);
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 10;
  c.max_position_embeddings = 64;
  c.num_experts = 6;
  c.num_experts_per_tok = 3;
  c.moe_intermediate_size = 5;
  c.norm_topk_prob = norm_topk_prob;
  return c;
}

struct Block {
  ModelConfig config;
  ParameterSet params, grads;
  Arena arena{Device::Cpu()};
  MoeActivations a;
  MoeScratch s;
  Tensor x, residual, out, dout, dx;  // (T, C)
  int64_t T;

  Block(const ModelConfig& c, int64_t tokens, uint64_t seed)
      : config(c),
        params(*ParameterSet::Allocate(c, Device::Cpu(), false)),
        grads(*ParameterSet::Allocate(c, Device::Cpu(), true)),
        T(tokens) {
    InitializeParameters(params, seed, 0.5f);
    const int64_t C = c.hidden_size;
    EXPECT_TRUE(arena
                    .Build([&](Arena& ar) {
                      a = TakeMoeActivations(ar, c, T, DType::kF32);
                      s = TakeMoeScratch(ar, c, T, DType::kF32);
                      x = ar.Take(DType::kF32, {T, C});
                      residual = ar.Take(DType::kF32, {T, C});
                      out = ar.Take(DType::kF32, {T, C});
                      dout = ar.Take(DType::kF32, {T, C});
                      dx = ar.Take(DType::kF32, {T, C});
                    })
                    .ok());
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (const Tensor* t : {&x, &residual, &dout}) {
      for (int64_t i = 0; i < t->numel(); ++i) t->f32()[i] = n(rng);
    }
  }
  const LayerParams& p() const { return params.params.layers[0]; }
  const LayerParams& g() const { return grads.params.layers[0]; }
  void Forward(const int32_t* forced = nullptr,
               kernels::ReductionOrder order = kernels::ReductionOrder::kFast) {
    MoeForward(config, order, p(), a, x, residual, out, forced);
  }
  // The loss whose gradient Backward computes: sum(out . dout).
  double Loss() const {
    double sum = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) sum += double{out.f32()[i]} * dout.f32()[i];
    return sum;
  }
  std::vector<int32_t> Routes() const {
    return std::vector<int32_t>(a.routes.i32(), a.routes.i32() + a.routes.numel());
  }
};

// transformers' Qwen3MoeSparseMoeBlock in float64, one token at a time (forced: replayed
// experts per token, or null).
std::vector<double> NaiveMoe(const Block& b, const int32_t* forced, std::vector<int32_t>* routes) {
  const ModelConfig& c = b.config;
  const int64_t C = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t Im = c.moe_intermediate_size;
  const float* wr = b.p().router_weight.f32();
  std::vector<double> out(b.T * C);
  routes->clear();
  for (int64_t t = 0; t < b.T; ++t) {
    const float* x = b.x.f32() + t * C;
    std::vector<double> p(E);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < C; ++i) p[e] += double{x[i]} * wr[e * C + i];
    }
    const double max = *std::max_element(p.begin(), p.end());
    double sum = 0.0;
    for (double& v : p) sum += (v = std::exp(v - max));
    for (double& v : p) v /= sum;
    std::vector<int32_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t i, int32_t j) { return p[i] > p[j]; });
    ids.resize(K);
    if (forced != nullptr) ids.assign(forced + t * K, forced + (t + 1) * K);
    routes->insert(routes->end(), ids.begin(), ids.end());
    double kept = 0.0;
    for (int32_t e : ids) kept += p[e];
    for (int32_t e : ids) {
      const double w = c.norm_topk_prob ? p[e] / kept : p[e];
      const float* gu = b.p().experts_gate_up.f32() + e * 2 * Im * C;
      const float* dn = b.p().experts_down.f32() + e * C * Im;
      std::vector<double> act(Im);
      for (int64_t j = 0; j < Im; ++j) {
        double g = 0.0, u = 0.0;
        for (int64_t i = 0; i < C; ++i) {
          g += double{gu[j * C + i]} * x[i];
          u += double{gu[(Im + j) * C + i]} * x[i];
        }
        act[j] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t i = 0; i < C; ++i) {
        double y = 0.0;
        for (int64_t j = 0; j < Im; ++j) y += double{dn[i * Im + j]} * act[j];
        out[t * C + i] += w * y;
      }
    }
    for (int64_t i = 0; i < C; ++i) out[t * C + i] += b.residual.f32()[t * C + i];
  }
  return out;
}

void ExpectCloseToNaive(const Block& b, const int32_t* forced) {
  std::vector<int32_t> routes;
  const std::vector<double> ref = NaiveMoe(b, forced, &routes);
  EXPECT_EQ(b.Routes(), routes);
  for (int64_t i = 0; i < b.out.numel(); ++i) {
    ASSERT_NEAR(b.out.f32()[i], ref[i], 1e-5 * (1.0 + std::abs(ref[i]))) << "element " << i;
  }
}

class MoeLayerTest : public ::testing::TestWithParam<bool> {};  // norm_topk_prob

TEST_P(MoeLayerTest, ForwardMatchesAFloat64PerTokenReferenceOfTransformersBlock) {
  Block b(MoeConfig(GetParam()), 37, 1);
  b.Forward();
  ExpectCloseToNaive(b, nullptr);
  // Grouping: every expert's rows are contiguous and every (token, k) pair has one row.
  const int32_t* begin = b.a.expert_begin.i32();
  EXPECT_EQ(begin[0], 0);
  EXPECT_EQ(begin[b.config.num_experts], b.T * b.config.num_experts_per_tok);
}

// The gradients of sum(out . dout) with respect to the router, the experts and x against
// central differences. The routes are held fixed (replayed as the router chose them), which is
// the same function near the point and keeps the differences off top-K's jumps.
TEST_P(MoeLayerTest, BackwardMatchesFiniteDifferencesOfRouterExpertsAndInput) {
  Block b(MoeConfig(GetParam()), 9, 2);
  b.Forward();
  const std::vector<int32_t> routes = b.Routes();
  MoeBackward(b.config, b.p(), b.g(), b.a, b.x, b.dout, b.dx, b.s);
  auto check = [&](const char* what, float* values, const float* analytic, int64_t n) {
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float saved = values[i], h = 1e-2f;
      values[i] = saved + h;
      b.Forward(routes.data());
      const double up = b.Loss();
      values[i] = saved - h;
      b.Forward(routes.data());
      const double down = b.Loss();
      values[i] = saved;
      const double fd = (up - down) / (2.0 * h);
      diff += (fd - analytic[i]) * (fd - analytic[i]);
      norm += double{analytic[i]} * analytic[i];
    }
    EXPECT_GT(norm, 1e-4) << what << ": a gradient this small checks nothing";
    EXPECT_LT(std::sqrt(diff / norm), 3e-3) << what;
  };
  check("router", b.p().router_weight.f32(), b.g().router_weight.f32(),
        b.p().router_weight.numel());
  check("experts gate|up", b.p().experts_gate_up.f32(), b.g().experts_gate_up.f32(),
        b.p().experts_gate_up.numel());
  check("experts down", b.p().experts_down.f32(), b.g().experts_down.f32(),
        b.p().experts_down.numel());
  check("input", b.x.f32(), b.dx.f32(), b.x.numel());
}

TEST_P(MoeLayerTest, ReplayedRoutesAreUsedWhileRecomputedOnesAreReported) {
  Block b(MoeConfig(GetParam()), 12, 3);
  b.Forward();
  const std::vector<int32_t> own = b.Routes();
  // Replay the router's lowest-probability experts for odd tokens; even tokens stay routed.
  const int64_t E = b.config.num_experts, K = b.config.num_experts_per_tok;
  std::vector<int32_t> forced(b.T * K, -1);
  for (int64_t t = 1; t < b.T; t += 2) {
    std::vector<int32_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    const float* p = b.a.probs.f32() + t * E;
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t i, int32_t j) { return p[i] < p[j]; });
    std::copy_n(ids.begin(), K, forced.begin() + t * K);
  }
  b.Forward(forced.data());
  std::vector<int32_t> expected = own;
  for (int64_t t = 1; t < b.T; t += 2) {
    std::copy_n(forced.begin() + t * K, K, expected.begin() + t * K);
  }
  EXPECT_EQ(b.Routes(), expected);
  EXPECT_EQ(std::vector<int32_t>(b.a.recomputed.i32(), b.a.recomputed.i32() + b.T * K), own);
  ExpectCloseToNaive(b, expected.data());
  // The router still gets a gradient through the replayed experts' probabilities.
  MoeBackward(b.config, b.p(), b.g(), b.a, b.x, b.dout, b.dx, b.s);
  double norm = 0.0;
  for (int64_t i = 0; i < b.g().router_weight.numel(); ++i) {
    norm += std::abs(b.g().router_weight.f32()[i]);
  }
  EXPECT_GT(norm, 0.0);
}

INSTANTIATE_TEST_SUITE_P(NormTopK, MoeLayerTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Renormalised" : "Raw"; });

TEST(MoeRoutingTest, EqualProbabilitiesGoToTheLowerExpertIds) {
  Block b(MoeConfig(true), 4, 4);
  std::fill_n(b.p().router_weight.f32(), b.p().router_weight.numel(), 0.0f);
  b.Forward();
  for (int64_t t = 0; t < b.T; ++t) {
    EXPECT_EQ(std::vector<int32_t>(b.a.routes.i32() + t * 3, b.a.routes.i32() + t * 3 + 3),
              (std::vector<int32_t>{0, 1, 2}));
  }
}

// In the batch-invariant order a token's routes and output do not depend on the batch: the
// engine (one token per decode step) and the learner (whole sequences) agree bit for bit.
TEST(MoeRoutingTest, BatchInvariantOrderGivesEveryTokenTheSameRoutesAndBitsAlone) {
  const ModelConfig c = MoeConfig(true);
  Block all(c, 40, 5);
  all.Forward(nullptr, kernels::ReductionOrder::kBatchInvariant);
  Block one(c, 1, 5);  // same seed: same parameters
  for (int64_t t = 0; t < all.T; t += 7) {
    std::memcpy(one.x.f32(), all.x.f32() + t * c.hidden_size, c.hidden_size * sizeof(float));
    std::memcpy(one.residual.f32(), all.residual.f32() + t * c.hidden_size,
                c.hidden_size * sizeof(float));
    one.Forward(nullptr, kernels::ReductionOrder::kBatchInvariant);
    EXPECT_EQ(std::memcmp(one.out.f32(), all.out.f32() + t * c.hidden_size,
                          c.hidden_size * sizeof(float)),
              0)
        << "token " << t;
    EXPECT_EQ(one.Routes(),
              std::vector<int32_t>(all.a.routes.i32() + t * 3, all.a.routes.i32() + t * 3 + 3));
  }
}

}  // namespace
}  // namespace prl
