// FsdpModel (learner/fsdp.h) at world sizes 1, 2 and 3, its ranks as threads of this process
// over Gloo, against the unsharded Transformer (model/transformer.h) on the same parameters.
//
// Each rank runs its own sequences (rank r: sequences r, r + W, ...) and the unsharded
// reference runs all of them in one batch, so FSDP's gradient (the reduce-scatter sum of W
// partial gradients) adds the same per-token terms as the reference in another grouping and
// order, in fp32: equal to rounding, not bit for bit. Bound: relative L2 difference 1e-5 per
// tensor, the model tests' bound for packing the same sequences differently (a sum of ~100
// fp32 terms rounds at ~sqrt(100) * 2^-24 ~ 1e-6 relative). A sharding error (a rank's part
// lost or counted twice, a slice misplaced, a unit's gradient not reduced, the tied
// embedding's two parts not both added) is an O(1) error in some tensor. Log-probs: 1e-5
// absolute, as for packing. Where FSDP does the same arithmetic either way (gathers,
// resharding) the test asks for the same bits.
#include "learner/fsdp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/transformer.h"
#include "tests/learner/learner_testing.h"
#include "tests/status_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::AllRanksOk;
using ::prl::learner::testing::BatchOf;
using ::prl::learner::testing::MaxLikelihoodGrad;
using ::prl::learner::testing::RelativeDifference;
using ::prl::learner::testing::RunRanks;

constexpr double kGradTolerance = 1e-5;     // relative L2 per tensor, see above
constexpr double kLogprobTolerance = 1e-5;  // absolute

struct Fixture {
  ModelConfig config;
  std::vector<float> full;  // the parameters every rank loads
  std::vector<std::vector<int32_t>> sequences;

  explicit Fixture(bool tied)
      : config(testing::TinyConfig(tied)),
        full(testing::RandomParameters(config, 17)),
        sequences(testing::RandomSequences(config, 23)) {}
};

// The log-probs and gradient of a pass over the sequences in a batch.
struct PassResult {
  std::vector<float> logprobs;  // (T) of the pass's batch
  std::vector<float> grads;     // full layout
};

// The unsharded model on all sequences in one batch.
PassResult Unsharded(const Fixture& f) {
  ParameterSet params = *ParameterSet::Allocate(f.config, Device::Cpu(), false);
  std::copy(f.full.begin(), f.full.end(), params.data());
  ParameterSet grads = *ParameterSet::Allocate(f.config, Device::Cpu(), true);
  Transformer model(f.config, Device::Cpu());
  const PackedBatch batch = BatchOf(f.sequences, 0, 1);
  PassResult out;
  out.logprobs.resize(batch.num_tokens());
  EXPECT_TRUE(model.Forward(params.params, batch, 1.0f, absl::MakeSpan(out.logprobs), true).ok());
  EXPECT_TRUE(model.Backward(params.params, MaxLikelihoodGrad(batch), grads.params).ok());
  out.grads.assign(grads.data(), grads.data() + f.full.size());
  return out;
}

// What one FSDP rank computed: its pass, then the gathered gradient and parameters.
struct RankResult {
  PassResult pass;
  std::vector<float> params;  // GatherFullParams after the pass
  FsdpMemory memory;
};

// A forward and backward pass of every rank over its own sequences.
std::vector<RankResult> Sharded(const Fixture& f, int world_size, const FsdpOptions& options) {
  std::vector<RankResult> out(world_size);
  const absl::Status status = AllRanksOk(
      RunRanks(world_size, [&](int rank, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(f.config, &comm, options));
        PRL_RETURN_IF_ERROR(model->LoadFull(f.full));
        const PackedBatch batch = BatchOf(f.sequences, rank, world_size);
        RankResult& r = out[rank];
        r.pass.logprobs.resize(batch.num_tokens());
        PRL_RETURN_IF_ERROR(model->Forward(batch, 1.0f, absl::MakeSpan(r.pass.logprobs), true));
        PRL_RETURN_IF_ERROR(model->Backward(MaxLikelihoodGrad(batch)));
        r.pass.grads.resize(f.full.size());
        r.params.resize(f.full.size());
        PRL_RETURN_IF_ERROR(model->GatherFullGrads(absl::MakeSpan(r.pass.grads)));
        PRL_RETURN_IF_ERROR(model->GatherFullParams(absl::MakeSpan(r.params)));
        r.memory = model->memory();
        return absl::OkStatus();
      }));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Setting {
  int world_size = 1;
  bool tied = true;
  bool always_gather = false;  // world size 1 through the sharded path
};

std::string Name(const ::testing::TestParamInfo<Setting>& info) {
  return absl::StrCat("world", info.param.world_size, info.param.tied ? "_tied" : "_untied",
                      info.param.always_gather ? "_gathered" : "");
}

class FsdpTest : public ::testing::TestWithParam<Setting> {};

TEST_P(FsdpTest, ShardedGradientsEqualUnshardedModel) {
  const Setting s = GetParam();
  const Fixture f(s.tied);
  const PassResult reference = Unsharded(f);
  FsdpOptions options;
  options.always_gather = s.always_gather;
  const std::vector<RankResult> ranks = Sharded(f, s.world_size, options);
  ASSERT_EQ(ranks[0].pass.grads.size(), reference.grads.size());

  double worst = 0;
  const ParameterLayout layout(f.config);
  for (const ParamEntry& e : layout.entries()) {
    ASSERT_TRUE(std::any_of(reference.grads.begin() + e.offset,
                            reference.grads.begin() + e.offset + e.numel,
                            [](float g) { return g != 0.0f; }))
        << e.name << " has no gradient: comparing it would prove nothing";
    const double error =
        RelativeDifference(ranks[0].pass.grads, reference.grads, e.offset, e.numel);
    EXPECT_LE(error, kGradTolerance) << e.name;
    worst = std::max(worst, error);
  }
  RecordProperty("worst_tensor_relative_error", absl::StrCat(worst));
  std::printf("worst tensor relative gradient error: %.3e\n", worst);
  for (int rank = 1; rank < s.world_size; ++rank) {
    EXPECT_TRUE(SameBits(ranks[rank].pass.grads, ranks[0].pass.grads))
        << "rank " << rank << " gathered another gradient than rank 0";
  }

  // Each rank's log-probs are the reference's for its sequences.
  std::vector<size_t> offset = {0};  // of each sequence's tokens in the reference batch
  for (const auto& seq : f.sequences) offset.push_back(offset.back() + seq.size() - 1);
  for (int rank = 0; rank < s.world_size; ++rank) {
    size_t at = 0;
    for (size_t i = rank; i < f.sequences.size(); i += s.world_size) {
      for (size_t t = offset[i]; t < offset[i + 1]; ++t, ++at) {
        ASSERT_NEAR(ranks[rank].pass.logprobs[at], reference.logprobs[t], kLogprobTolerance)
            << "rank " << rank << " sequence " << i << " position " << t - offset[i];
      }
    }
    EXPECT_EQ(at, ranks[rank].pass.logprobs.size());
  }
}

TEST_P(FsdpTest, GatherFullParamsReturnsWhatLoadFullLoaded) {
  const Setting s = GetParam();
  const Fixture f(s.tied);
  FsdpOptions options;
  options.always_gather = s.always_gather;
  const std::vector<RankResult> ranks = Sharded(f, s.world_size, options);
  for (int rank = 0; rank < s.world_size; ++rank) {
    // After a forward and backward pass, which must only have read the shards.
    EXPECT_TRUE(SameBits(ranks[rank].params, f.full)) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FsdpTest,
                         ::testing::Values(Setting{1, true, false}, Setting{1, true, true},
                                           Setting{2, true, false}, Setting{2, false, false},
                                           Setting{3, true, false}, Setting{3, false, false}),
                         Name);

// Keeping every unit gathered from forward to backward changes which buffers hold the
// parameters, never their values or the order of the arithmetic.
TEST(FsdpReshardTest, ReshardAfterForwardOnOrOffGivesIdenticalGradients) {
  const Fixture f(/*tied=*/true);
  for (const int world_size : {2, 3}) {
    FsdpOptions on, off;
    on.reshard_after_forward = true;
    off.reshard_after_forward = false;
    const std::vector<RankResult> resharded = Sharded(f, world_size, on);
    const std::vector<RankResult> kept = Sharded(f, world_size, off);
    for (int rank = 0; rank < world_size; ++rank) {
      EXPECT_TRUE(SameBits(kept[rank].pass.grads, resharded[rank].pass.grads))
          << "world size " << world_size << " rank " << rank;
      EXPECT_TRUE(SameBits(kept[rank].pass.logprobs, resharded[rank].pass.logprobs))
          << "world size " << world_size << " rank " << rank;
    }
    // The price of not resharding: a buffer per unit instead of a few in rotation.
    EXPECT_GT(kept[0].memory.unit_buffer_bytes, resharded[0].memory.unit_buffer_bytes);
  }
}

// The persistent state of a rank (fp32 parameter and gradient shards) is 1 / W of the model,
// up to the padding of each unit to a multiple of W.
TEST(FsdpMemoryTest, MemoryPerRankFallsWithWorldSize) {
  const Fixture f(/*tied=*/true);
  const ParameterLayout layout(f.config);
  const int64_t full_bytes = layout.num_elements() * static_cast<int64_t>(sizeof(float));
  int64_t previous = 0;
  for (const int world_size : {1, 2, 3}) {
    const std::vector<RankResult> ranks = Sharded(f, world_size, FsdpOptions{});
    for (int rank = 0; rank < world_size; ++rank) {
      const FsdpMemory& m = ranks[rank].memory;
      SCOPED_TRACE(absl::StrCat("world size ", world_size, " rank ", rank));
      EXPECT_EQ(m.full_model_bytes, full_bytes);
      EXPECT_EQ(m.grad_shard_bytes, m.param_shard_bytes);
      EXPECT_GE(m.param_shard_bytes * world_size, full_bytes);
      const int64_t padding_bytes = layout.num_units() * (world_size - 1) * sizeof(float);
      EXPECT_LE(m.param_shard_bytes * world_size, full_bytes + padding_bytes);
      if (previous > 0) {
        EXPECT_LT(m.param_shard_bytes, previous);
      }
    }
    previous = ranks[0].memory.param_shard_bytes;
  }
}

TEST(FsdpLoadTest, LoadFullOfTheWrongSizeIsAnErrorNamingBothSizes) {
  const Fixture f(/*tied=*/true);
  const int64_t n = ParameterLayout(f.config).num_elements();
  const absl::Status status =
      AllRanksOk(RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(f.config, &comm, {}));
        const std::vector<float> short_by_one(n - 1);
        EXPECT_TRUE(::prl::testing::IsError(
            model->LoadFull(short_by_one), absl::StatusCode::kInvalidArgument,
            {absl::StrCat("expected ", n, " parameters"), absl::StrCat("found ", n - 1)}));
        return absl::OkStatus();
      }));
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace prl::learner
