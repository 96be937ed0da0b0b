#include "model/parameters.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace prl {
namespace {

ModelConfig SmallConfig(Architecture arch, bool tied, bool attention_bias = false) {
  ModelConfig c;
  SetArchitecture(arch, attention_bias, &c);
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;  // H * D = 24 != C: o_proj is not square
  c.vocab_size = 11;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

// Qwen3-MoE with 4 experts (top 2) of width 10 in layers 1 and 2; layer 0 stays dense.
ModelConfig SmallMoeConfig(bool tied) {
  ModelConfig c = SmallConfig(Architecture::kQwen3Moe, tied);
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 10;
  c.mlp_only_layers = {0};
  return c;
}

// Every combination of biases (Qwen2 has q/k/v ones, Llama none, Qwen3 q/k/v/o ones or none)
// and tying.
std::vector<ModelConfig> AllVariants() {
  return {SmallConfig(Architecture::kQwen2, false),
          SmallConfig(Architecture::kQwen2, true),
          SmallConfig(Architecture::kLlama, false),
          SmallConfig(Architecture::kLlama, true),
          SmallConfig(Architecture::kQwen3, false),
          SmallConfig(Architecture::kQwen3, true, true),
          SmallMoeConfig(false),
          SmallMoeConfig(true)};
}

std::string Describe(const ModelConfig& c) {
  return absl::StrCat(ArchitectureName(c.arch), c.tie_word_embeddings ? " tied" : " untied",
                      c.o_bias ? " attention_bias" : "", c.has_moe() ? " moe" : "");
}

TEST(ParameterLayoutTest, ParameterCountEqualsTheSumOfTheEntries) {
  for (const ModelConfig& c : AllVariants()) {
    SCOPED_TRACE(Describe(c));
    const ParameterLayout layout(c);
    int64_t sum = 0;
    for (const ParamEntry& e : layout.entries()) sum += e.numel;
    EXPECT_EQ(ParameterCount(c), sum);
    EXPECT_EQ(layout.num_elements(), sum);
  }
}

TEST(ParameterLayoutTest, EntriesAreContiguousInBufferOrderWithNoGapsOrOverlaps) {
  for (const ModelConfig& c : AllVariants()) {
    SCOPED_TRACE(Describe(c));
    const ParameterLayout layout(c);
    int64_t next = 0;
    for (const ParamEntry& e : layout.entries()) {
      EXPECT_EQ(e.offset, next) << e.name;
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      EXPECT_EQ(e.numel, numel) << e.name;
      next = e.offset + e.numel;
    }
    EXPECT_EQ(next, layout.num_elements());
    EXPECT_EQ(layout.entries().front().name, "model.embed_tokens.weight");
    EXPECT_EQ(layout.entries().back().name,
              c.tie_word_embeddings ? "model.norm.weight" : "lm_head.weight");
    // 9 tensors per layer, 3 more with q/k/v biases, 1 with an o_proj bias, 2 with q/k norms;
    // a MoE layer has the router and 3 per expert instead of 3 MLP tensors.
    const size_t per_layer = 9 + (c.qkv_bias ? 3 : 0) + (c.o_bias ? 1 : 0) + (c.qk_norm ? 2 : 0);
    const size_t moe_extra = 1 + 3 * c.num_experts - 3;
    EXPECT_EQ(layout.entries().size(), 2 + per_layer * c.num_hidden_layers +
                                           moe_extra * c.num_moe_layers() +
                                           (c.tie_word_embeddings ? 0 : 1));
  }
}

TEST(ParameterLayoutTest, EntriesHaveTransformersNamesAndShapes) {
  const ModelConfig c = SmallConfig(Architecture::kQwen2, false);
  const ParameterLayout layout(c);
  const auto shape = [&](const char* name) {
    const ParamEntry* e = layout.Find(name);
    EXPECT_NE(e, nullptr) << name;
    return e ? e->shape : std::vector<int64_t>{};
  };
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(shape("model.embed_tokens.weight"), (Shape{11, 16}));
  EXPECT_EQ(shape("model.layers.2.input_layernorm.weight"), (Shape{16}));
  EXPECT_EQ(shape("model.layers.2.self_attn.q_proj.weight"), (Shape{24, 16}));
  EXPECT_EQ(shape("model.layers.2.self_attn.k_proj.weight"), (Shape{12, 16}));
  EXPECT_EQ(shape("model.layers.2.self_attn.v_proj.bias"), (Shape{12}));
  EXPECT_EQ(shape("model.layers.2.self_attn.o_proj.weight"), (Shape{16, 24}));
  EXPECT_EQ(shape("model.layers.2.mlp.gate_proj.weight"), (Shape{24, 16}));
  EXPECT_EQ(shape("model.layers.2.mlp.down_proj.weight"), (Shape{16, 24}));
  EXPECT_EQ(shape("lm_head.weight"), (Shape{11, 16}));
  EXPECT_EQ(layout.Find("model.layers.3.input_layernorm.weight"), nullptr);
}

TEST(ParameterLayoutTest, MoeLayersHaveTheRouterAndPerExpertTensorsUnderTransformersNames) {
  const ModelConfig c = SmallMoeConfig(false);
  const ParameterLayout layout(c);
  using Shape = std::vector<int64_t>;
  const auto shape = [&](const std::string& name) {
    const ParamEntry* e = layout.Find(name);
    EXPECT_NE(e, nullptr) << name;
    return e ? e->shape : Shape{};
  };
  EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (Shape{24, 16}));  // mlp_only_layers
  EXPECT_EQ(layout.Find("model.layers.0.mlp.gate.weight"), nullptr);
  for (int l : {1, 2}) {
    const std::string pre = absl::StrCat("model.layers.", l, ".mlp.");
    EXPECT_EQ(shape(pre + "gate.weight"), (Shape{4, 16}));
    EXPECT_EQ(layout.Find(pre + "gate_proj.weight"), nullptr);
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(shape(absl::StrCat(pre, "experts.", e, ".gate_proj.weight")), (Shape{10, 16}));
      EXPECT_EQ(shape(absl::StrCat(pre, "experts.", e, ".up_proj.weight")), (Shape{10, 16}));
      EXPECT_EQ(shape(absl::StrCat(pre, "experts.", e, ".down_proj.weight")), (Shape{16, 10}));
    }
  }
}

TEST(ParameterLayoutTest, ExpertStacksAreViewsOfEachExpertsGateUpAndDown) {
  const ModelConfig c = SmallMoeConfig(true);
  auto set = ParameterSet::Allocate(c, Device::Cpu(), /*zeroed=*/true);
  ASSERT_TRUE(set.ok());
  const float* base = set->data();
  const LayerParams& dense = set->params.layers[0];
  EXPECT_FALSE(dense.is_moe());
  EXPECT_TRUE(dense.gate_up_weight.defined());
  const LayerParams& lp = set->params.layers[2];
  ASSERT_TRUE(lp.is_moe());
  EXPECT_FALSE(lp.gate_up_weight.defined());
  const std::string pre = "model.layers.2.mlp.";
  EXPECT_EQ(lp.router_weight.data, base + set->layout.Find(pre + "gate.weight")->offset);
  for (int e = 0; e < 4; ++e) {
    const float* gate_up = lp.experts_gate_up.f32() + e * 20 * 16;
    EXPECT_EQ(
        gate_up,
        base + set->layout.Find(absl::StrCat(pre, "experts.", e, ".gate_proj.weight"))->offset);
    EXPECT_EQ(gate_up + 10 * 16,
              base + set->layout.Find(absl::StrCat(pre, "experts.", e, ".up_proj.weight"))->offset);
    EXPECT_EQ(
        lp.experts_down.f32() + e * 16 * 10,
        base + set->layout.Find(absl::StrCat(pre, "experts.", e, ".down_proj.weight"))->offset);
  }
}

TEST(ParameterLayoutTest, UnitRangesCoverTheBufferInOrderOnePerLayerPlusTwo) {
  for (const ModelConfig& c : AllVariants()) {
    SCOPED_TRACE(Describe(c));
    const ParameterLayout layout(c);
    const auto& units = layout.unit_ranges();
    ASSERT_EQ(static_cast<int64_t>(units.size()), c.num_hidden_layers + 2);
    int64_t next = 0;
    for (const auto& [begin, end] : units) {
      EXPECT_EQ(begin, next);
      EXPECT_LT(begin, end);
      next = end;
    }
    EXPECT_EQ(next, layout.num_elements());
    // Unit 0 is the embedding; unit 1 + l holds exactly layer l's tensors.
    EXPECT_EQ(units[0].second, layout.Find("model.embed_tokens.weight")->numel);
    for (const ParamEntry& e : layout.entries()) {
      size_t unit = units.size() - 1;
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (e.name.starts_with(absl::StrCat("model.layers.", l, "."))) unit = 1 + l;
      }
      if (e.name == "model.embed_tokens.weight") unit = 0;
      EXPECT_GE(e.offset, units[unit].first) << e.name;
      EXPECT_LE(e.offset + e.numel, units[unit].second) << e.name;
    }
  }
}

TEST(ParameterLayoutTest, QkvAndGateUpAreEachOneContiguousView) {
  for (const ModelConfig& c : AllVariants()) {
    SCOPED_TRACE(Describe(c));
    const ParameterLayout layout(c);
    std::vector<float> buffer(layout.num_elements());
    float* base = buffer.data();
    const ModelParams p = layout.Bind(base, Device::Cpu());
    ASSERT_EQ(static_cast<int64_t>(p.layers.size()), c.num_hidden_layers);
    const int64_t C = c.hidden_size;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string pre = absl::StrCat("model.layers.", l, ".");
      const auto* q = layout.Find(pre + "self_attn.q_proj.weight");
      const auto* k = layout.Find(pre + "self_attn.k_proj.weight");
      const auto* v = layout.Find(pre + "self_attn.v_proj.weight");
      ASSERT_TRUE(q && k && v);
      const LayerParams& lp = p.layers[l];
      EXPECT_EQ(lp.qkv_weight.data, base + q->offset);
      EXPECT_EQ(lp.qkv_weight.size(0), c.qkv_dim());
      EXPECT_EQ(lp.qkv_weight.size(1), C);
      EXPECT_EQ(k->offset, q->offset + c.q_dim() * C);
      EXPECT_EQ(v->offset, k->offset + c.kv_dim() * C);
      EXPECT_EQ(v->offset + v->numel, q->offset + lp.qkv_weight.numel());
      if (c.qkv_bias) {
        const auto* qb = layout.Find(pre + "self_attn.q_proj.bias");
        const auto* kb = layout.Find(pre + "self_attn.k_proj.bias");
        const auto* vb = layout.Find(pre + "self_attn.v_proj.bias");
        ASSERT_TRUE(qb && kb && vb);
        EXPECT_EQ(lp.qkv_bias.data, base + qb->offset);
        EXPECT_EQ(lp.qkv_bias.numel(), c.qkv_dim());
        EXPECT_EQ(kb->offset, qb->offset + c.q_dim());
        EXPECT_EQ(vb->offset, kb->offset + c.kv_dim());
      } else {
        EXPECT_FALSE(lp.qkv_bias.defined());
        EXPECT_EQ(layout.Find(pre + "self_attn.q_proj.bias"), nullptr);
      }
      const auto* gate = layout.Find(pre + "mlp.gate_proj.weight");
      const auto* up = layout.Find(pre + "mlp.up_proj.weight");
      if (c.IsMoeLayer(l)) continue;  // ExpertStacksAreViewsOfEachExpertsGateUpAndDown
      ASSERT_TRUE(gate && up);
      EXPECT_EQ(lp.gate_up_weight.data, base + gate->offset);
      EXPECT_EQ(lp.gate_up_weight.size(0), 2 * c.intermediate_size);
      EXPECT_EQ(up->offset, gate->offset + gate->numel);
      EXPECT_EQ(lp.o_weight.data, base + layout.Find(pre + "self_attn.o_proj.weight")->offset);
      const ParamEntry* ob = layout.Find(pre + "self_attn.o_proj.bias");
      ASSERT_EQ(ob != nullptr, c.o_bias);
      ASSERT_EQ(lp.o_bias.defined(), c.o_bias);
      if (c.o_bias) {
        EXPECT_EQ(lp.o_bias.data, base + ob->offset);
        EXPECT_EQ(ob->shape, std::vector<int64_t>{C});
      }
      for (const auto& [name, view] : {std::pair{"q_norm", lp.q_norm}, {"k_norm", lp.k_norm}}) {
        const ParamEntry* e = layout.Find(absl::StrCat(pre, "self_attn.", name, ".weight"));
        ASSERT_EQ(e != nullptr, c.qk_norm) << name;
        ASSERT_EQ(view.defined(), c.qk_norm) << name;
        if (!c.qk_norm) continue;
        EXPECT_EQ(view.data, base + e->offset) << name;
        EXPECT_EQ(e->shape, std::vector<int64_t>{c.head_dim}) << name;  // per head, not (H D)
      }
      EXPECT_EQ(lp.down_weight.data, base + layout.Find(pre + "mlp.down_proj.weight")->offset);
    }
    EXPECT_EQ(p.embed.data, base);
    EXPECT_EQ(p.final_norm.data, base + layout.Find("model.norm.weight")->offset);
  }
}

TEST(ParameterLayoutTest, TiedLmHeadAliasesTheEmbeddingAndUntiedHasItsOwn) {
  for (const ModelConfig& c : AllVariants()) {
    SCOPED_TRACE(Describe(c));
    const ParameterLayout layout(c);
    std::vector<float> buffer(layout.num_elements());
    const ModelParams p = layout.Bind(buffer.data(), Device::Cpu());
    EXPECT_EQ(p.lm_head.size(0), c.vocab_size);
    EXPECT_EQ(p.lm_head.size(1), c.hidden_size);
    if (c.tie_word_embeddings) {
      EXPECT_EQ(p.lm_head.data, p.embed.data);
      EXPECT_EQ(layout.Find("lm_head.weight"), nullptr);
    } else {
      ASSERT_NE(layout.Find("lm_head.weight"), nullptr);
      EXPECT_EQ(p.lm_head.data, buffer.data() + layout.Find("lm_head.weight")->offset);
      EXPECT_NE(p.lm_head.data, p.embed.data);
    }
  }
}

TEST(ParameterSetTest, ViewOfAnEntryHasItsShapeAndAddress) {
  const ModelConfig c = SmallConfig(Architecture::kQwen2, false);
  absl::StatusOr<ParameterSet> set = ParameterSet::Allocate(c, Device::Cpu(), true);
  ASSERT_TRUE(set.ok()) << set.status();
  const ParamEntry* o = set->layout.Find("model.layers.1.self_attn.o_proj.weight");
  ASSERT_NE(o, nullptr);
  const Tensor view = set->View(*o);
  EXPECT_EQ(view.data, set->data() + o->offset);
  ASSERT_EQ(view.rank, 2);
  EXPECT_EQ(view.size(0), 16);
  EXPECT_EQ(view.size(1), 24);
  EXPECT_EQ(set->params.layers[1].o_weight.data, view.data);
  for (int64_t i = 0; i < set->layout.num_elements(); ++i) ASSERT_EQ(set->data()[i], 0.0f);
}

TEST(InitializeParametersTest, NormsAreOneBiasesZeroAndWeightsDependOnlyOnTheSeed) {
  // Qwen3 with attention biases has every kind of tensor (q/k norms, q/k/v and o biases).
  const ModelConfig c = SmallConfig(Architecture::kQwen3, false, true);
  absl::StatusOr<ParameterSet> a = ParameterSet::Allocate(c, Device::Cpu(), false);
  absl::StatusOr<ParameterSet> b = ParameterSet::Allocate(c, Device::Cpu(), false);
  absl::StatusOr<ParameterSet> other = ParameterSet::Allocate(c, Device::Cpu(), false);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  InitializeParameters(*a, 42);
  InitializeParameters(*b, 42);
  InitializeParameters(*other, 43);
  const int64_t n = a->layout.num_elements();
  EXPECT_TRUE(std::equal(a->data(), a->data() + n, b->data()));
  EXPECT_FALSE(std::equal(a->data(), a->data() + n, other->data()));
  for (const ParamEntry& e : a->layout.entries()) {
    const float* x = a->data() + e.offset;
    if (e.name.ends_with("norm.weight")) {
      for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(x[i], 1.0f) << e.name;
    } else if (e.name.ends_with(".bias")) {
      for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(x[i], 0.0f) << e.name;
    } else {
      double sum_sq = 0;
      for (int64_t i = 0; i < e.numel; ++i) sum_sq += double{x[i]} * x[i];
      const double rms = std::sqrt(sum_sq / e.numel);
      EXPECT_GT(rms, 0.01) << e.name;  // std 0.02, loosely: the tensors are small
      EXPECT_LT(rms, 0.03) << e.name;
    }
  }
}

}  // namespace
}  // namespace prl
