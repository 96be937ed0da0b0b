// A rank of a run of adapters, for the joint step's and the step batcher's tests: a frozen base
// (the tiny test model) and three adapters of different ranks and targets on it, each started
// trained-looking (B random), with its own samples (adapter 1 has more), loss normalisation
// and AdamW optimizer; one activation workspace for all, as the learner role lays them out.
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/status_macros.h"
#include "learner/frozen_base.h"
#include "learner/fsdp.h"
#include "learner/joint_step.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "model/lora.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner::testing {

inline LoraConfig TestLora(int64_t rank, double alpha, std::vector<std::string> targets) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = alpha;
  l.target_modules = std::move(targets);
  return l;
}

// n samples with advantages, seeded.
inline std::vector<TrainSample> TestSamples(const ModelConfig& c, int n, uint64_t seed) {
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

struct TestAdapter {
  LoraConfig lora;
  std::vector<TrainSample> samples;
  StepConfig step;
  std::unique_ptr<FsdpModel> model;
  std::unique_ptr<ShardedOptimizer> optimizer;
  std::vector<float> start;  // the adapter it started from

  AdapterStep Step(int64_t version = 3) const {
    return {model.get(), optimizer.get(), samples, &step, version};
  }
  absl::StatusOr<std::vector<float>> Params() const {
    std::vector<float> params(model->trained_elements());
    PRL_RETURN_IF_ERROR(model->GatherFullParams(absl::MakeSpan(params)));
    return params;
  }
};

struct TestAdapterRank {
  ModelConfig config = TinyConfig(false);
  ParameterSet base = *ParameterSet::Allocate(config, Device::Cpu(), false);
  std::unique_ptr<FrozenBase> frozen;
  std::vector<TestAdapter> adapters;

  // Over `comm` (a world of one), the base file in `dir`.
  static absl::StatusOr<std::unique_ptr<TestAdapterRank>> Make(collective::Communicator& comm,
                                                               const std::string& dir,
                                                               int64_t micro_batch_tokens) {
    auto r = std::make_unique<TestAdapterRank>();
    const ModelConfig& c = r->config;
    const std::vector<float> full = RandomParameters(c, 17);
    std::copy(full.begin(), full.end(), r->base.data());
    PRL_ASSIGN_OR_RETURN(
        r->frozen, FrozenBase::Share(FrozenBasePath(dir, c), c, &r->base, absl::OkStatus(), comm));
    r->adapters.resize(3);
    r->adapters[0].lora = TestLora(4, 8, {"all-linear"});
    r->adapters[1].lora = TestLora(2, 3, {"q_proj", "v_proj"});
    r->adapters[2].lora = TestLora(3, 6, {"o_proj", "down_proj"});
    auto workspace = std::make_shared<Arena>(Device::Cpu());
    for (size_t k = 0; k < r->adapters.size(); ++k) {
      TestAdapter& a = r->adapters[k];
      a.samples = TestSamples(c, k == 1 ? 12 : 5, 31 + k);
      a.step.micro_batch_tokens = micro_batch_tokens;
      a.step.loss.normalization =
          k == 2 ? LossNormalization::kSequenceMean : LossNormalization::kGlobalTokens;
      FsdpOptions options;
      options.lora = a.lora;
      options.frozen_base = r->frozen.get();
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
      a.start.assign(start.data(), start.data() + start.layout.num_elements());
      PRL_RETURN_IF_ERROR(a.model->LoadFull(a.start));
      OptimizerConfig opt;
      opt.lr = 1e-2;
      opt.weight_decay = 0.1;
      PRL_ASSIGN_OR_RETURN(a.optimizer, ShardedOptimizer::Create(opt, a.model.get()));
    }
    return r;
  }
};

// max |a - b| / max |b|.
inline double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(double{a[i]} - b[i]));
    den = std::max(den, std::fabs(double{b[i]}));
  }
  return num / den;
}

}  // namespace prl::learner::testing
