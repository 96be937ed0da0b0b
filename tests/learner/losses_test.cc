#include "learner/losses.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/packed_batch.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl::learner {
namespace {

constexpr LossKind kAllKinds[] = {
    LossKind::kReinforceTis, LossKind::kPpoClip, LossKind::kDecoupledPpo, LossKind::kIcepop,
    LossKind::kCispo,        LossKind::kGspo,    LossKind::kSft};

// A micro-batch in the float values ComputeLoss sees.
struct Case {
  LossConfig config;
  std::vector<float> pi, mu, prox, adv;  // (N)
  std::vector<int32_t> offsets;          // (S + 1)

  LossInputs Inputs() const { return {pi, mu, prox, adv, offsets, {}}; }
  LossNormalizer Normalizer() const {
    LossNormalizer n{static_cast<double>(pi.size()), 0};
    for (size_t s = 0; s + 1 < offsets.size(); ++s) n.sequences += offsets[s + 1] > offsets[s];
    return n;
  }
};

// The ratios at which the loss has a kink, ascending (for decoupled_ppo: those of q; its
// behaviour weight's cap is handled apart).
std::vector<double> Kinks(const LossConfig& c) {
  switch (c.kind) {
    case LossKind::kReinforceTis:
      return {c.tis_cap};
    case LossKind::kPpoClip:
    case LossKind::kDecoupledPpo:
      return {1 - c.clip_low, 1 + c.clip_high};
    case LossKind::kIcepop:
      return {c.icepop_low, c.icepop_high};
    case LossKind::kCispo:
      return c.cispo_clip_low < 1 ? std::vector<double>{1 - c.cispo_clip_low, 1 + c.cispo_clip_high}
                                  : std::vector<double>{1 + c.cispo_clip_high};
    case LossKind::kGspo:
      return {1 - c.gspo_clip_low, 1 + c.gspo_clip_high};
    case LossKind::kSft:
      return {};
  }
  return {};
}

// A log-ratio inside region `region` of `kinks` (region j lies between kinks j - 1 and j), at
// least a margin (in log space) away from both ends, so that no finite difference crosses a kink.
double LogRatioInRegion(const std::vector<double>& kinks, size_t region, std::mt19937_64& rng) {
  if (kinks.empty()) return std::uniform_real_distribution<double>(-0.5, 0.5)(rng);
  const double lo = region == 0 ? std::log(kinks[0]) - 0.6 : std::log(kinks[region - 1]);
  const double hi = region == kinks.size() ? std::log(kinks.back()) + 0.6 : std::log(kinks[region]);
  const double margin = std::min(5e-3, (hi - lo) / 4);
  return std::uniform_real_distribution<double>(lo + margin, hi - margin)(rng);
}

// Random sequences (one of them empty) whose ratios visit every region between the loss's
// kinks with both signs of advantage: tokens on both sides of every clip boundary.
Case RandomCase(const LossConfig& config, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> logprob(-4.0, -0.05), magnitude(0.3, 2.0), dev(-.3, .3);
  const std::vector<double> kinks = Kinks(config), cap = {config.tis_cap};
  const size_t regions = kinks.size() + 1;
  const bool gspo = config.kind == LossKind::kGspo;
  Case c{config, {}, {}, {}, {}, {0}};
  size_t token = 0, seq = 0;
  for (int len : {3, 0, 5, 1, 7, 4, 6, 2, 5, 3, 8}) {
    // gspo's ratio is the sequence's: (region, sign) cycle through all 6 pairs over sequences;
    // its tokens deviate from it by zero-mean offsets.
    const double a = (seq % 2 == 0 ? 1 : -1) * magnitude(rng);
    const double seq_log_ratio = LogRatioInRegion(kinks, seq++ % regions, rng);
    std::vector<double> offset(len);
    double mean = 0;
    for (double& d : offset) mean += (d = dev(rng)) / len;
    for (int t = 0; t < len; ++t, ++token) {
      const double pi = logprob(rng);
      const double log_r =
          gspo ? seq_log_ratio + offset[t] - mean : LogRatioInRegion(kinks, token % regions, rng);
      double mu = pi - log_r;
      if (config.kind == LossKind::kDecoupledPpo) {  // log_r is log q = pi - prox
        c.prox.push_back(static_cast<float>(mu));
        mu -= LogRatioInRegion(cap, (token / 3) % 2, rng);  // behaviour ratio prox - mu
      }
      c.pi.push_back(static_cast<float>(pi));
      c.mu.push_back(static_cast<float>(mu));
      c.adv.push_back(static_cast<float>(a));
    }
    c.offsets.push_back(static_cast<int32_t>(c.pi.size()));
  }
  return c;
}

// The loss written the plain way, in float64, independently of losses.cc. `pi` is the variable;
// stop-gradient factors read `pi_sg`, so the derivative in `pi` is the gradient sg defines.
double ReferenceLoss(const Case& c, const std::vector<double>& pi,
                     const std::vector<double>& pi_sg) {
  const LossConfig& k = c.config;
  const LossNormalizer norm = c.Normalizer();
  double total = 0;
  for (size_t s = 0; s + 1 < c.offsets.size(); ++s) {
    const int begin = c.offsets[s], n = c.offsets[s + 1] - begin;
    if (n == 0) continue;
    double seq_sum = 0;
    if (k.kind == LossKind::kGspo) {
      double mean = 0;
      for (int t = begin; t < begin + n; ++t) mean += (pi[t] - c.mu[t]) / n;
      const double ratio = std::exp(mean), a = c.adv[begin];
      seq_sum = n * -std::min(ratio * a,
                              std::clamp(ratio, 1 - k.gspo_clip_low, 1 + k.gspo_clip_high) * a);
    }
    for (int t = begin; t < begin + n && k.kind != LossKind::kGspo; ++t) {
      const double r = std::exp(pi[t] - c.mu[t]), r_sg = std::exp(pi_sg[t] - c.mu[t]);
      const double a = c.adv[t];
      switch (k.kind) {
        case LossKind::kReinforceTis:
          seq_sum += -std::min(r_sg, k.tis_cap) * a * pi[t];
          break;
        case LossKind::kPpoClip:
          seq_sum += -std::min(r * a, std::clamp(r, 1 - k.clip_low, 1 + k.clip_high) * a);
          break;
        case LossKind::kDecoupledPpo: {
          const double q = std::exp(pi[t] - c.prox[t]);
          const double b = std::min(std::exp(double{c.prox[t]} - c.mu[t]), k.tis_cap);
          seq_sum += -b * std::min(q * a, std::clamp(q, 1 - k.clip_low, 1 + k.clip_high) * a);
          break;
        }
        case LossKind::kIcepop:
          seq_sum += -(r_sg >= k.icepop_low && r_sg <= k.icepop_high ? r_sg : 0) * a * pi[t];
          break;
        case LossKind::kCispo:
          seq_sum += -std::clamp(r_sg, 1 - k.cispo_clip_low, 1 + k.cispo_clip_high) * a * pi[t];
          break;
        case LossKind::kSft:
          seq_sum += -pi[t];
          break;
        case LossKind::kGspo:
          break;
      }
    }
    total += k.normalization == LossNormalization::kGlobalTokens ? seq_sum / norm.tokens
                                                                 : seq_sum / n / norm.sequences;
  }
  return total;
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<LossKind, LossNormalization>>& i) {
  return absl::StrCat(
      LossKindName(std::get<0>(i.param)),
      std::get<1>(i.param) == LossNormalization::kGlobalTokens ? "_GlobalTokens" : "_SequenceMean");
}

class LossTest : public ::testing::TestWithParam<std::tuple<LossKind, LossNormalization>> {
 protected:
  LossConfig Config() const {
    LossConfig c;
    c.kind = std::get<0>(GetParam());
    c.normalization = std::get<1>(GetParam());
    return c;
  }
};

TEST_P(LossTest, GradientMatchesFiniteDifferencesOfIndependentReference) {
  for (uint64_t seed : {1, 2, 3}) {
    const Case c = RandomCase(Config(), seed);
    std::vector<float> dpi(c.pi.size());
    LossStats stats;
    ASSERT_TRUE(
        ComputeLoss(c.config, c.Inputs(), c.Normalizer(), absl::MakeSpan(dpi), &stats).ok());
    const std::vector<double> pi(c.pi.begin(), c.pi.end());
    EXPECT_NEAR(stats.loss, ReferenceLoss(c, pi, pi), 1e-12 * (1 + std::abs(stats.loss)));
    // Kinks are >= 1.75e-4 away in log-ratio (gspo's narrow clip), far beyond h; the losses are
    // linear or exponential in pi, so the O(h^2) error is ~1e-11 and roundoff ~1e-16 / h.
    const double h = 1e-6;
    for (size_t t = 0; t < pi.size(); ++t) {
      std::vector<double> p = pi;
      p[t] = pi[t] + h;
      const double plus = ReferenceLoss(c, p, pi);
      p[t] = pi[t] - h;
      const double fd = (plus - ReferenceLoss(c, p, pi)) / (2 * h);
      // dpi is float: 2^-24 relative, plus the FD's absolute noise.
      ASSERT_NEAR(dpi[t], fd, 1e-7 * std::abs(fd) + 1e-9) << "seed " << seed << " token " << t;
    }
    if (c.config.kind != LossKind::kSft) {  // both sides of the kinks were visited
      EXPECT_GT(stats.clipped, 0);
      EXPECT_LT(stats.clipped, stats.tokens);
    }
  }
}

// Splits `c` at random sequence boundaries; every part uses the whole step's normalizer.
std::vector<Case> RandomSplit(const Case& c, std::mt19937_64& rng) {
  std::vector<Case> parts;
  Case part{c.config, {}, {}, {}, {}, {0}};
  auto take = [&](std::vector<float>& to, const std::vector<float>& from, int b, int e) {
    if (!from.empty()) to.insert(to.end(), from.begin() + b, from.begin() + e);
  };
  for (size_t s = 0; s + 1 < c.offsets.size(); ++s) {
    const int b = c.offsets[s], e = c.offsets[s + 1];
    take(part.pi, c.pi, b, e);
    take(part.mu, c.mu, b, e);
    take(part.prox, c.prox, b, e);
    take(part.adv, c.adv, b, e);
    part.offsets.push_back(static_cast<int32_t>(part.pi.size()));
    if (s + 2 == c.offsets.size() || rng() % 3 == 0) {
      parts.push_back(part);
      part = Case{c.config, {}, {}, {}, {}, {0}};
    }
  }
  return parts;
}

void ExpectStatsNear(const LossStats& a, const LossStats& b) {
  const std::vector<double> x = a.ToVector(), y = b.ToVector();
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], y[i], 1e-12 * std::max(1.0, std::abs(y[i]))) << "field " << i;
  }
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.sequences, b.sequences);
  EXPECT_EQ(a.clipped, b.clipped);
  EXPECT_EQ(a.ratio_max, b.ratio_max);
}

TEST_P(LossTest, SplittingIntoMicroBatchesChangesNeitherLossNorGradientNorStats) {
  std::mt19937_64 rng(7);
  const Case whole = RandomCase(Config(), 11);
  const LossNormalizer norm = whole.Normalizer();
  std::vector<float> whole_dpi(whole.pi.size());
  LossStats whole_stats;
  ASSERT_TRUE(
      ComputeLoss(whole.config, whole.Inputs(), norm, absl::MakeSpan(whole_dpi), &whole_stats)
          .ok());
  for (int trial = 0; trial < 5; ++trial) {
    const std::vector<Case> parts = RandomSplit(whole, rng);
    LossStats merged;
    std::vector<float> dpi;
    for (const Case& part : parts) {
      std::vector<float> part_dpi(part.pi.size());
      LossStats part_stats;
      ASSERT_TRUE(
          ComputeLoss(part.config, part.Inputs(), norm, absl::MakeSpan(part_dpi), &part_stats)
              .ok());
      merged.Merge(part_stats);
      dpi.insert(dpi.end(), part_dpi.begin(), part_dpi.end());
    }
    // Each token's gradient is computed from its own sequence alone: bit-identical.
    ASSERT_EQ(dpi, whole_dpi) << "trial " << trial;
    ExpectStatsNear(merged, whole_stats);
  }
}

// ---- The whole pipeline: Forward -> ComputeLoss -> Backward on a tiny model -----------------

// One layer of every tensor kind (Qwen2: q/k/v biases; untied: a separate head).
ModelConfig TinyModel() {
  ModelConfig c;
  c.arch = Architecture::kQwen2;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.vocab_size = 20;
  c.max_position_embeddings = 32;
  c.qkv_bias = true;
  return c;
}

struct ModelFixture {
  ParameterSet params = *ParameterSet::Allocate(TinyModel(), Device::Cpu(), false);
  Transformer model{TinyModel(), Device::Cpu()};
  PackedBatch batch;
  std::vector<int32_t> offsets = {0};  // trained tokens per sequence
  std::vector<float> pi0;              // (N) at the initial parameters

  ModelFixture() {
    InitializeParameters(params, 5, 0.3f);
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (const ParamEntry& e : params.layout.entries()) {  // norms and biases away from 1 / 0
      if (e.name.ends_with("norm.weight") || e.name.ends_with(".bias")) {
        for (int64_t i = 0; i < e.numel; ++i) params.data()[e.offset + i] += u(rng);
      }
    }
    for (auto [prompt, completion] : {std::pair{3, 5}, {2, 3}, {4, 6}}) {
      std::vector<int32_t> seq(prompt + completion);
      for (int32_t& t : seq) t = static_cast<int32_t>(rng() % 20);
      batch.AddScored(seq, prompt);  // the prompt is not scored, the completion is
      offsets.push_back(offsets.back() + completion);
    }
    pi0 = Logprobs(false);
  }

  // The trained tokens' log-probs (N) at the current parameters.
  std::vector<float> Logprobs(bool for_backward) {
    std::vector<float> all(batch.num_tokens()), trained;
    EXPECT_TRUE(model.Forward(params.params, batch, 1.0f, absl::MakeSpan(all), for_backward).ok());
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      if (batch.targets[t] != PackedBatch::kNoTarget) trained.push_back(all[t]);
    }
    return trained;
  }
};

// Behaviour, proximal log-probs and advantages around pi0, every ratio at least ~9% (in log)
// away from every kink, with both signs of advantage so that each loss clips some tokens.
Case ModelCase(const LossConfig& config, const std::vector<float>& pi0,
               const std::vector<int32_t>& offsets) {
  const double ratios[] = {0.3, 0.65, 1.0, 1.1, 1.6, 3.0}, behaviour[] = {0.5, 1.5, 3.0};
  const double seq_ratio[] = {0.6, 1.0, 1.5}, seq_adv[] = {1.0, -0.7, 1.3};
  Case c{config, pi0, {}, {}, {}, offsets};
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    for (int t = offsets[s]; t < offsets[s + 1]; ++t) {
      const double log_r = std::log(config.kind == LossKind::kGspo ? seq_ratio[s] : ratios[t % 6]);
      c.mu.push_back(static_cast<float>(pi0[t] - log_r));
      if (config.kind == LossKind::kDecoupledPpo) {  // q = ratios[t], b = behaviour[t / 2]
        c.prox.push_back(c.mu.back());
        c.mu.back() = static_cast<float>(c.prox.back() - std::log(behaviour[(t / 2) % 3]));
      }
      c.adv.push_back(static_cast<float>(seq_adv[s]));
    }
  }
  return c;
}

// Which side of each kink every token's clipped ratio is on (a finite difference across a
// change would measure a kink, not the gradient).
std::vector<int> Sides(const Case& c, const std::vector<float>& pi) {
  const std::vector<double> kinks = Kinks(c.config);
  std::vector<int> sides;
  for (size_t s = 0; s + 1 < c.offsets.size(); ++s) {
    double mean = 0;
    for (int t = c.offsets[s]; t < c.offsets[s + 1]; ++t) mean += pi[t] - c.mu[t];
    mean /= c.offsets[s + 1] - c.offsets[s];
    for (int t = c.offsets[s]; t < c.offsets[s + 1]; ++t) {
      const double x = c.config.kind == LossKind::kGspo           ? std::exp(mean)
                       : c.config.kind == LossKind::kDecoupledPpo ? std::exp(pi[t] - c.prox[t])
                                                                  : std::exp(pi[t] - c.mu[t]);
      sides.push_back(std::upper_bound(kinks.begin(), kinks.end(), x) - kinks.begin());
    }
  }
  return sides;
}

bool WeightIsStopGradient(LossKind kind) {
  return kind == LossKind::kReinforceTis || kind == LossKind::kIcepop || kind == LossKind::kCispo;
}

// Forward + ComputeLoss from scratch. For the losses whose weight is sg(f(r)), mu moves with pi
// (mu + pi - pi0): r, and with it the weight, keeps its value at pi0, which is what sg means
// for a derivative; the remaining dependence on pi is the one the gradient describes.
double FullLoss(ModelFixture& f, const Case& base, std::vector<int>* sides) {
  Case c = base;
  c.pi = f.Logprobs(false);
  if (WeightIsStopGradient(c.config.kind)) {
    for (size_t t = 0; t < c.pi.size(); ++t) c.mu[t] = base.mu[t] + (c.pi[t] - f.pi0[t]);
  }
  *sides = Sides(c, c.pi);
  std::vector<float> dpi(c.pi.size());
  LossStats stats;
  EXPECT_TRUE(ComputeLoss(c.config, c.Inputs(), c.Normalizer(), absl::MakeSpan(dpi), &stats).ok());
  return stats.loss;
}

TEST_P(LossTest, WholeModelGradientMatchesFiniteDifferences) {
  LossConfig config = Config();
  config.gspo_clip_low = config.gspo_clip_high = 0.2;  // room for fp32 differences around 1
  ModelFixture f;
  const Case c = ModelCase(config, f.pi0, f.offsets);

  // Analytic: dpi scattered to the scored positions, then Backward.
  ASSERT_EQ(f.Logprobs(true), f.pi0);
  std::vector<float> dpi(c.pi.size()), dlogprobs(f.batch.num_tokens(), 0.0f);
  LossStats stats;
  ASSERT_TRUE(ComputeLoss(c.config, c.Inputs(), c.Normalizer(), absl::MakeSpan(dpi), &stats).ok());
  for (int64_t t = 0, n = 0; t < f.batch.num_tokens(); ++t) {
    if (f.batch.targets[t] != PackedBatch::kNoTarget) dlogprobs[t] = dpi[n++];
  }
  ParameterSet grads = *ParameterSet::Allocate(TinyModel(), Device::Cpu(), true);
  ASSERT_TRUE(f.model.Backward(f.params.params, dlogprobs, grads.params).ok());
  if (config.kind != LossKind::kSft) {
    EXPECT_GT(stats.clipped, 0);
  }

  // Fourth-order central differences in fp32 at h = 1e-2. Each Forward's fp32 rounding moves
  // the O(1) loss by ~2e-7, i.e. ~1.5 * 2e-7 / h = 3e-5 in the quotient (measured: at most
  // 4.4e-5 absolute); the O(h^4) truncation is below that (second-order differences at this
  // h were truncation-bound at 1.5e-3 relative, smaller h noise-bound). Per entry we allow
  // 1e-4 + 5e-3 |fd|, over 5x the worst seen; over all sampled entries the relative L2 error
  // was <= 5e-5, and we require 5e-4: a 1% error in any large gradient, a wrong sign, a missing
  // stop-gradient or a wrong normaliser fails by orders of magnitude.
  const float h = 1e-2f;
  double error_sq = 0, fd_sq = 0;
  std::vector<int> base_sides;
  FullLoss(f, c, &base_sides);
  int checked = 0, skipped = 0;
  std::mt19937_64 rng(9);
  for (const ParamEntry& e : f.params.layout.entries()) {
    const float* g = grads.data() + e.offset;
    // The entries with the largest gradients, and two random ones.
    std::vector<int64_t> idx(e.numel);
    for (int64_t i = 0; i < e.numel; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(),
                      [&](int64_t a, int64_t b) { return std::abs(g[a]) > std::abs(g[b]); });
    idx.resize(3);
    idx.push_back(rng() % e.numel);
    idx.push_back(rng() % e.numel);
    for (int64_t i : idx) {
      float& w = f.params.data()[e.offset + i];
      const float saved = w;
      // Fourth-order central differences over the fp32 grid points saved +- h, +- 2 h.
      double loss[4], step[4];
      bool crossed = false;
      for (int k = 0; k < 4; ++k) {
        w = saved + static_cast<float>(k < 2 ? k + 1 : 1 - k) * h;  // +h, +2h, -h, -2h
        step[k] = double{w} - double{saved};
        std::vector<int> sides;
        loss[k] = FullLoss(f, c, &sides);
        crossed = crossed || sides != base_sides;
      }
      w = saved;
      if (crossed) {
        ++skipped;
        continue;
      }
      const double fd = (8 * (loss[0] - loss[2]) - (loss[1] - loss[3])) /
                        (8 * (step[0] - step[2]) - (step[1] - step[3]));
      EXPECT_NEAR(g[i], fd, 1e-4 + 5e-3 * std::abs(fd)) << e.name << "[" << i << "]";
      error_sq += (g[i] - fd) * (g[i] - fd);
      fd_sq += fd * fd;
      ++checked;
    }
  }
  EXPECT_LT(std::sqrt(error_sq / fd_sq), 5e-4);
  EXPECT_LE(skipped, checked / 10) << "too many perturbations crossed a clip boundary";
}

INSTANTIATE_TEST_SUITE_P(AllLosses, LossTest,
                         ::testing::Combine(::testing::ValuesIn(kAllKinds),
                                            ::testing::Values(LossNormalization::kGlobalTokens,
                                                              LossNormalization::kSequenceMean)),
                         ParamName);

TEST(LossStatsTest, AllReducedVectorEqualsMerge) {
  LossStats a{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, b{0.5, 1, 1, 2, 9, 1, 2, 3, 4, 5};
  std::vector<double> x = a.ToVector(), y = b.ToVector();
  ASSERT_EQ(x.size(), LossStats::kNumSums + 1);
  for (size_t i = 0; i < LossStats::kNumSums; ++i) x[i] += y[i];  // AllReduceHost(kSum)
  x.back() = std::max(x.back(), y.back());                        // AllReduceHost(kMax)
  LossStats merged = a;
  merged.Merge(b);
  EXPECT_EQ(LossStats::FromVector(x).ToVector(), merged.ToVector());
  EXPECT_EQ(merged.ratio_max, 9);
  EXPECT_EQ(merged.ratio_sum, 6);
}

// reinforce_tis, r = (1, 2) under a cap of 4: w = (1, 2).
TEST(LossStatsTest, HandComputedLossGradientAndReportFigures) {
  LossConfig config;
  config.tis_cap = 4;
  const std::vector<float> pi = {-1, -2}, mu = {-1, static_cast<float>(-2 - std::log(2.0))};
  const std::vector<float> adv = {1, 1};
  const std::vector<int32_t> offsets = {0, 1, 2};
  std::vector<float> dpi(2);
  LossStats s;
  ASSERT_TRUE(
      ComputeLoss(config, {pi, mu, {}, adv, offsets, {}}, {2, 2}, absl::MakeSpan(dpi), &s).ok());
  EXPECT_NEAR(s.loss, (1 * 1 + 2 * 2) / 2.0, 1e-6);  // -(w A pi) / 2 tokens
  EXPECT_NEAR(dpi[0], -0.5, 1e-6);
  EXPECT_NEAR(dpi[1], -1.0, 1e-6);
  EXPECT_NEAR(s.mean_ratio(), 1.5, 1e-6);
  EXPECT_NEAR(s.ratio_max, 2.0, 1e-6);
  EXPECT_NEAR(s.effective_sample_size(), 9.0 / (2 * 5), 1e-6);  // (1 + 2)^2 / (2 (1 + 4))
  EXPECT_NEAR(s.kl(), (0 + (1 - std::log(2.0))) / 2, 1e-6);     // k3 = r - 1 - log r
  EXPECT_NEAR(s.entropy(), 1.5, 1e-7);
  EXPECT_EQ(s.clipped_fraction(), 0);
  EXPECT_EQ(s.sequences, 2);

  // icepop masks r = 3 > icepop_high = 2: w = (1, 0), ESS 1 / 2, half clipped, and only the
  // kept token has a gradient.
  config.kind = LossKind::kIcepop;
  const std::vector<float> mu3 = {-1, static_cast<float>(-2 - std::log(3.0))};
  LossStats m;
  ASSERT_TRUE(
      ComputeLoss(config, {pi, mu3, {}, adv, offsets, {}}, {2, 2}, absl::MakeSpan(dpi), &m).ok());
  EXPECT_NEAR(m.effective_sample_size(), 0.5, 1e-6);
  EXPECT_EQ(m.clipped_fraction(), 0.5);
  EXPECT_EQ(dpi[1], 0.0f);
  EXPECT_NEAR(m.loss, 0.5, 1e-6);
}

TEST(LossStatsTest, SftNeedsNoBehaviourAndReportsNoRatio) {
  LossConfig config;
  config.kind = LossKind::kSft;
  config.normalization = LossNormalization::kSequenceMean;
  const std::vector<float> pi = {-1, -3, -2};
  const std::vector<int32_t> offsets = {0, 2, 3};
  std::vector<float> dpi(3);
  LossStats s;
  ASSERT_TRUE(ComputeLoss(config, {pi, {}, {}, {}, offsets, {}}, {3, 4}, absl::MakeSpan(dpi), &s).ok());
  EXPECT_NEAR(s.loss, (4.0 / 2 + 2.0) / 4, 1e-12);  // mean over sequences, 4 in the step
  EXPECT_EQ(dpi, (std::vector<float>{-1.0f / 8, -1.0f / 8, -1.0f / 4}));
  EXPECT_EQ(s.ratio_sum, 0);
  EXPECT_EQ(s.kl_sum, 0);
  EXPECT_EQ(s.effective_sample_size(), 1);
  EXPECT_NEAR(s.entropy(), 2, 1e-12);
}

TEST(LossStatsTest, EmptyMicroBatchAddsNothing) {
  std::vector<float> none;
  LossStats s;
  const std::vector<int32_t> offsets = {0};
  ASSERT_TRUE(
      ComputeLoss(LossConfig{}, {none, none, {}, none, offsets, {}}, {}, absl::MakeSpan(none), &s)
          .ok());
  EXPECT_EQ(s.ToVector(), LossStats{}.ToVector());
  EXPECT_EQ(s.effective_sample_size(), 0);
  EXPECT_EQ(s.kl(), 0);
}

// ---- Errors name the field, the expected and the found value -------------------------------

// ComputeLoss on a valid 2-sequence batch after `mutate`; returns the error message.
template <typename Mutate>
std::string LossError(LossKind kind, Mutate mutate) {
  LossConfig config;
  config.kind = kind;
  Case c{config, {-1, -2, -3, -1}, {-1, -2, -3, -1}, {-1, -2, -3, -1}, {1, 1, -1, -1}, {0, 2, 4}};
  LossNormalizer norm{4, 2};
  std::vector<float> dpi(4, 7.0f);
  mutate(c, norm, dpi);
  LossStats stats;
  const absl::Status status = ComputeLoss(c.config, c.Inputs(), norm, absl::MakeSpan(dpi), &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stats.ToVector(), LossStats{}.ToVector()) << "stats touched on error";
  for (float d : dpi) EXPECT_EQ(d, 7.0f) << "dpi touched on error";
  return std::string(status.message());
}

TEST(LossErrorsTest, InvalidInputsAreRejectedWithTheFieldNamed) {
  using V = std::vector<float>;
  using O = std::vector<int32_t>;
  struct ErrorCase {
    LossKind kind;
    std::function<void(Case&, LossNormalizer&, std::vector<float>&)> mutate;
    std::string expected;
  };
  const float nan = std::nanf("");
  const std::vector<ErrorCase> cases = {
      {LossKind::kPpoClip, [](Case& c, auto&, auto&) { c.mu.pop_back(); },
       "mu has 3 elements, expected 4"},
      {LossKind::kPpoClip, [](Case& c, auto&, auto&) { c.mu.clear(); }, "mu has 0 elements"},
      {LossKind::kDecoupledPpo, [](Case& c, auto&, auto&) { c.prox.clear(); },
       "prox has 0 elements, expected 4"},
      {LossKind::kCispo, [](Case& c, auto&, auto&) { c.prox = V{1}; }, "prox has 1 elements"},
      {LossKind::kIcepop, [](Case& c, auto&, auto&) { c.adv.push_back(1); },
       "advantages has 5 elements, expected 4"},
      {LossKind::kSft, [](Case&, auto&, auto& dpi) { dpi.resize(3); }, "dpi has 3 elements"},
      {LossKind::kGspo, [](Case& c, auto&, auto&) { c.offsets = O{}; }, "seq_offsets must start"},
      {LossKind::kGspo,
       [](Case& c, auto&, auto&) {
         c.offsets = O{1, 4};
       },
       "found first 1, last 4"},
      {LossKind::kGspo,
       [](Case& c, auto&, auto&) {
         c.offsets = O{0, 3};
       },
       "end at 4"},
      {LossKind::kGspo,
       [](Case& c, auto&, auto&) {
         c.offsets = O{0, 3, 1, 4};
       },
       "seq_offsets[2] = 1 is less than seq_offsets[1] = 3"},
      {LossKind::kReinforceTis, [=](Case& c, auto&, auto&) { c.pi[2] = nan; },
       "pi[2] = nan (token 2, sequence 1) is not finite"},
      {LossKind::kReinforceTis, [](Case& c, auto&, auto&) { c.mu[1] = -INFINITY; },
       "mu[1] = -inf (token 1, sequence 0)"},
      {LossKind::kPpoClip, [=](Case& c, auto&, auto&) { c.adv[3] = nan; }, "advantages[3] = nan"},
      {LossKind::kDecoupledPpo, [=](Case& c, auto&, auto&) { c.prox[0] = nan; }, "prox[0] = nan"},
      {LossKind::kGspo, [](Case& c, auto&, auto&) { c.adv[3] = 0.5f; },
       "sequence 1 has -1 on its first token and 0.5 on token 3"},
      {LossKind::kReinforceTis, [](Case&, auto& n, auto&) { n.tokens = 0; },
       "tokens (the step's total) must be finite and >= this micro-batch's 4, found 0"},
      {LossKind::kSft,
       [](Case& c, auto& n, auto&) {
         c.config.normalization = LossNormalization::kSequenceMean;
         n.sequences = 1;
       },
       "sequences (the step's total) must be finite and >= this micro-batch's 2, found 1"},
      {LossKind::kCispo, [](Case& c, auto&, auto&) { c.config.cispo_clip_high = -1; },
       "cispo_clip_high must be finite and >= 0, found -1"},
  };
  for (const ErrorCase& e : cases) {
    const std::string message = LossError(e.kind, e.mutate);
    EXPECT_NE(message.find(e.expected), std::string::npos)
        << LossKindName(e.kind) << ": \"" << message << "\" lacks \"" << e.expected << "\"";
  }
}

TEST(LossErrorsTest, OutOfRangeConfigNamesTheFieldTheRangeAndTheValue) {
  EXPECT_TRUE(ValidateLossConfig(LossConfig{}).ok()) << "the defaults are valid";
  const std::vector<std::pair<std::function<void(LossConfig&)>, std::string>> cases = {
      {[](LossConfig& c) { c.tis_cap = 0; }, "tis_cap must be finite and > 0, found 0"},
      {[](LossConfig& c) { c.tis_cap = INFINITY; }, "tis_cap must be finite and > 0, found inf"},
      {[](LossConfig& c) { c.clip_low = 1; }, "clip_low must be finite and in [0, 1), found 1"},
      {[](LossConfig& c) { c.clip_high = -0.1; }, "clip_high must be finite and >= 0, found -0.1"},
      {[](LossConfig& c) { c.icepop_low = -1; }, "icepop_low must be finite and >= 0, found -1"},
      {[](LossConfig& c) { c.icepop_high = 0.5; }, "icepop_high must be finite and > 0.5"},
      {[](LossConfig& c) { c.cispo_clip_low = 1.5; },
       "cispo_clip_low must be finite and in [0, 1]"},
      {[](LossConfig& c) { c.gspo_clip_low = std::nan(""); }, "gspo_clip_low must be finite"},
      {[](LossConfig& c) { c.gspo_clip_high = -1e-4; }, "gspo_clip_high"},
  };
  for (const auto& [mutate, expected] : cases) {
    LossConfig config;
    mutate(config);
    const absl::Status status = ValidateLossConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(expected), absl::string_view::npos) << status.message();
  }
}

TEST(LossErrorsTest, LossNamesRoundTripAndAnUnknownNameListsTheValidOnes) {
  for (LossKind kind : kAllKinds) EXPECT_EQ(*ParseLossKind(LossKindName(kind)), kind);
  const absl::StatusOr<LossKind> bad = ParseLossKind("ppo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("loss: expected one of reinforce_tis, ppo_clip, "
                                        "decoupled_ppo, icepop, cispo, gspo, sft; found 'ppo'"),
            absl::string_view::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace prl::learner
