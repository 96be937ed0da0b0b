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
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::RunRanks;
using ::prl::learner::testing::ScratchDir;

// max |a - b| / max |b|.
double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(double{a[i]} - b[i]));
    den = std::max(den, std::fabs(double{b[i]}));
  }
  return num / den;
}

LoraConfig Lora(int64_t rank, double alpha, std::vector<std::string> targets) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = alpha;
  l.target_modules = std::move(targets);
  return l;
}

// A group's worth of samples with advantages, seeded.
std::vector<TrainSample> Samples(const ModelConfig& c, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::uniform_int_distribution<int> len(2, 9);
  std::normal_distribution<float> lp(-2.0f, 0.5f);
  std::vector<TrainSample> out;
  for (int i = 0; i < n; ++i) {
    TrainSample s;
    s.prompt.resize(len(rng));
    for (auto& t : s.prompt) t = tok(rng);
    s.completion.resize(len(rng));
    for (auto& t : s.completion) t = tok(rng);
    for (size_t t = 0; t < s.completion.size(); ++t) s.behaviour_logprobs.push_back(lp(rng));
    s.has_advantage = true;
    s.advantage = (i % 3) - 1.0 + 0.1 * i;
    out.push_back(s);
  }
  return out;
}

struct Adapter {
  LoraConfig lora;
  std::vector<TrainSample> samples;
  StepConfig step;
  std::unique_ptr<FsdpModel> model;
  std::unique_ptr<ShardedOptimizer> optimizer;
};

struct Result {
  std::vector<std::vector<float>> start, params;  // per adapter, before and after the step
  std::vector<StepStats> stats;
};

// The adapters' steps, joint (pass_tokens > 0) or each its own TrainStep.
Result Train(int64_t pass_tokens, int64_t micro_batch_tokens) {
  const ModelConfig c = testing::TinyConfig(false);
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), false);
  const std::vector<float> full = testing::RandomParameters(c, 17);
  std::copy(full.begin(), full.end(), base.data());
  ScratchDir dir("joint_step");
  Result out;
  const absl::Status status = RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
    PRL_ASSIGN_OR_RETURN(
        std::unique_ptr<FrozenBase> frozen,
        FrozenBase::Share(FrozenBasePath(dir.path(), c), c, &base, absl::OkStatus(), comm));
    std::vector<Adapter> adapters(3);
    adapters[0].lora = Lora(4, 8, {"all-linear"});
    adapters[1].lora = Lora(2, 3, {"q_proj", "v_proj"});
    adapters[2].lora = Lora(3, 6, {"o_proj", "down_proj"});
    auto workspace = std::make_shared<Arena>(Device::Cpu());
    for (size_t k = 0; k < adapters.size(); ++k) {
      Adapter& a = adapters[k];
      a.samples = Samples(c, k == 1 ? 12 : 5, 31 + k);  // adapter 1: more micro-batches
      a.step.micro_batch_tokens = micro_batch_tokens;
      a.step.loss.normalization =
          k == 2 ? LossNormalization::kSequenceMean : LossNormalization::kGlobalTokens;
      FsdpOptions options;
      options.lora = a.lora;
      options.frozen_base = frozen.get();
      options.transformer.shared_workspace = workspace;
      PRL_ASSIGN_OR_RETURN(a.model, FsdpModel::Create(c, &comm, options));
      LoraSet start = *LoraSet::Allocate(c, a.lora, Device::Cpu(), false);
      InitializeLora(start, 40 + k);
      std::mt19937_64 rng(50 + k);
      std::normal_distribution<float> normal(0.0f, 0.2f);
      for (const LoraEntry& e : start.layout.entries()) {
        if (e.is_a) continue;
        for (int64_t i = 0; i < e.numel; ++i) start.data()[e.offset + i] = normal(rng);
      }
      out.start.emplace_back(start.data(), start.data() + start.layout.num_elements());
      PRL_RETURN_IF_ERROR(a.model->LoadFull(out.start.back()));
      OptimizerConfig opt;
      opt.lr = 1e-2;
      opt.weight_decay = 0.1;
      PRL_ASSIGN_OR_RETURN(a.optimizer, ShardedOptimizer::Create(opt, a.model.get()));
    }
    std::vector<StepResult> results;
    if (pass_tokens > 0) {
      std::vector<AdapterStep> steps;
      for (Adapter& a : adapters) {
        steps.push_back({a.model.get(), a.optimizer.get(), a.samples, &a.step, 3});
      }
      PRL_ASSIGN_OR_RETURN(results, TrainJointStep(steps, pass_tokens));
    } else {
      for (Adapter& a : adapters) {
        PRL_ASSIGN_OR_RETURN(StepResult r, TrainStep(*a.model, *a.optimizer, a.samples, a.step, 3));
        results.push_back(r);
      }
    }
    for (size_t k = 0; k < adapters.size(); ++k) {
      std::vector<float> params(adapters[k].model->trained_elements());
      PRL_RETURN_IF_ERROR(adapters[k].model->GatherFullParams(absl::MakeSpan(params)));
      out.params.push_back(params);
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
      EXPECT_LE(RelativeDifference(joint.params[k], separate.params[k]), 1e-5);
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
    EXPECT_GT(RelativeDifference(separate.params[k], separate.start[k]), 1e-3) << "adapter " << k;
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
    options.lora = Lora(2, 4, {"q_proj"});
    options.frozen_base = frozen.get();
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> a, FsdpModel::Create(c, &comm, options));
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> b, FsdpModel::Create(c, &comm, options));
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> whole, FsdpModel::Create(c, &comm, {}));
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> oa,
                         ShardedOptimizer::Create({}, a.get()));
    const std::vector<TrainSample> samples = Samples(c, 2, 1);
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
