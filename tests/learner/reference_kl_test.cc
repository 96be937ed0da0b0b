// The KL penalty to a reference model (learner/reference_kl.h): the estimators against their
// float64 closed forms and the exact KL, the loss and its gradient (loss and reward penalties)
// against an independent float64 reference, and a training step whose reference stays frozen
// and whose penalty keeps the policy nearer to it, on 1 and 2 FSDP ranks.
#include "learner/reference_kl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/status_macros.h"
#include "learner/losses.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

constexpr KlEstimator kEstimators[] = {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3};

// The estimators written the plain way (d = log pi - log ref), independently of reference_kl.cc.
double PlainK(KlEstimator e, double d) {
  const double log_ratio_ref_pi = -d;  // log(ref / pi)
  switch (e) {
    case KlEstimator::kK1:
      return d;
    case KlEstimator::kK2:
      return 0.5 * d * d;
    case KlEstimator::kK3:
      return std::min(std::exp(log_ratio_ref_pi) - 1.0 - log_ratio_ref_pi, 10.0);
  }
  return 0;
}

TEST(KlEstimateTest, ValuesMatchTheClosedFormsAndDerivativesTheFiniteDifferences) {
  for (KlEstimator e : kEstimators) {
    for (double d = -2.0; d <= 3.0; d += 0.137) {
      const KlTerm k = KlEstimate(e, d);
      EXPECT_NEAR(k.value, PlainK(e, d), 1e-15 * (1 + std::abs(k.value)));
      const double h = 1e-6;
      const double fd = (PlainK(e, d + h) - PlainK(e, d - h)) / (2 * h);
      EXPECT_NEAR(k.grad, fd, 1e-8 * (1 + std::abs(fd))) << "d " << d;
    }
  }
  // k3 is clamped at 10 (verl's low_var_kl), where it carries no gradient.
  const KlTerm far = KlEstimate(KlEstimator::kK3, -3.0);  // exp(3) - 1 - 3 = 16.1
  EXPECT_EQ(far.value, kK3Clamp);
  EXPECT_EQ(far.grad, 0.0);
}

// Under x ~ pi, k1 and k3 average to KL(pi || ref) exactly; k2 is a non-negative, biased one.
TEST(KlEstimateTest, K1AndK3AverageToTheExactKlUnderThePolicy) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> logit(-1.5, 1.5);
  for (int trial = 0; trial < 20; ++trial) {
    const int V = 7;
    std::vector<double> pi(V), ref(V);
    double zp = 0, zr = 0;
    for (int v = 0; v < V; ++v) zp += pi[v] = std::exp(logit(rng));
    for (int v = 0; v < V; ++v) zr += ref[v] = std::exp(logit(rng));
    double exact = 0, e1 = 0, e2 = 0, e3 = 0;
    for (int v = 0; v < V; ++v) {
      pi[v] /= zp;
      ref[v] /= zr;
    }
    for (int v = 0; v < V; ++v) {
      const double d = std::log(pi[v]) - std::log(ref[v]);
      exact += pi[v] * d;
      e1 += pi[v] * KlEstimate(KlEstimator::kK1, d).value;
      e2 += pi[v] * KlEstimate(KlEstimator::kK2, d).value;
      e3 += pi[v] * KlEstimate(KlEstimator::kK3, d).value;
      EXPECT_GE(KlEstimate(KlEstimator::kK3, d).value, 0.0);
    }
    EXPECT_NEAR(e1, exact, 1e-14);
    EXPECT_NEAR(e3, exact, 1e-14);
    EXPECT_GE(e2, 0.0);
  }
}

// ---- The loss with the penalty --------------------------------------------------------------

struct KlCase {
  LossConfig config;
  std::vector<float> pi, mu, adv, ref;  // (N)
  std::vector<int32_t> offsets;         // (S + 1)
  LossInputs Inputs() const { return {pi, mu, {}, adv, offsets, ref}; }
  LossNormalizer Normalizer() const {
    LossNormalizer n{static_cast<double>(pi.size()), 0};
    for (size_t s = 0; s + 1 < offsets.size(); ++s) n.sequences += offsets[s + 1] > offsets[s];
    return n;
  }
};

// Ratios within 10% of 1 (inside every clip, far from its kinks at h = 1e-6), references
// within e^{+-0.8} of the policy (k3 far below its clamp).
KlCase RandomKlCase(const LossConfig& config, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> logprob(-4.0, -0.05), near(-0.1, 0.1), ref(-0.8, 0.8),
      adv(-1.5, 1.5);
  KlCase c{config, {}, {}, {}, {}, {0}};
  for (int len : {3, 5, 1, 7, 4}) {
    const double a = adv(rng);
    for (int t = 0; t < len; ++t) {
      const double pi = logprob(rng);
      c.pi.push_back(static_cast<float>(pi));
      c.mu.push_back(static_cast<float>(pi - near(rng)));
      c.ref.push_back(static_cast<float>(pi - ref(rng)));
      c.adv.push_back(static_cast<float>(a));
    }
    c.offsets.push_back(static_cast<int32_t>(c.pi.size()));
  }
  return c;
}

// The loss in float64, independently of losses.cc: `pi` is the variable, `pi_sg` what
// stop-gradient factors read. The reward penalty's advantage is A - coef sum_{u >= t} k(mu - ref).
double ReferenceKlLoss(const KlCase& c, const std::vector<double>& pi,
                       const std::vector<double>& pi_sg) {
  const LossConfig& k = c.config;
  const bool reward = k.kl.penalty == KlPenalty::kReward;
  double total = 0;
  for (size_t s = 0; s + 1 < c.offsets.size(); ++s) {
    const int begin = c.offsets[s], n = c.offsets[s + 1] - begin;
    std::vector<double> a(n);
    for (int t = 0; t < n; ++t) {
      double penalty = 0;
      for (int u = t; u < n && reward; ++u) {
        penalty += k.kl.coef * PlainK(k.kl.estimator, double{c.mu[begin + u]} - c.ref[begin + u]);
      }
      a[t] = c.adv[begin + t] - penalty;
    }
    double sum = 0;
    if (k.kind == LossKind::kGspo) {
      double mean = 0;
      for (int t = begin; t < begin + n; ++t) mean += (pi[t] - c.mu[t]) / n;
      const double ratio = std::exp(mean);
      sum = n * -std::min(ratio * a[0],
                          std::clamp(ratio, 1 - k.gspo_clip_low, 1 + k.gspo_clip_high) * a[0]);
    }
    for (int t = begin; t < begin + n; ++t) {
      const double r = std::exp(pi[t] - c.mu[t]), r_sg = std::exp(pi_sg[t] - c.mu[t]);
      if (k.kind == LossKind::kReinforceTis) sum += -std::min(r_sg, k.tis_cap) * a[t - begin] * pi[t];
      if (k.kind == LossKind::kPpoClip) {
        sum += -std::min(r * a[t - begin],
                         std::clamp(r, 1 - k.clip_low, 1 + k.clip_high) * a[t - begin]);
      }
      if (!reward) sum += k.kl.coef * PlainK(k.kl.estimator, pi[t] - c.ref[t]);
    }
    total += sum / static_cast<double>(c.pi.size());
  }
  return total;
}

TEST(KlLossTest, LossGradientAndReportedKlMatchAnIndependentFloat64Reference) {
  for (LossKind kind : {LossKind::kReinforceTis, LossKind::kPpoClip, LossKind::kGspo}) {
    for (KlEstimator estimator : kEstimators) {
      for (KlPenalty penalty : {KlPenalty::kLoss, KlPenalty::kReward}) {
        LossConfig config;
        config.kind = kind;
        config.gspo_clip_low = config.gspo_clip_high = 0.2;
        config.kl = {0.3, estimator, penalty};
        const KlCase c = RandomKlCase(config, 17);
        std::vector<float> dpi(c.pi.size());
        LossStats stats;
        const absl::Status status =
            ComputeLoss(config, c.Inputs(), c.Normalizer(), absl::MakeSpan(dpi), &stats);
        ASSERT_TRUE(status.ok()) << status;
        const std::vector<double> pi(c.pi.begin(), c.pi.end());
        const std::string where = absl::StrCat(LossKindName(kind), " ",
                                               EnumName(kKlEstimatorNames, estimator), " ",
                                               EnumName(kKlPenaltyNames, penalty));
        EXPECT_NEAR(stats.loss, ReferenceKlLoss(c, pi, pi), 1e-12 * (1 + std::abs(stats.loss)))
            << where;
        const double h = 1e-6;
        for (size_t t = 0; t < pi.size(); ++t) {
          std::vector<double> p = pi;
          p[t] = pi[t] + h;
          const double plus = ReferenceKlLoss(c, p, pi);
          p[t] = pi[t] - h;
          const double fd = (plus - ReferenceKlLoss(c, p, pi)) / (2 * h);
          ASSERT_NEAR(dpi[t], fd, 1e-7 * std::abs(fd) + 1e-9) << where << " token " << t;
        }
        double kl = 0;  // reported in both modes: the policy's estimate, k(pi - ref)
        for (size_t t = 0; t < pi.size(); ++t) kl += PlainK(estimator, pi[t] - c.ref[t]);
        EXPECT_NEAR(stats.reference_kl(), kl / pi.size(), 1e-12) << where;
        EXPECT_GT(std::abs(stats.reference_kl()), 1e-3) << where;
      }
    }
  }
}

TEST(KlLossTest, WithoutThePenaltyNothingChangesAndAMissingReferenceIsAnError) {
  LossConfig config;
  config.kl.coef = 0.5;
  KlCase c = RandomKlCase(config, 4);
  std::vector<float> with(c.pi.size()), without(c.pi.size());
  LossStats a, b;
  c.config.kl.coef = 0;  // off: ref is ignored
  ASSERT_TRUE(ComputeLoss(c.config, c.Inputs(), c.Normalizer(), absl::MakeSpan(without), &a).ok());
  EXPECT_EQ(a.ref_kl_sum, 0.0);
  c.config.kl.coef = 0.5;
  ASSERT_TRUE(ComputeLoss(c.config, c.Inputs(), c.Normalizer(), absl::MakeSpan(with), &b).ok());
  EXPECT_NE(with, without);
  c.ref.pop_back();
  const absl::Status missing =
      ComputeLoss(c.config, c.Inputs(), c.Normalizer(), absl::MakeSpan(with), &b);
  EXPECT_TRUE(absl::IsInvalidArgument(missing));
  EXPECT_NE(missing.message().find("ref has"), std::string::npos) << missing;
  c.config.kl.coef = -1;
  const absl::Status negative = ValidateLossConfig(c.config);
  EXPECT_NE(negative.message().find("kl.coef"), std::string::npos) << negative;
}

// ---- A training step with a reference model --------------------------------------------------

std::vector<TrainSample> Samples(const ModelConfig& config) {
  std::vector<TrainSample> samples;
  const auto sequences = testing::RandomSequences(config, 8);
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& seq = sequences[i];
    if (seq.size() < 4) continue;
    TrainSample s;
    const size_t P = seq.size() / 2;
    s.prompt.assign(seq.begin(), seq.begin() + P);
    s.completion.assign(seq.begin() + P, seq.end());
    s.behaviour_logprobs.assign(s.completion.size(), -3.0f);
    s.has_advantage = true;
    s.advantage = i % 2 == 0 ? 1.0 : -1.0;
    samples.push_back(std::move(s));
  }
  return samples;
}

struct Trained {
  std::vector<double> reference_kl;  // per step
  bool reference_unchanged = false;
};

// `steps` SGD steps from the same start; the reference is the start, on its own communicator.
Trained Train(double kl_coef, int world_size, int steps) {
  const ModelConfig config = testing::TinyConfig();
  const std::vector<float> start = testing::RandomParameters(config, 6);
  const std::vector<TrainSample> samples = Samples(config);
  Trained run;
  const absl::Status status = testing::AllRanksOk(testing::RunRanksWithTwoGroups(
      world_size,
      [&](int rank, collective::Communicator& comm,
          collective::Communicator& reference_comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(config, &comm, {}));
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> reference,
                             FsdpModel::Create(config, &reference_comm, {}));
        PRL_RETURN_IF_ERROR(model->LoadFull(start));
        PRL_RETURN_IF_ERROR(reference->LoadFull(start));
        OptimizerConfig sgd;
        sgd.kind = OptimizerKind::kSgd;
        sgd.lr = 0.1;
        sgd.max_grad_norm = 0;
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> optimizer,
                             ShardedOptimizer::Create(sgd, model.get()));
        StepConfig step;
        step.micro_batch_tokens = 30;  // several micro-batches, each with a reference pass
        step.loss.kl = {kl_coef, KlEstimator::kK3, KlPenalty::kLoss};
        step.reference = reference.get();
        std::vector<double> kl;
        for (int i = 0; i < steps; ++i) {
          PRL_ASSIGN_OR_RETURN(StepResult result, TrainStep(*model, *optimizer, samples, step, i));
          kl.push_back(result.stats.reference_kl);
        }
        std::vector<float> reference_now(start.size());
        PRL_RETURN_IF_ERROR(reference->GatherFullParams(absl::MakeSpan(reference_now)));
        if (rank == 0) {
          run.reference_kl = kl;
          run.reference_unchanged = reference_now == start;
        }
        return absl::OkStatus();
      }));
  EXPECT_TRUE(status.ok()) << status;
  return run;
}

class ReferenceKlStepTest : public ::testing::TestWithParam<int> {};  // world size

TEST_P(ReferenceKlStepTest, TheReferenceStaysFrozenAndThePenaltyKeepsThePolicyNearIt) {
  const int steps = 6;
  const Trained unpulled = Train(1e-12, GetParam(), steps);  // on (a reference is run), no pull
  const Trained held = Train(0.5, GetParam(), steps);
  ASSERT_EQ(unpulled.reference_kl.size(), static_cast<size_t>(steps));
  ASSERT_EQ(held.reference_kl.size(), static_cast<size_t>(steps));
  // At the first step the policy is the reference: the same forward, bit for bit.
  EXPECT_EQ(unpulled.reference_kl[0], 0.0);
  EXPECT_EQ(held.reference_kl[0], 0.0);
  EXPECT_TRUE(unpulled.reference_unchanged);
  EXPECT_TRUE(held.reference_unchanged);
  EXPECT_GT(unpulled.reference_kl.back(), 1e-3);  // the policy moved away from the reference
  EXPECT_LT(held.reference_kl.back(), 0.5 * unpulled.reference_kl.back())
      << ::testing::PrintToString(held.reference_kl) << " vs "
      << ::testing::PrintToString(unpulled.reference_kl);
  // The world size changes nothing but summation order.
  if (GetParam() > 1) {
    const Trained one = Train(0.5, 1, steps);
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(held.reference_kl[i], one.reference_kl[i], 1e-4 * (1 + one.reference_kl[i]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReferenceKlStepTest, ::testing::Values(1, 2));

TEST(ReferenceKlStepErrorsTest, AStepWithThePenaltyButNoReferenceModelIsAnError) {
  const ModelConfig config = testing::TinyConfig();
  const std::vector<float> start = testing::RandomParameters(config, 6);
  absl::Status step_status;
  const absl::Status status = testing::AllRanksOk(
      testing::RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(config, &comm, {}));
        PRL_RETURN_IF_ERROR(model->LoadFull(start));
        StepConfig step;
        step.loss.kl.coef = 0.1;  // and no reference model
        EXPECT_TRUE(ValidateStepConfig(step).ok()) << "the values are valid";
        step_status = AccumulateGradients(*model, Samples(config), step, 0).status();
        return absl::OkStatus();
      }));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(absl::IsInvalidArgument(step_status));
  EXPECT_NE(step_status.message().find("needs a reference model"), std::string::npos)
      << step_status;
}

}  // namespace
}  // namespace prl::learner
