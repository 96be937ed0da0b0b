// FsdpModel's LoRA mode (learner/fsdp.h) and the frozen base it reads (learner/frozen_base.h),
// ranks as threads of this process over Gloo:
// - at world sizes 1, 2 and 3 (and 1 through the sharded path) the adapter's gradient, summed
//   over the ranks' sequences, equals the unsharded Transformer's with the base frozen, per
//   tensor within 1e-5 relative (the bound and its reasoning: fsdp_test.cc); the log-probs
//   within 1e-5; the gathered adapter is what was loaded, bit for bit; each rank holds a
//   1 / W shard of the adapter and no shard of the base;
// - the base file is written once (mode 0600), mapped by every rank, and gone once all have
//   mapped it; a file of the wrong size is an error naming both sizes; the default directory is
//   this user's alone (0700), and one others may write is refused; two learners of one model
//   on a node each map their own base; BindOn on the CPU is the mapping (no copy);
// - LoRA without a frozen base, or with a base of another model, is refused with an error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/frozen_base.h"
#include "learner/fsdp.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::AllRanksOk;
using ::prl::learner::testing::BatchOf;
using ::prl::learner::testing::MaxLikelihoodGrad;
using ::prl::learner::testing::RelativeDifference;
using ::prl::learner::testing::RunRanks;
using ::prl::learner::testing::ScratchDir;

constexpr double kTolerance = 1e-5;

LoraConfig AllLinear() {
  LoraConfig lora;
  lora.rank = 3;  // 3: the adapter's element count is not a multiple of 2 or 3 in general
  lora.alpha = 5;
  lora.target_modules = {"all-linear"};
  return lora;
}

struct Fixture {
  ModelConfig config = testing::TinyConfig(false);
  ParameterSet base = *ParameterSet::Allocate(config, Device::Cpu(), false);
  LoraSet adapter = *LoraSet::Allocate(config, AllLinear(), Device::Cpu(), false);
  std::vector<std::vector<int32_t>> sequences = testing::RandomSequences(config, 23);

  Fixture() {
    const std::vector<float> full = testing::RandomParameters(config, 17);
    std::copy(full.begin(), full.end(), base.data());
    InitializeLora(adapter, 4);
    std::mt19937_64 rng(6);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (const LoraEntry& e : adapter.layout.entries()) {  // B random: A's gradient non-zero
      if (e.is_a) continue;
      for (int64_t i = 0; i < e.numel; ++i) adapter.data()[e.offset + i] = normal(rng);
    }
  }
  int64_t adapter_elements() const { return adapter.layout.num_elements(); }
};

struct Pass {
  std::vector<float> logprobs, grads, params;
  FsdpMemory memory;
};

Pass Unsharded(const Fixture& f) {
  Transformer model(f.config, Device::Cpu());
  ModelParams params = f.base.params;
  params.lora = &f.adapter.params;
  LoraSet grads = *LoraSet::Allocate(f.config, f.adapter.lora, Device::Cpu(), true);
  ModelParams frozen;
  frozen.lora = &grads.params;
  const PackedBatch batch = BatchOf(f.sequences, 0, 1);
  Pass out;
  out.logprobs.resize(batch.num_tokens());
  {
    const absl::Status status =
        model.Forward(params, batch, 1.0f, absl::MakeSpan(out.logprobs), true);
    EXPECT_TRUE(status.ok()) << status;
  }
  {
    const absl::Status status = model.Backward(params, MaxLikelihoodGrad(batch), frozen);
    EXPECT_TRUE(status.ok()) << status;
  }
  out.grads.assign(grads.data(), grads.data() + f.adapter_elements());
  return out;
}

std::vector<Pass> Sharded(const Fixture& f, int world_size, bool always_gather) {
  ScratchDir dir("fsdp_lora");
  std::vector<Pass> out(world_size);
  const absl::Status status = AllRanksOk(
      RunRanks(world_size, [&](int rank, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(
            std::unique_ptr<FrozenBase> base,
            FrozenBase::Share(FrozenBasePath(dir.path(), f.config), f.config,
                              rank == 0 ? &f.base : nullptr, absl::OkStatus(), comm));
        FsdpOptions options;
        options.always_gather = always_gather;
        options.lora = f.adapter.lora;
        options.frozen_base = base.get();
        PRL_ASSIGN_OR_RETURN(std::unique_ptr<FsdpModel> model,
                             FsdpModel::Create(f.config, &comm, options));
        PRL_RETURN_IF_ERROR(
            model->LoadFull({f.adapter.data(), static_cast<size_t>(f.adapter_elements())}));
        PRL_RETURN_IF_ERROR(model->ZeroGrad());
        const PackedBatch batch = BatchOf(f.sequences, rank, world_size);
        Pass& r = out[rank];
        r.logprobs.resize(batch.num_tokens());
        PRL_RETURN_IF_ERROR(model->Forward(batch, 1.0f, absl::MakeSpan(r.logprobs), true));
        PRL_RETURN_IF_ERROR(model->Backward(MaxLikelihoodGrad(batch)));
        r.grads.resize(f.adapter_elements());
        r.params.resize(f.adapter_elements());
        PRL_RETURN_IF_ERROR(model->GatherFullGrads(absl::MakeSpan(r.grads)));
        PRL_RETURN_IF_ERROR(model->GatherFullParams(absl::MakeSpan(r.params)));
        r.memory = model->memory();
        return absl::OkStatus();
      }));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

struct Setting {
  int world_size = 1;
  bool always_gather = false;
};

class FsdpLoraTest : public ::testing::TestWithParam<Setting> {};

TEST_P(FsdpLoraTest, AdapterGradientsEqualTheUnshardedModelsWithTheBaseFrozen) {
  const Setting s = GetParam();
  const Fixture f;
  const Pass want = Unsharded(f);
  const std::vector<Pass> ranks = Sharded(f, s.world_size, s.always_gather);
  ASSERT_EQ(static_cast<int>(ranks.size()), s.world_size);
  for (const LoraEntry& e : f.adapter.layout.entries()) {
    const double d = RelativeDifference(ranks[0].grads, want.grads, e.offset, e.numel);
    EXPECT_LE(d, kTolerance) << e.name;
  }
  double norm = 0;
  for (float g : want.grads) norm += double{g} * g;
  EXPECT_GT(norm, 0.0) << "a gradient to compare";
  // Rank r's log-probs are the reference batch's of its sequences (r, r + W, ...), each
  // sequence of n tokens giving n - 1.
  std::vector<size_t> offset = {0};
  for (const auto& seq : f.sequences) offset.push_back(offset.back() + seq.size() - 1);
  for (int r = 0; r < s.world_size; ++r) {
    size_t at = 0;
    for (size_t i = r; i < f.sequences.size(); i += s.world_size) {
      for (size_t t = offset[i]; t < offset[i + 1]; ++t, ++at) {
        ASSERT_NEAR(ranks[r].logprobs[at], want.logprobs[t], 1e-5) << "rank " << r;
      }
    }
    EXPECT_EQ(at, ranks[r].logprobs.size());
    EXPECT_TRUE(std::equal(ranks[r].params.begin(), ranks[r].params.end(), f.adapter.data()))
        << "rank " << r << " gathers the adapter it loaded";
    const int64_t shard = (f.adapter_elements() + s.world_size - 1) / s.world_size;
    EXPECT_EQ(ranks[r].memory.param_shard_bytes, shard * 4);
    EXPECT_EQ(ranks[r].memory.grad_shard_bytes, shard * 4);
    EXPECT_EQ(ranks[r].memory.frozen_base_bytes, ParameterLayout(f.config).num_elements() * 4);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FsdpLoraTest,
                         ::testing::Values(Setting{1, false}, Setting{1, true}, Setting{2, false},
                                           Setting{3, false}),
                         [](const ::testing::TestParamInfo<Setting>& info) {
                           return absl::StrCat("world", info.param.world_size,
                                               info.param.always_gather ? "_gathered" : "");
                         });

TEST(FrozenBaseTest, OneFileIsWrittenMappedByEveryRankAndRemovedOnceMapped) {
  const Fixture f;
  ScratchDir dir("frozen_base");
  const std::string path = FrozenBasePath(dir.path(), f.config);
  {
    const absl::Status status = FrozenBase::Write(path, f.base);
    ASSERT_TRUE(status.ok()) << status;
  }
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "run data is this user's alone";
  std::filesystem::remove(path);

  std::vector<std::unique_ptr<FrozenBase>> mapped(2);
  {
    const absl::Status status =
        AllRanksOk(RunRanks(2, [&](int rank, collective::Communicator& comm) -> absl::Status {
          PRL_ASSIGN_OR_RETURN(mapped[rank],
                               FrozenBase::Share(path, f.config, rank == 0 ? &f.base : nullptr,
                                                 absl::OkStatus(), comm));
          return absl::OkStatus();
        }));
    ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "no file outlives the mapping";
  for (const auto& base : mapped) {
    ASSERT_EQ(base->num_elements(), f.base.layout.num_elements());
    EXPECT_TRUE(std::equal(base->data(), base->data() + base->num_elements(), f.base.data()));
  }
}

// BindOn on the CPU is the mapping itself (no copy); BF16 is a CUDA mode, refused naming it.
TEST(FrozenBaseTest, BindOnTheCpuViewsTheMappingAndRefusesBf16) {
  const Fixture f;
  ScratchDir dir("frozen_base_bind");
  const std::string path = FrozenBasePath(dir.path(), f.config);
  ASSERT_TRUE(FrozenBase::Write(path, f.base).ok());
  absl::StatusOr<std::unique_ptr<FrozenBase>> base = FrozenBase::Map(path, f.config);
  ASSERT_TRUE(base.ok()) << base.status();
  absl::StatusOr<ModelParams> on_cpu = (*base)->BindOn(Device::Cpu(), DType::kF32);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_EQ(on_cpu->embed.data, (*base)->Bind().embed.data);
  EXPECT_EQ((*base)->device_bytes(), 0);
  const absl::StatusOr<ModelParams> bf16 = (*base)->BindOn(Device::Cpu(), DType::kBF16);
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bf16.status().message().find("expected F32, found BF16"), std::string::npos)
      << bf16.status();
}

TEST(FrozenBaseTest, TwoLearnersOfOneModelOnANodeEachMapTheirOwnBase) {
  const Fixture f;
  ParameterSet other = *ParameterSet::Allocate(f.config, Device::Cpu(), false);
  for (int64_t i = 0; i < other.layout.num_elements(); ++i) other.data()[i] = f.base.data()[i] + 1;
  ScratchDir dir("frozen_base_two");
  const std::string path = FrozenBasePath(dir.path(), f.config);  // the same for both
  std::vector<absl::Status> results(2);
  auto learner = [&](const ParameterSet* weights, absl::Status* result) {
    *result = AllRanksOk(RunRanks(2, [&](int rank, collective::Communicator& comm) -> absl::Status {
      PRL_ASSIGN_OR_RETURN(
          std::unique_ptr<FrozenBase> base,
          FrozenBase::Share(path, f.config, rank == 0 ? weights : nullptr, absl::OkStatus(), comm));
      if (!std::equal(base->data(), base->data() + base->num_elements(), weights->data())) {
        return absl::InternalError(absl::StrCat("rank ", rank, " mapped another learner's base"));
      }
      return absl::OkStatus();
    }));
  };
  std::thread a(learner, &f.base, &results[0]), b(learner, &other, &results[1]);
  a.join();
  b.join();
  for (const absl::Status& r : results) EXPECT_TRUE(r.ok()) << r;
}

TEST(FrozenBaseTest, TheDefaultDirectoryIsThisUsersAloneAndAnOpenOneIsRefused) {
  ScratchDir parent("private_temp");
  const absl::StatusOr<std::string> dir = PrivateTempDirectory(parent.path());
  ASSERT_TRUE(dir.ok()) << dir.status();
  struct stat st {};
  ASSERT_EQ(stat(dir->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, getuid());
  ASSERT_EQ(chmod(dir->c_str(), 0777), 0);
  const absl::Status open = PrivateTempDirectory(parent.path()).status();
  ASSERT_EQ(chmod(dir->c_str(), 0700), 0);
  EXPECT_EQ(open.code(), absl::StatusCode::kPermissionDenied) << open;
  EXPECT_NE(open.message().find("mode 777"), std::string::npos) << open;
}

TEST(FrozenBaseTest, AFileOfAnotherSizeIsAnErrorNamingBothSizes) {
  const Fixture f;
  ScratchDir dir("frozen_base_size");
  const std::string path = dir.path() + "/short.f32";
  {
    const absl::Status status = WriteFileAtomically(path, "0123");
    ASSERT_TRUE(status.ok()) << status;
  }
  const absl::Status s = FrozenBase::Map(path, f.config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(
                absl::StrCat("expected ", ParameterLayout(f.config).num_elements() * 4, " bytes")),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("found 4"), std::string::npos) << s;
}

TEST(FsdpLoraErrorsTest, LoraWithoutAFrozenBaseOrWithAnotherModelsIsRefused) {
  const Fixture f;
  ScratchDir dir("fsdp_lora_errors");
  {
    const absl::Status status =
        AllRanksOk(RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
          FsdpOptions options;
          options.lora = f.adapter.lora;
          const absl::Status none = FsdpModel::Create(f.config, &comm, options).status();
          EXPECT_NE(none.message().find("no frozen base"), std::string::npos) << none;
          ModelConfig other = f.config;
          other.tie_word_embeddings = true;
          ParameterSet other_base = *ParameterSet::Allocate(other, Device::Cpu(), true);
          PRL_ASSIGN_OR_RETURN(std::unique_ptr<FrozenBase> base,
                               FrozenBase::Share(FrozenBasePath(dir.path(), other), other,
                                                 &other_base, absl::OkStatus(), comm));
          options.frozen_base = base.get();
          const absl::Status mismatch = FsdpModel::Create(f.config, &comm, options).status();
          EXPECT_NE(mismatch.message().find("another model config"), std::string::npos) << mismatch;
          return absl::OkStatus();
        }));
    ASSERT_TRUE(status.ok()) << status;
  }
}

}  // namespace
}  // namespace prl::learner
