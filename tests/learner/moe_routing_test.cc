// learner.moe_routing (learner/train_step.h): a Qwen3-MoE step recomputes or replays the
// actor's experts, FSDP over 1 and 2 ranks, and counts the tokens whose recomputed experts
// differ from the recorded ones.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/status_macros.h"
#include "learner/train_step.h"
#include "model/transformer.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

using testing::AllRanksOk;
using testing::RandomParameters;
using testing::RunRanks;

// Two MoE layers of 4 experts (top 2, renormalised) around a dense one.
ModelConfig MoeConfig() {
  ModelConfig c = testing::TinyConfig(/*tied=*/false);
  SetArchitecture(Architecture::kQwen3Moe, /*attention_bias=*/false, &c);
  c.num_hidden_layers = 3;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  return c;
}

// The fp32 CPU batch-invariant mode, in which the engine routes as the learner, bit for bit
// (tests/inference_engine/engine_routes_test.cc).
FsdpOptions InvariantOptions() {
  FsdpOptions o;
  o.transformer.reduction_order = kernels::ReductionOrder::kBatchInvariant;
  return o;
}

// Samples whose routes are what the router of `full` chooses (as the engine records them in
// the batch-invariant mode), at the position that predicts each completion token.
std::vector<TrainSample> RoutedSamples(const ModelConfig& c, const std::vector<float>& full) {
  ParameterSet params = *ParameterSet::Allocate(c, Device::Cpu(), false);
  std::copy(full.begin(), full.end(), params.data());
  Transformer model(c, Device::Cpu(), InvariantOptions().transformer);
  std::vector<TrainSample> samples;
  const auto sequences = testing::RandomSequences(c, 5);
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& seq = sequences[i];
    if (seq.size() < 4) continue;
    TrainSample s;
    const size_t P = seq.size() / 2;
    s.prompt.assign(seq.begin(), seq.begin() + P);
    s.completion.assign(seq.begin() + P, seq.end());
    s.behaviour_logprobs.assign(s.completion.size(), -1.0f);
    // The step runs at learner version 1: even samples were sampled with its weights, odd ones
    // with the version before.
    s.versions.assign(s.completion.size(), i % 2 == 0 ? 1 : 0);
    s.has_advantage = true;
    s.advantage = i % 2 == 0 ? 1.0 : -0.5;
    PackedBatch batch;
    batch.AddScored(seq, static_cast<int64_t>(P));
    std::vector<float> lp(batch.num_tokens());
    EXPECT_TRUE(model.Forward(params.params, batch, 1.0f, absl::MakeSpan(lp), false).ok());
    const int64_t LK = c.num_moe_layers() * c.num_experts_per_tok;
    const auto routes = model.recomputed_routes();
    s.route_layers = static_cast<uint16_t>(c.num_moe_layers());
    s.route_top_k = static_cast<uint8_t>(c.num_experts_per_tok);
    s.routes.assign(routes.begin() + (P - 1) * LK, routes.end());
    EXPECT_EQ(s.routes.size(), s.completion.size() * LK);
    samples.push_back(std::move(s));
  }
  return samples;
}

struct StepOutcome {
  StepStats stats;
  std::vector<float> grads;
};

StepOutcome Step(const ModelConfig& c, const std::vector<float>& full,
                 const std::vector<TrainSample>& samples, MoeRouting routing, int world_size) {
  StepOutcome out;
  out.grads.resize(full.size());
  StepConfig config;
  config.moe_routing = routing;
  config.micro_batch_tokens = 40;
  const absl::Status status = AllRanksOk(
      RunRanks(world_size, [&](int rank, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(c, &comm, InvariantOptions()));
        PRL_RETURN_IF_ERROR(model->LoadFull(full));
        PRL_ASSIGN_OR_RETURN(StepStats stats, AccumulateGradients(*model, samples, config, 1));
        std::vector<float> grads(full.size());
        PRL_RETURN_IF_ERROR(model->GatherFullGrads(absl::MakeSpan(grads)));
        if (rank == 0) {
          out.stats = stats;
          out.grads = grads;
        }
        return absl::OkStatus();
      }));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Completion tokens of the samples sampled with version `version`.
int64_t CompletionTokens(const std::vector<TrainSample>& samples, int64_t version) {
  int64_t n = 0;
  for (const TrainSample& s : samples) {
    if (s.versions[0] == version) n += static_cast<int64_t>(s.completion.size());
  }
  return n;
}

class MoeRoutingTest : public ::testing::TestWithParam<int> {};  // world size

// The fp32 CPU batch-invariant learner routes every completion token as the actor's router
// did, whatever its micro-batches: nothing differs, and replaying those routes trains on
// bit-identical gradients.
TEST_P(MoeRoutingTest, RoutesOfTheSameRouterNeverMismatchAndReplayChangesNoBit) {
  const ModelConfig c = MoeConfig();
  const std::vector<float> full = RandomParameters(c, 3);
  const std::vector<TrainSample> samples = RoutedSamples(c, full);
  const StepOutcome recompute = Step(c, full, samples, MoeRouting::kRecompute, GetParam());
  const StepOutcome replay = Step(c, full, samples, MoeRouting::kReplay, GetParam());
  // Tokens of the step's own weights and of the version before are counted apart.
  EXPECT_EQ(recompute.stats.routed_tokens, CompletionTokens(samples, 1));
  EXPECT_EQ(recompute.stats.lagged_routed_tokens, CompletionTokens(samples, 0));
  EXPECT_GT(recompute.stats.lagged_routed_tokens, 0);
  EXPECT_EQ(recompute.stats.route_mismatches, 0);
  EXPECT_EQ(recompute.stats.lagged_route_mismatches, 0);  // (the same weights, in this test)
  EXPECT_EQ(replay.stats.route_mismatches, 0);
  EXPECT_EQ(std::memcmp(recompute.grads.data(), replay.grads.data(),
                        recompute.grads.size() * sizeof(float)),
            0);
}

// Recorded routes that the learner's router would not choose: recompute ignores them (its
// gradient is the unperturbed one) and replay trains on them; both count them.
TEST_P(MoeRoutingTest, PerturbedRoutesAreCountedAndOnlyReplayTrainsOnThem) {
  const ModelConfig c = MoeConfig();
  const std::vector<float> full = RandomParameters(c, 4);
  const std::vector<TrainSample> exact = RoutedSamples(c, full);
  std::vector<TrainSample> perturbed = exact;
  int64_t changed = 0;
  for (TrainSample& s : perturbed) {
    // Every third completion token's first MoE layer gets the two experts it did not choose.
    for (size_t t = 0; t < s.completion.size(); t += 3, ++changed) {
      uint8_t* r = s.routes.data() + t * 2 * 2;
      uint8_t other[2], k = 0;
      for (uint8_t e = 0; e < 4; ++e) {
        if (e != r[0] && e != r[1]) other[k++] = e;
      }
      r[0] = other[1];
      r[1] = other[0];
    }
  }
  const StepOutcome base = Step(c, full, exact, MoeRouting::kRecompute, GetParam());
  const StepOutcome recompute = Step(c, full, perturbed, MoeRouting::kRecompute, GetParam());
  const StepOutcome replay = Step(c, full, perturbed, MoeRouting::kReplay, GetParam());
  EXPECT_EQ(recompute.stats.route_mismatches + recompute.stats.lagged_route_mismatches, changed);
  // The router's own choice is compared; replayed experts in the first MoE layer may move the
  // second's choice too.
  EXPECT_GE(replay.stats.route_mismatches + replay.stats.lagged_route_mismatches, changed);
  EXPECT_EQ(
      std::memcmp(base.grads.data(), recompute.grads.data(), base.grads.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(base.grads.data(), replay.grads.data(), base.grads.size() * sizeof(float)),
            0);
  EXPECT_NE(replay.stats.loss.loss, base.stats.loss.loss);
}

TEST(MoeRoutingErrorsTest, RoutesOfAnotherShapeAreAnErrorNamingTheSample) {
  const ModelConfig c = MoeConfig();
  const std::vector<float> full = RandomParameters(c, 5);
  std::vector<TrainSample> samples = RoutedSamples(c, full);
  samples[1].route_top_k = 3;
  const absl::Status status = AllRanksOk(RunRanks(1, [&](int, collective::Communicator& comm) {
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model, FsdpModel::Create(c, &comm, {}));
    PRL_RETURN_IF_ERROR(model->LoadFull(full));
    return AccumulateGradients(*model, samples, {}, 0).status();
  }));
  EXPECT_NE(status.message().find("sample 1: routes"), std::string::npos) << status;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MoeRoutingTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

}  // namespace
}  // namespace prl::learner
