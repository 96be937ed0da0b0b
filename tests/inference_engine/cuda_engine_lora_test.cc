// LoRA adapters in the engine on CUDA (EngineOptions::cuda_lora, written, not yet run on a
// GPU), for the GPU session that turns the setting on:
// - requests naming three adapters (of other ranks and targets) and none, batched together,
//   in the batch-invariant mode, F32 and BF16 weights: each request's behaviour log-probs equal
//   the learner's on the GPU with its own adapter (the Transformer with cuda_lora), bit for bit;
// - an adapter swapped in (Engine::SwapAdapter, a LoRA learner's version) takes over at the next
//   step: what the engine samples from then on is what an engine given it from the start
//   samples, bit for bit;
// - without the setting, an adapter on a CUDA engine is refused naming it.
// The engine takes the CPU sets it is given and keeps its own copy on the GPU. Skips without a
// GPU (scripts/gpu_check.sh runs it).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "inference_engine/engine.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/inference_engine/engine_testing.h"

namespace prl::testing {
namespace {

#define PRL_SKIP_WITHOUT_GPU() \
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU (scripts/gpu_check.sh runs this)"

EngineOptions GpuInvariantOptions(DType dtype, bool cuda_lora) {
  EngineOptions o;
  o.device = Device::Cuda(0);
  o.dtype = dtype;
  o.batch_invariant = true;
  o.kv_cache_bytes = int64_t{64} << 20;
  o.max_model_len = 256;
  o.cuda_lora = cuda_lora;
  return o;
}

// The learner's log-probs on the GPU (batch-invariant order, `dtype` compute) of a completion
// with the adapter (null: none).
std::vector<float> GpuLearnerLogprobs(const ParameterSet& host_weights, DType dtype,
                                      const LoraSet* adapter, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& completion, float temperature) {
  const Device gpu = Device::Cuda(0);
  ParameterSet weights = *ParameterSet::Allocate(host_weights.config, gpu, false);
  EXPECT_TRUE(CopyBytes(weights.data(), gpu, host_weights.data(), Device::Cpu(),
                        host_weights.buffer.bytes())
                  .ok());
  std::optional<ComputeParams> compute;
  if (dtype != DType::kF32) compute = *ToComputeDType(weights, dtype);
  ModelParams params = compute.has_value() ? compute->params : weights.params;
  std::optional<LoraSet> on_gpu;
  if (adapter != nullptr) {
    on_gpu.emplace(*adapter->CopyTo(gpu));
    params.lora = &on_gpu->params;
  }
  TransformerOptions options;
  options.reduction_order = kernels::ReductionOrder::kBatchInvariant;
  options.compute_dtype = dtype;
  options.cuda_lora = true;
  Transformer model(host_weights.config, gpu, options);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), completion.begin(), completion.end());
  PackedBatch batch;
  batch.AddScored(seq, static_cast<int64_t>(prompt.size()));
  std::vector<float> lp(batch.num_tokens());
  const absl::Status s = model.Forward(params, batch, temperature, absl::MakeSpan(lp), false);
  EXPECT_TRUE(s.ok()) << s;
  return std::vector<float>(lp.begin() + prompt.size() - 1, lp.end());
}

std::vector<RequestOutput> RunNamed(Engine& engine, const std::vector<Job>& jobs,
                                    const std::vector<std::string>& names) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const absl::StatusOr<uint64_t> id =
        engine.AddRequest(jobs[i].prompt, jobs[i].params, names[i % names.size()]);
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) index[*id] = i;
  }
  std::vector<RequestOutput> out(jobs.size());
  while (engine.HasUnfinishedRequests()) {
    const absl::Status s = engine.Step();
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    for (RequestOutput& r : engine.TakeFinished()) out[index.at(r.request_id)] = std::move(r);
  }
  return out;
}

TEST(CudaEngineLoraTest, ABatchOfSeveralAdaptersGivesEachRequestTheGpuLearnersBits) {
  PRL_SKIP_WITHOUT_GPU();
  const ModelConfig c = TinyQwen3EngineConfig();
  auto weights = TinyWeights(c, 13);
  const std::vector<std::string> names = {"a", "b", "c", ""};
  const std::vector<std::shared_ptr<const LoraSet>> sets = {
      TestAdapter(c, /*trained=*/true, 4, {"all-linear"}, 21),
      TestAdapter(c, /*trained=*/true, 2, {"q_proj", "v_proj"}, 22),
      TestAdapter(c, /*trained=*/true, 8, {"gate_proj", "up_proj", "down_proj"}, 23), nullptr};
  std::vector<Job> jobs = UnfilteredJobs(c, 6, 9, /*max_prompt=*/70);
  const size_t distinct = jobs.size();
  for (size_t i = 0; i < distinct; ++i) jobs.push_back(jobs[i]);  // each prompt twice
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto engine =
        *Engine::Create(OnGpu(*weights), 0, GpuInvariantOptions(dtype, /*cuda_lora=*/true));
    for (int a = 0; a < 3; ++a) ASSERT_TRUE(engine->AddAdapter(names[a], sets[a]).ok());
    const std::vector<RequestOutput> out = RunNamed(*engine, jobs, names);
    int64_t tokens = 0, equal = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      for (const SampleOutput& s : out[i].samples) {
        const std::vector<float> want =
            GpuLearnerLogprobs(*weights, dtype, sets[i % sets.size()].get(), jobs[i].prompt,
                               s.tokens, jobs[i].params.temperature);
        ASSERT_EQ(want.size(), s.logprobs.size());
        for (size_t t = 0; t < want.size(); ++t) equal += want[t] == s.logprobs[t];
        tokens += static_cast<int64_t>(want.size());
      }
    }
    RecordProperty(std::string("lora_engine_") + std::string(DTypeName(dtype)) + "_bit_equal",
                   std::to_string(equal) + "/" + std::to_string(tokens));
    ASSERT_GT(tokens, 0);
    EXPECT_EQ(equal, tokens) << "every token's log-prob must be the learner's, bit for bit";
  }
}

TEST(CudaEngineLoraTest, ASwappedAdapterTakesOverAtTheNextStepAsIfGivenFromTheStart) {
  PRL_SKIP_WITHOUT_GPU();
  const ModelConfig c = TinyQwen3EngineConfig();
  auto weights = TinyWeights(c, 13);
  const auto adapter = TestAdapter(c, /*trained=*/true, 4, {"all-linear"}, 31);
  const std::vector<Job> jobs = UnfilteredJobs(c, 5, 4, /*max_prompt=*/70);
  auto from_start = *Engine::Create(OnGpu(*weights), 0, GpuInvariantOptions(DType::kBF16, true));
  ASSERT_TRUE(from_start->SetAdapter(adapter).ok());
  const std::vector<RequestOutput> want = RunJobs(*from_start, jobs);
  auto swapped = *Engine::Create(OnGpu(*weights), 0, GpuInvariantOptions(DType::kBF16, true));
  ASSERT_TRUE(swapped->SwapAdapter(adapter, 7).ok());
  const std::vector<RequestOutput> got = RunJobs(*swapped, jobs);
  EXPECT_EQ(swapped->Stats().weight_version, 7);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(got[i].samples.size(), want[i].samples.size());
    for (size_t k = 0; k < got[i].samples.size(); ++k) {
      EXPECT_EQ(got[i].samples[k].tokens, want[i].samples[k].tokens) << "request " << i;
      EXPECT_EQ(got[i].samples[k].logprobs, want[i].samples[k].logprobs) << "request " << i;
    }
  }
}

TEST(CudaEngineLoraTest, WithoutTheSettingAnAdapterOnACudaEngineIsRefusedNamingIt) {
  PRL_SKIP_WITHOUT_GPU();
  const ModelConfig c = TinyQwen3EngineConfig();
  auto engine =
      *Engine::Create(OnGpu(*TinyWeights(c, 13)), 0, GpuInvariantOptions(DType::kF32, false));
  const absl::Status s =
      engine->AddAdapter("a", TestAdapter(c, /*trained=*/true, 4, {"q_proj"}, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("cuda_lora"), std::string::npos) << s;
}

}  // namespace
}  // namespace prl::testing
