// Activation checkpointing (model/activation_checkpointing.h): the recomputing passes give the
// passes that keep everything, bit for bit on the CPU, for every architecture, with FSDP's unit
// windows, replayed Qwen3-MoE routes, the load-balancing loss, LoRA adapters on a trained or a
// frozen base and kept or recomputed logits; and they lay out less.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "model/lora.h"
#include "model/transformer.h"
#include "tests/model/transformer_testing.h"

namespace prl {
namespace {

constexpr ActivationCheckpointing kNone = ActivationCheckpointing::kNone;
constexpr ActivationCheckpointing kSelective = ActivationCheckpointing::kSelective;
constexpr ActivationCheckpointing kFull = ActivationCheckpointing::kFull;

TransformerOptions With(ActivationCheckpointing mode, bool keep_logits = true) {
  TransformerOptions o;
  o.activation_checkpointing = mode;
  o.keep_logits = keep_logits;
  return o;
}

// What a training pass produces: log-probs, entropies, gradients (the base's, the adapters').
struct PassResult {
  std::vector<float> logprobs, entropies, grads, lora_grads;
  double load_balancing_loss = 0;
  bool operator==(const PassResult&) const = default;
};

// Forward + backward of sum_t d_t logprob_t with d_t varying by position (so every row's
// gradient differs), on `params` (with params.lora: the adapters' gradients too; frozen: only
// theirs).
PassResult TrainingPass(const Fixture& f, const TransformerOptions& options,
                        const PackedBatch& batch, const ModelParams& params,
                        const LoraLayout* lora_layout = nullptr, bool frozen = false,
                        double lb_weight = 0.0) {
  Transformer model(f.config, Device::Cpu(), options);
  PassResult r;
  r.logprobs.assign(batch.num_tokens(), 0.0f);
  EXPECT_TRUE(model.Forward(params, batch, 0.9f, absl::MakeSpan(r.logprobs), true).ok());
  r.entropies.assign(model.entropies().begin(), model.entropies().end());
  r.load_balancing_loss = model.load_balancing_loss();
  std::vector<float> d(batch.num_tokens());
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    d[t] = batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -0.5f + 0.125f * (t % 7);
  }
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ModelParams g = frozen ? ModelParams{} : grads.params;
  std::vector<float> lora_buffer;
  LoraParams lora_grads;
  if (lora_layout != nullptr) {
    lora_buffer.assign(lora_layout->num_elements(), 0.0f);
    lora_grads = lora_layout->Bind(lora_buffer.data(), Device::Cpu());
    lora_grads.scale = params.lora->scale;
    lora_grads.rank = params.lora->rank;
    g.lora = &lora_grads;
  }
  const absl::Status s = model.Backward(params, d, g, nullptr, lb_weight);
  EXPECT_TRUE(s.ok()) << s;
  if (!frozen) r.grads.assign(grads.data(), grads.data() + f.params.layout.num_elements());
  r.lora_grads = lora_buffer;
  return r;
}

// (model, mode)
class CheckpointingTest
    : public ::testing::TestWithParam<std::tuple<ArchitectureCase, ActivationCheckpointing>> {
 protected:
  const ArchitectureCase& model() const { return std::get<0>(GetParam()); }
  ActivationCheckpointing mode() const { return std::get<1>(GetParam()); }
  Fixture f = Fixture::Make(TinyConfig(std::get<0>(model()), std::get<1>(model()),
                                       std::get<2>(model()), std::get<3>(model())),
                            42);
};

TEST_P(CheckpointingTest, GradientsAreThoseOfKeepingEveryActivationBitForBit) {
  const PackedBatch batch = f.Batch(0, f.sequences.size());  // 4 packed sequences
  for (const bool keep_logits : {true, false}) {
    SCOPED_TRACE(keep_logits ? "kept logits" : "recomputed logits");
    const PassResult none = TrainingPass(f, With(kNone, keep_logits), batch, f.params.params);
    const PassResult checkpointed =
        TrainingPass(f, With(mode(), keep_logits), batch, f.params.params);
    EXPECT_EQ(checkpointed.logprobs, none.logprobs);
    EXPECT_EQ(checkpointed.entropies, none.entropies);
    ASSERT_EQ(checkpointed.grads.size(), none.grads.size());
    EXPECT_EQ(std::memcmp(checkpointed.grads.data(), none.grads.data(),
                          none.grads.size() * sizeof(float)),
              0);
  }
}

// Under FSDP a unit's parameters are bound only between Acquire and Release: the recomputation
// runs inside the backward's window of its layer (poisoned with NaN outside it).
TEST_P(CheckpointingTest, TheRecomputationReadsItsUnitOnlyInsideTheBackwardsWindow) {
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  Transformer plain(f.config, Device::Cpu());
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const std::vector<float> expected = Score(plain, f, batch, &grads);

  Transformer hooked(f.config, Device::Cpu(), With(mode()));
  ModelParams params, unit_grads;
  PoisoningHooks hooks(f.params, &params, &unit_grads);
  const std::vector<float> logprobs = ScoreThroughHooks(hooked, batch, hooks, params, unit_grads);
  EXPECT_EQ(logprobs, expected);
  const std::vector<float> g = hooks.Gradient();
  EXPECT_EQ(std::memcmp(g.data(), grads.data(), grads.buffer.bytes()), 0);
}

// A training pass lays out less the more it recomputes, and PlanPassBytes says how much before
// the pass runs.
TEST_P(CheckpointingTest, APassLaysOutWhatItsPlanSaysAndLessThanKeepingEverything) {
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  Transformer none(f.config, Device::Cpu(), With(kNone));
  Transformer checkpointed(f.config, Device::Cpu(), With(mode()));
  const int64_t T = batch.num_tokens(), B = batch.num_seqs();
  const int64_t R = std::count_if(batch.targets.begin(), batch.targets.end(),
                                  [](int32_t t) { return t != PackedBatch::kNoTarget; });
  for (Transformer* model : {&none, &checkpointed}) {
    std::vector<float> lp(T);
    ASSERT_TRUE(model->Forward(f.params.params, batch, 1.0f, absl::MakeSpan(lp), true).ok());
    EXPECT_EQ(model->last_pass_bytes(), model->PlanPassBytes(T, B, R, true));
  }
  EXPECT_LT(checkpointed.last_pass_bytes(), none.last_pass_bytes());
  // A forward-only pass never checkpoints: it keeps two layers' worth either way.
  EXPECT_EQ(checkpointed.PlanPassBytes(T, B, R, false), none.PlanPassBytes(T, B, R, false));
  if (mode() == kFull) {
    Transformer selective(f.config, Device::Cpu(), With(kSelective));
    EXPECT_LT(checkpointed.PlanPassBytes(T, B, R, true), selective.PlanPassBytes(T, B, R, true));
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CheckpointingTest,
                         ::testing::Combine(ArchitectureCases(), ::testing::Values(kSelective, kFull)),
                         [](const auto& info) {
                           return ArchitectureCaseName(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == kFull ? "Full" : "Selective");
                         });

// Qwen3-MoE with some positions replaying experts the router would not pick, and the
// load-balancing loss trained: the recomputed layers route as the forward did.
TEST(MoeCheckpointingTest, ReplayedRoutesAndTheLoadBalancingLossRecomputeAsTheForwardRan) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen3Moe, true, 2), 12);
  PackedBatch batch = f.Batch(0, f.sequences.size());
  const int64_t T = batch.num_tokens(), Lm = 2, K = 2, E = 4;
  batch.routes.assign(T * Lm * K, PackedBatch::kRouted);
  std::mt19937_64 rng(5);
  for (int64_t t = 0; t < T; t += 3) {  // every third position: two distinct random experts
    for (int64_t l = 0; l < Lm; ++l) {
      const int32_t first = static_cast<int32_t>(rng() % E);
      batch.routes[(t * Lm + l) * K] = first;
      batch.routes[(t * Lm + l) * K + 1] = static_cast<int32_t>((first + 1 + rng() % (E - 1)) % E);
    }
  }
  const PassResult none =
      TrainingPass(f, With(kNone), batch, f.params.params, nullptr, false, 0.01);
  EXPECT_GT(none.load_balancing_loss, 0.0);
  for (const ActivationCheckpointing mode : {kSelective, kFull}) {
    const PassResult r = TrainingPass(f, With(mode), batch, f.params.params, nullptr, false, 0.01);
    EXPECT_EQ(r.logprobs, none.logprobs);
    EXPECT_EQ(r.load_balancing_loss, none.load_balancing_loss);
    EXPECT_EQ(std::memcmp(r.grads.data(), none.grads.data(), none.grads.size() * sizeof(float)), 0)
        << (mode == kFull ? "full" : "selective");
  }
}

// LoRA adapters (on a dense model every linear, the MLP's too, which selective recomputes): the
// base's and the adapters' gradients, and a frozen base's adapter gradients, are none's.
TEST(LoraCheckpointingTest, AdaptersGradientsOnATrainedAndAFrozenBaseAreNonesBitForBit) {
  for (const Architecture arch : {Architecture::kQwen2, Architecture::kQwen3Moe}) {
    SCOPED_TRACE(ModelTypeName(arch));
    Fixture f = Fixture::Make(TinyConfig(arch, false, 2), 21);
    LoraConfig lora;
    lora.rank = 3;
    lora.alpha = 6;
    // A sparse MoE layer takes no MLP adapters: the attention's there.
    if (arch == Architecture::kQwen2) lora.target_modules = {"all-linear"};
    LoraSet adapter = *LoraSet::Allocate(f.config, lora, Device::Cpu(), false);
    InitializeLora(adapter, 9);
    std::mt19937_64 rng(4);
    std::normal_distribution<float> n(0.0f, 0.3f);
    for (const LoraEntry& e : adapter.layout.entries()) {  // B != 0: a trained adapter
      if (!e.is_a) {
        for (int64_t i = 0; i < e.numel; ++i) adapter.data()[e.offset + i] = n(rng);
      }
    }
    ModelParams params = f.params.params;
    params.lora = &adapter.params;
    const PackedBatch batch = f.Batch(0, f.sequences.size());
    for (const bool frozen : {false, true}) {
      const PassResult none = TrainingPass(f, With(kNone), batch, params, &adapter.layout, frozen);
      ASSERT_FALSE(none.lora_grads.empty());
      for (const ActivationCheckpointing mode : {kSelective, kFull}) {
        SCOPED_TRACE(::testing::Message() << (frozen ? "frozen base " : "trained base ")
                                          << (mode == kFull ? "full" : "selective"));
        const PassResult r = TrainingPass(f, With(mode), batch, params, &adapter.layout, frozen);
        EXPECT_EQ(r.logprobs, none.logprobs);
        EXPECT_EQ(r.lora_grads, none.lora_grads);
        EXPECT_EQ(r.grads, none.grads);
      }
    }
  }
}

}  // namespace
}  // namespace prl
