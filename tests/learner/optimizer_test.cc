// ShardedOptimizer (learner/optimizer.h) against an independent float64 AdamW and SGD written
// here from their documented semantics (torch.optim.AdamW with decoupled weight decay, SGD
// with L2 decay, both decaying matrices only; torch.nn.utils.clip_grad_norm_ at the global
// norm over all ranks), at world sizes 1 and 2, the ranks as threads over Gloo. Gradients are
// written straight into the gradient shards: no model passes, so every difference is the
// optimizer's.
//
// Tolerance. The kernels keep parameters and moments in fp32; the reference in float64 from
// the same fp32 gradients. Each step rounds a parameter about twice (decay, update: 2^-24
// relative each) and computes an update of at most ~lr with ~10 fp32 roundings, so five steps
// of lr 1e-2 on parameters |p| < 1.5 differ by at most ~5 * (2 * 6e-8 * |p| + 1e-2 * 6e-7),
// about 1e-6: the bound is 4e-6 (1 + |p|). What the test must catch is far larger: decaying a
// norm weight (|p| ~ 1) moves it by lr * wd ~ 1e-3 per step, a wrong bias correction or clip
// scale changes the update by O(lr). The gradient norm is a float64 sum of exact squares of
// fp32 values in another order: 1e-11 relative.
#include "learner/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "tests/learner/learner_testing.h"
#include "tests/status_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::AllRanksOk;
using ::prl::learner::testing::RunRanks;
using ::prl::learner::testing::ShardOf;

constexpr double kParamTolerance = 4e-6;  // times (1 + |p|), see above
constexpr double kNormTolerance = 1e-11;  // relative

// float64 AdamW / SGD over the full parameter vector, from the documented formulas.
class ReferenceOptimizer {
 public:
  ReferenceOptimizer(const OptimizerConfig& config, const ModelConfig& model,
                     const std::vector<float>& params)
      : config_(config),
        p_(params.begin(), params.end()),
        m_(params.size(), 0.0),
        v_(params.size(), 0.0),
        decay_(params.size(), false) {
    // Matrices (embeddings, projections, the head) decay; norms and biases do not.
    const ParameterLayout layout(model);
    for (const ParamEntry& e : layout.entries()) {
      if (e.shape.size() >= 2) std::fill_n(decay_.begin() + e.offset, e.numel, true);
    }
  }

  OptimizerStepResult Step(const std::vector<float>& grad) {
    OptimizerStepResult result;
    double sum_sq = 0;
    for (const float g : grad) sum_sq += double{g} * g;
    result.grad_norm = std::sqrt(sum_sq);
    if (config_.max_grad_norm > 0) {
      result.clip_scale = std::min(1.0, config_.max_grad_norm / (result.grad_norm + 1e-6));
    }
    ++step_;
    const double lr = config_.lr, wd = config_.weight_decay;
    const double b1 = config_.beta1, b2 = config_.beta2;
    for (size_t i = 0; i < p_.size(); ++i) {
      const double g = result.clip_scale * grad[i];
      if (config_.kind == OptimizerKind::kSgd) {
        p_[i] -= lr * (g + (decay_[i] ? wd * p_[i] : 0.0));
        continue;
      }
      m_[i] = b1 * m_[i] + (1 - b1) * g;
      v_[i] = b2 * v_[i] + (1 - b2) * g * g;
      if (decay_[i]) p_[i] -= lr * wd * p_[i];
      const double m_hat = m_[i] / (1 - std::pow(b1, step_));
      const double v_hat = v_[i] / (1 - std::pow(b2, step_));
      p_[i] -= lr * m_hat / (std::sqrt(v_hat) + config_.eps);
    }
    return result;
  }

  const std::vector<double>& params() const { return p_; }
  std::vector<float> exp_avg() const { return {m_.begin(), m_.end()}; }
  std::vector<float> exp_avg_sq() const { return {v_.begin(), v_.end()}; }

 private:
  OptimizerConfig config_;
  std::vector<double> p_, m_, v_;
  std::vector<bool> decay_;
  int64_t step_ = 0;
};

// What the sharded optimizer produced, per rank.
struct ShardedRun {
  std::vector<std::vector<OptimizerStepResult>> results;  // [rank][step]
  std::vector<std::vector<float>> exp_avg, exp_avg_sq;    // [rank]: the local moments
  std::vector<int64_t> state_bytes;                       // [rank]
  std::vector<float> params;                              // gathered after the last step
};

// Loads `init` at `world_size`, then steps once per gradient, each rank's shard of it written
// into its gradient shard.
ShardedRun RunSharded(const OptimizerConfig& config, const ModelConfig& model_config,
                      int world_size, const std::vector<float>& init,
                      const std::vector<std::vector<float>>& grads) {
  ShardedRun run;
  run.results.resize(world_size);
  run.exp_avg.resize(world_size);
  run.exp_avg_sq.resize(world_size);
  run.state_bytes.resize(world_size);
  run.params.resize(init.size());
  const absl::Status status = AllRanksOk(
      RunRanks(world_size, [&](int rank, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(model_config, &comm, {}));
        PRL_RETURN_IF_ERROR(model->LoadFull(init));
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> optimizer,
                             ShardedOptimizer::Create(config, model.get()));
        for (const std::vector<float>& grad : grads) {
          const std::vector<float> shard = ShardOf(grad, model_config, rank, world_size);
          std::copy(shard.begin(), shard.end(), model->grad_shard().begin());
          PRL_ASSIGN_OR_RETURN(const OptimizerStepResult result, optimizer->Step());
          run.results[rank].push_back(result);
        }
        run.exp_avg[rank].assign(optimizer->exp_avg().begin(), optimizer->exp_avg().end());
        run.exp_avg_sq[rank].assign(optimizer->exp_avg_sq().begin(), optimizer->exp_avg_sq().end());
        run.state_bytes[rank] = optimizer->state_bytes();
        std::vector<float> params(init.size());
        PRL_RETURN_IF_ERROR(model->GatherFullParams(absl::MakeSpan(params)));
        if (rank == 0) run.params = params;
        return absl::OkStatus();
      }));
  EXPECT_TRUE(status.ok()) << status;
  return run;
}

OptimizerConfig Config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = 1e-2;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.max_grad_norm = 1.0;
  return c;
}

// Five steps of U(-1, 1) gradients scaled so that their norms (~76 unscaled) are clipped at
// steps 1, 3 and 4 and not at 2 and 5: a different clip scale every step, which AdamW's
// invariance to a constant gradient scale cannot hide.
std::vector<std::vector<float>> StepGradients(size_t n) {
  std::vector<std::vector<float>> grads;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const float scale : {1.0f, 1e-3f, 0.02f, 0.5f, 3e-3f}) {
    std::vector<float> g(n);
    for (float& x : g) x = scale * u(rng);
    grads.push_back(std::move(g));
  }
  return grads;
}

// Steps the reference and the sharded optimizer on the same gradients and compares the step
// results, the parameters and the moments.
void ExpectMatchesReference(OptimizerKind kind, int world_size) {
  const ModelConfig model = testing::TinyConfig();
  const std::vector<float> init = testing::RandomParameters(model, 3);
  const std::vector<std::vector<float>> grads = StepGradients(init.size());
  const OptimizerConfig config = Config(kind);
  ReferenceOptimizer reference(config, model, init);
  std::vector<OptimizerStepResult> expected;
  for (const auto& g : grads) expected.push_back(reference.Step(g));
  const ShardedRun run = RunSharded(config, model, world_size, init, grads);

  for (int rank = 0; rank < world_size; ++rank) {
    ASSERT_EQ(run.results[rank].size(), expected.size());
    for (size_t s = 0; s < expected.size(); ++s) {
      const OptimizerStepResult& got = run.results[rank][s];
      EXPECT_NEAR(got.grad_norm, expected[s].grad_norm, kNormTolerance * expected[s].grad_norm)
          << "rank " << rank << " step " << s + 1;
      EXPECT_NEAR(got.clip_scale, expected[s].clip_scale, kNormTolerance)
          << "rank " << rank << " step " << s + 1;
    }
  }
  double worst = 0;
  for (size_t i = 0; i < init.size(); ++i) {
    const double want = reference.params()[i];
    ASSERT_NEAR(run.params[i], want, kParamTolerance * (1 + std::fabs(want))) << "element " << i;
    worst = std::max(worst, std::fabs(run.params[i] - want) / (1 + std::fabs(want)));
  }
  ::testing::Test::RecordProperty("worst_param_error", absl::StrCat(worst));
  std::printf("worst parameter error / (1 + |p|): %.3e\n", worst);
  // The moments live beside each rank's shard (SGD keeps none).
  for (int rank = 0; rank < world_size; ++rank) {
    if (kind == OptimizerKind::kSgd) {
      EXPECT_TRUE(run.exp_avg[rank].empty() && run.exp_avg_sq[rank].empty());
      continue;
    }
    const std::vector<float> m = ShardOf(reference.exp_avg(), model, rank, world_size);
    const std::vector<float> v = ShardOf(reference.exp_avg_sq(), model, rank, world_size);
    ASSERT_EQ(run.exp_avg[rank].size(), m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      // fp32 moments: 1e-5 relative, and absolute 1e-8 (m) and 1e-10 (v), about 1e-6 of the
      // largest clipped gradient (~0.013) and of its square, where sums cancel.
      ASSERT_NEAR(run.exp_avg[rank][i], m[i], 1e-5 * std::fabs(m[i]) + 1e-8) << "m " << i;
      ASSERT_NEAR(run.exp_avg_sq[rank][i], v[i], 1e-5 * v[i] + 1e-10) << "v " << i;
    }
  }
}

class OptimizerTest : public ::testing::TestWithParam<int> {};

TEST_P(OptimizerTest, AdamWMatchesFloat64ReferenceWithDecayOnMatricesOnly) {
  ExpectMatchesReference(OptimizerKind::kAdamW, GetParam());
}

TEST_P(OptimizerTest, SgdMatchesFloat64ReferenceWithDecayOnMatricesOnly) {
  ExpectMatchesReference(OptimizerKind::kSgd, GetParam());
}

// With a zero gradient only weight decay moves anything: matrices shrink by (1 - lr wd) = 0.95
// (to fp32 rounding), norms and biases keep their bits. At world size 2 shard boundaries cut
// tensors, so the decayed runs of a shard start and end inside units.
TEST_P(OptimizerTest, WeightDecayAppliesToMatricesOnly) {
  const int world_size = GetParam();
  const ModelConfig model = testing::TinyConfig();
  const std::vector<float> init = testing::RandomParameters(model, 4);
  OptimizerConfig config = Config(OptimizerKind::kSgd);
  config.lr = 0.5;
  const std::vector<std::vector<float>> zero = {std::vector<float>(init.size(), 0.0f)};
  const ShardedRun run = RunSharded(config, model, world_size, init, zero);
  const ParameterLayout layout(model);
  for (const ParamEntry& e : layout.entries()) {
    const bool matrix = e.shape.size() >= 2;
    for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
      if (matrix) {
        ASSERT_NEAR(run.params[i], 0.95 * init[i], 1e-6 * std::fabs(init[i])) << e.name << " " << i;
      } else {
        ASSERT_EQ(run.params[i], init[i]) << e.name << " element " << i;
      }
    }
  }
}

// Rank 1's gradient is 100 times smaller than rank 0's: a rank that clipped at its local norm
// would report it, and scale its shard by another factor.
TEST(OptimizerClipTest, ClippingUsesTheGlobalNormAcrossRanks) {
  const ModelConfig model = testing::TinyConfig();
  const std::vector<float> init = testing::RandomParameters(model, 6);
  std::vector<float> grad = StepGradients(init.size())[0];
  const std::vector<UnitShard> plan = PlanShards(ParameterLayout(model), 2);
  for (const UnitShard& u : plan) {
    for (int64_t i = u.shard; i < u.numel; ++i) grad[u.begin + i] *= 0.01f;  // rank 1's part
  }
  const OptimizerConfig config = Config(OptimizerKind::kSgd);
  ReferenceOptimizer reference(config, model, init);
  const OptimizerStepResult expected = reference.Step(grad);
  ASSERT_LT(expected.clip_scale, 1.0) << "the step must clip for the test to mean anything";
  const ShardedRun run = RunSharded(config, model, 2, init, {grad});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NEAR(run.results[rank][0].grad_norm, expected.grad_norm,
                kNormTolerance * expected.grad_norm)
        << "rank " << rank;
    EXPECT_NEAR(run.results[rank][0].clip_scale, expected.clip_scale, kNormTolerance)
        << "rank " << rank;
  }
  for (size_t i = 0; i < init.size(); ++i) {
    const double want = reference.params()[i];
    ASSERT_NEAR(run.params[i], want, kParamTolerance * (1 + std::fabs(want))) << "element " << i;
  }
}

// AdamW's moments are sharded with the parameters.
TEST(OptimizerMemoryTest, OptimizerStateShrinksWithWorldSize) {
  const ModelConfig model = testing::TinyConfig();
  const std::vector<float> init = testing::RandomParameters(model, 7);
  const ShardedRun one = RunSharded(Config(OptimizerKind::kAdamW), model, 1, init, {});
  const ShardedRun two = RunSharded(Config(OptimizerKind::kAdamW), model, 2, init, {});
  const int64_t full_moments = 2 * static_cast<int64_t>(init.size() * sizeof(float));
  EXPECT_EQ(one.state_bytes[0], full_moments);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_LT(two.state_bytes[rank], one.state_bytes[0]);
    EXPECT_GE(2 * two.state_bytes[rank], one.state_bytes[0]);
  }
  EXPECT_EQ(RunSharded(Config(OptimizerKind::kSgd), model, 2, init, {}).state_bytes[0], 0);
}

// One infinite gradient element on one rank: every rank refuses the step, names the norm, and
// leaves parameters and step count as they were.
TEST(OptimizerNonFiniteTest, NonFiniteGradientSkipsTheStepOnEveryRank) {
  const ModelConfig model = testing::TinyConfig();
  const std::vector<float> init = testing::RandomParameters(model, 8);
  std::vector<float> grad(init.size(), 0.01f);
  grad.back() = std::numeric_limits<float>::infinity();  // in the last rank's shard
  std::vector<float> params(init.size());
  const std::vector<absl::Status> status =
      RunRanks(2, [&](int rank, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> fsdp, FsdpModel::Create(model, &comm, {}));
        PRL_RETURN_IF_ERROR(fsdp->LoadFull(init));
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> optimizer,
                             ShardedOptimizer::Create(Config(OptimizerKind::kAdamW), fsdp.get()));
        const std::vector<float> shard = ShardOf(grad, model, rank, 2);
        std::copy(shard.begin(), shard.end(), fsdp->grad_shard().begin());
        const absl::Status step = optimizer->Step().status();
        EXPECT_EQ(optimizer->step(), 0) << "rank " << rank;
        std::vector<float> gathered(init.size());
        PRL_RETURN_IF_ERROR(fsdp->GatherFullParams(absl::MakeSpan(gathered)));
        if (rank == 0) params = gathered;
        return step;
      });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(::prl::testing::IsError(status[rank], absl::StatusCode::kInvalidArgument,
                                        {"gradient norm is inf", "parameters are unchanged"}))
        << "rank " << rank;
  }
  EXPECT_EQ(std::memcmp(params.data(), init.data(), init.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, OptimizerTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

}  // namespace
}  // namespace prl::learner
