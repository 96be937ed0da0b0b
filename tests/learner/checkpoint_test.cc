// Sharded learner checkpoints (learner/checkpoint.h) in one process, the ranks as threads
// over Gloo: a resumed run is the uninterrupted run bit for bit, the directory keeps the
// newest keep_last checkpoints and no partial ones, the export reassembles the shards, and
// every reason a checkpoint cannot be loaded is an error naming what was expected and found.
#include "learner/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "tests/learner/learner_testing.h"
#include "tests/status_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::AllRanksOk;
using ::prl::learner::testing::RunRanks;
using ::prl::learner::testing::ScratchDir;
using ::prl::testing::IsError;

// One rank's learner.
struct Learner {
  std::unique_ptr<FsdpModel> model;
  std::unique_ptr<ShardedOptimizer> optimizer;
};

absl::StatusOr<Learner> MakeLearner(const ModelConfig& config, collective::Communicator& comm,
                                    OptimizerKind kind = OptimizerKind::kAdamW) {
  Learner l;
  PRL_ASSIGN_OR_RETURN(l.model, FsdpModel::Create(config, &comm, {}));
  OptimizerConfig optimizer;
  optimizer.kind = kind;
  optimizer.lr = 1e-2;
  optimizer.weight_decay = 0.1;
  PRL_ASSIGN_OR_RETURN(l.optimizer, ShardedOptimizer::Create(optimizer, l.model.get()));
  return l;
}

// Everything a resumed run must reproduce: the gathered parameters, and per rank the moments
// and the optimizer's step count.
struct Final {
  std::vector<float> params;
  std::vector<std::vector<float>> exp_avg, exp_avg_sq;
  std::vector<int64_t> optimizer_step;
};

// The uninterrupted and the resumed runs of one model on one data stream.
class TrainingRun {
 public:
  TrainingRun(int world_size, int64_t steps)
      : world_size_(world_size),
        steps_(steps),
        config_(testing::TinyConfig()),
        init_(testing::RandomParameters(config_, 11)),
        sequences_(testing::RandomSequences(config_, 12)) {}

  // Steps 1..steps_ without a break.
  Final Uninterrupted() {
    Final out = Sized();
    Run([&](int rank, collective::Communicator& comm) -> absl::Status {
      PRL_ASSIGN_OR_RETURN(Learner l, MakeLearner(config_, comm));
      PRL_RETURN_IF_ERROR(l.model->LoadFull(init_));
      for (int64_t step = 1; step <= steps_; ++step) PRL_RETURN_IF_ERROR(Step(l, step, rank));
      return Record(l, rank, out);
    });
    return out;
  }

  // Steps 1..saved_at, then a checkpoint of the state after them (returned).
  Final SaveAfter(const std::string& dir, int64_t saved_at) {
    Final out = Sized();
    Run([&](int rank, collective::Communicator& comm) -> absl::Status {
      PRL_ASSIGN_OR_RETURN(Learner l, MakeLearner(config_, comm));
      PRL_RETURN_IF_ERROR(l.model->LoadFull(init_));
      for (int64_t step = 1; step <= saved_at; ++step) PRL_RETURN_IF_ERROR(Step(l, step, rank));
      PRL_RETURN_IF_ERROR(Record(l, rank, out));
      return SaveCheckpoint(dir, *l.model, *l.optimizer, StateAt(saved_at));
    });
    return out;
  }

  // SaveAfter, then a new group of ranks (fresh communicators, models holding other
  // parameters) that loads the checkpoint and runs the remaining steps from its state.
  Final Resumed(const std::string& dir, int64_t saved_at) {
    SaveAfter(dir, saved_at);
    Final out = Sized();
    Run([&](int rank, collective::Communicator& comm) -> absl::Status {
      PRL_ASSIGN_OR_RETURN(Learner l, MakeLearner(config_, comm));
      PRL_RETURN_IF_ERROR(l.model->LoadFull(testing::RandomParameters(config_, 99)));
      PRL_ASSIGN_OR_RETURN(const std::optional<TrainingState> state,
                           LoadLatestCheckpoint(dir, *l.model, *l.optimizer));
      if (!state.has_value()) return absl::NotFoundError("no checkpoint loaded");
      ExpectSameState(*state, StateAt(saved_at));
      for (int64_t step = state->step + 1; step <= steps_; ++step) {
        PRL_RETURN_IF_ERROR(Step(l, step, rank));
      }
      return Record(l, rank, out);
    });
    return out;
  }

  // The training state after `step` steps (the rng fields use all 64 bits).
  TrainingState StateAt(int64_t step) const {
    return {.step = step,
            .weight_version = 100 + step,
            .data_position = step * world_size_,
            .rng_seed = 0xFEDCBA9876543210ull,
            .rng_counter = 1000 * static_cast<uint64_t>(step)};
  }

  static void ExpectSameState(const TrainingState& a, const TrainingState& b) {
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.weight_version, b.weight_version);
    EXPECT_EQ(a.data_position, b.data_position);
    EXPECT_EQ(a.rng_seed, b.rng_seed);
    EXPECT_EQ(a.rng_counter, b.rng_counter);
  }

 private:
  void Run(const std::function<absl::Status(int, collective::Communicator&)>& fn) {
    const absl::Status status = AllRanksOk(RunRanks(world_size_, fn));
    EXPECT_TRUE(status.ok()) << status;
  }

  Final Sized() const {
    Final out;
    out.params.resize(init_.size());
    out.exp_avg.resize(world_size_);
    out.exp_avg_sq.resize(world_size_);
    out.optimizer_step.resize(world_size_);
    return out;
  }

  // Training step `step` (1-based) on rank r's sequence (step W + r) mod N: a step sees the
  // same data whether or not the run was interrupted before it.
  absl::Status Step(Learner& l, int64_t step, int rank) const {
    const size_t i = static_cast<size_t>(step * world_size_ + rank) % sequences_.size();
    PackedBatch batch;
    batch.AddScored(sequences_[i], 1);
    std::vector<float> logprobs(batch.num_tokens());
    PRL_RETURN_IF_ERROR(l.model->ZeroGrad());
    PRL_RETURN_IF_ERROR(l.model->Forward(batch, 1.0f, absl::MakeSpan(logprobs), true));
    PRL_RETURN_IF_ERROR(l.model->Backward(testing::MaxLikelihoodGrad(batch)));
    return l.optimizer->Step().status();
  }

  absl::Status Record(Learner& l, int rank, Final& out) const {
    out.exp_avg[rank].assign(l.optimizer->exp_avg().begin(), l.optimizer->exp_avg().end());
    out.exp_avg_sq[rank].assign(l.optimizer->exp_avg_sq().begin(), l.optimizer->exp_avg_sq().end());
    out.optimizer_step[rank] = l.optimizer->step();
    std::vector<float> params(init_.size());
    PRL_RETURN_IF_ERROR(l.model->GatherFullParams(absl::MakeSpan(params)));
    if (rank == 0) out.params = params;
    return absl::OkStatus();
  }

  int world_size_;
  int64_t steps_;
  ModelConfig config_;
  std::vector<float> init_;
  std::vector<std::vector<int32_t>> sequences_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Saves `steps` checkpoints (steps 1..steps) of a freshly loaded model at `world_size`.
void SaveSteps(const std::string& dir, const ModelConfig& config, int world_size,
               std::vector<int64_t> steps, int keep_last = 2,
               OptimizerKind kind = OptimizerKind::kAdamW) {
  const std::vector<float> init = testing::RandomParameters(config, 1);
  const absl::Status status =
      AllRanksOk(RunRanks(world_size, [&](int, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(Learner l, MakeLearner(config, comm, kind));
        PRL_RETURN_IF_ERROR(l.model->LoadFull(init));
        for (const int64_t step : steps) {
          PRL_RETURN_IF_ERROR(
              SaveCheckpoint(dir, *l.model, *l.optimizer, {.step = step}, keep_last));
        }
        return absl::OkStatus();
      }));
  ASSERT_TRUE(status.ok()) << status;
}

// LoadLatestCheckpoint into a fresh model of `config` at `world_size`; rank 0's result.
absl::StatusOr<std::optional<TrainingState>> Load(const std::string& dir, const ModelConfig& config,
                                                  int world_size,
                                                  OptimizerKind kind = OptimizerKind::kAdamW) {
  std::vector<absl::StatusOr<std::optional<TrainingState>>> loaded(world_size,
                                                                   absl::UnknownError("not run"));
  const std::vector<absl::Status> status =
      RunRanks(world_size, [&](int rank, collective::Communicator& comm) -> absl::Status {
        PRL_ASSIGN_OR_RETURN(Learner l, MakeLearner(config, comm, kind));
        loaded[rank] = LoadLatestCheckpoint(dir, *l.model, *l.optimizer);
        return absl::OkStatus();
      });
  EXPECT_TRUE(AllRanksOk(status).ok()) << AllRanksOk(status);
  return loaded[0];
}

// The names in `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class CheckpointResumeTest : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointResumeTest, ResumedTrainingIsBitIdentical) {
  ScratchDir dir("checkpoint_resume");
  TrainingRun run(/*world_size=*/GetParam(), /*steps=*/4);
  const Final uninterrupted = run.Uninterrupted();
  const Final resumed = run.Resumed(dir.path(), /*saved_at=*/2);
  EXPECT_TRUE(SameBits(resumed.params, uninterrupted.params));
  for (int rank = 0; rank < GetParam(); ++rank) {
    EXPECT_TRUE(SameBits(resumed.exp_avg[rank], uninterrupted.exp_avg[rank])) << rank;
    EXPECT_TRUE(SameBits(resumed.exp_avg_sq[rank], uninterrupted.exp_avg_sq[rank])) << rank;
    EXPECT_EQ(resumed.optimizer_step[rank], 4) << rank;
  }
  // The moments were not all zero (AdamW ran), so their bits were a real comparison.
  EXPECT_TRUE(std::any_of(uninterrupted.exp_avg[0].begin(), uninterrupted.exp_avg[0].end(),
                          [](float m) { return m != 0.0f; }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CheckpointResumeTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

TEST(CheckpointTest, AnEmptyDirectoryIsAFreshRun) {
  ScratchDir dir("checkpoint_fresh");
  const auto loaded = Load(dir.path(), testing::TinyConfig(), 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
}

TEST(CheckpointTest, KeepLastPrunesAllButTheNewest) {
  ScratchDir dir("checkpoint_keep");
  const ModelConfig config = testing::TinyConfig();
  SaveSteps(dir.path(), config, 1, {1, 2, 3, 4}, /*keep_last=*/2);
  EXPECT_EQ(Entries(dir.path()),
            (std::vector<std::string>{"latest", "step-00000003", "step-00000004"}));
  EXPECT_EQ(ReadFile(dir.path() + "/latest"), "step-00000004\n");
  SaveSteps(dir.path(), config, 1, {5}, /*keep_last=*/1);
  EXPECT_EQ(Entries(dir.path()), (std::vector<std::string>{"latest", "step-00000005"}));
  const auto loaded = Load(dir.path(), config, 1);
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->step, 5);
}

// A save that crashed before its rename leaves step-N.partial/: never loaded, and removed by
// the next save.
TEST(CheckpointTest, LeftoverPartialDirectoryIsIgnoredAndCleaned) {
  ScratchDir dir("checkpoint_partial");
  const ModelConfig config = testing::TinyConfig();
  SaveSteps(dir.path(), config, 1, {1});
  const std::string partial = dir.path() + "/step-00000007.partial";
  std::filesystem::create_directories(partial);
  std::ofstream(partial + "/rank-00000-of-00001.safetensors") << "half a shard";

  const auto loaded = Load(dir.path(), config, 1);
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->step, 1);
  const absl::StatusOr<ExportedCheckpoint> exported = ReadCheckpointFull(dir.path());
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->path, dir.path() + "/step-00000001");

  SaveSteps(dir.path(), config, 1, {2});
  EXPECT_FALSE(std::filesystem::exists(partial));
  EXPECT_EQ(Entries(dir.path()),
            (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));
}

// The export reads every rank's shard (world size 3: every unit padded) without collectives.
TEST(CheckpointTest, ReadCheckpointFullReassemblesTheShardsOfEveryRank) {
  ScratchDir dir("checkpoint_export");
  TrainingRun run(/*world_size=*/3, /*steps=*/1);
  const Final trained = run.SaveAfter(dir.path(), /*saved_at=*/1);
  const absl::StatusOr<ExportedCheckpoint> exported = ReadCheckpointFull(dir.path());
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->path, dir.path() + "/step-00000001");
  const int64_t n = exported->params->layout.num_elements();
  ASSERT_EQ(n, static_cast<int64_t>(trained.params.size()));
  EXPECT_TRUE(SameBits(std::vector<float>(exported->params->data(), exported->params->data() + n),
                       trained.params));
  TrainingRun::ExpectSameState(exported->state, run.StateAt(1));
}

TEST(CheckpointTest, WorldSizeMismatchIsAnErrorNamingBothSizes) {
  const ModelConfig config = testing::TinyConfig();
  for (const auto& [saved, loaded] : {std::pair{2, 1}, std::pair{1, 2}}) {
    ScratchDir dir("checkpoint_world");
    SaveSteps(dir.path(), config, saved, {3});
    EXPECT_TRUE(IsError(Load(dir.path(), config, loaded).status(),
                        absl::StatusCode::kFailedPrecondition,
                        {absl::StrCat("its world_size is '", saved, "'"),
                         absl::StrCat("this run has '", loaded, "'"), "resharding"}))
        << "saved at " << saved << ", loaded at " << loaded;
  }
}

TEST(CheckpointTest, ModelMismatchIsAnErrorNamingBothModels) {
  ScratchDir dir("checkpoint_model");
  const ModelConfig saved = testing::TinyConfig();
  ModelConfig wider = saved;
  wider.intermediate_size = 64;
  SaveSteps(dir.path(), saved, 1, {1});
  EXPECT_TRUE(
      IsError(Load(dir.path(), wider, 1).status(), absl::StatusCode::kFailedPrecondition,
              {"checkpoint model is '", "intermediate=48", "this run has '", "intermediate=64"}));
}

TEST(CheckpointTest, OptimizerMismatchIsAnErrorNamingBothOptimizers) {
  ScratchDir dir("checkpoint_optimizer");
  const ModelConfig config = testing::TinyConfig();
  SaveSteps(dir.path(), config, 1, {1}, 2, OptimizerKind::kAdamW);
  EXPECT_TRUE(IsError(Load(dir.path(), config, 1, OptimizerKind::kSgd).status(),
                      absl::StatusCode::kFailedPrecondition,
                      {"checkpoint optimizer is 'adamw'", "this run has 'sgd'"}));
}

TEST(CheckpointTest, LatestNamingAMissingDirectoryIsAClearError) {
  ScratchDir dir("checkpoint_latest");
  std::ofstream(dir.path() + "/latest") << "step-00000077\n";
  const std::initializer_list<absl::string_view> message = {"/latest names 'step-00000077'",
                                                            "which is not a checkpoint directory"};
  EXPECT_TRUE(IsError(Load(dir.path(), testing::TinyConfig(), 1).status(),
                      absl::StatusCode::kDataLoss, message));
  EXPECT_TRUE(
      IsError(ReadCheckpointFull(dir.path()).status(), absl::StatusCode::kDataLoss, message));
}

// ---- Fallback to the newest complete checkpoint ----------------------------------------

// Flips the last byte of a file (inside its last tensor's data).
void FlipLastByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get());
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(c ^ 0x40));
}

class CheckpointFallbackTest : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointFallbackTest, ADamagedShardOfTheLatestFallsBackToTheNewestCompleteOne) {
  const int world = GetParam();
  ScratchDir dir("checkpoint_damaged");
  const ModelConfig config = testing::TinyConfig();
  SaveSteps(dir.path(), config, world, {1, 2, 3}, /*keep_last=*/3);
  // Only the last rank's shard is damaged: every rank must still agree on step 2.
  FlipLastByte(absl::StrFormat("%s/step-00000003/rank-%05d-of-%05d.safetensors", dir.path(),
                               world - 1, world));
  const auto loaded = Load(dir.path(), config, world);
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->step, 2);
  const absl::StatusOr<ExportedCheckpoint> exported = ReadCheckpointFull(dir.path());
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->path, dir.path() + "/step-00000002");
}

TEST_P(CheckpointFallbackTest, ATruncatedOrMissingLatestFallsBackToTheNewestCompleteOne) {
  const int world = GetParam();
  ScratchDir dir("checkpoint_missing");
  const ModelConfig config = testing::TinyConfig();
  SaveSteps(dir.path(), config, world, {1, 2, 3}, /*keep_last=*/3);
  std::filesystem::remove_all(dir.path() + "/step-00000003");  // `latest` names it
  std::filesystem::resize_file(
      absl::StrFormat("%s/step-00000002/rank-%05d-of-%05d.safetensors", dir.path(), 0, world), 100);
  const auto loaded = Load(dir.path(), config, world);
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->step, 1);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CheckpointFallbackTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

TEST(CheckpointTest, WithNoCompleteCheckpointLeftLoadingIsDataLossNamingTheDamage) {
  ScratchDir dir("checkpoint_none_complete");
  const ModelConfig config = testing::TinyConfig();
  SaveSteps(dir.path(), config, 1, {1});
  FlipLastByte(dir.path() + "/step-00000001/rank-00000-of-00001.safetensors");
  EXPECT_TRUE(IsError(Load(dir.path(), config, 1).status(), absl::StatusCode::kDataLoss,
                      {"no complete checkpoint to fall back to", "has XXH3", "its metadata says"}));
}

TEST(CheckpointTest, AMismatchedModelIsNotMistakenForDamage) {
  ScratchDir dir("checkpoint_mismatch_no_fallback");
  const ModelConfig saved = testing::TinyConfig();
  ModelConfig wider = saved;
  wider.intermediate_size = 64;
  SaveSteps(dir.path(), saved, 1, {1, 2}, /*keep_last=*/2);
  EXPECT_TRUE(IsError(Load(dir.path(), wider, 1).status(), absl::StatusCode::kFailedPrecondition,
                      {"step-00000002", "intermediate=64"}))
      << "an older checkpoint of the same run fits no better";
}

}  // namespace
}  // namespace prl::learner
