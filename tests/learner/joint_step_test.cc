// The joint step of a run of adapters (learner/joint_step.h), on one rank's frozen base:
// - three adapters of different ranks and targets, each with its own samples and loss settings,
//   trained in one joint step end where their separate TrainSteps end: the updated adapters
//   within 1e-5 relative, the losses and entropies within 1e-5, the token counts exact; whatever
//   the pass_tokens (every adapter in one pass, or one per pass) and micro-batch budgets;
// - an adapter with more micro-batches than the others trains them all (the others do not hold
//   it back, nor it them);
// - steps that cannot be joint are refused naming the step and what differs.
#include "learner/joint_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "learner/frozen_base.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "model/lora.h"
#include "tests/learner/adapter_rank_testing.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::MaxRelativeDifference;
using ::prl::learner::testing::RunRanks;
using ::prl::learner::testing::ScratchDir;
using ::prl::learner::testing::TestAdapter;
using ::prl::learner::testing::TestAdapterRank;
using ::prl::learner::testing::TestLora;
using ::prl::learner::testing::TestSamples;

struct Result {
  std::vector<std::vector<float>> start, params;  // per adapter, before and after the step
  std::vector<StepStats> stats;
};

// The adapters' steps, joint (pass_tokens > 0) or each its own TrainStep.
Result Train(int64_t pass_tokens, int64_t micro_batch_tokens) {
  ScratchDir dir("joint_step");
  Result out;
  const absl::Status status = RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<TestAdapterRank> rank,
                         TestAdapterRank::Make(comm, dir.path(), micro_batch_tokens));
    std::vector<StepResult> results;
    if (pass_tokens > 0) {
      std::vector<AdapterStep> steps;
      for (const TestAdapter& a : rank->adapters) steps.push_back(a.Step());
      PRL_ASSIGN_OR_RETURN(results, TrainJointStep(steps, pass_tokens));
    } else {
      for (const TestAdapter& a : rank->adapters) {
        PRL_ASSIGN_OR_RETURN(StepResult r, TrainStep(*a.model, *a.optimizer, a.samples, a.step, 3));
        results.push_back(r);
      }
    }
    for (size_t k = 0; k < rank->adapters.size(); ++k) {
      out.start.push_back(rank->adapters[k].start);
      PRL_ASSIGN_OR_RETURN(std::vector<float> params, rank->adapters[k].Params());
      out.params.push_back(std::move(params));
      out.stats.push_back(results[k].stats);
    }
    return absl::OkStatus();
  })[0];
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(JointStepTest, EachAdapterEndsWhereItsOwnStepEnds) {
  const Result separate = Train(0, 40);
  ASSERT_EQ(separate.params.size(), 3u);
  EXPECT_GT(separate.stats[1].micro_batches, separate.stats[0].micro_batches)
      << "adapter 1 has more micro-batches than the others";
  for (const auto& [pass_tokens, micro_batch_tokens] :
       std::vector<std::pair<int64_t, int64_t>>{{4096, 40}, {1, 40}, {60, 40}, {4096, 4096}}) {
    SCOPED_TRACE(::testing::Message()
                 << "pass_tokens " << pass_tokens << ", micro-batch tokens " << micro_batch_tokens);
    const Result joint = Train(pass_tokens, micro_batch_tokens);
    ASSERT_EQ(joint.params.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      SCOPED_TRACE(::testing::Message() << "adapter " << k);
      EXPECT_LE(MaxRelativeDifference(joint.params[k], separate.params[k]), 1e-5);
      const LossStats &j = joint.stats[k].loss, &s = separate.stats[k].loss;
      EXPECT_NEAR(j.loss, s.loss, 1e-5 * std::max(1.0, std::fabs(s.loss)));
      EXPECT_EQ(j.tokens, s.tokens);
      EXPECT_EQ(j.sequences, s.sequences);
      EXPECT_EQ(joint.stats[k].input_tokens, separate.stats[k].input_tokens);
      EXPECT_NEAR(joint.stats[k].policy_entropy, separate.stats[k].policy_entropy, 1e-5);
      EXPECT_NEAR(joint.stats[k].lag_mean, separate.stats[k].lag_mean, 0.0);
    }
  }
  // The check can fail: every adapter moved far more than the tolerance.
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_GT(MaxRelativeDifference(separate.params[k], separate.start[k]), 1e-3)
        << "adapter " << k;
  }
}

TEST(JointStepTest, StepsThatCannotBeJointAreRefusedNamingWhatDiffers) {
  const ModelConfig c = testing::TinyConfig(false);
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), false);
  ScratchDir dir("joint_step_refused");
  const absl::Status status = RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
    PRL_ASSIGN_OR_RETURN(
        std::unique_ptr<FrozenBase> frozen,
        FrozenBase::Share(FrozenBasePath(dir.path(), c), c, &base, absl::OkStatus(), comm));
    FsdpOptions options;
    options.lora = TestLora(2, 4, {"q_proj"});
    options.frozen_base = frozen.get();
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> a, FsdpModel::Create(c, &comm, options));
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> b, FsdpModel::Create(c, &comm, options));
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> whole, FsdpModel::Create(c, &comm, {}));
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> oa,
                         ShardedOptimizer::Create({}, a.get()));
    const std::vector<TrainSample> samples = TestSamples(c, 2, 1);
    StepConfig hot, cold;
    cold.temperature = 0.5f;
    std::vector<AdapterStep> steps = {{a.get(), oa.get(), samples, &hot, 0},
                                      {b.get(), oa.get(), samples, &cold, 0}};
    absl::Status s = CheckJointStep(steps);
    EXPECT_NE(s.message().find("adapter step 1: expected the first step's temperature 1, found "
                               "0.5"),
              std::string::npos)
        << s;
    steps[1] = {whole.get(), oa.get(), samples, &hot, 0};
    s = CheckJointStep(steps);
    EXPECT_NE(s.message().find("adapter step 1: expected an adapter's model at world size 1, "
                               "found a model of every weight"),
              std::string::npos)
        << s;
    steps[1] = {b.get(), oa.get(), {}, &hot, 0};
    s = CheckJointStep(steps);
    EXPECT_NE(s.message().find("adapter step 1: expected samples, found none"), std::string::npos)
        << s;
    EXPECT_FALSE(TrainJointStep(steps, 4096).ok());
    return absl::OkStatus();
  })[0];
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace prl::learner
