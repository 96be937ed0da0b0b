// Context parallelism (model/context_parallel.h): C ranks, each holding two chunks of every
// sequence, compute the log-probs, entropies, load-balancing loss and (summed) gradients of the
// one rank that holds everything, to fp32 rounding, for every architecture, with activation
// checkpointing too, through the all-gather of keys and values and through Ulysses' all-to-all
// over heads; and the split itself.
#include "model/context_heads.h"
#include "model/context_parallel.h"
#include "model/context_ring.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

#include "model/transformer.h"
#include "tests/model/thread_group_exchange.h"
#include "tests/model/transformer_testing.h"

namespace prl {
namespace {

using ::prl::testing::ThreadGroup;

TEST(ContextRunsTest, TwoChunksPerRankFromTheFrontAndTheBackCoverEveryPositionOnce) {
  for (const int size : {1, 2, 3, 4}) {
    for (const int64_t length : {1, 2, 5, 7, 8, 64, 1000}) {
      std::vector<int> holder(length, -1);
      for (int r = 0; r < size; ++r) {
        for (const PositionRun& run : ContextRuns(length, r, size)) {
          for (int64_t p = run.begin; p < run.end; ++p) {
            ASSERT_EQ(holder[p], -1) << length << " tokens, rank " << r << ", position " << p;
            holder[p] = r;
          }
        }
      }
      for (int64_t p = 0; p < length; ++p) ASSERT_GE(holder[p], 0) << p;
    }
  }
  const std::vector<PositionRun> runs = ContextRuns(1000, 1, 4);  // chunks 1 and 6 of 8
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].begin, 125);
  EXPECT_EQ(runs[0].end, 250);
  EXPECT_EQ(runs[1].begin, 750);
  EXPECT_EQ(runs[1].end, 875);
}

struct Pass {
  std::vector<float> logprobs, entropies, grads;
  double load_balancing_loss = 0;
};

std::vector<float> Dlogprobs(const PackedBatch& batch) {
  std::vector<float> d(batch.num_tokens());
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    d[t] = batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -0.5f + 0.125f * (t % 7);
  }
  return d;
}

// The group's pass: log-probs and entropies at their global rows, gradients summed.
Pass GroupPass(const Fixture& f, const PackedBatch& full, int size,
               const TransformerOptions& options, double lb_weight,
               ContextAttention attention = ContextAttention::kAllGather) {
  const std::vector<float> d_full = Dlogprobs(full);
  ContextShard shard;
  shard.attention = attention;
  for (int64_t s = 0; s < full.num_seqs(); ++s) {
    shard.lengths.push_back(full.cu_seqlens[s + 1] - full.cu_seqlens[s]);
  }
  ThreadGroup group(size);
  Pass pass;
  pass.logprobs.assign(full.num_tokens(), 0.0f);
  pass.entropies.assign(full.num_tokens(), 0.0f);
  pass.grads.assign(f.params.layout.num_elements(), 0.0f);
  std::vector<std::vector<float>> grads(size);
  std::vector<double> lb(size);
  std::vector<std::thread> ranks;
  std::mutex mu;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      ThreadGroup::Exchange exchange(&group, r);
      ContextShard mine = shard;
      mine.exchange = &exchange;
      const PackedBatch local = ShardBatch(full, r, size);
      const std::vector<int64_t> rows = ShareRows(full, r, size);
      Transformer model(f.config, Device::Cpu(), options);
      std::vector<float> lp(local.num_tokens()), d(local.num_tokens());
      const absl::Status forward =
          model.Forward(f.params.params, local, 0.9f, absl::MakeSpan(lp), true, nullptr, &mine);
      EXPECT_TRUE(forward.ok()) << forward;
      for (size_t i = 0; i < rows.size(); ++i) d[i] = d_full[rows[i]];
      ParameterSet g = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
      const absl::Status backward =
          model.Backward(f.params.params, d, g.params, nullptr, lb_weight);
      EXPECT_TRUE(backward.ok()) << backward;
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 0; i < rows.size(); ++i) {
        pass.logprobs[rows[i]] = lp[i];
        pass.entropies[rows[i]] = model.entropies()[i];
      }
      grads[r].assign(g.data(), g.data() + f.params.layout.num_elements());
      lb[r] = model.load_balancing_loss();
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < pass.grads.size(); ++i) pass.grads[i] += grads[r][i];
    EXPECT_EQ(lb[r], lb[0]) << "every rank has the group's load-balancing loss";
  }
  pass.load_balancing_loss = lb[0];
  return pass;
}

// The pass of one rank that holds every sequence, without the context path.
Pass PlainPass(const Fixture& f, const PackedBatch& full, const TransformerOptions& options,
               double lb_weight) {
  Transformer model(f.config, Device::Cpu(), options);
  Pass pass;
  pass.logprobs.assign(full.num_tokens(), 0.0f);
  EXPECT_TRUE(
      model.Forward(f.params.params, full, 0.9f, absl::MakeSpan(pass.logprobs), true).ok());
  pass.entropies.assign(model.entropies().begin(), model.entropies().end());
  pass.load_balancing_loss = model.load_balancing_loss();
  ParameterSet g = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  EXPECT_TRUE(model.Backward(f.params.params, Dlogprobs(full), g.params, nullptr, lb_weight).ok());
  pass.grads.assign(g.data(), g.data() + f.params.layout.num_elements());
  return pass;
}

double Relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    ref += double{b[i]} * b[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-30));
}

class ContextParallelTest : public ::testing::TestWithParam<ArchitectureCase> {
 protected:
  Fixture f = Fixture::Make(TinyConfig(std::get<0>(GetParam()), std::get<1>(GetParam()),
                                       std::get<2>(GetParam()), std::get<3>(GetParam())),
                            42);

  // Groups of each size, keeping everything and with full checkpointing, over the fixture's
  // sequences (2, 17, 70 and 5 tokens): one rank's log-probs, entropies and load-balancing loss,
  // and the gradient summed over the group, to fp32 rounding.
  void ExpectGroupsGiveOneRanksResults(std::initializer_list<int> sizes,
                                       ContextAttention attention) {
    const PackedBatch full = f.Batch(0, f.sequences.size());
    const double lb_weight = f.config.has_moe() ? 0.01 : 0.0;
    for (const ActivationCheckpointing mode :
         {ActivationCheckpointing::kNone, ActivationCheckpointing::kFull}) {
      TransformerOptions options;
      options.activation_checkpointing = mode;
      const Pass one = PlainPass(f, full, options, lb_weight);
      for (const int size : sizes) {
        SCOPED_TRACE(::testing::Message()
                     << size << " ranks, checkpointing "
                     << (mode == ActivationCheckpointing::kFull ? "full" : "none"));
        const Pass group = GroupPass(f, full, size, options, lb_weight, attention);
        for (size_t t = 0; t < one.logprobs.size(); ++t) {
          ASSERT_NEAR(group.logprobs[t], one.logprobs[t], 1e-5 * std::max(1.0f, -one.logprobs[t]))
              << "token " << t;
          ASSERT_NEAR(group.entropies[t], one.entropies[t], 1e-5) << "token " << t;
        }
        EXPECT_LT(Relative(group.grads, one.grads), 1e-5);
        EXPECT_NEAR(group.load_balancing_loss, one.load_balancing_loss,
                    1e-6 * std::max(1.0, one.load_balancing_loss));
      }
    }
  }
};

TEST_P(ContextParallelTest, AGroupGivesTheResultsOfOneRankThatHoldsEverySequence) {
  ExpectGroupsGiveOneRanksResults({1, 2, 3}, ContextAttention::kAllGather);
}

// A batch too short for the group: a 2-token sequence over 3 ranks leaves rank 1 none of it
// (chunks 1 and 4 of 6 are empty); it runs one untrained token and the group's results stand.
TEST_P(ContextParallelTest, ARankThatHoldsNothingRunsAnUntrainedTokenAndChangesNothing) {
  const PackedBatch full = f.Batch(0, 1);  // 2 tokens
  ASSERT_TRUE(ContextRuns(2, 1, 3).empty());
  const Pass one = PlainPass(f, full, {}, 0.0);
  const Pass group = GroupPass(f, full, 3, {}, 0.0);
  for (size_t t = 0; t < one.logprobs.size(); ++t) {
    ASSERT_NEAR(group.logprobs[t], one.logprobs[t], 1e-5 * std::max(1.0f, -one.logprobs[t]));
  }
  EXPECT_LT(Relative(group.grads, one.grads), 1e-5);
}

// Ulysses (model/context_heads.h): the all-to-all over heads gives the same results, with a
// group that splits the heads into whole key/value groups (4 heads over 2 ranks, 4 kv heads) or
// reads one key/value head from several ranks (1 or 2 kv heads over 2 or 4 ranks), a rank that
// holds nothing of a sequence included.
TEST_P(ContextParallelTest, UlyssesGivesTheResultsOfOneRankThatHoldsEverySequence) {
  ExpectGroupsGiveOneRanksResults({1, 2, 4}, ContextAttention::kUlysses);
  const Pass short_one = PlainPass(f, f.Batch(0, 1), {}, 0.0);  // 2 tokens over 4 ranks
  const Pass short_group = GroupPass(f, f.Batch(0, 1), 4, {}, 0.0, ContextAttention::kUlysses);
  EXPECT_LT(Relative(short_group.grads, short_one.grads), 1e-5);
}

// Ring attention (model/context_ring.h): the blocks around the group, merged by their
// log-sum-exps, give the same results at every group size, a rank that holds nothing included.
TEST_P(ContextParallelTest, RingAttentionGivesTheResultsOfOneRankThatHoldsEverySequence) {
  ExpectGroupsGiveOneRanksResults({1, 2, 3, 4}, ContextAttention::kRing);
  const Pass short_one = PlainPass(f, f.Batch(0, 1), {}, 0.0);  // 2 tokens over 3 ranks
  const Pass short_group = GroupPass(f, f.Batch(0, 1), 3, {}, 0.0, ContextAttention::kRing);
  EXPECT_LT(Relative(short_group.grads, short_one.grads), 1e-5);
}

// Each step's calls cover a query row at most once, and over the C steps every query sees each
// earlier chunk of its sequence once and its own chunk causally.
TEST(RingStepsTest, EveryQueryChunkSeesEachEarlierChunkOnceAndItselfCausally) {
  for (const int size : {2, 3, 4}) {
    const int64_t length = 40;
    PackedBatch full;
    full.cu_seqlens = {0, static_cast<int32_t>(length)};
    full.tokens.assign(length, 1);
    full.targets.assign(length, PackedBatch::kNoTarget);
    for (int r = 0; r < size; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " of " << size);
      ThreadGroup group(size);
      ThreadGroup::Exchange exchange(&group, r);
      ContextShard shard;
      shard.exchange = &exchange;
      shard.lengths = {length};
      const ContextPlan plan = *ContextPlan::Make(shard, ShardBatch(full, r, size), 1024);
      const RingSteps ring = RingSteps::Make(plan);
      ASSERT_EQ(static_cast<int>(ring.steps.size()), size);
      std::vector<int64_t> keys_seen(plan.positions.size(), 0);
      int64_t diagonal = 0;
      for (const auto& step : ring.steps) {
        for (const auto& call : step) {
          std::vector<int> covered(plan.positions.size(), 0);
          for (const kernels::QueryPiece& p : call) {
            for (int64_t i = 0; i < p.len; ++i) {
              ASSERT_EQ(covered[p.row0 + i]++, 0) << "row " << p.row0 + i << " twice in a call";
              keys_seen[p.row0 + i] += p.keys > 0 ? p.keys : i + 1;
            }
            if (p.keys == 0) ++diagonal;
          }
        }
      }
      EXPECT_EQ(diagonal, static_cast<int64_t>(ContextRuns(length, r, size).size()));
      for (size_t t = 0; t < keys_seen.size(); ++t) {
        EXPECT_EQ(keys_seen[t], plan.positions[t] + 1) << "row " << t;
      }
    }
  }
}

TEST(UlyssesHeadsTest, EachRankTakesItsQueryHeadsAndTheKeyValueHeadsTheyRead) {
  // 14 query heads, 2 key/value heads (Qwen2.5-0.5B) over 2 ranks: 7 heads and 1 kv head each.
  HeadSlice s = *UlyssesHeads(14, 2, 1, 2);
  EXPECT_EQ(s.q0, 7);
  EXPECT_EQ(s.heads, 7);
  EXPECT_EQ(s.kv0, 1);
  EXPECT_EQ(s.kv_heads, 1);
  // 4 / 2 over 4 ranks: one query head each, ranks 2 and 3 both read kv head 1.
  s = *UlyssesHeads(4, 2, 3, 4);
  EXPECT_EQ(s.q0, 3);
  EXPECT_EQ(s.kv0, 1);
  EXPECT_EQ(s.kv_heads, 1);
  // 16 / 8 over 2 ranks: 8 heads reading 4 kv heads each.
  s = *UlyssesHeads(16, 8, 1, 2);
  EXPECT_EQ(s.kv0, 4);
  EXPECT_EQ(s.kv_heads, 4);
}

TEST(UlyssesHeadsTest, AGroupThatDoesNotSplitTheHeadsIsRefusedNamingTheSettings) {
  // 14 heads over 4 ranks: not whole heads.
  const absl::Status s = UlyssesHeads(14, 2, 0, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("learner.context_parallel = 4"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("learner.context_parallel_attention = allgather"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("14 query heads"));
  // 12 heads, 4 per kv head, over 4 ranks: 3 heads each straddle two kv groups.
  EXPECT_FALSE(UlyssesHeads(12, 3, 1, 4).ok());
}

INSTANTIATE_TEST_SUITE_P(Architectures, ContextParallelTest, ArchitectureCases(),
                         [](const auto& info) { return ArchitectureCaseName(info.param); });

}  // namespace
}  // namespace prl
