// LoRA on CUDA (TransformerOptions::cuda_lora, written, not yet run on a GPU) against the CPU
// backend, for the GPU session that turns it on:
// - the column kernels (kernels/cuda/lora_columns.cu): AddColumns and AddColumnsAtRows for
//   every pair of destination and source dtypes (an F32 adapter output into a BF16 model's
//   activation; the backward reading a BF16 gradient into F32) equal the CPU's result on the
//   stored inputs, within 1e-6 relative into F32 (one fp32 multiply-add per element) and within
//   BF16's rounding into BF16;
// - the Transformer with an adapter on every linear projection (F32): log-probs within 1e-5
//   relative and every gradient (base and adapter) within 1e-4 relative per tensor of the CPU's
//   (the bounds of cuda_transformer_test.cc, for the same reasons); with a frozen base (grads
//   for the adapter only: no base weight, norm, head or embedding gradient) the adapter's
//   gradients equal the full backward's within 1e-6;
// - the Transformer in BF16 compute on a frozen base with an F32 adapter (the LoRA learner's
//   bf16 mode): log-probs within 2e-2 absolute of the CPU's fp32 model and the adapter's
//   gradients within 5e-2 relative per tensor (cuda_transformer_test's bf16 bounds: weights of
//   std 0.02);
// - without the setting, adapters on CUDA are refused with an error naming it.
// Skips without a GPU (scripts/gpu_check.sh runs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "tests/kernels/cuda_test_util.h"

namespace prl {
namespace {

using ::prl::testing::RelativeError;

#if PRL_WITH_CUDA
using ::prl::testing::AsStored;
using ::prl::testing::DeviceTensor;
using ::prl::testing::Random;

// Every pair of destination and source dtypes (the same, or an F32 adapter output into a BF16
// activation, or a BF16 gradient read into F32): the CPU's result on the stored inputs, rounded
// once to the destination's dtype.
TEST(CudaLoraColumnsTest, AddColumnsAndAddColumnsAtRowsMatchTheCpuForEveryPairOfDtypes) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t T = 37, Wd = 96, Ws = 40, width = 24, dst_col = 17, src_col = 9, n = 5;
  const std::vector<int32_t> rows = {30, 2, 17, 0, 36};
  uint32_t seed = 1;
  for (const DType dst_dt : {DType::kF32, DType::kBF16}) {
    for (const DType src_dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(DTypeName(dst_dt)) + " <- " + std::string(DTypeName(src_dt)));
      const double bound = dst_dt == DType::kF32 ? 1e-6 : 8e-3;
      for (const bool accumulate : {true, false}) {
        std::vector<float> dst = AsStored(Random(T * Wd, seed++), dst_dt),
                           src = AsStored(Random(T * Ws, seed++), src_dt);
        std::vector<float> want = dst;
        kernels::AddColumns(Tensor(want.data(), DType::kF32, Device::Cpu(), {T, Wd}), dst_col,
                            Tensor(src.data(), DType::kF32, Device::Cpu(), {T, Ws}), src_col, width,
                            0.75f, accumulate);
        DeviceTensor gdst(dst_dt, {T, Wd}), gsrc(src_dt, {T, Ws});
        gdst.Upload(dst);
        gsrc.Upload(src);
        kernels::AddColumns(gdst.t, dst_col, gsrc.t, src_col, width, 0.75f, accumulate);
        EXPECT_LE(RelativeError(gdst.Download(), want), bound) << "accumulate " << accumulate;
      }
      std::vector<float> dst = AsStored(Random(T * Wd, seed++), dst_dt),
                         src = AsStored(Random(n * width, seed++), src_dt);
      std::vector<float> want = dst;
      std::vector<int32_t> host_rows = rows;
      kernels::AddColumnsAtRows(Tensor(want.data(), DType::kF32, Device::Cpu(), {T, Wd}),
                                Tensor(host_rows.data(), DType::kI32, Device::Cpu(), {n}), dst_col,
                                Tensor(src.data(), DType::kF32, Device::Cpu(), {n, width}), 1.5f);
      DeviceTensor gdst(dst_dt, {T, Wd}), gsrc(src_dt, {n, width}), grows(DType::kI32, {n});
      gdst.Upload(dst);
      gsrc.Upload(src);
      grows.Upload(rows);
      kernels::AddColumnsAtRows(gdst.t, grows.t, dst_col, gsrc.t, 1.5f);
      EXPECT_LE(RelativeError(gdst.Download(), want), bound) << "at rows";
    }
  }
}
#endif  // PRL_WITH_CUDA

ModelConfig Qwen2Config() {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen2, /*attention_bias=*/false, &c);
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 300;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  return c;
}

std::vector<float> Host(const void* data, Device device, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  EXPECT_TRUE(CopyBytes(out.data(), Device::Cpu(), data, device, n * sizeof(float)).ok());
  return out;
}

// The adapter of these tests: rank 8, alpha 16, on every linear projection.
LoraConfig AllLinearRank8() {
  LoraConfig l;
  l.rank = 8;
  l.alpha = 16;
  l.target_modules = {"all-linear"};
  return l;
}

// A model's weights (std 0.2, as cuda_transformer_test), an all-linear adapter of rank 8 with B
// random, and a batch: on `device`, the same values everywhere.
struct LoraModel {
  ParameterSet params;
  LoraSet adapter;
};
LoraModel MakeModel(const ModelConfig& c, Device device, float weight_std = 0.2f,
                    float b_std = 0.1f) {
  ParameterSet cpu = *ParameterSet::Allocate(c, Device::Cpu(), false);
  InitializeParameters(cpu, 7, weight_std);
  const LoraConfig lora = AllLinearRank8();
  LoraSet adapter = *LoraSet::Allocate(c, lora, Device::Cpu(), false);
  InitializeLora(adapter, 3);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, b_std);
  for (const LoraEntry& e : adapter.layout.entries()) {
    if (!e.is_a) {
      for (int64_t i = 0; i < e.numel; ++i) adapter.data()[e.offset + i] = normal(rng);
    }
  }
  if (device.is_cpu()) return {std::move(cpu), std::move(adapter)};
  ParameterSet params = *ParameterSet::Allocate(c, device, false);
  LoraSet dev_adapter = *LoraSet::Allocate(c, lora, device, false);
  EXPECT_TRUE(CopyBytes(params.data(), device, cpu.data(), Device::Cpu(), cpu.buffer.bytes()).ok());
  EXPECT_TRUE(
      CopyBytes(dev_adapter.data(), device, adapter.data(), Device::Cpu(), adapter.buffer.bytes())
          .ok());
  return {std::move(params), std::move(dev_adapter)};
}

struct Result {
  std::vector<float> logprobs, base_grads, adapter_grads, frozen_adapter_grads;
};

// A batch of four sequences and a gradient at each scored token's log-prob.
PackedBatch LoraBatch(const ModelConfig& c, std::vector<float>* dlogprobs) {
  PackedBatch batch;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  for (int len : {2, 33, 150, 9}) {
    std::vector<int32_t> seq(len);
    for (auto& t : seq) t = tok(rng);
    batch.AddScored(seq, 1);
  }
  dlogprobs->resize(batch.num_tokens());
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    (*dlogprobs)[t] = batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -1.0f + 0.01f * (t % 7);
  }
  return batch;
}

Result RunWithAdapter(const ModelConfig& c, Device device) {
  LoraModel m = MakeModel(c, device);
  std::vector<float> dlogprobs;
  const PackedBatch batch = LoraBatch(c, &dlogprobs);
  TransformerOptions options;
  options.cuda_lora = true;
  Transformer model(c, device, options);
  ModelParams weights = m.params.params;
  weights.lora = &m.adapter.params;
  Result r;
  r.logprobs.resize(batch.num_tokens());
  ParameterSet grads = *ParameterSet::Allocate(c, device, true);
  LoraSet adapter_grads = *LoraSet::Allocate(c, m.adapter.lora, device, true);
  ModelParams g = grads.params;
  g.lora = &adapter_grads.params;
  absl::Status s = model.Forward(weights, batch, 0.8f, absl::MakeSpan(r.logprobs), true);
  EXPECT_TRUE(s.ok()) << s;
  s = model.Backward(weights, dlogprobs, g);
  EXPECT_TRUE(s.ok()) << s;
  LoraSet frozen_grads = *LoraSet::Allocate(c, m.adapter.lora, device, true);
  ModelParams frozen;
  frozen.lora = &frozen_grads.params;
  std::vector<float> again(batch.num_tokens());
  s = model.Forward(weights, batch, 0.8f, absl::MakeSpan(again), true);
  EXPECT_TRUE(s.ok()) << s;
  s = model.Backward(weights, dlogprobs, frozen);
  EXPECT_TRUE(s.ok()) << s;
  r.base_grads = Host(grads.data(), device, grads.layout.num_elements());
  r.adapter_grads = Host(adapter_grads.data(), device, adapter_grads.layout.num_elements());
  r.frozen_adapter_grads = Host(frozen_grads.data(), device, frozen_grads.layout.num_elements());
  return r;
}

TEST(CudaLoraTransformerTest, LogprobsAndGradientsMatchTheCpuWithTheBaseTrainedOrFrozen) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  const ModelConfig c = Qwen2Config();
  const Result cpu = RunWithAdapter(c, Device::Cpu()), gpu = RunWithAdapter(c, Device::Cuda(0));
  EXPECT_LE(RelativeError(gpu.logprobs, cpu.logprobs), 1e-5);
  const ParameterLayout layout(c);
  for (const ParamEntry& e : layout.entries()) {
    const std::vector<float> got(gpu.base_grads.begin() + e.offset,
                                 gpu.base_grads.begin() + e.offset + e.numel);
    const std::vector<float> want(cpu.base_grads.begin() + e.offset,
                                  cpu.base_grads.begin() + e.offset + e.numel);
    EXPECT_LE(RelativeError(got, want), 1e-4) << e.name;
  }
  const LoraLayout lora = *LoraLayout::Make(c, AllLinearRank8());
  for (const LoraEntry& e : lora.entries()) {
    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + e.offset, v.begin() + e.offset + e.numel);
    };
    EXPECT_LE(RelativeError(slice(gpu.adapter_grads), slice(cpu.adapter_grads)), 1e-4) << e.name;
    EXPECT_LE(RelativeError(slice(gpu.frozen_adapter_grads), slice(gpu.adapter_grads)), 1e-6)
        << e.name << ": a frozen base changes no adapter gradient";
  }
}

// A frozen base in `dtype` compute with its F32 adapter: the log-probs and the adapter's
// gradients (weights of std 0.02, B of std 0.02).
Result RunFrozen(const ModelConfig& c, Device device, DType dtype) {
  LoraModel m = MakeModel(c, device, 0.02f, 0.02f);
  std::vector<float> dlogprobs;
  const PackedBatch batch = LoraBatch(c, &dlogprobs);
  TransformerOptions options;
  options.cuda_lora = true;
  options.compute_dtype = dtype;
  Transformer model(c, device, options);
  std::optional<ComputeParams> compute;
  if (dtype != DType::kF32) compute = *ToComputeDType(m.params, dtype);
  ModelParams weights = compute.has_value() ? compute->params : m.params.params;
  weights.lora = &m.adapter.params;
  LoraSet adapter_grads = *LoraSet::Allocate(c, m.adapter.lora, device, true);
  ModelParams frozen;
  frozen.lora = &adapter_grads.params;
  Result r;
  r.logprobs.resize(batch.num_tokens());
  absl::Status s = model.Forward(weights, batch, 0.8f, absl::MakeSpan(r.logprobs), true);
  EXPECT_TRUE(s.ok()) << s;
  s = model.Backward(weights, dlogprobs, frozen);
  EXPECT_TRUE(s.ok()) << s;
  r.adapter_grads = Host(adapter_grads.data(), device, adapter_grads.layout.num_elements());
  return r;
}

TEST(CudaLoraTransformerTest, Bf16LogprobsAndAdapterGradientsOfAFrozenBaseMatchTheCpu) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  const ModelConfig c = Qwen2Config();
  const Result cpu = RunFrozen(c, Device::Cpu(), DType::kF32);
  const Result gpu = RunFrozen(c, Device::Cuda(0), DType::kBF16);
  ASSERT_EQ(gpu.logprobs.size(), cpu.logprobs.size());
  double max_abs = 0;
  for (size_t t = 0; t < cpu.logprobs.size(); ++t) {
    max_abs = std::max(max_abs, std::fabs(double{gpu.logprobs[t]} - cpu.logprobs[t]));
  }
  RecordProperty("lora_bf16_logprob_max_abs", std::to_string(max_abs));
  EXPECT_LE(max_abs, 2e-2);
  const LoraLayout lora = *LoraLayout::Make(c, AllLinearRank8());
  double worst = 0;
  for (const LoraEntry& e : lora.entries()) {
    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + e.offset, v.begin() + e.offset + e.numel);
    };
    const double error = RelativeError(slice(gpu.adapter_grads), slice(cpu.adapter_grads));
    worst = std::max(worst, error);
    EXPECT_LE(error, 5e-2) << e.name;
  }
  RecordProperty("lora_bf16_worst_adapter_grad", std::to_string(worst));
}

TEST(CudaLoraTransformerTest, WithoutTheSettingAdaptersOnCudaAreRefused) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  const ModelConfig c = Qwen2Config();
  LoraModel m = MakeModel(c, Device::Cuda(0));
  Transformer model(c, Device::Cuda(0));
  ModelParams weights = m.params.params;
  weights.lora = &m.adapter.params;
  PackedBatch batch;
  batch.AddScored({1, 2, 3}, 1);
  std::vector<float> logprobs(batch.num_tokens());
  const absl::Status s = model.Forward(weights, batch, 1.0f, absl::MakeSpan(logprobs), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("cuda_lora"), std::string::npos) << s;
}

}  // namespace
}  // namespace prl
