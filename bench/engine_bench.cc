#include "bench/engine_bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/decode_roofline.h"
#include "bench/torch_baseline.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "model/lora.h"
#include "model/transformer.h"

namespace prl::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Phases {
  double prefill_s = 0.0;  // the step that prefills every prompt
  double decode_s = 0.0;   // every step after it
  int64_t swaps = 0;
  EngineStats stats;  // at the end of the run
};

// Copies `source` into spare buffers and swaps them into the engine every interval, never
// writing a buffer the engine may still read (use_count == 1: only this loader holds it).
class SwapStream {
 public:
  SwapStream(Engine* engine, std::shared_ptr<const ParameterSet> source, int64_t interval_ms)
      : engine_(engine), source_(std::move(source)), interval_ms_(interval_ms) {}

  // The spare buffers are allocated and touched before timing starts: a long-running actor
  // allocates them once, so their first page faults are not part of a swap's cost.
  absl::Status Start() {
    for (auto& b : buffers_) {
      PRL_ASSIGN_OR_RETURN(ParameterSet set, ParameterSet::Allocate(
                                                 source_->config, source_->buffer.device(), false));
      b = std::make_shared<ParameterSet>(std::move(set));
      PRL_RETURN_IF_ERROR(CopyBytes(b->data(), b->buffer.device(), source_->data(),
                                    source_->buffer.device(), source_->buffer.bytes()));
    }
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }
  int64_t Stop() {
    stop_ = true;
    thread_.join();
    return swaps_;
  }

 private:
  void Run() {
    // Loading is background work: it must not take cores from generation (setpriority on a
    // thread id sets that thread's nice value on Linux).
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    for (int64_t version = 1; !stop_.load(); ++version) {
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms_));
      std::shared_ptr<ParameterSet>& spare = buffers_[version % 2];
      while (spare.use_count() > 1 && !stop_.load()) std::this_thread::yield();
      if (stop_.load()) break;
      // In 4 MiB pieces with a yield between them, so that an OpenMP worker preempted by the
      // copy gets its core back quickly (a parallel region waits for its slowest thread).
      const size_t total = source_->buffer.bytes(), piece = size_t{4} << 20;
      for (size_t off = 0; off < total; off += piece) {
        CopyBytes(static_cast<char*>(spare->buffer.data()) + off, spare->buffer.device(),
                  static_cast<const char*>(source_->buffer.data()) + off, source_->buffer.device(),
                  std::min(piece, total - off))
            .IgnoreError();  // same-device copy within equal-sized buffers
        std::this_thread::yield();
      }
      if (engine_->SwapWeights(spare, version).ok()) ++swaps_;
    }
  }

  Engine* engine_;
  std::shared_ptr<const ParameterSet> source_;
  int64_t interval_ms_;
  std::shared_ptr<ParameterSet> buffers_[2];
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> swaps_{0};
};

// profile: decode step o.profile_step runs between cudaProfilerStart and cudaProfilerStop.
// adapters: the requests spread over o.adapters LoRA adapters.
absl::StatusOr<Phases> RunBatch(std::shared_ptr<const ParameterSet> weights, int64_t batch,
                                const EngineBenchOptions& o, bool swaps, bool profile = false,
                                bool adapters = false) {
  EngineOptions eo = o.engine;
  eo.max_num_seqs = static_cast<int32_t>(std::max<int64_t>(batch, 1));
  eo.max_num_batched_tokens = static_cast<int32_t>(batch * o.prompt_len);  // one prefill step
  eo.enable_prefix_caching = false;
  // Room for every sequence's prompt and output: the decode figures never include preemption.
  const int64_t blocks_per_seq = (o.prompt_len + o.output_len + eo.block_size - 1) / eo.block_size;
  eo.kv_cache_bytes = std::max<int64_t>(
      eo.kv_cache_bytes,
      batch * blocks_per_seq * KvCache::BytesPerBlock(weights->config, eo.block_size, eo.dtype));
  eo.max_model_len = o.prompt_len + o.output_len;
  eo.max_adapters = std::max(o.adapters, 1);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(weights, 0, eo));
  // With adapters: N of them (A as peft creates it, B random), requests spread over them.
  const int num_adapters = adapters ? o.adapters : 0;
  for (int a = 0; a < num_adapters; ++a) {
    LoraConfig lora;
    lora.rank = o.adapter_rank;
    lora.alpha = 2.0 * static_cast<double>(o.adapter_rank);
    lora.target_modules = {"all-linear"};
    PRL_ASSIGN_OR_RETURN(LoraSet set,
                         LoraSet::Allocate(weights->config, lora, Device::Cpu(), false));
    InitializeLora(set, static_cast<uint64_t>(a + 1));
    std::mt19937 brng(static_cast<uint32_t>(a + 100));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (const LoraEntry& e : set.layout.entries()) {
      if (e.is_a) continue;
      for (int64_t i = 0; i < e.numel; ++i) set.data()[e.offset + i] = normal(brng);
    }
    PRL_RETURN_IF_ERROR(engine->AddAdapter(absl::StrCat("adapter-", a),
                                           std::make_shared<const LoraSet>(std::move(set))));
  }
  std::mt19937 rng(static_cast<uint32_t>(batch));
  std::uniform_int_distribution<int32_t> token(
      0, static_cast<int32_t>(weights->config.vocab_size - 1));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(o.prompt_len);
    for (auto& t : prompt) t = token(rng);
    SamplingParams p;
    p.max_tokens = static_cast<int32_t>(o.output_len);
    p.seed = static_cast<uint64_t>(b);
    const std::string adapter =
        num_adapters > 0 ? absl::StrCat("adapter-", b % num_adapters) : std::string();
    PRL_RETURN_IF_ERROR(engine->AddRequest(std::move(prompt), p, adapter).status());
  }
  Phases phases;
  auto start = Clock::now();
  PRL_RETURN_IF_ERROR(engine->Step());
  phases.prefill_s = Since(start);
  if (engine->Stats().generated_tokens != batch) {
    return absl::InternalError("bench engine: the prefill did not fit in one step");
  }
  SwapStream stream(engine.get(), weights, o.swap_interval_ms);
  if (swaps) PRL_RETURN_IF_ERROR(stream.Start());
  start = Clock::now();
  for (int64_t step = 1; engine->HasUnfinishedRequests(); ++step) {
    // Step returns once its tokens are on the host: the profiled range holds that step alone.
    const bool profiled = profile && o.engine.device.is_cuda() && step == o.profile_step;
    if (profiled) PRL_RETURN_IF_ERROR(cuda::ProfilerStart());
    PRL_RETURN_IF_ERROR(engine->Step());
    if (profiled) PRL_RETURN_IF_ERROR(cuda::ProfilerStop());
  }
  phases.decode_s = Since(start);
  if (swaps) phases.swaps = stream.Stop();
  phases.stats = engine->Stats();
  return phases;
}

absl::StatusOr<double> TrainingForwardTokensPerSecond(const ParameterSet& weights, int64_t seq_len,
                                                      Device device, DType dtype) {
  const int64_t tokens = 2048;
  PackedBatch batch;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0,
                                               static_cast<int32_t>(weights.config.vocab_size - 1));
  for (int64_t start = 0; start < tokens; start += seq_len) {
    const int64_t len = std::min(seq_len, tokens - start);
    std::vector<int32_t> t(len), targets(len);
    for (auto& x : t) x = token(rng);
    for (auto& x : targets) x = token(rng);
    batch.Add(t, targets);
  }
  TransformerOptions options;
  options.compute_dtype = dtype;
  Transformer model(weights.config, device, options);
  std::optional<ComputeParams> compute;
  if (dtype != DType::kF32) {
    PRL_ASSIGN_OR_RETURN(compute, ToComputeDType(weights, dtype));
  }
  const ModelParams& params = compute.has_value() ? compute->params : weights.params;
  std::vector<float> lp(tokens);
  std::vector<double> seconds;
  for (int i = 0; i < 4; ++i) {
    const auto start = Clock::now();
    PRL_RETURN_IF_ERROR(model.Forward(params, batch, 1.0f, absl::MakeSpan(lp), false));
    if (i > 0) seconds.push_back(Since(start));  // the first run is warm-up
  }
  std::sort(seconds.begin(), seconds.end());
  return tokens / seconds[seconds.size() / 2];
}

absl::StatusOr<Phases> BestOf(std::shared_ptr<const ParameterSet> weights, int64_t batch,
                              const EngineBenchOptions& o) {
  Phases best;
  best.decode_s = best.prefill_s = 1e30;
  for (int i = 0; i < o.iterations; ++i) {
    PRL_ASSIGN_OR_RETURN(const Phases p, RunBatch(weights, batch, o, false));
    if (p.decode_s < best.decode_s) best = p;
  }
  return best;
}

// The CUDA rows of one batch: decode beside the HBM roofline, beside PyTorch, without CUDA
// graphs (batch 1) and in the batch-invariant mode (--invariant-cost).
absl::Status AddCudaDecodeRows(std::shared_ptr<const ParameterSet> weights, int64_t batch,
                               double decode, const EngineBenchOptions& o, Report* report) {
  const ModelConfig& c = weights->config;
  static double bandwidth = 0.0;  // bytes/s, measured once per run
  if (bandwidth == 0.0) {
    PRL_ASSIGN_OR_RETURN(bandwidth, MeasureDeviceBandwidth(o.engine.device));
    report->setup.push_back(
        {"hbm_bandwidth",
         absl::StrFormat("%.0f GB/s (device-to-device copy, this run)", bandwidth / 1e9)});
  }
  const double step_bytes =
      MeanDecodeStepBytes(c, o.engine.dtype, batch, o.prompt_len, o.output_len);
  const double roofline = batch * bandwidth / step_bytes;
  const std::string name = absl::StrCat("decode_b", batch);
  report->results.push_back({name + "_vs_roofline", decode, "tok/s", "hbm_roofline", roofline});
  if (!o.torch_python.empty()) {
    TorchDecodeOptions t;
    t.python = o.torch_python;
    t.script = o.torch_script;
    t.modes = o.torch_modes;
    t.batch = batch;
    t.prompt = o.prompt_len;
    t.output = o.output_len;
    t.device = o.engine.device;
    t.dtype = o.engine.dtype;
    PRL_ASSIGN_OR_RETURN(const TorchDecodeResult torch, RunTorchDecodeBaseline(c, t));
    for (const TorchDecodeMode& m : torch.modes) {
      if (!m.error.empty()) {
        report->setup.push_back({absl::StrCat("pytorch_", m.mode, "_b", batch), m.error});
        continue;
      }
      report->results.push_back({absl::StrCat(name, "_vs_pytorch_", m.mode), decode, "tok/s",
                                 absl::StrCat("pytorch_", m.mode), m.decode_tokens_per_s});
    }
    if (batch == o.batches.front()) {
      report->setup.push_back(
          {"pytorch", absl::StrCat(torch.framework, ", ", torch.attention, ", ", torch.sampling)});
    }
  }
  const double tokens = static_cast<double>(batch * (o.output_len - 1));
  if (batch == 1 && o.engine.cuda_graphs) {
    EngineBenchOptions eager = o;
    eager.engine.cuda_graphs = false;
    PRL_ASSIGN_OR_RETURN(const Phases p, BestOf(weights, batch, eager));
    report->results.push_back(
        {name + "_graphs_vs_eager", decode, "tok/s", "no_cuda_graphs", tokens / p.decode_s});
  }
  if (o.tuned_cost && !o.engine.batch_invariant) {
    EngineBenchOptions flipped = o;
    flipped.engine.tuned_kernels = !o.engine.tuned_kernels;
    PRL_ASSIGN_OR_RETURN(const Phases p, BestOf(weights, batch, flipped));
    const double other = tokens / p.decode_s;
    const bool main_tuned = o.engine.tuned_kernels;
    report->results.push_back({name + "_tuned_kernels", main_tuned ? decode : other, "tok/s",
                               name + "_default_kernels", main_tuned ? other : decode});
  }
  if (o.engine.norm_in_gemm && o.engine.tuned_kernels && !o.engine.batch_invariant) {
    EngineBenchOptions separate = o;  // the same kernels with the RMSNorms as kernels of their own
    separate.engine.norm_in_gemm = false;
    PRL_ASSIGN_OR_RETURN(const Phases p, BestOf(weights, batch, separate));
    report->results.push_back(
        {name + "_norm_in_gemm", decode, "tok/s", name + "_separate_norms", tokens / p.decode_s});
  }
  if (o.invariant_cost && !o.engine.batch_invariant) {
    EngineBenchOptions inv = o;
    inv.engine.batch_invariant = true;
    PRL_ASSIGN_OR_RETURN(const Phases p, BestOf(weights, batch, inv));
    report->results.push_back(
        {name + "_batch_invariant", tokens / p.decode_s, "tok/s", name + "_fast", decode});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Report> RunEngineBench(std::shared_ptr<const ParameterSet> weights,
                                      const EngineBenchOptions& o) {
  if (o.prompt_len < 1 || o.output_len < 2 || o.batches.empty() || o.iterations < 1) {
    return absl::InvalidArgumentError(
        "bench engine: --prompt-len >= 1, --output-len >= 2, --batches and --iters >= 1 needed");
  }
  if (o.prompt_len + o.output_len > weights->config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench engine: prompt + output = ", o.prompt_len + o.output_len,
        " exceeds max_position_embeddings = ", weights->config.max_position_embeddings));
  }
  PRL_ASSIGN_OR_RETURN(const double train_fwd,
                       TrainingForwardTokensPerSecond(*weights, o.prompt_len + o.output_len,
                                                      o.engine.device, o.engine.dtype));
  // Warm-up: thread pools, page faults of the KV pool and workspaces.
  PRL_RETURN_IF_ERROR(RunBatch(weights, o.batches.front(), o, false).status());

  Report report;
  report.bench = "engine";
  report.machine = MachineInfo();
  const ModelConfig& c = weights->config;
  report.setup = {
      {"model", absl::StrFormat("%s hidden=%d layers=%d heads=%d kv_heads=%d vocab=%d",
                                ArchitectureName(c.arch), c.hidden_size, c.num_hidden_layers,
                                c.num_attention_heads, c.num_key_value_heads, c.vocab_size)},
      {"requests", absl::StrFormat("prompt %d, output %d, temperature 1, batches %s", o.prompt_len,
                                   o.output_len, absl::StrJoin(o.batches, ","))},
      {"engine",
       absl::StrFormat("block_size %d, %s, %s, %s%s, prefill in one step per batch",
                       o.engine.block_size, o.engine.device.ToString(), DTypeName(o.engine.dtype),
                       o.engine.batch_invariant ? "batch-invariant"
                       : o.engine.tuned_kernels ? "fast, tuned kernels"
                                                : "fast",
                       o.engine.device.is_cuda()
                           ? (o.engine.cuda_graphs ? ", CUDA graphs" : ", no CUDA graphs")
                           : "")},
      {"baseline", absl::StrFormat("training forward (Transformer::Forward, 2048 tokens in "
                                   "sequences of %d): %.1f tok/s",
                                   o.prompt_len + o.output_len, train_fwd)}};
  for (int64_t batch : o.batches) {
    double prefill_s = 1e30, decode_s = 1e30;
    for (int i = 0; i < o.iterations; ++i) {
      PRL_ASSIGN_OR_RETURN(const Phases p,
                           RunBatch(weights, batch, o, false, o.profile_step > 0 && i == 0));
      prefill_s = std::min(prefill_s, p.prefill_s);
      decode_s = std::min(decode_s, p.decode_s);
    }
    const double prefill = batch * o.prompt_len / prefill_s;
    const double decode = batch * (o.output_len - 1) / decode_s;
    if (o.progress) {
      std::fprintf(stderr, "bench engine: batch %lld: prefill %.0f tok/s, decode %.0f tok/s\n",
                   static_cast<long long>(batch), prefill, decode);
    }
    report.results.push_back(
        {absl::StrCat("prefill_b", batch), prefill, "tok/s", "train_forward", train_fwd});
    report.results.push_back(
        {absl::StrCat("decode_b", batch), decode, "tok/s", "train_forward", train_fwd});
    if (o.engine.device.is_cuda()) {
      PRL_RETURN_IF_ERROR(AddCudaDecodeRows(weights, batch, decode, o, &report));
    }
    if (o.adapters > 0) {  // runs alternating with the base model's, best of each
      double base_s = 1e30, lora_s = 1e30;
      for (int i = 0; i < o.iterations; ++i) {
        PRL_ASSIGN_OR_RETURN(const Phases base, RunBatch(weights, batch, o, false));
        PRL_ASSIGN_OR_RETURN(const Phases lora,
                             RunBatch(weights, batch, o, false, false, /*adapters=*/true));
        base_s = std::min(base_s, base.decode_s);
        lora_s = std::min(lora_s, lora.decode_s);
      }
      const double tokens = static_cast<double>(batch * (o.output_len - 1));
      report.results.push_back({absl::StrCat("decode_b", batch, "_", o.adapters, "_adapters"),
                                tokens / lora_s, "tok/s", absl::StrCat("decode_b", batch, "_base"),
                                tokens / base_s});
    }
  }
  if (o.adapters > 0) {
    report.setup.push_back(
        {"adapters", absl::StrFormat("%d LoRA adapters of rank %d on every projection, the "
                                     "requests of a batch spread over them, alternating with "
                                     "runs of the base model alone",
                                     o.adapters, o.adapter_rank)});
  }
  if (o.swap_interval_ms > 0) {
    // Runs with and without swaps alternate, so that both see the same machine conditions.
    const int64_t batch = o.batches.back();
    double plain_s = 1e30, swapped_s = 1e30;
    int64_t swaps = 0;
    for (int i = 0; i < o.iterations; ++i) {
      PRL_ASSIGN_OR_RETURN(const Phases plain, RunBatch(weights, batch, o, false));
      PRL_ASSIGN_OR_RETURN(const Phases swapped, RunBatch(weights, batch, o, true));
      plain_s = std::min(plain_s, plain.decode_s);
      swapped_s = std::min(swapped_s, swapped.decode_s);
      swaps = std::max(swaps, swapped.swaps);
    }
    report.setup.push_back(
        {"swaps", absl::StrFormat("a full weight copy + swap every %d ms during decode at batch "
                                  "%d (%d swaps per run), alternating with runs without",
                                  o.swap_interval_ms, batch, swaps)});
    report.results.push_back({absl::StrCat("decode_b", batch, "_with_swaps"),
                              batch * (o.output_len - 1) / swapped_s, "tok/s",
                              absl::StrCat("decode_b", batch, "_without"),
                              batch * (o.output_len - 1) / plain_s});
    if (o.engine.device.is_cuda()) {
      // A swap copies the new weights into the buffers the graphs captured; the alternative,
      // re-capturing every bucket's graph, costs what the first captures cost.
      PRL_ASSIGN_OR_RETURN(const Phases swapped, RunBatch(weights, batch, o, true));
      const EngineStats& s = swapped.stats;
      if (s.weight_swaps > 0 && s.graph_captures > 0) {
        report.results.push_back({"weight_swap_ms", 1e3 * s.weight_swap_seconds / s.weight_swaps,
                                  "ms", "graph_capture_ms",
                                  1e3 * s.graph_capture_seconds / s.graph_captures});
      }
    }
  }
  return report;
}

}  // namespace prl::bench
