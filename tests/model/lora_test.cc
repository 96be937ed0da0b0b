// LoRA adapters (model/lora.h, model/lora_layer.h) with PEFT's semantics, on the CPU:
// - the config's errors name the field, the expected and the found value;
// - the layout holds PEFT's tensor names and shapes, in order;
// - at creation (A random, B zero) an adapter leaves the model's log-probs bit for bit;
// - with random A and B the log-probs equal the base model's with the adapters merged into its
//   weights in float64 (W' = W + scale B A, PEFT's merge_and_unload), and the gradients follow
//   the chain rule through that merge: dB = scale dW' A^T, dA = scale B^T dW' (float64 from the
//   merged model's own gradient dW'), while the base weights' gradients equal the merged
//   model's — for Qwen2 (biases, every target), Qwen3 (q/k norms, attention targets) and a
//   Qwen3-MoE model (attention targets), with rank, alpha and rsLoRA varied;
// - with a frozen base (no base gradients asked for) the adapters' gradients are the same bits;
// - MergeLora's merged model gives the base-with-adapter's log-probs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/lora_merge.h"
#include "model/packed_batch.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl {
namespace {

ModelConfig Tiny(Architecture arch) {
  ModelConfig c;
  SetArchitecture(arch, /*attention_bias=*/false, &c);
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = arch == Architecture::kQwen2 ? 8 : 16;
  if (arch == Architecture::kQwen3Moe) {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.norm_topk_prob = true;
  }
  c.vocab_size = 50;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = arch != Architecture::kQwen2;
  return c;
}

double RelError(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<double> AsDouble(const Tensor& t) {
  return std::vector<double>(t.f32(), t.f32() + t.numel());
}

// The fused weight a target lives in, and its first row there.
std::pair<Tensor, int64_t> Home(const LayerParams& p, LoraTarget t, const ModelConfig& c) {
  const LoraSite site = LoraSiteOf(t, c);
  switch (t) {
    case LoraTarget::kQ:
    case LoraTarget::kK:
    case LoraTarget::kV:
      return {p.qkv_weight, site.out_col};
    case LoraTarget::kO:
      return {p.o_weight, 0};
    case LoraTarget::kGate:
    case LoraTarget::kUp:
      return {p.gate_up_weight, site.out_col};
    case LoraTarget::kDown:
      return {p.down_weight, 0};
  }
  return {};
}

TEST(LoraConfigTest, ErrorsNameTheFieldTheExpectedAndTheFoundValue) {
  const ModelConfig dense = Tiny(Architecture::kQwen2), moe = Tiny(Architecture::kQwen3Moe);
  auto error = [](const LoraConfig& l, const ModelConfig& m) {
    return std::string(ValidateLoraConfig(l, m).message());
  };
  LoraConfig l;
  l.rank = 0;
  EXPECT_EQ(error(l, dense), "lora.rank: expected 1 to 1024, found 0");
  l = {};
  l.alpha = -1;
  EXPECT_EQ(error(l, dense), "lora.alpha: expected a finite number > 0, found -1");
  l = {};
  l.target_modules = {"q_proj", "lm_head"};
  EXPECT_EQ(error(l, dense),
            "lora.target_modules: expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
            "down_proj or all-linear, found 'lm_head'");
  l = {};
  l.rank = 20;  // k_proj is 16 x 32
  EXPECT_EQ(error(l, dense), "lora.rank: expected at most 16 (k_proj is 16 x 32), found 20");
  l = {};
  l.target_modules = {"all-linear"};
  EXPECT_TRUE(ValidateLoraConfig(l, dense).ok());
  EXPECT_NE(error(l, moe).find("layer 0 of this Qwen3-MoE model is sparse"), std::string::npos)
      << error(l, moe);
  l.target_modules = {"q_proj", "o_proj"};
  EXPECT_TRUE(ValidateLoraConfig(l, moe).ok());
}

TEST(LoraLayoutTest, HoldsPeftsTensorNamesAndShapesInOrder) {
  const ModelConfig c = Tiny(Architecture::kQwen2);
  LoraConfig l;
  l.rank = 4;
  l.target_modules = {"v_proj", "down_proj"};
  const LoraLayout layout = *LoraLayout::Make(c, l);
  std::vector<std::string> names;
  for (const LoraEntry& e : layout.entries()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight",
                       "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight",
                       "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight",
                       "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight",
                       "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight",
                       "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight",
                       "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight",
                       "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"}));
  EXPECT_EQ(layout.entries()[0].shape, (std::vector<int64_t>{4, 32}));   // A (r, in)
  EXPECT_EQ(layout.entries()[1].shape, (std::vector<int64_t>{16, 4}));   // B (out, r)
  EXPECT_EQ(layout.entries()[2].shape, (std::vector<int64_t>{4, 48}));   // down: in I
  EXPECT_EQ(layout.entries()[3].shape, (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(layout.num_elements(), 2 * (4 * 32 + 16 * 4 + 4 * 48 + 32 * 4));
  EXPECT_DOUBLE_EQ(LoraScale(l), 16.0 / 4);
  l.rslora = true;
  EXPECT_DOUBLE_EQ(LoraScale(l), 16.0 / 2);
}

// An adapter made for another model (a wider MLP) is an error naming the layer, the target and
// both shapes, in the forward, not a kernel's abort.
TEST(LoraModelErrorsTest, AnAdapterOfAnotherModelIsAnErrorNamingTheShapes) {
  const ModelConfig c = Tiny(Architecture::kQwen2);
  ModelConfig wider = c;
  wider.intermediate_size = 64;
  LoraConfig l;
  l.rank = 2;
  l.target_modules = {"down_proj"};
  const LoraSet other = *LoraSet::Allocate(wider, l, Device::Cpu(), true);
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), true);
  ModelParams params = base.params;
  params.lora = &other.params;
  Transformer model(c, Device::Cpu());
  PackedBatch batch;
  batch.AddScored(std::vector<int32_t>{1, 2, 3}, 1);
  std::vector<float> lp(batch.num_tokens());
  const absl::Status s = model.Forward(params, batch, 1.0f, absl::MakeSpan(lp), false);
  EXPECT_EQ(s.message(),
            "LoRA adapter: layer 0 down_proj: expected F32 A 2 x 48 and B 32 x 2 on cpu, found A "
            "(2, 64) and B (32, 2) F32 on cpu (an adapter of another model?)");
}

struct Case {
  const char* name;
  Architecture arch;
  LoraConfig lora;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class LoraModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(LoraModelTest, AFreshAdapterIsTheIdentityAndATrainedOneIsItsMergeInFloat64) {
  const ModelConfig c = Tiny(GetParam().arch);
  const LoraConfig& lora = GetParam().lora;
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), false);
  InitializeParameters(base, 5, 0.2f);
  LoraSet adapter = *LoraSet::Allocate(c, lora, Device::Cpu(), false);
  InitializeLora(adapter, 9);
  for (const LoraEntry& e : adapter.layout.entries()) {
    const float* w = adapter.data() + e.offset;
    const double bound = 1.0 / std::sqrt(static_cast<double>(e.shape[1]));
    for (int64_t i = 0; i < e.numel; ++i) {
      if (e.is_a) {
        ASSERT_LE(std::fabs(w[i]), bound) << e.name;
      } else {
        ASSERT_EQ(w[i], 0.0f) << e.name;
      }
    }
  }
  PackedBatch batch;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  for (int len : {2, 17, 40}) {
    std::vector<int32_t> s(len);
    for (auto& t : s) t = tok(rng);
    batch.AddScored(s, 1);
  }
  const int64_t T = batch.num_tokens();
  std::vector<float> dlogprobs(T);
  for (int64_t t = 0; t < T; ++t) dlogprobs[t] = batch.targets[t] < 0 ? 0.0f : -0.5f + 0.1f * (t % 5);

  Transformer model(c, Device::Cpu());
  auto forward = [&](ModelParams params, const LoraParams* l, std::vector<float>* lp) {
    params.lora = l;
    lp->assign(T, 0.0f);
    ASSERT_TRUE(model.Forward(params, batch, 1.0f, absl::MakeSpan(*lp), true).ok());
  };
  std::vector<float> plain, fresh;
  forward(base.params, nullptr, &plain);
  forward(base.params, &adapter.params, &fresh);
  EXPECT_EQ(plain, fresh) << "B = 0: the adapter adds exactly zero";

  // A trained adapter: B random too.
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (const LoraEntry& e : adapter.layout.entries()) {
    if (e.is_a) continue;
    for (int64_t i = 0; i < e.numel; ++i) adapter.data()[e.offset + i] = n(rng);
  }
  const double scale = adapter.params.scale;
  ParameterSet merged = *ParameterSet::Allocate(c, Device::Cpu(), false);
  std::copy_n(base.data(), base.layout.num_elements(), merged.data());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int ti = 0; ti < kNumLoraTargets; ++ti) {
      const LoraTarget t = static_cast<LoraTarget>(ti);
      const LoraPair& pair = adapter.params.layers[l][t];
      if (!pair.defined()) continue;
      const LoraSite site = LoraSiteOf(t, c);
      const auto [w, row0] = Home(merged.params.layers[l], t, c);
      const int64_t r = pair.a.size(0);
      for (int64_t o = 0; o < site.out; ++o) {
        for (int64_t i = 0; i < site.in; ++i) {
          double delta = 0;
          for (int64_t j = 0; j < r; ++j) {
            delta += static_cast<double>(pair.b.f32()[o * r + j]) * pair.a.f32()[j * site.in + i];
          }
          float& x = w.f32()[(row0 + o) * site.in + i];
          x = static_cast<float>(x + scale * delta);
        }
      }
    }
  }
  std::vector<float> with_adapter, with_merge;
  ParameterSet grads = *ParameterSet::Allocate(c, Device::Cpu(), true);
  LoraSet adapter_grads = *LoraSet::Allocate(c, lora, Device::Cpu(), true);
  ModelParams g = grads.params;
  g.lora = &adapter_grads.params;
  forward(base.params, &adapter.params, &with_adapter);
  ModelParams with = base.params;
  with.lora = &adapter.params;
  ASSERT_TRUE(model.Backward(with, dlogprobs, g).ok());
  ParameterSet merged_grads = *ParameterSet::Allocate(c, Device::Cpu(), true);
  forward(merged.params, nullptr, &with_merge);
  ASSERT_TRUE(model.Backward(merged.params, dlogprobs, merged_grads.params).ok());

  double max_diff = 0;
  for (int64_t t = 0; t < T; ++t) {
    max_diff = std::max(max_diff, std::fabs(double{with_adapter[t]} - with_merge[t]));
  }
  EXPECT_LE(max_diff, 2e-5);
  EXPECT_NE(with_adapter, plain) << "a trained adapter changes the model";
  // The base's gradients are the merged model's (the same point of the loss).
  for (const ParamEntry& e : base.layout.entries()) {
    const Tensor got = grads.View(e), want = merged_grads.View(e);
    EXPECT_LE(RelError(AsDouble(got), AsDouble(want)), 1e-4) << e.name;
  }
  // A frozen base (no base gradients asked for): the adapters' gradients bit for bit.
  LoraSet frozen_grads = *LoraSet::Allocate(c, lora, Device::Cpu(), true);
  ModelParams only_adapters;
  only_adapters.lora = &frozen_grads.params;
  std::vector<float> again;
  forward(base.params, &adapter.params, &again);
  ASSERT_TRUE(model.Backward(with, dlogprobs, only_adapters).ok());
  EXPECT_EQ(0, std::memcmp(frozen_grads.data(), adapter_grads.data(), adapter_grads.buffer.bytes()))
      << "the adapters' gradients with a frozen base";
  // The adapters' gradients through W' = W + scale B A.
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int ti = 0; ti < kNumLoraTargets; ++ti) {
      const LoraTarget t = static_cast<LoraTarget>(ti);
      const LoraPair& pair = adapter.params.layers[l][t];
      if (!pair.defined()) continue;
      SCOPED_TRACE(::testing::Message() << "layer " << l << " " << LoraTargetName(t));
      const LoraSite site = LoraSiteOf(t, c);
      const auto [dw, row0] = Home(merged_grads.params.layers[l], t, c);
      const int64_t r = pair.a.size(0);
      std::vector<double> want_da(r * site.in, 0.0), want_db(site.out * r, 0.0);
      for (int64_t o = 0; o < site.out; ++o) {
        for (int64_t i = 0; i < site.in; ++i) {
          const double d = dw.f32()[(row0 + o) * site.in + i];
          for (int64_t j = 0; j < r; ++j) {
            want_db[o * r + j] += scale * d * pair.a.f32()[j * site.in + i];
            want_da[j * site.in + i] += scale * pair.b.f32()[o * r + j] * d;
          }
        }
      }
      const LoraPair& gp = adapter_grads.params.layers[l][t];
      EXPECT_LE(RelError(AsDouble(gp.a), want_da), 1e-4);
      EXPECT_LE(RelError(AsDouble(gp.b), want_db), 1e-4);
    }
  }
}

// MergeLora (model/lora_merge.h), what the LoRA learner publishes to the actors: the merged
// model's log-probs are the base-with-adapter's, to fp32 rounding (1e-5 absolute, as for
// packing the same sequences differently); unmerged, they differ by far more.
TEST_P(LoraModelTest, TheMergedModelGivesTheAdaptersLogprobs) {
  const ModelConfig c = Tiny(GetParam().arch);
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), false);
  InitializeParameters(base, 5, 0.2f);
  LoraSet adapter = *LoraSet::Allocate(c, GetParam().lora, Device::Cpu(), false);
  InitializeLora(adapter, 9);
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (const LoraEntry& e : adapter.layout.entries()) {
    if (e.is_a) continue;
    for (int64_t i = 0; i < e.numel; ++i) adapter.data()[e.offset + i] = normal(rng);
  }
  PackedBatch batch;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  for (int len : {3, 21, 33}) {
    std::vector<int32_t> s(len);
    for (auto& t : s) t = tok(rng);
    batch.AddScored(s, 1);
  }
  Transformer model(c, Device::Cpu());
  auto logprobs = [&](const ModelParams& params) {
    std::vector<float> lp(batch.num_tokens(), 0.0f);
    const absl::Status s = model.Forward(params, batch, 1.0f, absl::MakeSpan(lp), false);
    EXPECT_TRUE(s.ok()) << s;
    return lp;
  };
  ModelParams with = base.params;
  with.lora = &adapter.params;
  const std::vector<float> want = logprobs(with), plain = logprobs(base.params);
  MergeLora(adapter.params, c, base.params);
  const std::vector<float> got = logprobs(base.params);
  double worst = 0, moved = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    worst = std::max(worst, std::fabs(double{got[t]} - want[t]));
    moved = std::max(moved, std::fabs(double{plain[t]} - want[t]));
  }
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(moved, 1e-2) << "the adapter changes the model, so the check can fail";
}

LoraConfig Lora(int64_t rank, double alpha, bool rslora, std::vector<std::string> targets) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = alpha;
  l.rslora = rslora;
  l.target_modules = std::move(targets);
  return l;
}

INSTANTIATE_TEST_SUITE_P(
    Models, LoraModelTest,
    ::testing::Values(Case{"qwen2_all_linear", Architecture::kQwen2,
                           Lora(4, 8, false, {"all-linear"})},
                      Case{"qwen3_attention_rslora", Architecture::kQwen3,
                           Lora(2, 3, true, {"q_proj", "k_proj", "v_proj", "o_proj"})},
                      Case{"qwen3_mlp_only", Architecture::kQwen3,
                           Lora(8, 16, false, {"gate_proj", "up_proj", "down_proj"})},
                      Case{"qwen3_moe_attention", Architecture::kQwen3Moe,
                           Lora(3, 6, false, {"q_proj", "v_proj", "o_proj"})}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace prl
