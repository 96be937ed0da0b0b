// RopeInverseFrequencies (model/config.h, model/config_derived.cc): transformers' fp32 inverse
// frequencies for the default RoPE, linear scaling and Llama 3's frequency-dependent scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "model/config.h"

namespace prl {
namespace {

ModelConfig RopeConfig(int64_t head_dim, double theta) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  return c;
}

void ExpectRelativelyNear(double got, double want, double tolerance, int64_t i) {
  EXPECT_LE(std::abs(got - want), tolerance * std::abs(want))
      << "frequency " << i << ": got " << got << ", want " << want;
}

TEST(RopeInverseFrequenciesTest, DefaultMatchesTheClosedForm) {
  for (const auto& [head_dim, theta] :
       {std::pair<int64_t, double>{64, 1e6}, {128, 10000.0}, {64, 500000.0}}) {
    const std::vector<float> inv_freq = RopeInverseFrequencies(RopeConfig(head_dim, theta));
    ASSERT_EQ(static_cast<int64_t>(inv_freq.size()), head_dim / 2);
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double want = 1.0 / std::pow(theta, 2.0 * i / head_dim);
      ExpectRelativelyNear(inv_freq[i], want, 1e-6, i);
    }
  }
}

TEST(RopeInverseFrequenciesTest, LinearScalingDividesEveryFrequencyByTheFactor) {
  ModelConfig c = RopeConfig(64, 10000.0);
  const std::vector<float> plain = RopeInverseFrequencies(c);
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 4.0;
  const std::vector<float> scaled = RopeInverseFrequencies(c);
  ASSERT_EQ(scaled.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(scaled[i], plain[i] / 4.0f) << i;
}

// transformers' _compute_llama3_parameters, in float64.
double Llama3InverseFrequency(double inv_freq, const RopeScaling& rs) {
  const double low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor;
  const double high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor;
  const double wavelen = 2 * std::numbers::pi / inv_freq;
  if (wavelen < high_freq_wavelen) return inv_freq;
  if (wavelen > low_freq_wavelen) return inv_freq / rs.factor;
  const double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                        (rs.high_freq_factor - rs.low_freq_factor);
  return (1 - smooth) * inv_freq / rs.factor + smooth * inv_freq;
}

// Llama 3.2 1B's RoPE (its config.json: theta 500000, head_dim 64, llama3 scaling of factor 32,
// low 1, high 4, original context 8192; config_test.cc parses that file).
ModelConfig Llama32OneBRope() {
  ModelConfig c = RopeConfig(64, 500000.0);
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

TEST(RopeInverseFrequenciesTest, Llama3KeepsHighDividesLowAndSmoothsMiddleFrequencies) {
  const ModelConfig c = Llama32OneBRope();
  const RopeScaling& rs = c.rope_scaling;
  const std::vector<float> inv_freq = RopeInverseFrequencies(c);
  ASSERT_EQ(inv_freq.size(), 32u);
  const double high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor;
  const double low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor;
  int high = 0, low = 0, middle = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const double plain = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
    const double wavelen = 2 * std::numbers::pi / plain;
    // Stay clear of the band edges, where float and double may classify differently.
    if (std::abs(wavelen / high_freq_wavelen - 1) < 1e-3 ||
        std::abs(wavelen / low_freq_wavelen - 1) < 1e-3) {
      continue;
    }
    const double want = Llama3InverseFrequency(plain, rs);
    ExpectRelativelyNear(inv_freq[i], want, 1e-5, i);
    if (wavelen < high_freq_wavelen) {
      ++high;
      ExpectRelativelyNear(inv_freq[i], plain, 1e-6, i);
    } else if (wavelen > low_freq_wavelen) {
      ++low;
      ExpectRelativelyNear(inv_freq[i], plain / 32.0, 1e-6, i);
    } else {
      ++middle;
      EXPECT_LT(inv_freq[i], plain) << i;
      EXPECT_GT(inv_freq[i], plain / 32.0) << i;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(middle, 0);
}

}  // namespace
}  // namespace prl
