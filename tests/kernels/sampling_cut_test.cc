// The GPU sampler's host-compilable pieces, run on the CPU: its Philox equals core/philox.h
// (the CPU sampler's), its order key sorts floats as the CPU compares them, and its kept-set
// search (FindCut, kernels/cuda/sampling_cut.cuh) keeps exactly the tokens the CPU keeps for
// top-k and top-p — ties by lower id, -inf logits, signed zeros, and both filters together.
// The device code calls these very functions with block-wide sums in place of the serial ones.
#include "kernels/cuda/sampling_cut.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/philox.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/philox.cuh"

namespace prl::kernels::cuda {
namespace {

TEST(GpuSamplerOnTheHostTest, PhiloxEqualsTheCpuSamplersPhilox) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t seed = rng(), stream = i % 7 == 0 ? i : rng(), index = i % 3 == 0 ? i : rng();
    ASSERT_EQ(PhiloxUniform(seed, stream, index), prl::PhiloxUniform(seed, stream, index))
        << seed << " " << stream << " " << index;
  }
}

TEST(GpuSamplerOnTheHostTest, OrderKeySortsFloatsAsTheCpuComparesThem) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {-inf,   -3e38f, -1.0f, -1e-38f, -1e-45f, -0.0f, 0.0f,
                               1e-45f, 1e-38f, 1.0f,  2.5f,    3e38f,   inf};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (int i = 0; i < 2000; ++i) values.push_back(normal(rng));
  for (float a : values) {
    for (float b : values) {
      ASSERT_EQ(a < b, OrderKey(a) < OrderKey(b)) << a << " " << b;
      ASSERT_EQ(a == b, OrderKey(a) == OrderKey(b)) << a << " " << b;
    }
  }
}

// The CPU sampler's kept set (kernels/cpu/sampling.cc), as membership.
std::vector<bool> CpuKeptSet(const std::vector<float>& z, const std::vector<float>& e, int top_k,
                             float top_p) {
  const int64_t V = static_cast<int64_t>(z.size());
  const double total = std::accumulate(e.begin(), e.end(), 0.0);
  std::vector<int32_t> ids;
  prl::kernels::cpu::KeepTopKTopP(ids, z.data(), e.data(), V, total, top_k, top_p);
  std::vector<bool> in(V, false);
  for (int32_t id : ids) in[id] = true;
  return in;
}

// The GPU's kept set: the sampler's two FindCut calls with a serial measure.
std::vector<bool> GpuKeptSet(const std::vector<float>& z, const std::vector<float>& e, int top_k,
                             float top_p) {
  const int64_t V = static_cast<int64_t>(z.size());
  auto measure_in = [&](const Cut& inner, bool mass) {
    return [&, inner, mass](auto pred) {
      double s = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        const uint32_t k = OrderKey(z[v]);
        if (inner.In(k, v) && pred(k, v)) s += mass ? static_cast<double>(e[v]) : 1.0;
      }
      return s;
    };
  };
  const Cut all{0, V};
  Cut keep_k = all, keep_p = all;
  if (top_k > 0 && top_k < V) keep_k = FindCut(measure_in(all, false), V, top_k);
  if (top_p < 1.0f) {
    const double kept = measure_in(keep_k, true)([](uint32_t, int64_t) { return true; });
    keep_p = FindCut(measure_in(keep_k, true), V, static_cast<double>(top_p) * kept);
  }
  std::vector<bool> in(V);
  for (int64_t v = 0; v < V; ++v) {
    const uint32_t k = OrderKey(z[v]);
    in[v] = keep_k.In(k, v) && keep_p.In(k, v);
  }
  return in;
}

TEST(GpuSamplerOnTheHostTest, KeptSetEqualsTheCpuSamplersForTopKAndTopP) {
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(11);
  int cases = 0;
  for (int it = 0; it < 600; ++it) {
    const int64_t V = 1 + rng() % 600;
    std::vector<float> z(V);
    const int kind = it % 4;
    for (float& x : z) {
      switch (kind) {
        case 0:
          x = std::normal_distribution<float>(0.0f, 3.0f)(rng);
          break;
        case 1:
          x = static_cast<float>(rng() % 5);
          break;  // many ties
        case 2:
          x = rng() % 3 == 0 ? -inf : static_cast<float>(rng() % 4) - 1.5f;
          break;
        default:
          x = rng() % 2 ? 0.0f : -0.0f;
          break;  // the two zeros tie
      }
    }
    const float max = *std::max_element(z.begin(), z.end());
    if (max == -inf) continue;  // no token is possible: the sampler never sees such a row
    std::vector<float> e(V);    // as both samplers weigh: exp(z - max) in float, summed in double
    for (int64_t v = 0; v < V; ++v) e[v] = std::exp(z[v] - max);
    const int top_k = static_cast<int>(rng() % (V + 3));
    float top_p = rng() % 4 == 0 ? 1.0f : std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
    // The two sum the same masses in different orders: keep top_p off a prefix boundary, where
    // the last rounding bit would decide.
    if (top_p < 1.0f) {
      std::vector<double> sorted(e.begin(), e.end());
      std::sort(sorted.rbegin(), sorted.rend());
      double total = 0.0, prefix = 0.0;
      for (double x : sorted) total += x;
      bool near = false;
      for (double x : sorted) {
        prefix += x;
        near |= std::abs(prefix - top_p * total) < 1e-9 * total;
      }
      if (near) continue;
    }
    ++cases;
    ASSERT_EQ(GpuKeptSet(z, e, top_k, top_p), CpuKeptSet(z, e, top_k, top_p))
        << "case " << it << ": V " << V << " top_k " << top_k << " top_p " << top_p;
  }
  EXPECT_GT(cases, 400);
}

TEST(GpuSamplerOnTheHostTest, FindCutTerminatesAtTheExtremes) {
  // All of a one-token row; a top_k of 1 among equal logits keeps the lowest id.
  const std::vector<float> one = {0.5f};
  EXPECT_EQ(GpuKeptSet(one, {1.0f}, 1, 0.01f), std::vector<bool>{true});
  const std::vector<float> equal(50, -2.0f);
  const std::vector<bool> kept = GpuKeptSet(equal, std::vector<float>(50, 1.0f), 1, 1.0f);
  EXPECT_TRUE(kept[0]);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), true), 1);
}

}  // namespace
}  // namespace prl::kernels::cuda
