// The Transformer on a CUDA device (fp32 and bf16 modes) against the same model on the CPU
// backend (fp32): the
// forward's log-probabilities (relative L2 error <= 1e-5, the bound for `prl score`)
// and the backward's gradients, every parameter tensor on its own (<= 1e-4: both backends are
// fp32 with different summation orders — cuBLASLt's GEMM blocking, the GPU's attention and
// norm reductions — and the backward compounds those last-bit differences through every layer;
// measured 1e-5 to 6e-5 on the H100 with weights of std 0.2), for Qwen2 (q/k/v biases, GQA, tied)
// and Llama (MHA, untied) shapes with head sizes that cross the kernels' lane tiles, over a packed
// batch of unequal sequences. Skips without a GPU (scripts/gpu_check.sh runs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "model/context_parallel.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/model/thread_group_exchange.h"

namespace prl {
namespace {

ModelConfig Config(Architecture arch, bool tied, int64_t heads, int64_t kv_heads,
                   int64_t head_dim) {
  ModelConfig c;
  SetArchitecture(arch, /*attention_bias=*/false, &c);
  c.hidden_size = heads * head_dim;
  c.intermediate_size = 3 * c.hidden_size;
  c.num_hidden_layers = 3;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = 300;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = tied;
  return c;
}

// Qwen3: per-head q/k norms, hidden 128 != H D = 256 (as Qwen3-0.6B: 1024 != 2048).
ModelConfig Qwen3Config(bool tied, bool attention_bias) {
  ModelConfig c = Config(Architecture::kQwen3, tied, 4, 2, 64);
  SetArchitecture(Architecture::kQwen3, attention_bias, &c);
  c.hidden_size = 128;
  c.intermediate_size = 384;
  return c;
}

std::string Sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", x);
  return buf;
}

std::vector<float> ToHost(const ParameterSet& p, const ParamEntry& e) {
  std::vector<float> out(static_cast<size_t>(e.numel));
  EXPECT_TRUE(CopyBytes(out.data(), Device::Cpu(), p.data() + e.offset, p.buffer.device(),
                        out.size() * sizeof(float))
                  .ok());
  return out;
}

// Five packed sequences of random tokens (lengths that cross the kernels' tiles), drawn from
// `rng`, and in *dlogprobs a gradient at their log-probs.
PackedBatch RandomBatch(const ModelConfig& config, std::mt19937_64& rng,
                        std::vector<float>* dlogprobs) {
  PackedBatch batch;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(config.vocab_size) - 1);
  for (int len : {2, 33, 150, 9, 64}) {
    std::vector<int32_t> seq(len);
    for (auto& t : seq) t = tok(rng);
    batch.AddScored(seq, 1);
  }
  const int64_t T = batch.num_tokens();
  dlogprobs->assign(T, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    (*dlogprobs)[t] =
        batch.targets[t] == PackedBatch::kNoTarget ? 0.0f : -1.0f + 0.01f * (t % 7);
  }
  return batch;
}

// Every parameter's gradient on the GPU against the CPU's (relative L2 error within `bound`,
// each tensor on its own): the worst error and its tensor.
std::pair<double, std::string> WorstGradient(const ParameterSet& gpu, const ParameterSet& cpu,
                                             double bound) {
  double worst = 0;
  std::string worst_name;
  for (const ParamEntry& e : cpu.layout.entries()) {
    const double err = ::prl::testing::RelativeError(ToHost(gpu, e), ToHost(cpu, e));
    EXPECT_LE(err, bound) << e.name;
    if (err > worst) {
      worst = err;
      worst_name = e.name;
    }
  }
  return {worst, worst_name};
}

struct Case {
  const char* name;
  ModelConfig config;
};

class CudaTransformerTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTransformerTest, LogprobsAndGradientsMatchTheCpuBackend) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  const ModelConfig& config = GetParam().config;
  const Device gpu_device = Device::Cuda(0);
  std::mt19937_64 rng(7);
  std::vector<float> dlogprobs;
  const PackedBatch batch = RandomBatch(config, rng, &dlogprobs);
  const int64_t T = batch.num_tokens();
  // The weights, on the CPU and a copy on the GPU: matrices of std `init_std`, norms and biases
  // moved away from 1 / 0 by up to `perturb`.
  auto weights_pair = [&](float init_std, float perturb) {
    ParameterSet cpu = *ParameterSet::Allocate(config, Device::Cpu(), false);
    InitializeParameters(cpu, 7, init_std);
    std::uniform_real_distribution<float> u(-perturb, perturb);
    for (const ParamEntry& e : cpu.layout.entries()) {
      if (e.name.ends_with("norm.weight") || e.name.ends_with(".bias")) {
        for (int64_t i = 0; i < e.numel; ++i) cpu.data()[e.offset + i] += u(rng);
      }
    }
    ParameterSet gpu = *ParameterSet::Allocate(config, gpu_device, false);
    EXPECT_TRUE(
        CopyBytes(gpu.data(), gpu_device, cpu.data(), Device::Cpu(), cpu.buffer.bytes()).ok());
    return std::make_pair(std::move(cpu), std::move(gpu));
  };
  auto run = [&](const ParameterSet& params, Device device, DType dtype,
                 std::vector<float>* logprobs) {
    ParameterSet grads = *ParameterSet::Allocate(config, device, true);
    TransformerOptions options;
    options.compute_dtype = dtype;
    Transformer model(config, device, options);
    std::optional<ComputeParams> compute;
    if (dtype != DType::kF32) compute = *ToComputeDType(params, dtype);
    const ModelParams& weights = compute.has_value() ? compute->params : params.params;
    logprobs->resize(T);
    EXPECT_TRUE(model.Forward(weights, batch, 0.8f, absl::MakeSpan(*logprobs), true).ok());
    EXPECT_TRUE(model.Backward(weights, dlogprobs, grads.params).ok());
    return grads;
  };
  // fp32 mode: weights of std 0.2 (a stress test: sharp softmaxes, large activations), the
  // CPU's numbers within the bounds in the header. bf16 mode: weights of std 0.02 (the
  // Hugging Face initializer range of Qwen2 and Llama): log-probs within 2e-2 absolute (the
  // issue's bound for `prl score` in bf16) and gradients within 5e-2 relative per tensor (bf16
  // keeps 8 bits of mantissa: ~4e-3 per rounding, compounded over the layers). At std 0.2 the
  // bf16 model is chaotic (measured on the H100: log-probs off by up to 1.7, gradients by
  // 30-60%, while every bf16 kernel alone is within 3e-3): the mode is not meant for it.
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const bool f32 = dtype == DType::kF32;
    const auto [cpu, gpu] = f32 ? weights_pair(0.2f, 0.3f) : weights_pair(0.02f, 0.1f);
    std::vector<float> cpu_logprobs;
    const ParameterSet cpu_grads = run(cpu, Device::Cpu(), DType::kF32, &cpu_logprobs);
    std::vector<float> gpu_logprobs;
    const ParameterSet gpu_grads = run(gpu, gpu_device, dtype, &gpu_logprobs);
    const double logprob_error = ::prl::testing::RelativeError(gpu_logprobs, cpu_logprobs);
    double max_abs = 0;
    for (int64_t t = 0; t < T; ++t) {
      max_abs = std::max(max_abs, std::fabs(double{gpu_logprobs[t]} - cpu_logprobs[t]));
    }
    if (f32) {
      EXPECT_LE(logprob_error, 1e-5);
    } else {
      EXPECT_LE(max_abs, 2e-2);
    }
    SCOPED_TRACE(DTypeName(dtype));
    const auto [worst, worst_name] = WorstGradient(gpu_grads, cpu_grads, f32 ? 1e-4 : 5e-2);
    const std::string tag =
        std::string("model_") + GetParam().name + "_" + std::string(DTypeName(dtype));
    RecordProperty(tag + "_logprobs", Sci(logprob_error));
    RecordProperty(tag + "_logprob_max_abs", Sci(max_abs));
    RecordProperty(tag + "_worst_grad", Sci(worst));
    std::printf("%s %s: log-prob relative error %.3e (max abs %.3e), worst gradient %.3e (%s)\n",
                GetParam().name, std::string(DTypeName(dtype)).c_str(), logprob_error, max_abs,
                worst, worst_name.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaTransformerTest,
    ::testing::Values(Case{"qwen2_tied_gqa_d64", Config(Architecture::kQwen2, true, 4, 2, 64)},
                      Case{"llama_untied_mha_d32", Config(Architecture::kLlama, false, 4, 4, 32)},
                      Case{"qwen2_untied_kv1_d128", Config(Architecture::kQwen2, false, 2, 1, 128)},
                      Case{"qwen3_tied_gqa_d64_hidden128", Qwen3Config(true, false)},
                      Case{"qwen3_untied_attention_bias_d64_hidden128", Qwen3Config(false, true)}),
    [](const auto& info) { return std::string(info.param.name); });

// Qwen3-MoE on CUDA (model/moe_layer.h: routing, the sort by expert and the combine on the
// device, each expert's GEMMs over its row range): three layers of Qwen3Config's attention,
// renormalised top-2 of 8 experts in every layer, or raw top-3 of 6 with layer 1 dense. The
// CPU routes a batch first; both backends then replay those routes (what the learner does with
// the actor's), so that a near-tie routed differently cannot hide an error, and the log-probs
// and every gradient (the routers' and the experts' included, with the load-balancing loss on)
// must match as the dense models' do. The GPU's own routes (recomputed beside the replay) must
// equal the CPU's but for near-ties in the fp32 mode: at most 1% of the choices.
ModelConfig Qwen3MoeConfig(bool renormalise) {
  ModelConfig c = Qwen3Config(true, false);
  SetArchitecture(Architecture::kQwen3Moe, false, &c);
  c.num_experts = renormalise ? 8 : 6;
  c.num_experts_per_tok = renormalise ? 2 : 3;
  c.moe_intermediate_size = 64;
  c.norm_topk_prob = renormalise;
  if (!renormalise) c.mlp_only_layers = {1};
  return c;
}

TEST(CudaTransformerMoeTest, LogprobsGradientsAndRoutesMatchTheCpuBackend) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  const Device gpu_device = Device::Cuda(0);
  constexpr double kLoadBalancing = 0.01;
  for (const bool renormalise : {true, false}) {
    const ModelConfig config = Qwen3MoeConfig(renormalise);
    ASSERT_TRUE(ValidateModelConfig(config).ok()) << ValidateModelConfig(config);
    std::mt19937_64 rng(11);
    std::vector<float> dlogprobs;
    PackedBatch batch = RandomBatch(config, rng, &dlogprobs);
    const int64_t T = batch.num_tokens();
    struct Result {
      std::vector<float> logprobs;
      std::vector<uint8_t> routes;
      std::optional<ParameterSet> grads;
    };
    auto run = [&](const ParameterSet& params, Device device, DType dtype) {
      Result r;
      r.grads.emplace(*ParameterSet::Allocate(config, device, true));
      TransformerOptions options;
      options.compute_dtype = dtype;
      Transformer model(config, device, options);
      std::optional<ComputeParams> compute;
      if (dtype != DType::kF32) compute = *ToComputeDType(params, dtype);
      const ModelParams& weights = compute.has_value() ? compute->params : params.params;
      r.logprobs.resize(T);
      EXPECT_TRUE(model.Forward(weights, batch, 0.8f, absl::MakeSpan(r.logprobs), true).ok());
      r.routes.assign(model.recomputed_routes().begin(), model.recomputed_routes().end());
      EXPECT_TRUE(
          model.Backward(weights, dlogprobs, r.grads->params, nullptr, kLoadBalancing).ok());
      return r;
    };
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << (renormalise ? "renormalised" : "raw") << " "
                                        << DTypeName(dtype));
      const bool f32 = dtype == DType::kF32;
      ParameterSet cpu = *ParameterSet::Allocate(config, Device::Cpu(), false);
      InitializeParameters(cpu, 7, f32 ? 0.2f : 0.02f);
      ParameterSet gpu = *ParameterSet::Allocate(config, gpu_device, false);
      ASSERT_TRUE(
          CopyBytes(gpu.data(), gpu_device, cpu.data(), Device::Cpu(), cpu.buffer.bytes()).ok());
      batch.routes.clear();
      const std::vector<uint8_t> cpu_routes = run(cpu, Device::Cpu(), DType::kF32).routes;
      batch.routes.assign(cpu_routes.begin(), cpu_routes.end());  // replayed from here on
      const Result want = run(cpu, Device::Cpu(), DType::kF32);
      const Result got = run(gpu, gpu_device, dtype);
      ASSERT_EQ(got.routes.size(), cpu_routes.size());
      int64_t differing = 0;
      for (size_t i = 0; i < cpu_routes.size(); ++i) differing += got.routes[i] != cpu_routes[i];
      const double route_mismatch =
          static_cast<double>(differing) / static_cast<double>(cpu_routes.size());
      // bf16's router logits round differently from the CPU's fp32 ones: reported, not bound.
      if (f32) EXPECT_LE(route_mismatch, 0.01);
      double max_abs = 0;
      for (int64_t t = 0; t < T; ++t) {
        max_abs = std::max(max_abs, std::fabs(double{got.logprobs[t]} - want.logprobs[t]));
      }
      const double logprob_error = ::prl::testing::RelativeError(got.logprobs, want.logprobs);
      if (f32) {
        EXPECT_LE(logprob_error, 1e-5);
      } else {
        EXPECT_LE(max_abs, 2e-2);
      }
      const auto [worst, worst_name] = WorstGradient(*got.grads, *want.grads, f32 ? 1e-4 : 5e-2);
      const std::string tag = std::string("model_qwen3_moe_") +
                              (renormalise ? "top2of8_" : "top3of6_dense1_") +
                              std::string(DTypeName(dtype));
      RecordProperty(tag + "_logprobs", Sci(logprob_error));
      RecordProperty(tag + "_logprob_max_abs", Sci(max_abs));
      RecordProperty(tag + "_worst_grad", Sci(worst));
      RecordProperty(tag + "_route_mismatch", Sci(route_mismatch));
      std::printf("%s: log-prob relative error %.3e (max abs %.3e), worst gradient %.3e (%s), "
                  "routes differing %.3e\n",
                  tag.c_str(), logprob_error, max_abs, worst, worst_name.c_str(), route_mismatch);
    }
  }
}

// An untied Qwen2 model's weights on the GPU (seeded as on the CPU) and a random batch with its
// d(logprob): the tests that compare passes on the GPU with each other run them here.
class GpuPasses {
 public:
  explicit GpuPasses(uint64_t batch_seed)
      : config_(Config(Architecture::kQwen2, /*tied=*/false, 4, 2, 64)) {
    std::mt19937_64 rng(batch_seed);
    batch_ = RandomBatch(config_, rng, &dlogprobs_);
    ParameterSet cpu = *ParameterSet::Allocate(config_, Device::Cpu(), false);
    InitializeParameters(cpu, 7, 0.02f);
    params_.emplace(*ParameterSet::Allocate(config_, gpu_, false));
    EXPECT_TRUE(
        CopyBytes(params_->data(), gpu_, cpu.data(), Device::Cpu(), cpu.buffer.bytes()).ok());
  }
  const ModelConfig& config() const { return config_; }

  // A forward and backward with `options` (on its compute dtype's copy of the weights): the
  // log-probs, and the gradient (on the host) in *grads.
  std::vector<float> Run(const TransformerOptions& options, std::vector<float>* grads) {
    std::optional<ComputeParams> compute;
    if (options.compute_dtype != DType::kF32) {
      compute = *ToComputeDType(*params_, options.compute_dtype);
    }
    const ModelParams& weights = compute.has_value() ? compute->params : params_->params;
    Transformer model(config_, gpu_, options);
    ParameterSet g = *ParameterSet::Allocate(config_, gpu_, true);
    std::vector<float> lp(batch_.num_tokens());
    EXPECT_TRUE(model.Forward(weights, batch_, 0.8f, absl::MakeSpan(lp), true).ok());
    EXPECT_TRUE(model.Backward(weights, dlogprobs_, g.params).ok());
    grads->resize(static_cast<size_t>(g.layout.num_elements()));
    EXPECT_TRUE(CopyBytes(grads->data(), Device::Cpu(), g.data(), gpu_, g.buffer.bytes()).ok());
    return lp;
  }

  // The same pass split over a context-parallel group of `size` threads sharing this GPU
  // (Ulysses, model/context_heads.h), each rank's log-probs at their rows of the batch and the
  // ranks' gradients summed (FSDP's reduce-scatter would).
  std::vector<float> RunGroup(TransformerOptions options, int size, std::vector<float>* grads);

 private:
  ModelConfig config_;
  Device gpu_ = Device::Cuda(0);
  PackedBatch batch_;
  std::vector<float> dlogprobs_;
  std::optional<ParameterSet> params_;
};

std::vector<float> GpuPasses::RunGroup(TransformerOptions options, int size,
                                       std::vector<float>* grads) {
  options.cuda_context_parallel = true;
  std::optional<ComputeParams> compute;
  if (options.compute_dtype != DType::kF32) {
    compute = *ToComputeDType(*params_, options.compute_dtype);
  }
  const ModelParams& weights = compute.has_value() ? compute->params : params_->params;
  ContextShard shard;
  shard.attention = ContextAttention::kUlysses;
  for (int64_t s = 0; s < batch_.num_seqs(); ++s) {
    shard.lengths.push_back(batch_.cu_seqlens[s + 1] - batch_.cu_seqlens[s]);
  }
  // Threads sharing this GPU, relayed through the host (NCCL needs a GPU per rank).
  ::prl::testing::ThreadGroup group(size);
  std::vector<float> logprobs(batch_.num_tokens(), 0.0f);
  grads->assign(static_cast<size_t>(ParameterLayout(config_).num_elements()), 0.0f);
  std::mutex mu;
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      ::prl::testing::ThreadGroup::Exchange exchange(&group, r);
      ContextShard mine = shard;
      mine.exchange = &exchange;
      const PackedBatch local = ShardBatch(batch_, r, size);
      const std::vector<int64_t> rows = ShareRows(batch_, r, size);
      Transformer model(config_, gpu_, options);
      std::vector<float> lp(local.num_tokens()), d(local.num_tokens(), 0.0f);
      const absl::Status forward =
          model.Forward(weights, local, 0.8f, absl::MakeSpan(lp), true, nullptr, &mine);
      EXPECT_TRUE(forward.ok()) << forward;
      for (size_t i = 0; i < rows.size(); ++i) d[i] = dlogprobs_[rows[i]];
      ParameterSet g = *ParameterSet::Allocate(config_, gpu_, true);
      const absl::Status backward = model.Backward(weights, d, g.params);
      EXPECT_TRUE(backward.ok()) << backward;
      std::vector<float> host(static_cast<size_t>(g.layout.num_elements()));
      EXPECT_TRUE(CopyBytes(host.data(), Device::Cpu(), g.data(), gpu_, g.buffer.bytes()).ok());
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 0; i < rows.size(); ++i) logprobs[rows[i]] = lp[i];
      for (size_t i = 0; i < host.size(); ++i) (*grads)[i] += host[i];
    });
  }
  for (std::thread& t : ranks) t.join();
  return logprobs;
}

// Context parallelism on CUDA (learner.cuda_context_parallel; model/context_heads.h): Ulysses'
// exchanges by strided copies on the device and the packed CUDA attention over each rank's
// heads, written and verified on the CPU, not yet run on a GPU. A group of 2 (the model's 2
// key/value heads, one per rank) gives one rank's log-probs and gradients: fp32 within 1e-5 and
// 1e-4, bf16 within 1e-2 (the same kernels over fewer heads; the sums of the group's gradients
// add in another order). Waits for a GPU session (issue 54).
TEST(CudaTransformerContextParallelTest, UlyssesOnTheGpuGivesOneRanksResults) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  GpuPasses gpu(13);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    TransformerOptions options;
    options.compute_dtype = dtype;
    std::vector<float> one_grads, group_grads;
    const std::vector<float> one = gpu.Run(options, &one_grads);
    const std::vector<float> group = gpu.RunGroup(options, 2, &group_grads);
    const double bound = dtype == DType::kF32 ? 1e-5 : 1e-2;
    EXPECT_LE(::prl::testing::RelativeError(group, one), bound);
    EXPECT_LE(::prl::testing::RelativeError(group_grads, one_grads), bound * 10);
  }
}

// TransformerOptions::keep_logits on CUDA (off there until this passes): a training pass whose
// trained rows fit one logits chunk reads the forward's logits in the backward instead of
// recomputing them. In the fast order the forward and the recomputing backward run the same GEMM
// on the same rows, so the log-probs and every gradient must equal the recomputing pass's bit
// for bit, in the fp32 and the bf16 modes; and a keep_logits_bytes budget makes that one chunk
// where logits_chunk_bytes alone would make chunks of 16 rows (the same pass, bit for bit). The
// embedding's gradient is the exception: its scatter-add (EmbeddingBackward) adds repeated
// tokens' rows with atomics, in no fixed order, so it is compared within 1e-6 (the model is
// untied, so that the LM head's gradient is compared bit for bit).
TEST(CudaTransformerKeptLogitsTest, KeptLogitsGiveTheRecomputingPassesResultsBitForBit) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  GpuPasses gpu(9);
  const ModelConfig& config = gpu.config();
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto pass = [&](bool keep, int64_t chunk_bytes, std::vector<float>* grads) {
      TransformerOptions options;
      options.compute_dtype = dtype;
      options.keep_logits = keep;
      options.logits_chunk_bytes = chunk_bytes;
      options.keep_logits_bytes = int64_t{1} << 30;
      return gpu.Run(options, grads);
    };
    const int64_t one_chunk = int64_t{1} << 30, rows16 = 16 * config.vocab_size * 4;
    std::vector<float> recomputed_grads, kept_grads, budget_grads;
    const std::vector<float> recomputed = pass(false, one_chunk, &recomputed_grads);
    const std::vector<float> kept = pass(true, one_chunk, &kept_grads);
    const std::vector<float> budget = pass(true, rows16, &budget_grads);
    EXPECT_EQ(kept, recomputed);
    EXPECT_EQ(budget, kept);
    for (const ParamEntry& e : ParameterLayout(config).entries()) {
      auto slice = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + e.offset, v.begin() + e.offset + e.numel);
      };
      if (e.name == "model.embed_tokens.weight") {
        EXPECT_LE(::prl::testing::RelativeError(slice(kept_grads), slice(recomputed_grads)), 1e-6);
        EXPECT_LE(::prl::testing::RelativeError(slice(budget_grads), slice(kept_grads)), 1e-6);
        continue;
      }
      EXPECT_EQ(slice(kept_grads), slice(recomputed_grads))
          << e.name << ": the backward reads the logits it would compute";
      EXPECT_EQ(slice(budget_grads), slice(kept_grads))
          << e.name << ": keep_logits_bytes makes one chunk of every row";
    }
  }
}

// Activation checkpointing on CUDA (model/activation_checkpointing.h): the recomputation runs
// the forward's own kernels, written and verified on the CPU, not yet run on a GPU. In fp32 and
// bf16 the log-probs are none's and the gradients within 1e-5 (the embedding's scatter-add and
// attention's atomics add in no fixed order). Waits for a GPU session (issue 54).
TEST(CudaTransformerCheckpointingTest, SelectiveAndFullGiveTheGradientsOfKeepingEverything) {
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    GTEST_SKIP() << "no CUDA GPU: this test runs on a GPU machine (scripts/gpu_check.sh)";
  }
  GpuPasses gpu(11);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto pass = [&](ActivationCheckpointing mode, std::vector<float>* grads) {
      TransformerOptions options;
      options.compute_dtype = dtype;
      options.activation_checkpointing = mode;
      return gpu.Run(options, grads);
    };
    std::vector<float> none_grads;
    const std::vector<float> none = pass(ActivationCheckpointing::kNone, &none_grads);
    for (const ActivationCheckpointing mode :
         {ActivationCheckpointing::kSelective, ActivationCheckpointing::kFull}) {
      std::vector<float> grads;
      EXPECT_EQ(pass(mode, &grads), none);
      EXPECT_LE(::prl::testing::RelativeError(grads, none_grads), 1e-5);
    }
  }
}

}  // namespace
}  // namespace prl
