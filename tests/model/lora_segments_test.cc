// Several adapters in one pass (ModelParams::lora_segments, the learner's joint step over a run
// of adapters: learner/joint_step.h), on the CPU:
// - each adapter's log-probs, entropies and gradients equal those of a pass over its own
//   sequences alone (fp32 summation order: 1e-5), for adapters of different ranks, scales and
//   targets, a Qwen2 and a Qwen3-MoE base (whose per-segment load-balancing loss is the
//   separate pass's too), with and without activation checkpointing;
// - the segments are checked: in order, covering the batch, whole sequences, one backward with
//   the same segments, no load-balancing weight; each error names what was expected and found.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/packed_batch.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl {
namespace {

ModelConfig Tiny(Architecture arch) {
  ModelConfig c;
  SetArchitecture(arch, /*attention_bias=*/true, &c);
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  if (arch == Architecture::kQwen3Moe) {
    c.head_dim = 16;
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.norm_topk_prob = true;
  }
  c.vocab_size = 50;
  c.max_position_embeddings = 128;
  return c;
}

LoraConfig Lora(int64_t rank, double alpha, std::vector<std::string> targets) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = alpha;
  l.target_modules = std::move(targets);
  return l;
}

// An adapter with A and B random (a trained one), seeded.
LoraSet Adapter(const ModelConfig& c, const LoraConfig& lora, uint64_t seed) {
  LoraSet a = *LoraSet::Allocate(c, lora, Device::Cpu(), false);
  InitializeLora(a, seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (const LoraEntry& e : a.layout.entries()) {
    if (e.is_a) continue;
    for (int64_t i = 0; i < e.numel; ++i) a.data()[e.offset + i] = n(rng);
  }
  return a;
}

// One adapter's sequences, and what a pass over them alone gives.
struct Part {
  LoraConfig lora;
  std::vector<std::vector<int32_t>> seqs;
  LoraSet adapter, grads;
  PackedBatch batch;
  std::vector<float> dlogprobs, logprobs, entropies;
  double lb_loss = 0;
};

PackedBatch Pack(const std::vector<std::vector<int32_t>>& seqs) {
  PackedBatch b;
  for (const auto& s : seqs) b.AddScored(s, 2);
  return b;
}

double MaxRelative(const float* got, const float* want, int64_t n) {
  double num = 0, den = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double{got[i]} - want[i]));
    den = std::max(den, std::fabs(double{want[i]}));
  }
  return num / den;
}

struct Case {
  const char* name;
  Architecture arch;
  ActivationCheckpointing checkpointing;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class LoraSegmentsTest : public ::testing::TestWithParam<Case> {};

TEST_P(LoraSegmentsTest, EachAdapterGetsTheLogprobsAndGradientsOfItsOwnPass) {
  const ModelConfig c = Tiny(GetParam().arch);
  const bool moe = GetParam().arch == Architecture::kQwen3Moe;
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), false);
  InitializeParameters(base, 5, 0.2f);
  std::vector<Part> parts(3);
  parts[0].lora = Lora(4, 8,
                       moe ? std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}
                           : std::vector<std::string>{"all-linear"});
  parts[1].lora = Lora(2, 3, {"q_proj", "v_proj", "o_proj"});
  parts[2].lora = Lora(8, 16,
                       moe ? std::vector<std::string>{"k_proj", "o_proj"}
                           : std::vector<std::string>{"gate_proj", "down_proj"});
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  const std::vector<std::vector<int>> lengths = {{5, 19}, {33}, {3, 11, 26}};
  TransformerOptions options;
  options.activation_checkpointing = GetParam().checkpointing;
  Transformer model(c, Device::Cpu(), options);
  for (size_t i = 0; i < parts.size(); ++i) {
    Part& p = parts[i];
    p.adapter = Adapter(c, p.lora, 11 + i);
    p.grads = *LoraSet::Allocate(c, p.lora, Device::Cpu(), true);
    for (int len : lengths[i]) {
      std::vector<int32_t> s(len);
      for (auto& t : s) t = tok(rng);
      p.seqs.push_back(s);
    }
    p.batch = Pack(p.seqs);
    const int64_t T = p.batch.num_tokens();
    for (int64_t t = 0; t < T; ++t) {
      p.dlogprobs.push_back(p.batch.targets[t] < 0 ? 0.0f : -0.7f + 0.13f * ((t + i) % 7));
    }
    // Its pass alone.
    ModelParams params = base.params;
    params.lora = &p.adapter.params;
    ModelParams g;
    g.lora = &p.grads.params;
    p.logprobs.assign(T, 0.0f);
    ASSERT_TRUE(model.Forward(params, p.batch, 0.9f, absl::MakeSpan(p.logprobs), true).ok());
    p.entropies.assign(model.entropies().begin(), model.entropies().end());
    p.lb_loss = model.load_balancing_loss();
    ASSERT_TRUE(model.Backward(params, p.dlogprobs, g).ok());
  }
  // One pass over the three, each on its segment.
  std::vector<std::vector<int32_t>> all;
  std::vector<LoraSegment> segments, grad_segments;
  std::vector<LoraSet> joint_grads;
  std::vector<float> dlogprobs;
  int64_t begin = 0;
  for (Part& p : parts) {
    all.insert(all.end(), p.seqs.begin(), p.seqs.end());
    const int64_t end = begin + p.batch.num_tokens();
    segments.push_back({&p.adapter.params, begin, end});
    joint_grads.push_back(*LoraSet::Allocate(c, p.lora, Device::Cpu(), true));
    dlogprobs.insert(dlogprobs.end(), p.dlogprobs.begin(), p.dlogprobs.end());
    begin = end;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    grad_segments.push_back({&joint_grads[i].params, segments[i].begin, segments[i].end});
  }
  const PackedBatch joint = Pack(all);
  ModelParams params = base.params;
  params.lora_segments = segments;
  ModelParams g;
  g.lora_segments = grad_segments;
  std::vector<float> logprobs(joint.num_tokens());
  ASSERT_TRUE(model.Forward(params, joint, 0.9f, absl::MakeSpan(logprobs), true).ok());
  const std::vector<float> entropies(model.entropies().begin(), model.entropies().end());
  const std::vector<double> lb(model.segment_load_balancing_losses().begin(),
                               model.segment_load_balancing_losses().end());
  ASSERT_EQ(lb.size(), parts.size());
  ASSERT_TRUE(model.Backward(params, dlogprobs, g).ok());
  for (size_t i = 0; i < parts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "adapter " << i);
    const Part& p = parts[i];
    const int64_t b = segments[i].begin, n = segments[i].end - b;
    EXPECT_LE(MaxRelative(logprobs.data() + b, p.logprobs.data(), n), 1e-5);
    EXPECT_LE(MaxRelative(entropies.data() + b, p.entropies.data(), n), 1e-5);
    EXPECT_LE(MaxRelative(joint_grads[i].data(), p.grads.data(), p.grads.layout.num_elements()),
              1e-5);
    double norm = 0;
    for (int64_t e = 0; e < p.grads.layout.num_elements(); ++e)
      norm += std::fabs(p.grads.data()[e]);
    EXPECT_GT(norm, 1e-3) << "the adapter has a gradient to compare";
    if (moe) {
      EXPECT_NEAR(lb[i], p.lb_loss, 1e-6 * p.lb_loss);  // (the router's float probabilities)
    } else {
      EXPECT_EQ(lb[i], 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LoraSegmentsTest,
                         ::testing::Values(Case{"qwen2", Architecture::kQwen2,
                                                ActivationCheckpointing::kNone},
                                           Case{"qwen2_full_checkpointing", Architecture::kQwen2,
                                                ActivationCheckpointing::kFull},
                                           Case{"qwen3_moe_selective", Architecture::kQwen3Moe,
                                                ActivationCheckpointing::kSelective}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(LoraSegmentsErrorsTest, SegmentsAreCheckedNamingWhatWasExpectedAndFound) {
  const ModelConfig c = Tiny(Architecture::kQwen2);
  ParameterSet base = *ParameterSet::Allocate(c, Device::Cpu(), false);
  InitializeParameters(base, 5, 0.2f);
  LoraSet a = Adapter(c, Lora(2, 4, {"q_proj"}), 1), b = Adapter(c, Lora(2, 4, {"v_proj"}), 2);
  const PackedBatch batch = Pack({{1, 2, 3, 4}, {5, 6, 7}});  // tokens [0, 3), [3, 5)
  Transformer model(c, Device::Cpu());
  std::vector<float> lp(5);
  auto forward = [&](std::vector<LoraSegment> segments) {
    ModelParams params = base.params;
    params.lora_segments = segments;
    return model.Forward(params, batch, 1.0f, absl::MakeSpan(lp), true);
  };
  absl::Status s = forward({{&a.params, 0, 2}, {&b.params, 2, 5}});  // mid-sequence
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lora_segments[0]: expected an adapter on tokens [0, the end of a "
                             "sequence <= 5), found [0, 2)"),
            std::string::npos)
      << s;
  s = forward({{&a.params, 0, 3}});
  EXPECT_NE(s.message().find("cover tokens [0, 3) of a batch of 5"), std::string::npos) << s;
  s = forward({{&a.params, 3, 5}, {&b.params, 0, 3}});
  EXPECT_NE(s.message().find("found [3, 5)"), std::string::npos) << s;
  {
    ModelParams params = base.params;
    const std::vector<LoraSegment> segments = {{&a.params, 0, 5}};
    params.lora_segments = segments;
    params.lora = &b.params;
    s = model.Forward(params, batch, 1.0f, absl::MakeSpan(lp), true);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find("one adapter besides"), std::string::npos) << s;
  }
  // A backward with other segments than its forward's, or a load-balancing weight.
  const std::vector<LoraSegment> segments = {{&a.params, 0, 3}, {&b.params, 3, 5}};
  ASSERT_TRUE(forward(segments).ok());
  LoraSet ga = *LoraSet::Allocate(c, a.lora, Device::Cpu(), true);
  ModelParams params = base.params;
  params.lora_segments = segments;
  ModelParams g;
  const std::vector<LoraSegment> one = {{&ga.params, 0, 5}};
  g.lora_segments = one;
  const std::vector<float> dlp(5, 0.5f);
  s = model.Backward(params, dlp, g);
  EXPECT_NE(s.message().find("must be the Forward's 2 segments"), std::string::npos) << s;
  LoraSet gb = *LoraSet::Allocate(c, b.lora, Device::Cpu(), true);
  const std::vector<LoraSegment> both = {{&ga.params, 0, 3}, {&gb.params, 3, 5}};
  g.lora_segments = both;
  s = model.Backward(params, dlp, g, nullptr, 0.01);
  EXPECT_NE(s.message().find("a load-balancing weight (0.01)"), std::string::npos) << s;
  ASSERT_TRUE(model.Backward(params, dlp, g).ok());
}

}  // namespace
}  // namespace prl
