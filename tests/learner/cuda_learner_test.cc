// The learner on a GPU (FSDP over NCCL, world size 1) against the CPU learner (FSDP over Gloo,
// world size 1) on the same model and samples: the step's gradient, and the update of one
// optimizer step, in the fp32 mode and the bf16 mixed-precision mode, through the direct path
// (the shard is the whole model) and the sharded path (every unit all-gathered and its
// gradient reduce-scattered on NCCL's stream, with the next unit prefetched while the current
// one computes: FsdpOptions::always_gather).
//
// Bounds. Gradients: fp32 1e-4 relative per step (as the model test: two fp32 backends with
// different summation orders through every layer), bf16 5e-2 (weights of std 0.02, as the
// model test). SGD's update is -lr * clip * grad, so it inherits the gradient's bound. AdamW's
// first update is lr * g / (|g| + eps) per element, about lr * sign(g): an element whose
// gradient is below the backends' absolute difference can flip sign, so its relative error
// is not bounded by the gradient's; it is recorded, and bounded loosely (fp32 1e-2, bf16 0.3)
// against gross errors. The sharded path equals the direct path on the GPU to 1e-6 (its
// collectives at world size 1 are copies; the accumulation order differs only in where the
// unit's gradient is added). Skips without a GPU and NCCL (scripts/gpu_check.sh runs it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/rendezvous.h"
#include "core/device.h"
#include "learner/checkpoint.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "model/parameters.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/learner/cuda_learner_testing.h"

namespace prl::learner {
namespace {

using testing::GpuTestConfig;
using testing::GpuTestSamples;
using testing::RecordFigure;

struct Outcome {
  std::vector<float> grads;   // the step's full gradient (before clipping)
  std::vector<float> update;  // parameters after the step minus before
  double loss = 0;
};

struct Setting {
  Device device = Device::Cpu();
  DType dtype = DType::kF32;
  bool always_gather = false;
  OptimizerKind optimizer = OptimizerKind::kSgd;
};

class CudaLearnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!collective::NcclCompiled() || CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA GPU (or no NCCL): this test runs on a GPU machine "
                      "(scripts/gpu_check.sh)";
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/prl_cuda_learner_test_", getpid());
    std::filesystem::create_directories(dir_);
    full_.resize(static_cast<size_t>(ParameterLayout(config_).num_elements()));
    ParameterSet init = *ParameterSet::Allocate(config_, Device::Cpu(), false);
    InitializeParameters(init, 5, 0.02f);
    std::copy(init.data(), init.data() + full_.size(), full_.begin());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // One step of the learner in `setting` from full_, on samples_.
  Outcome Step(const Setting& setting) {
    Outcome out;
    collective::RendezvousConfig rendezvous;
    rendezvous.file_store_dir = dir_;
    rendezvous.group_name = absl::StrCat("g", next_group_++);
    absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
        setting.device.is_cuda() ? collective::ConnectNccl(rendezvous, setting.device, {})
                                 : collective::ConnectGloo(rendezvous, {});
    EXPECT_TRUE(comm.ok()) << comm.status();
    if (!comm.ok()) return out;
    FsdpOptions options;
    options.transformer.compute_dtype = setting.dtype;
    options.always_gather = setting.always_gather;
    absl::StatusOr<std::unique_ptr<FsdpModel>> model =
        FsdpModel::Create(config_, comm->get(), options);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return out;
    EXPECT_TRUE((*model)->LoadFull(full_).ok());
    OptimizerConfig opt;
    opt.kind = setting.optimizer;
    opt.lr = 1e-3;
    opt.max_grad_norm = 1.0;
    absl::StatusOr<std::unique_ptr<ShardedOptimizer>> optimizer =
        ShardedOptimizer::Create(opt, model->get());
    EXPECT_TRUE(optimizer.ok()) << optimizer.status();
    if (!optimizer.ok()) return out;
    StepConfig step;
    step.micro_batch_tokens = 96;  // several micro-batches: accumulation across them
    step.temperature = 0.9f;
    EXPECT_TRUE((*model)->ZeroGrad().ok());
    absl::StatusOr<StepStats> stats = AccumulateGradients(**model, samples_, step, 3);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) return out;
    EXPECT_GT(stats->micro_batches, 1);
    out.loss = stats->loss.loss;
    out.grads.resize(full_.size());
    EXPECT_TRUE((*model)->GatherFullGrads(absl::MakeSpan(out.grads)).ok());
    EXPECT_TRUE((*optimizer)->Step().ok());
    out.update.resize(full_.size());
    EXPECT_TRUE((*model)->GatherFullParams(absl::MakeSpan(out.update)).ok());
    for (size_t i = 0; i < full_.size(); ++i) out.update[i] -= full_[i];
    return out;
  }

  ModelConfig config_ = GpuTestConfig();
  std::vector<TrainSample> samples_ = GpuTestSamples(config_);
  std::vector<float> full_;
  std::string dir_;
  int next_group_ = 0;
};

TEST_F(CudaLearnerTest, GpuStepMatchesTheCpuLearnerInBothModesAndBothPaths) {
  const Device gpu = Device::Cuda(0);
  for (const OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    const bool sgd = kind == OptimizerKind::kSgd;
    const Outcome cpu = Step({Device::Cpu(), DType::kF32, false, kind});
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      const bool f32 = dtype == DType::kF32;
      const Outcome direct = Step({gpu, dtype, false, kind});
      const Outcome gathered = Step({gpu, dtype, true, kind});
      const std::string tag =
          absl::StrCat("learner_", sgd ? "sgd_" : "adamw_", std::string(DTypeName(dtype)));
      const double grad_error = ::prl::testing::RelativeError(direct.grads, cpu.grads);
      const double update_error = ::prl::testing::RelativeError(direct.update, cpu.update);
      RecordFigure(tag + "_grad", grad_error);
      RecordFigure(tag + "_update", update_error);
      RecordFigure(tag + "_loss_abs", std::fabs(direct.loss - cpu.loss));
      EXPECT_LE(grad_error, f32 ? 1e-4 : 5e-2) << tag;
      EXPECT_LE(update_error, sgd ? (f32 ? 1e-4 : 5e-2) : (f32 ? 1e-2 : 0.3)) << tag;
      EXPECT_NEAR(direct.loss, cpu.loss, f32 ? 1e-4 : 2e-2) << tag;
      // The sharded path (NCCL all-gathers and reduce-scatters, prefetching) is the direct
      // path's arithmetic.
      const double path_grad = ::prl::testing::RelativeError(gathered.grads, direct.grads);
      const double path_update = ::prl::testing::RelativeError(gathered.update, direct.update);
      RecordFigure(tag + "_sharded_vs_direct_grad", path_grad);
      RecordFigure(tag + "_sharded_vs_direct_update", path_update);
      EXPECT_LE(path_grad, 1e-6) << tag;
      if (sgd) {
        // SGD's update lr * clip * g (clip <= 1) is the gradient's image: per parameter the
        // paths may differ by what their gradients' difference explains plus the rounding of
        // each new parameter (half an ulp each). A relative bound on the whole update would
        // measure that rounding against updates of ~1e-6 on parameters of ~0.02 (on the H200
        // it read 3.8e-6 with gradients 3e-8 apart).
        int64_t beyond = 0;
        for (size_t i = 0; i < full_.size(); ++i) {
          const float p = std::fabs(full_[i] + direct.update[i]);
          const double ulp = std::nextafter(p, INFINITY) - p;
          const double explained =
              1e-3 * std::fabs(gathered.grads[i] - direct.grads[i]) * 1.0001 + ulp;
          if (std::fabs(gathered.update[i] - direct.update[i]) > explained) ++beyond;
        }
        EXPECT_EQ(beyond, 0) << tag << ": updates beyond their gradients' difference";
      } else {
        EXPECT_LE(path_update, 1e-3) << tag;
      }
    }
  }
}

// Runs everywhere (CI included): the mixed-precision mode is a CUDA mode.
// A checkpoint of a GPU learner holds its device shards (copied out, not read as host memory):
// the CPU learner and a fresh GPU learner load it to the same parameters, bit for bit, and the
// GPU learner's next AdamW step from it equals the CPU learner's next step (the moments came
// back too) within the fp32 bound.
TEST_F(CudaLearnerTest, ACheckpointOfTheGpuLearnerLoadsIntoTheCpuAndTheGpuLearner) {
  struct Learner {
    std::unique_ptr<collective::Communicator> comm;
    std::unique_ptr<FsdpModel> model;
    std::unique_ptr<ShardedOptimizer> optimizer;
  };
  auto make = [&](Device device) {
    Learner l;
    collective::RendezvousConfig rendezvous;
    rendezvous.file_store_dir = dir_;
    rendezvous.group_name = absl::StrCat("ckpt", next_group_++);
    l.comm = *(device.is_cuda() ? collective::ConnectNccl(rendezvous, device, {})
                                : collective::ConnectGloo(rendezvous, {}));
    l.model = *FsdpModel::Create(config_, l.comm.get(), FsdpOptions{});
    EXPECT_TRUE(l.model->LoadFull(full_).ok());
    OptimizerConfig opt;
    opt.kind = OptimizerKind::kAdamW;
    opt.lr = 1e-3;
    l.optimizer = *ShardedOptimizer::Create(opt, l.model.get());
    return l;
  };
  auto step = [&](Learner& l) {
    StepConfig config;
    config.micro_batch_tokens = 96;
    ASSERT_TRUE(l.model->ZeroGrad().ok());
    ASSERT_TRUE(AccumulateGradients(*l.model, samples_, config, 3).ok());
    ASSERT_TRUE(l.optimizer->Step().ok());
  };
  auto params = [&](Learner& l) {
    std::vector<float> p(full_.size());
    EXPECT_TRUE(l.model->GatherFullParams(absl::MakeSpan(p)).ok());
    return p;
  };
  const std::string ckpt = dir_ + "/checkpoints";
  Learner gpu = make(Device::Cuda(0));
  step(gpu);
  TrainingState state;
  state.step = 1;
  state.weight_version = 1;
  ASSERT_TRUE(SaveCheckpoint(ckpt, *gpu.model, *gpu.optimizer, state).ok());
  const std::vector<float> saved = params(gpu);

  Learner cpu = make(Device::Cpu()), gpu2 = make(Device::Cuda(0));
  for (Learner* l : {&cpu, &gpu2}) {
    absl::StatusOr<std::optional<TrainingState>> loaded =
        LoadLatestCheckpoint(ckpt, *l->model, *l->optimizer);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_EQ((*loaded)->step, 1);
    EXPECT_EQ(params(*l), saved) << l->model->device().ToString();
  }
  step(cpu);
  step(gpu2);
  const std::vector<float> a = params(cpu), b = params(gpu2);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(b[i]) - a[i]) * (static_cast<double>(b[i]) - a[i]);
    norm += (static_cast<double>(a[i]) - saved[i]) * (static_cast<double>(a[i]) - saved[i]);
  }
  const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  RecordFigure("checkpoint_resume_adamw_update_F32", rel);
  EXPECT_LE(rel, 1e-2);  // AdamW's loose fp32 bound above
}

TEST(FsdpComputeDTypeTest, Bf16ModeIsRefusedOnTheCpuNamingTheDeviceAndTheDType) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/prl_fsdp_dtype_test_", getpid());
  collective::RendezvousConfig rendezvous;
  rendezvous.file_store_dir = dir;
  absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
      collective::ConnectGloo(rendezvous, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  FsdpOptions options;
  options.transformer.compute_dtype = DType::kBF16;
  const absl::Status s = FsdpModel::Create(GpuTestConfig(), comm->get(), options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("bf16 on a CUDA device; found BF16 on cpu"),
            std::string::npos)
      << s;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace prl::learner
