// The LoRA learner on a GPU (learner.cuda_lora, written, not yet run on a GPU: FsdpModel's LoRA
// mode over NCCL at world size 1, the frozen base copied to the GPU in the compute dtype, the
// adapter and its optimizer in F32) against the CPU LoRA learner (Gloo) on the same base,
// adapter and samples, for the GPU session that turns the setting on:
// - one step's adapter gradient and SGD update: within 1e-4 relative in the fp32 mode, 5e-2 in
//   the bf16 mode (the bounds of cuda_learner_test.cc, for the same reasons), the loss within
//   1e-4 / 2e-2;
// - the base is on the GPU once per process: two adapters' models on one frozen base hold one
//   copy (FrozenBase::BindOn), of the model's elements in the compute dtype.
// Skips without a GPU and NCCL (scripts/gpu_check.sh runs it).
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
#include "learner/frozen_base.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/learner/cuda_learner_testing.h"

namespace prl::learner {
namespace {

using testing::GpuTestConfig;
using testing::GpuTestSamples;
using testing::RecordFigure;

struct Outcome {
  std::vector<float> grads, update;
  double loss = 0;
  FsdpMemory memory;
};

class CudaLoraLearnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!collective::NcclCompiled() || CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA GPU (or no NCCL): this test runs on a GPU machine "
                      "(scripts/gpu_check.sh)";
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/prl_cuda_lora_learner_test_", getpid());
    std::filesystem::create_directories(dir_);
    InitializeParameters(base_, 5, 0.02f);
    lora_.rank = 8;
    lora_.alpha = 16;
    lora_.target_modules = {"all-linear"};
    adapter_ = Adapter(3);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // An adapter as PEFT starts one, but with B random (std 0.02) so that A has a gradient.
  std::vector<float> Adapter(uint64_t seed) const {
    LoraSet set = *LoraSet::Allocate(config_, lora_, Device::Cpu(), false);
    InitializeLora(set, seed);
    std::mt19937_64 rng(seed + 1);
    std::normal_distribution<float> n(0.0f, 0.02f);
    for (const LoraEntry& e : set.layout.entries()) {
      if (e.is_a) continue;
      for (int64_t i = 0; i < e.numel; ++i) set.data()[e.offset + i] = n(rng);
    }
    return std::vector<float>(set.data(), set.data() + set.layout.num_elements());
  }

  std::unique_ptr<collective::Communicator> Connect(Device device) {
    collective::RendezvousConfig rendezvous;
    rendezvous.file_store_dir = dir_;
    rendezvous.group_name = absl::StrCat("g", next_group_++);
    absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
        device.is_cuda() ? collective::ConnectNccl(rendezvous, device, {})
                         : collective::ConnectGloo(rendezvous, {});
    EXPECT_TRUE(comm.ok()) << comm.status();
    return comm.ok() ? std::move(*comm) : nullptr;
  }

  absl::StatusOr<std::unique_ptr<FsdpModel>> Model(collective::Communicator& comm,
                                                   const FrozenBase& base, DType dtype) {
    FsdpOptions options;
    options.lora = lora_;
    options.frozen_base = &base;
    options.transformer.compute_dtype = dtype;
    options.transformer.cuda_lora = true;
    return FsdpModel::Create(config_, &comm, options);
  }

  // One SGD step of the LoRA learner on `device` in `dtype` from adapter_.
  Outcome Step(Device device, DType dtype) {
    Outcome out;
    std::unique_ptr<collective::Communicator> comm = Connect(device);
    if (comm == nullptr) return out;
    absl::StatusOr<std::unique_ptr<FrozenBase>> base =
        FrozenBase::Share(FrozenBasePath(dir_, config_), config_, &base_, absl::OkStatus(), *comm);
    EXPECT_TRUE(base.ok()) << base.status();
    if (!base.ok()) return out;
    absl::StatusOr<std::unique_ptr<FsdpModel>> model = Model(*comm, **base, dtype);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return out;
    EXPECT_TRUE((*model)->LoadFull(adapter_).ok());
    OptimizerConfig opt;
    opt.kind = OptimizerKind::kSgd;
    opt.lr = 1e-3;
    opt.max_grad_norm = 1.0;
    absl::StatusOr<std::unique_ptr<ShardedOptimizer>> optimizer =
        ShardedOptimizer::Create(opt, model->get());
    EXPECT_TRUE(optimizer.ok()) << optimizer.status();
    if (!optimizer.ok()) return out;
    StepConfig step;
    step.micro_batch_tokens = 96;
    step.temperature = 0.9f;
    EXPECT_TRUE((*model)->ZeroGrad().ok());
    absl::StatusOr<StepStats> stats = AccumulateGradients(**model, samples_, step, 3);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) return out;
    out.loss = stats->loss.loss;
    out.grads.resize(adapter_.size());
    EXPECT_TRUE((*model)->GatherFullGrads(absl::MakeSpan(out.grads)).ok());
    EXPECT_TRUE((*optimizer)->Step().ok());
    out.update.resize(adapter_.size());
    EXPECT_TRUE((*model)->GatherFullParams(absl::MakeSpan(out.update)).ok());
    for (size_t i = 0; i < adapter_.size(); ++i) out.update[i] -= adapter_[i];
    out.memory = (*model)->memory();
    return out;
  }

  ModelConfig config_ = GpuTestConfig();
  ParameterSet base_ = *ParameterSet::Allocate(config_, Device::Cpu(), false);
  LoraConfig lora_;
  std::vector<float> adapter_;
  std::vector<TrainSample> samples_ = GpuTestSamples(config_);
  std::string dir_;
  int next_group_ = 0;
};

TEST_F(CudaLoraLearnerTest, GpuStepMatchesTheCpuLoraLearnerInBothModes) {
  const Outcome cpu = Step(Device::Cpu(), DType::kF32);
  ASSERT_FALSE(cpu.grads.empty());
  double norm = 0;
  for (float g : cpu.grads) norm += double{g} * g;
  ASSERT_GT(norm, 0.0) << "a gradient to compare";
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const bool f32 = dtype == DType::kF32;
    const Outcome gpu = Step(Device::Cuda(0), dtype);
    ASSERT_FALSE(gpu.grads.empty());
    const std::string tag = absl::StrCat("lora_learner_", std::string(DTypeName(dtype)));
    const double grad_error = ::prl::testing::RelativeError(gpu.grads, cpu.grads);
    const double update_error = ::prl::testing::RelativeError(gpu.update, cpu.update);
    RecordFigure(tag + "_grad", grad_error);
    RecordFigure(tag + "_update", update_error);
    RecordFigure(tag + "_loss_abs", std::fabs(gpu.loss - cpu.loss));
    EXPECT_LE(grad_error, f32 ? 1e-4 : 5e-2) << tag;
    EXPECT_LE(update_error, f32 ? 1e-4 : 5e-2) << tag;
    EXPECT_NEAR(gpu.loss, cpu.loss, f32 ? 1e-4 : 2e-2) << tag;
    EXPECT_EQ(gpu.memory.frozen_base_device_bytes,
              ParameterLayout(config_).num_elements() * static_cast<int64_t>(DTypeSize(dtype)))
        << tag;
  }
}

TEST_F(CudaLoraLearnerTest, TwoAdaptersOnOneFrozenBaseHoldOneCopyOfItOnTheGpu) {
  std::unique_ptr<collective::Communicator> comm = Connect(Device::Cuda(0));
  ASSERT_NE(comm, nullptr);
  absl::StatusOr<std::unique_ptr<FrozenBase>> base =
      FrozenBase::Share(FrozenBasePath(dir_, config_), config_, &base_, absl::OkStatus(), *comm);
  ASSERT_TRUE(base.ok()) << base.status();
  absl::StatusOr<std::unique_ptr<FsdpModel>> first = Model(*comm, **base, DType::kBF16);
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t one_copy = ParameterLayout(config_).num_elements() * 2;
  EXPECT_EQ((*base)->device_bytes(), one_copy);
  absl::StatusOr<std::unique_ptr<FsdpModel>> second = Model(*comm, **base, DType::kBF16);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*base)->device_bytes(), one_copy) << "the second adapter reads the same copy";
}

}  // namespace
}  // namespace prl::learner
