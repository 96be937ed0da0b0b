#include "bench/model_bench.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "bench/gpu_peak.h"
#include "bench/stats.h"
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

const char* DTypeLabel(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "f32"; }

// ---- Setup ---------------------------------------------------------------------------------

absl::Status ValidateOptions(const ModelConfig& config, const ModelBenchOptions& o) {
  if (o.tokens <= 0 || o.seq_len <= 0 || o.iterations <= 0) {
    return absl::InvalidArgumentError("bench model: --tokens, --seq-len and --iters must be > 0");
  }
  if (o.seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("bench model: --seq-len ", o.seq_len,
                                                   " exceeds max_position_embeddings ",
                                                   config.max_position_embeddings));
  }
  if (o.keep_logits_mb < -1 || o.keep_logits_mb > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench model: --keep-logits-mb: expected -1 (the device's default), 0 (recompute) or up "
        "to 1048576 MiB, found ",
        o.keep_logits_mb));
  }
  return absl::OkStatus();
}

// Where the run happens and the denominator of its MFU.
struct BenchDevice {
  bool gpu = false;
  std::string gpu_name;         // empty on the CPU
  std::optional<GpuPeak> peak;  // --peak-tflops, else the GPU's from the table; none: no MFU
};

absl::StatusOr<BenchDevice> ResolveBenchDevice(const ModelBenchOptions& o) {
  BenchDevice d;
  d.gpu = o.device.is_cuda();
  if (d.gpu) {
    PRL_ASSIGN_OR_RETURN(d.gpu_name, cuda::DeviceName(o.device.index));
  }
  if (o.peak_tflops > 0) {
    d.peak = GpuPeak{"--peak-tflops", o.peak_tflops};
  } else if (d.gpu) {
    d.peak = LookupGpuPeak(d.gpu_name, o.dtype);
  }
  return d;
}

// The PyTorch baseline, when o.torch_python names an interpreter; nullopt otherwise.
absl::StatusOr<std::optional<TorchBaseline>> RunTorch(const ModelConfig& config,
                                                      const ModelBenchOptions& o,
                                                      const BenchDevice& d) {
  if (o.torch_python.empty()) return std::optional<TorchBaseline>();
  TorchBaselineOptions t;
  t.python = o.torch_python;
  t.script = o.torch_script;
  t.modes = o.torch_modes;
  t.tokens = o.tokens;
  t.seq_len = o.seq_len;
  t.iterations = o.iterations;
  t.device = o.device;
  t.dtype = o.dtype;
  t.peak_tflops = d.peak.has_value() ? d.peak->tflops : 0.0;
  if (o.progress) {
    std::fprintf(stderr, "bench model: PyTorch baseline: %s\n",
                 absl::StrJoin(TorchBaselineArgv(config, t), " ").c_str());
  }
  PRL_ASSIGN_OR_RETURN(TorchBaseline torch, RunTorchBaseline(config, t));
  return std::optional<TorchBaseline>(std::move(torch));
}

}  // namespace

absl::StatusOr<ParameterSet> RandomParameters(const ModelConfig& config, Device device) {
  PRL_ASSIGN_OR_RETURN(ParameterSet params, ParameterSet::Allocate(config, Device::Cpu(), false));
  InitializeParameters(params, /*seed=*/1);
  if (device.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(ParameterSet on_device, ParameterSet::Allocate(config, device, false));
    PRL_RETURN_IF_ERROR(
        CopyBytes(on_device.data(), device, params.data(), Device::Cpu(), params.buffer.bytes()));
    params = std::move(on_device);
  }
  return params;
}

namespace {

// o.tokens random tokens and targets (seed 7) packed in sequences of o.seq_len (the last one
// may be shorter).
struct RandomBatch {
  PackedBatch batch;
  std::vector<int64_t> seq_lens;
};

RandomBatch MakeRandomBatch(const ModelConfig& config, const ModelBenchOptions& o) {
  RandomBatch r;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  for (int64_t start = 0; start < o.tokens; start += o.seq_len) {
    const int64_t len = std::min(o.seq_len, o.tokens - start);
    std::vector<int32_t> toks(len), targets(len);
    for (auto& t : toks) t = token(rng);
    for (auto& t : targets) t = token(rng);
    r.batch.Add(toks, targets);
    r.seq_lens.push_back(len);
  }
  return r;
}

// ---- The GEMM baseline ---------------------------------------------------------------------

// The GEMM on the model's gate|up projection shape, C (M x N) = A (M x K) B^T (N x K), with
// M = tokens, N = 2 I, K = hidden: OpenBLAS SGEMM on the CPU, the CUDA backend's GEMM
// (cuBLASLt; fp32 without TF32, or bf16 in the bf16 mode) on a GPU.
class GemmBaseline {
 public:
  static absl::StatusOr<GemmBaseline> Create(const ModelConfig& config,
                                             const ModelBenchOptions& o) {
    GemmBaseline g(o, o.tokens, 2 * config.intermediate_size, config.hidden_size);
    if (g.gpu_) PRL_RETURN_IF_ERROR(g.PrepareGpu());
    return g;
  }

  // One GEMM, to its end on the device: GFLOP/s.
  double TimeGflops() {
    const auto start = std::chrono::steady_clock::now();
    if (gpu_) {
      RunGpu();
    } else {
      RunCpu();
    }
    return 2.0 * M_ * N_ * K_ / Seconds(start) / 1e9;
  }

  // The baseline's name in the report.
  std::string Name() const {
    return gpu_ ? absl::StrFormat("cublaslt_%s_gemm_%dx%dx%d", DTypeLabel(dtype_), M_, N_, K_)
                : absl::StrFormat("sgemm_%dx%dx%d", M_, N_, K_);
  }

 private:
  GemmBaseline(const ModelBenchOptions& o, int64_t M, int64_t N, int64_t K)
      : gpu_(o.device.is_cuda()),
        device_(o.device),
        dtype_(o.dtype),
        M_(M),
        N_(N),
        K_(K),
        a_(M * K, 0.5f),
        b_(N * K, 0.25f),
        c_(M * N) {}

  // The operands on the GPU, in the compute dtype.
  absl::Status PrepareGpu() {
    PRL_ASSIGN_OR_RETURN(ga_, AllocateTensor(DType::kF32, device_, {M_, K_}));
    PRL_ASSIGN_OR_RETURN(gb_, AllocateTensor(DType::kF32, device_, {N_, K_}));
    PRL_ASSIGN_OR_RETURN(gc_, AllocateTensor(DType::kF32, device_, {M_, N_}));
    PRL_RETURN_IF_ERROR(CopyBytes(ga_.view.data, device_, a_.data(), Device::Cpu(), a_.size() * 4));
    PRL_RETURN_IF_ERROR(CopyBytes(gb_.view.data, device_, b_.data(), Device::Cpu(), b_.size() * 4));
    if (dtype_ == DType::kF32) return absl::OkStatus();
    // The same GEMM in the compute dtype.
    OwnedTensor a16, b16, c16;
    PRL_ASSIGN_OR_RETURN(a16, AllocateTensor(dtype_, device_, {M_, K_}));
    PRL_ASSIGN_OR_RETURN(b16, AllocateTensor(dtype_, device_, {N_, K_}));
    PRL_ASSIGN_OR_RETURN(c16, AllocateTensor(dtype_, device_, {M_, N_}));
    kernels::ConvertDType(a16.view, ga_.view);
    kernels::ConvertDType(b16.view, gb_.view);
    PRL_RETURN_IF_ERROR(cuda::Synchronize(device_.index));  // before the fp32 copies go
    ga_ = std::move(a16);
    gb_ = std::move(b16);
    gc_ = std::move(c16);
    return absl::OkStatus();
  }

  void RunCpu() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M_, N_, K_, 1.0f, a_.data(), K_, b_.data(),
                K_, 0.0f, c_.data(), N_);
  }

  void RunGpu() {
    kernels::MatmulForward(gc_.view, ga_.view, gb_.view);
    cuda::Synchronize(device_.index).IgnoreError();
  }

  bool gpu_;
  Device device_;
  DType dtype_;
  int64_t M_, N_, K_;
  std::vector<float> a_, b_, c_;  // host operands (the CPU's GEMM; the GPU's source values)
  OwnedTensor ga_, gb_, gc_;      // GPU operands, in the compute dtype
};

// ---- The model's passes --------------------------------------------------------------------

// Forward (scoring) and forward + backward (training) over one batch, each timed to its end on
// the device. In the bf16 mode the passes read a bf16 copy of the weights.
class ModelPasses {
 public:
  ModelPasses(const ModelConfig& config, const ModelBenchOptions& o, const ParameterSet& params,
              ParameterSet& grads, const PackedBatch& batch)
      : o_(o),
        model_(config, o.device, Options(o)),
        params_(params),
        grads_(grads),
        batch_(batch),
        logprobs_(o.tokens),
        dlogprobs_(o.tokens, -1.0f) {}

  static TransformerOptions Options(const ModelBenchOptions& o) {
    TransformerOptions t{.compute_dtype = o.dtype, .residual_in_gemm = o.tuned_kernels};
    if (o.keep_logits_mb >= 0) t.keep_logits = o.keep_logits_mb > 0;
    t.keep_logits_bytes = std::max<int64_t>(o.keep_logits_mb, 0) << 20;
    return t;
  }

  absl::Status MakeComputeCopy() {
    if (o_.dtype != DType::kF32) {
      PRL_ASSIGN_OR_RETURN(compute_, ToComputeDType(params_, o_.dtype));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> TimeForward() {
    const auto start = std::chrono::steady_clock::now();
    PRL_RETURN_IF_ERROR(model_.Forward(weights(), batch_, 1.0f, absl::MakeSpan(logprobs_), false));
    return Seconds(start);
  }

  absl::StatusOr<double> TimeTrain() {
    const auto start = std::chrono::steady_clock::now();
    PRL_RETURN_IF_ERROR(model_.Forward(weights(), batch_, 1.0f, absl::MakeSpan(logprobs_), true));
    PRL_RETURN_IF_ERROR(model_.Backward(weights(), dlogprobs_, grads_.params));
    if (o_.device.is_cuda()) PRL_RETURN_IF_ERROR(cuda::Synchronize(o_.device.index));
    return Seconds(start);
  }

 private:
  const ModelParams& weights() const {
    return compute_.has_value() ? compute_->params : params_.params;
  }

  const ModelBenchOptions& o_;
  Transformer model_;
  const ParameterSet& params_;
  ParameterSet& grads_;
  const PackedBatch& batch_;
  std::optional<ComputeParams> compute_;  // the bf16 copy of the weights in bf16 mode
  std::vector<float> logprobs_;
  std::vector<float> dlogprobs_;
};

// Medians over the timed iterations.
struct Timings {
  double sgemm_gflops = 0;
  double forward_s = 0, train_s = 0;
};

absl::StatusOr<Timings> Measure(GemmBaseline& gemm, ModelPasses& passes,
                                const ModelBenchOptions& o) {
  // Warm-up: page in weights and workspaces, let OpenBLAS start its threads.
  gemm.TimeGflops();
  PRL_RETURN_IF_ERROR(passes.TimeForward().status());
  PRL_RETURN_IF_ERROR(passes.TimeTrain().status());

  std::vector<double> sgemm_gflops, fwd_s, train_s;
  for (int i = 0; i < o.iterations; ++i) {
    // Interleaved, so that the baseline and the model see the same machine conditions.
    for (int r = 0; r < 3; ++r) sgemm_gflops.push_back(gemm.TimeGflops());
    PRL_ASSIGN_OR_RETURN(const double f, passes.TimeForward());
    PRL_ASSIGN_OR_RETURN(const double t, passes.TimeTrain());
    fwd_s.push_back(f);
    train_s.push_back(t);
    if (o.progress) {
      std::fprintf(stderr,
                   "bench model: iteration %d/%d: forward %.3f s, forward+backward %.3f s\n", i + 1,
                   o.iterations, f, t);
    }
  }
  if (o.profile && o.device.is_cuda()) {  // one more pass, for ncu --profile-from-start off
    PRL_RETURN_IF_ERROR(cuda::ProfilerStart());
    PRL_RETURN_IF_ERROR(passes.TimeTrain().status());
    PRL_RETURN_IF_ERROR(cuda::ProfilerStop());
  }
  return Timings{Median(sgemm_gflops), Median(fwd_s), Median(train_s)};
}

// ---- Report rows ---------------------------------------------------------------------------

// Model FLOPs of one step (model/flops.h).
struct StepFlops {
  double forward = 0, train = 0;
};

std::vector<std::pair<std::string, std::string>> SetupRows(const ModelConfig& config,
                                                           const ModelBenchOptions& o,
                                                           const StepFlops& flops) {
  return {
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
      {"kernels", o.tuned_kernels ? "tuned (GEMM algorithm search, residual GEMMs)" : "default"},
      {"lm_head_logits", o.keep_logits_mb < 0    ? "the device's default (kept on the CPU)"
                         : o.keep_logits_mb == 0 ? "recomputed in the backward"
                                                 : absl::StrCat("kept for the backward (up to ",
                                                                o.keep_logits_mb, " MiB)")},
      {"flops_per_step", absl::StrFormat("forward %.1f GFLOP, forward+backward %.1f GFLOP",
                                         flops.forward / 1e9, flops.train / 1e9)}};
}

// Tokens/s against what the model would reach if all of its FLOPs ran at SGEMM speed, and
// GFLOP/s against the SGEMM's.
std::vector<Result> GemmRows(const ModelBenchOptions& o, const StepFlops& flops, const Timings& t,
                             const std::string& gemm_name) {
  const double sgemm = t.sgemm_gflops;
  return {{"forward_tokens_per_s", o.tokens / t.forward_s, "tok/s", "at_sgemm_speed",
           sgemm * 1e9 / (flops.forward / o.tokens)},
          {"forward_gflops", flops.forward / t.forward_s / 1e9, "GFLOP/s", gemm_name, sgemm},
          {"train_tokens_per_s", o.tokens / t.train_s, "tok/s", "at_sgemm_speed",
           sgemm * 1e9 / (flops.train / o.tokens)},
          {"train_gflops", flops.train / t.train_s / 1e9, "GFLOP/s", gemm_name, sgemm}};
}

// MFU: the ratio of the TFLOP/s rows to the peak; on a GPU without a known peak, a note.
void AddMfuRows(const ModelBenchOptions& o, const BenchDevice& d, const StepFlops& flops,
                const Timings& t, Report& report) {
  const std::string peak_name =
      o.peak_tflops > 0    ? std::string("peak_from_flag")
      : d.peak.has_value() ? absl::StrCat("peak_", absl::StrReplaceAll(d.peak->label, {{" ", "_"}}))
                           : std::string();
  if (d.peak.has_value()) {
    const double mfu = flops.train / t.train_s / 1e12 / d.peak->tflops;
    report.setup.emplace_back("mfu", absl::StrFormat("forward+backward %.1f%% of %.0f TFLOP/s (%s)",
                                                     100 * mfu, d.peak->tflops, d.peak->label));
    report.results.push_back({"forward_tflops", flops.forward / t.forward_s / 1e12, "TFLOP/s",
                              peak_name, d.peak->tflops});
    report.results.push_back(
        {"train_tflops", flops.train / t.train_s / 1e12, "TFLOP/s", peak_name, d.peak->tflops});
  } else if (d.gpu) {
    report.setup.emplace_back(
        "mfu", absl::StrCat("unknown peak for '", d.gpu_name, "': pass --peak-tflops for an MFU"));
  }
}

// One setup line per PyTorch mode, and this run's tokens/s against each mode that ran.
void AddTorchRows(const ModelBenchOptions& o, const BenchDevice& d, const TorchBaseline& torch,
                  const Timings& t, Report& report) {
  report.setup.emplace_back("torch_attention", torch.attention);
  const char* dtype_name = DTypeLabel(o.dtype);
  for (const TorchModeResult& m : torch.modes) {
    const std::string key = absl::StrCat("torch_", m.mode);
    if (!m.error.empty()) {
      report.setup.emplace_back(key, absl::StrCat(torch.framework, " failed: ", m.error));
      continue;
    }
    std::string line =
        absl::StrFormat("%s %s %s: forward+backward %.0f tok/s, %.1f TFLOP/s", torch.framework,
                        m.mode, dtype_name, m.train_tokens_per_s, m.train_tflops);
    if (d.peak.has_value()) {
      absl::StrAppendFormat(&line, ", MFU %.1f%%", 100 * m.train_tflops / d.peak->tflops);
    }
    report.setup.emplace_back(key, line);
    const std::string baseline = absl::StrCat("pytorch_", m.mode, "_", dtype_name);
    report.results.push_back({"forward_tokens_per_s", o.tokens / t.forward_s, "tok/s", baseline,
                              m.forward_tokens_per_s});
    report.results.push_back(
        {"train_tokens_per_s", o.tokens / t.train_s, "tok/s", baseline, m.train_tokens_per_s});
  }
}

}  // namespace

absl::StatusOr<Report> RunModelBench(const ModelConfig& config, const ModelBenchOptions& o) {
  PRL_RETURN_IF_ERROR(ValidateOptions(config, o));
  PRL_ASSIGN_OR_RETURN(const BenchDevice device, ResolveBenchDevice(o));
  // The PyTorch baseline first, while this process holds no device memory (both models at
  // once would not fit beside each other for the larger shapes).
  PRL_ASSIGN_OR_RETURN(const std::optional<TorchBaseline> torch, RunTorch(config, o, device));

  kernels::SetGemmAlgorithmSearch(o.tuned_kernels);
  PRL_ASSIGN_OR_RETURN(const ParameterSet params, RandomParameters(config, o.device));
  PRL_ASSIGN_OR_RETURN(ParameterSet grads, ParameterSet::Allocate(config, o.device, true));
  const RandomBatch batch = MakeRandomBatch(config, o);
  const StepFlops flops{ForwardFlops(config, batch.seq_lens, o.tokens),
                        TrainingFlops(config, batch.seq_lens, o.tokens)};
  PRL_ASSIGN_OR_RETURN(GemmBaseline gemm, GemmBaseline::Create(config, o));
  ModelPasses passes(config, o, params, grads, batch.batch);
  PRL_RETURN_IF_ERROR(passes.MakeComputeCopy());
  PRL_ASSIGN_OR_RETURN(const Timings timings, Measure(gemm, passes, o));

  Report report;
  report.bench = "model";
  report.machine = MachineInfo();
  if (device.gpu) report.machine.emplace_back("gpu", device.gpu_name);
  report.setup = SetupRows(config, o, flops);
  report.results = GemmRows(o, flops, timings, gemm.Name());
  AddMfuRows(o, device, flops, timings, report);
  if (torch.has_value()) AddTorchRows(o, device, *torch, timings, report);
  return report;
}

}  // namespace prl::bench
