#include "bench/model_bench.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "bench/gpu_peak.h"
#include "bench/torch_baseline.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "model/flops.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl::bench {

namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

absl::StatusOr<Report> RunModelBench(const ModelConfig& config, const ModelBenchOptions& o) {
  if (o.tokens <= 0 || o.seq_len <= 0 || o.iterations <= 0) {
    return absl::InvalidArgumentError("bench model: --tokens, --seq-len and --iters must be > 0");
  }
  if (o.seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("bench model: --seq-len ", o.seq_len,
                                                   " exceeds max_position_embeddings ",
                                                   config.max_position_embeddings));
  }
  const bool gpu = o.device.is_cuda();
  std::string gpu_name;
  if (gpu) {
    PRL_ASSIGN_OR_RETURN(gpu_name, cuda::DeviceName(o.device.index));
  }
  std::optional<GpuPeak> peak;
  if (o.peak_tflops > 0) {
    peak = GpuPeak{"--peak-tflops", o.peak_tflops};
  } else if (gpu) {
    peak = LookupGpuPeak(gpu_name, o.dtype);
  }

  // The PyTorch baseline first, while this process holds no device memory (both models at
  // once would not fit beside each other for the larger shapes).
  std::optional<TorchBaseline> torch;
  if (!o.torch_python.empty()) {
    TorchBaselineOptions t;
    t.python = o.torch_python;
    t.script = o.torch_script;
    t.modes = o.torch_modes;
    t.tokens = o.tokens;
    t.seq_len = o.seq_len;
    t.iterations = o.iterations;
    t.device = o.device;
    t.dtype = o.dtype;
    t.peak_tflops = peak.has_value() ? peak->tflops : 0.0;
    if (o.progress) {
      std::fprintf(stderr, "bench model: PyTorch baseline: %s\n",
                   absl::StrJoin(TorchBaselineArgv(config, t), " ").c_str());
    }
    PRL_ASSIGN_OR_RETURN(torch, RunTorchBaseline(config, t));
  }

  PRL_ASSIGN_OR_RETURN(ParameterSet params, ParameterSet::Allocate(config, Device::Cpu(), false));
  InitializeParameters(params, /*seed=*/1);  // on the host, then to the device
  if (o.device.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(ParameterSet on_device, ParameterSet::Allocate(config, o.device, false));
    PRL_RETURN_IF_ERROR(
        CopyBytes(on_device.data(), o.device, params.data(), Device::Cpu(), params.buffer.bytes()));
    params = std::move(on_device);
  }
  PRL_ASSIGN_OR_RETURN(ParameterSet grads, ParameterSet::Allocate(config, o.device, true));

  PackedBatch batch;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int64_t> seq_lens;
  for (int64_t start = 0; start < o.tokens; start += o.seq_len) {
    const int64_t len = std::min(o.seq_len, o.tokens - start);
    std::vector<int32_t> toks(len), targets(len);
    for (auto& t : toks) t = token(rng);
    for (auto& t : targets) t = token(rng);
    batch.Add(toks, targets);
    seq_lens.push_back(len);
  }
  const double fwd_flops = ForwardFlops(config, seq_lens, o.tokens);
  const double train_flops = TrainingFlops(config, seq_lens, o.tokens);

  // GEMM baseline on the model's gate|up projection shape: OpenBLAS SGEMM on the CPU, the CUDA
  // backend's GEMM (cuBLASLt; fp32 without TF32, or bf16 in the bf16 mode) on a GPU.
  const int64_t M = o.tokens, N = 2 * config.intermediate_size, K = config.hidden_size;
  auto sync = [&]() -> absl::Status {
    return gpu ? cuda::Synchronize(o.device.index) : absl::OkStatus();
  };
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  OwnedTensor ga, gb, gc;
  if (gpu) {
    PRL_ASSIGN_OR_RETURN(ga, AllocateTensor(DType::kF32, o.device, {M, K}));
    PRL_ASSIGN_OR_RETURN(gb, AllocateTensor(DType::kF32, o.device, {N, K}));
    PRL_ASSIGN_OR_RETURN(gc, AllocateTensor(DType::kF32, o.device, {M, N}));
    PRL_RETURN_IF_ERROR(CopyBytes(ga.view.data, o.device, a.data(), Device::Cpu(), a.size() * 4));
    PRL_RETURN_IF_ERROR(CopyBytes(gb.view.data, o.device, b.data(), Device::Cpu(), b.size() * 4));
    if (o.dtype != DType::kF32) {  // the same GEMM in the compute dtype
      OwnedTensor a16, b16, c16;
      PRL_ASSIGN_OR_RETURN(a16, AllocateTensor(o.dtype, o.device, {M, K}));
      PRL_ASSIGN_OR_RETURN(b16, AllocateTensor(o.dtype, o.device, {N, K}));
      PRL_ASSIGN_OR_RETURN(c16, AllocateTensor(o.dtype, o.device, {M, N}));
      kernels::ConvertDType(a16.view, ga.view);
      kernels::ConvertDType(b16.view, gb.view);
      PRL_RETURN_IF_ERROR(cuda::Synchronize(o.device.index));  // before the fp32 copies go
      ga = std::move(a16);
      gb = std::move(b16);
      gc = std::move(c16);
    }
  }
  auto time_sgemm = [&] {
    const auto start = std::chrono::steady_clock::now();
    if (gpu) {
      kernels::MatmulForward(gc.view, ga.view, gb.view);
      sync().IgnoreError();
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K,
                  0.0f, c.data(), N);
    }
    return 2.0 * M * N * K / Seconds(start) / 1e9;
  };

  TransformerOptions model_options;
  model_options.compute_dtype = o.dtype;
  Transformer model(config, o.device, model_options);
  std::optional<ComputeParams> compute;  // the bf16 copy of the weights in bf16 mode
  if (o.dtype != DType::kF32) {
    PRL_ASSIGN_OR_RETURN(compute, ToComputeDType(params, o.dtype));
  }
  const ModelParams& weights = compute.has_value() ? compute->params : params.params;
  std::vector<float> logprobs(o.tokens);
  std::vector<float> dlogprobs(o.tokens, -1.0f);
  auto time_forward = [&]() -> absl::StatusOr<double> {
    const auto start = std::chrono::steady_clock::now();
    PRL_RETURN_IF_ERROR(model.Forward(weights, batch, 1.0f, absl::MakeSpan(logprobs), false));
    return Seconds(start);
  };
  auto time_train = [&]() -> absl::StatusOr<double> {
    const auto start = std::chrono::steady_clock::now();
    PRL_RETURN_IF_ERROR(model.Forward(weights, batch, 1.0f, absl::MakeSpan(logprobs), true));
    PRL_RETURN_IF_ERROR(model.Backward(weights, dlogprobs, grads.params));
    PRL_RETURN_IF_ERROR(sync());
    return Seconds(start);
  };

  // Warm-up: page in weights and workspaces, let OpenBLAS start its threads.
  time_sgemm();
  PRL_RETURN_IF_ERROR(time_forward().status());
  PRL_RETURN_IF_ERROR(time_train().status());

  std::vector<double> sgemm_gflops, fwd_s, train_s;
  for (int i = 0; i < o.iterations; ++i) {
    // Interleaved, so that the baseline and the model see the same machine conditions.
    for (int r = 0; r < 3; ++r) sgemm_gflops.push_back(time_sgemm());
    PRL_ASSIGN_OR_RETURN(const double f, time_forward());
    PRL_ASSIGN_OR_RETURN(const double t, time_train());
    fwd_s.push_back(f);
    train_s.push_back(t);
    if (o.progress) {
      std::fprintf(stderr,
                   "bench model: iteration %d/%d: forward %.3f s, forward+backward %.3f s\n", i + 1,
                   o.iterations, f, t);
    }
  }
  const double sgemm = Median(sgemm_gflops);
  const double fwd = Median(fwd_s), train = Median(train_s);
  const std::string sgemm_name =
      gpu ? absl::StrFormat("cublaslt_%s_gemm_%dx%dx%d", o.dtype == DType::kBF16 ? "bf16" : "f32",
                            M, N, K)
          : absl::StrFormat("sgemm_%dx%dx%d", M, N, K);

  Report report;
  report.bench = "model";
  report.machine = MachineInfo();
  if (gpu) report.machine.emplace_back("gpu", gpu_name);
  report.setup = {
      {"model",
       absl::StrFormat("%s hidden=%d layers=%d heads=%d kv_heads=%d intermediate=%d "
                       "vocab=%d tied=%d",
                       ArchitectureName(config.arch), config.hidden_size, config.num_hidden_layers,
                       config.num_attention_heads, config.num_key_value_heads,
                       config.intermediate_size, config.vocab_size, config.tie_word_embeddings)},
      {"parameters", absl::StrCat(ParameterCount(config))},
      {"tokens", absl::StrFormat("%d in sequences of %d", o.tokens, o.seq_len)},
      {"device", o.device.ToString()},
      {"dtype",
       o.dtype == DType::kBF16 ? "bf16 (bf16 weights and activations, fp32 accumulation)" : "f32"},
      {"iterations", absl::StrCat(o.iterations, " (median reported)")},
      {"flops_per_step", absl::StrFormat("forward %.1f GFLOP, forward+backward %.1f GFLOP",
                                         fwd_flops / 1e9, train_flops / 1e9)}};
  // Tokens/s baselines: what the model would reach if all of its FLOPs ran at SGEMM speed.
  report.results = {{"forward_tokens_per_s", o.tokens / fwd, "tok/s", "at_sgemm_speed",
                     sgemm * 1e9 / (fwd_flops / o.tokens)},
                    {"forward_gflops", fwd_flops / fwd / 1e9, "GFLOP/s", sgemm_name, sgemm},
                    {"train_tokens_per_s", o.tokens / train, "tok/s", "at_sgemm_speed",
                     sgemm * 1e9 / (train_flops / o.tokens)},
                    {"train_gflops", train_flops / train / 1e9, "GFLOP/s", sgemm_name, sgemm}};
  // MFU: the ratio of these two rows.
  const std::string peak_name =
      o.peak_tflops > 0  ? std::string("peak_from_flag")
      : peak.has_value() ? absl::StrCat("peak_", absl::StrReplaceAll(peak->label, {{" ", "_"}}))
                         : std::string();
  if (peak.has_value()) {
    const double mfu = train_flops / train / 1e12 / peak->tflops;
    report.setup.emplace_back("mfu", absl::StrFormat("forward+backward %.1f%% of %.0f TFLOP/s (%s)",
                                                     100 * mfu, peak->tflops, peak->label));
    report.results.push_back(
        {"forward_tflops", fwd_flops / fwd / 1e12, "TFLOP/s", peak_name, peak->tflops});
    report.results.push_back(
        {"train_tflops", train_flops / train / 1e12, "TFLOP/s", peak_name, peak->tflops});
  } else if (gpu) {
    report.setup.emplace_back(
        "mfu", absl::StrCat("unknown peak for '", gpu_name, "': pass --peak-tflops for an MFU"));
  }
  if (torch.has_value()) {
    report.setup.emplace_back("torch_attention", torch->attention);
    const char* dtype_name = o.dtype == DType::kBF16 ? "bf16" : "f32";
    for (const TorchModeResult& m : torch->modes) {
      const std::string key = absl::StrCat("torch_", m.mode);
      if (!m.error.empty()) {
        report.setup.emplace_back(key, absl::StrCat(torch->framework, " failed: ", m.error));
        continue;
      }
      std::string line =
          absl::StrFormat("%s %s %s: forward+backward %.0f tok/s, %.1f TFLOP/s", torch->framework,
                          m.mode, dtype_name, m.train_tokens_per_s, m.train_tflops);
      if (peak.has_value()) {
        absl::StrAppendFormat(&line, ", MFU %.1f%%", 100 * m.train_tflops / peak->tflops);
      }
      report.setup.emplace_back(key, line);
      const std::string baseline = absl::StrCat("pytorch_", m.mode, "_", dtype_name);
      report.results.push_back(
          {"forward_tokens_per_s", o.tokens / fwd, "tok/s", baseline, m.forward_tokens_per_s});
      report.results.push_back(
          {"train_tokens_per_s", o.tokens / train, "tok/s", baseline, m.train_tokens_per_s});
    }
  }
  return report;
}

}  // namespace prl::bench
