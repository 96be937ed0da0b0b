#include "model/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "model/parameters.h"
#include "tests/model/transformer_testing.h"

namespace prl {
namespace {

double RelativeDifference(const float* a, const float* b, int64_t n) {
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    ref += double{b[i]} * b[i];
  }
  return std::sqrt(diff / ref);
}

// (architecture, tied, KV heads, attention_bias)
class TransformerTest : public ::testing::TestWithParam<ArchitectureCase> {
 protected:
  Fixture f = Fixture::Make(TinyConfig(std::get<0>(GetParam()), std::get<1>(GetParam()),
                                       std::get<2>(GetParam()), std::get<3>(GetParam())),
                            42);
};

TEST_P(TransformerTest, PackingDoesNotChangeLogprobsOrGradients) {
  Transformer model(f.config, Device::Cpu());
  ParameterSet packed_grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ParameterSet single_grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const std::vector<float> packed = Score(model, f, f.Batch(0, f.sequences.size()), &packed_grads);
  size_t offset = 0;
  for (size_t i = 0; i < f.sequences.size(); ++i) {
    const std::vector<float> single = Score(model, f, f.Batch(i, i + 1), &single_grads);
    for (size_t t = 0; t < single.size(); ++t) {
      ASSERT_NEAR(single[t], packed[offset + t], 1e-5) << "sequence " << i << " position " << t;
    }
    offset += single.size();
  }
  EXPECT_LT(
      RelativeDifference(single_grads.data(), packed_grads.data(), f.params.layout.num_elements()),
      1e-5);
}

TEST_P(TransformerTest, InferenceForwardEqualsTrainingForwardBitForBit) {
  Transformer model(f.config, Device::Cpu());
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  std::vector<float> train(batch.num_tokens()), infer(batch.num_tokens());
  ASSERT_TRUE(model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(train), true).ok());
  ASSERT_TRUE(model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(infer), false).ok());
  EXPECT_EQ(std::memcmp(train.data(), infer.data(), train.size() * sizeof(float)), 0);
}

TEST_P(TransformerTest, LogitChunkingDoesNotChangeResults) {
  Transformer whole(f.config, Device::Cpu());
  TransformerOptions tiny_chunks;
  tiny_chunks.logits_chunk_bytes = 3 * f.config.vocab_size * sizeof(float);  // 3 rows per chunk
  Transformer chunked(f.config, Device::Cpu(), tiny_chunks);
  ParameterSet g1 = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ParameterSet g2 = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  const std::vector<float> a = Score(whole, f, batch, &g1), b = Score(chunked, f, batch, &g2);
  // 1e-6 relative: a chunk's GEMM may round differently in the last bits of a large logit.
  for (size_t t = 0; t < a.size(); ++t) ASSERT_NEAR(a[t], b[t], 1e-6 * std::max(1.0f, -a[t]));
  EXPECT_LT(RelativeDifference(g2.data(), g1.data(), f.params.layout.num_elements()), 1e-6);
}

// A training pass whose trained rows fit one logits chunk keeps the forward's logits for the
// backward (TransformerOptions::keep_logits, the CPU's default): its log-probs and gradients are
// the recomputing pass's bit for bit; and a keep_logits_bytes budget makes that one chunk when
// logits_chunk_bytes alone would cut the rows into chunks of 3.
TEST_P(TransformerTest, KeptLogitsGiveTheRecomputingPassesResultsBitForBit) {
  TransformerOptions recompute;
  recompute.keep_logits = false;
  TransformerOptions keep;
  keep.keep_logits = true;
  TransformerOptions budget = keep;
  budget.logits_chunk_bytes = 3 * f.config.vocab_size * static_cast<int64_t>(sizeof(float));
  budget.keep_logits_bytes = int64_t{1} << 30;
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  std::vector<std::vector<float>> logprobs, grads;
  for (const TransformerOptions& options : {recompute, keep, budget}) {
    Transformer model(f.config, Device::Cpu(), options);
    ParameterSet g = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
    logprobs.push_back(Score(model, f, batch, &g));
    grads.emplace_back(g.data(), g.data() + f.params.layout.num_elements());
  }
  EXPECT_EQ(logprobs[1], logprobs[0]);
  EXPECT_EQ(grads[1], grads[0]) << "kept logits";
  EXPECT_EQ(logprobs[2], logprobs[0]);
  EXPECT_EQ(grads[2], grads[0]) << "one chunk by keep_logits_bytes";
}

TEST_P(TransformerTest, BackwardAccumulatesIntoGradients) {
  Transformer model(f.config, Device::Cpu());
  ParameterSet once = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ParameterSet twice = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  Score(model, f, batch, &once);
  Score(model, f, batch, &twice);
  Score(model, f, batch, &twice);
  const int64_t n = f.params.layout.num_elements();
  std::vector<float> doubled(once.data(), once.data() + n);
  for (float& g : doubled) g *= 2.0f;
  EXPECT_LT(RelativeDifference(twice.data(), doubled.data(), n), 1e-6);
}

// Resumed training must replay bit for bit: nothing may depend on thread timing.
TEST_P(TransformerTest, ForwardAndBackwardAreBitwiseDeterministic) {
  Transformer model(f.config, Device::Cpu());
  ParameterSet first = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ParameterSet second = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  const std::vector<float> a = Score(model, f, batch, &first);
  const std::vector<float> b = Score(model, f, batch, &second);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.buffer.bytes()), 0);
}

// Models that take turns may share one workspace (TransformerOptions::shared_workspace, a run
// of adapters' trainers): each pass lays itself out again, so two models alternating passes in
// one workspace give exactly what each gives in its own, and the workspace holds the larger
// pass once.
TEST_P(TransformerTest, ModelsTakingTurnsInOneWorkspaceGiveTheirOwnResultsBitForBit) {
  const Fixture other = Fixture::Make(f.config, 7);  // another model of the same shape
  const PackedBatch small = f.Batch(0, 1), large = f.Batch(0, f.sequences.size());
  auto run = [&](Transformer& a, Transformer& b, ParameterSet* ga, ParameterSet* gb) {
    std::vector<float> out = Score(a, f, large, ga);  // the larger pass first, then the smaller
    const std::vector<float> more = Score(b, other, small, gb);
    out.insert(out.end(), more.begin(), more.end());
    const std::vector<float> again = Score(a, f, small, ga);
    out.insert(out.end(), again.begin(), again.end());
    return out;
  };
  ParameterSet own_a = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ParameterSet own_b = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  Transformer alone_a(f.config, Device::Cpu()), alone_b(f.config, Device::Cpu());
  const std::vector<float> separate = run(alone_a, alone_b, &own_a, &own_b);
  TransformerOptions shared;
  shared.shared_workspace = std::make_shared<Arena>(Device::Cpu());
  ParameterSet shared_a = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  ParameterSet shared_b = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  Transformer turn_a(f.config, Device::Cpu(), shared), turn_b(f.config, Device::Cpu(), shared);
  const std::vector<float> turns = run(turn_a, turn_b, &shared_a, &shared_b);
  ASSERT_EQ(separate.size(), turns.size());
  EXPECT_EQ(std::memcmp(separate.data(), turns.data(), turns.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(own_a.data(), shared_a.data(), own_a.buffer.bytes()), 0);
  EXPECT_EQ(std::memcmp(own_b.data(), shared_b.data(), own_b.buffer.bytes()), 0);
  EXPECT_EQ(turn_a.workspace_bytes(), alone_a.workspace_bytes()) << "the larger pass, once";
  EXPECT_EQ(turn_b.workspace_bytes(), turn_a.workspace_bytes());
}

TEST_P(TransformerTest, PassesReadUnitsOnlyBetweenAcquireAndRelease) {
  Transformer plain(f.config, Device::Cpu()), hooked(f.config, Device::Cpu());
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const PackedBatch batch = f.Batch(0, f.sequences.size());
  const std::vector<float> expected = Score(plain, f, batch, &grads);

  ModelParams params, unit_grads;
  PoisoningHooks hooks(f.params, &params, &unit_grads);
  const std::vector<float> logprobs = ScoreThroughHooks(hooked, batch, hooks, params, unit_grads);
  EXPECT_EQ(std::memcmp(logprobs.data(), expected.data(), logprobs.size() * sizeof(float)), 0);
  const std::vector<float> g = hooks.Gradient();
  EXPECT_EQ(std::memcmp(g.data(), grads.data(), grads.buffer.bytes()), 0);
  // Every unit's gradient is announced done exactly once, the head first, the embedding last.
  const int L = static_cast<int>(f.config.num_hidden_layers);
  std::vector<int> order = {L + 1};
  for (int l = L; l >= 0; --l) order.push_back(l);
  EXPECT_EQ(hooks.done_, order);
}

INSTANTIATE_TEST_SUITE_P(Architectures, TransformerTest,
                         ::testing::Values(std::make_tuple(Architecture::kQwen2, true, 2, false),
                                           std::make_tuple(Architecture::kQwen2, false, 4, false),
                                           std::make_tuple(Architecture::kLlama, false, 1, false),
                                           std::make_tuple(Architecture::kLlama, true, 4, false),
                                           std::make_tuple(Architecture::kQwen3, true, 2, false),
                                           std::make_tuple(Architecture::kQwen3, false, 1, true),
                                           std::make_tuple(Architecture::kQwen3Moe, true, 2, false),
                                           std::make_tuple(Architecture::kQwen3Moe, false, 1,
                                                           true)),
                         [](const auto& info) { return ArchitectureCaseName(info.param); });

// The q_norm / k_norm / o_proj.bias gradients against central differences of the loss
// -sum logprob (fp32 forward, so a loose tolerance; tests/reference checks them against the
// float64 PyTorch reference to 1e-3). A backward that skipped the per-head norms, or took their
// rows as (token, H D) instead of (token x head, D), fails by far more.
TEST(Qwen3GradientTest, QkNormAndOBiasGradientsMatchFiniteDifferences) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen3, false, 2, true), 7);
  Transformer model(f.config, Device::Cpu());
  const PackedBatch batch = f.Batch(1, 2);  // 17 tokens
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  Score(model, f, batch, &grads);
  auto loss = [&] {
    std::vector<float> lp(batch.num_tokens());
    EXPECT_TRUE(model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(lp), false).ok());
    double sum = 0.0;
    for (float x : lp) sum -= x;
    return sum;
  };
  for (const char* name :
       {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
        "model.layers.0.self_attn.o_proj.bias"}) {
    const ParamEntry* e = f.params.layout.Find(name);
    ASSERT_NE(e, nullptr) << name;
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < e->numel; ++i) {
      float& w = f.params.data()[e->offset + i];
      const float saved = w, h = 1e-2f;
      w = saved + h;
      const double up = loss();
      w = saved - h;
      const double down = loss();
      w = saved;
      const double fd = (up - down) / (2.0 * h);
      const double analytic = grads.data()[e->offset + i];
      diff += (fd - analytic) * (fd - analytic);
      norm += analytic * analytic;
    }
    EXPECT_GT(norm, 1e-2) << name << ": a gradient this small checks nothing";
    EXPECT_LT(std::sqrt(diff / norm), 1e-2) << name;
  }
}

// Qwen3-MoE routing replay through PackedBatch::routes (model/moe_layer.h).
TEST(MoeTransformerTest, ReplayingTheRecomputedRoutesChangesNothingBitForBit) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen3Moe, true, 2), 11);
  Transformer model(f.config, Device::Cpu());
  PackedBatch batch = f.Batch(0, f.sequences.size());
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const std::vector<float> recompute = Score(model, f, batch, &grads);
  const std::vector<uint8_t> routes(model.recomputed_routes().begin(),
                                    model.recomputed_routes().end());
  ASSERT_EQ(static_cast<int64_t>(routes.size()), batch.num_tokens() * 2 * 2);  // T x Lm x K
  batch.routes.assign(routes.begin(), routes.end());
  ParameterSet replay_grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const std::vector<float> replay = Score(model, f, batch, &replay_grads);
  EXPECT_EQ(recompute, replay);
  EXPECT_EQ(std::memcmp(grads.data(), replay_grads.data(), grads.buffer.bytes()), 0);
}

TEST(MoeTransformerTest, ReplayedRoutesChangeTheForwardAndTheRouterStillReportsItsOwn) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen3Moe, true, 2), 12);
  // Batch-invariant: the experts' row counts change with the replay, and no other bit may.
  Transformer model(f.config, Device::Cpu(),
                    {.reduction_order = kernels::ReductionOrder::kBatchInvariant});
  PackedBatch batch = f.Batch(1, 2);  // 17 tokens
  const std::vector<float> recompute = Score(model, f, batch, nullptr);
  const std::vector<uint8_t> own(model.recomputed_routes().begin(),
                                 model.recomputed_routes().end());
  // Replay, at positions >= 8, two experts the router did not pick (of 4, top 2).
  const int64_t T = batch.num_tokens(), Lm = 2, K = 2;
  batch.routes.assign(T * Lm * K, PackedBatch::kRouted);
  for (int64_t t = 8; t < T; ++t) {
    for (int64_t l = 0; l < Lm; ++l) {
      const uint8_t* r = own.data() + (t * Lm + l) * K;
      int32_t* out = batch.routes.data() + (t * Lm + l) * K;
      for (int32_t e = 0, k = 0; e < 4; ++e) {
        if (e != r[0] && e != r[1]) out[k++] = e;
      }
    }
  }
  const std::vector<float> replay = Score(model, f, batch, nullptr);
  for (int64_t t = 0; t < T; ++t) {
    if (t < 8) {
      EXPECT_EQ(replay[t], recompute[t]) << t;  // causal: earlier positions unchanged
    } else {
      EXPECT_NE(replay[t], recompute[t]) << t;
    }
  }
  // The router's own choice is still what recomputed_routes reports at replayed positions
  // (layer 0 sees the same input; layer 1's input changed after the replayed layer 0).
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(model.recomputed_routes()[(t * Lm + 0) * K], own[(t * Lm + 0) * K]) << t;
  }
  batch.routes[8 * Lm * K + 1] = batch.routes[8 * Lm * K];  // a repeated expert is refused
  std::vector<float> lp(T);
  const absl::Status s = model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(lp), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("routes: position 8 MoE layer 0"), std::string::npos) << s;
}

TEST(TransformerErrorsTest, PositionsWithoutTargetScoreZeroAndGetNoGradient) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen2, true, 2), 1);
  Transformer model(f.config, Device::Cpu());
  PackedBatch batch;
  batch.Add({1, 2, 3}, {PackedBatch::kNoTarget, PackedBatch::kNoTarget, PackedBatch::kNoTarget});
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const std::vector<float> logprobs = Score(model, f, batch, &grads);
  for (float lp : logprobs) EXPECT_EQ(lp, 0.0f);
  for (int64_t i = 0; i < f.params.layout.num_elements(); ++i) ASSERT_EQ(grads.data()[i], 0.0f);
}

TEST(TransformerErrorsTest, BackwardNeedsATrainingForward) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen2, true, 2), 1);
  Transformer model(f.config, Device::Cpu());
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  const PackedBatch batch = f.Batch(0, 2);
  std::vector<float> logprobs(batch.num_tokens()), d(batch.num_tokens(), 1.0f);
  EXPECT_EQ(model.Backward(f.params.params, d, grads.params).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(logprobs), false).ok());
  EXPECT_EQ(model.Backward(f.params.params, d, grads.params).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model.Forward(f.params.params, batch, 1.0f, absl::MakeSpan(logprobs), true).ok());
  EXPECT_TRUE(model.Backward(f.params.params, d, grads.params).ok());
  EXPECT_EQ(model.Backward(f.params.params, d, grads.params).code(),
            absl::StatusCode::kFailedPrecondition)
      << "activations are consumed by one backward";
}

TEST(TransformerErrorsTest, InvalidBatchesAreRejectedWithTheSequenceNamed) {
  Fixture f = Fixture::Make(TinyConfig(Architecture::kQwen2, true, 2), 1);
  Transformer model(f.config, Device::Cpu());
  auto forward = [&](const PackedBatch& b) {
    std::vector<float> lp(b.num_tokens());
    return model.Forward(f.params.params, b, 1.0f, absl::MakeSpan(lp), false);
  };
  PackedBatch bad_token;
  bad_token.Add({1, 2}, {2, 3});
  bad_token.Add({4, 50}, {1, 1});
  absl::Status s = forward(bad_token);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sequence 1 position 1: token id 50"), absl::string_view::npos)
      << s.message();

  PackedBatch bad_target;
  bad_target.Add({1, 2}, {2, -5});
  EXPECT_NE(forward(bad_target).message().find("target id -5"), absl::string_view::npos);

  PackedBatch too_long;
  too_long.Add(std::vector<int32_t>(129, 1), std::vector<int32_t>(129, 1));
  EXPECT_NE(forward(too_long).message().find("max_position_embeddings = 128"),
            absl::string_view::npos);

  PackedBatch empty_seq;
  empty_seq.Add({1}, {1});
  empty_seq.Add({}, {});
  EXPECT_NE(forward(empty_seq).message().find("sequence 1 is empty"), absl::string_view::npos);

  std::vector<float> lp(2);
  PackedBatch ok;
  ok.Add({1, 2}, {2, 3});
  EXPECT_EQ(model.Forward(f.params.params, ok, 0.0f, absl::MakeSpan(lp), false).code(),
            absl::StatusCode::kInvalidArgument)
      << "temperature 0 has no log-probabilities";
}

}  // namespace
}  // namespace prl
