// `prl bench ...`: benchmarks that print their figure beside a baseline from the same run.
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench/coordinator_bench.h"
#include "bench/engine_bench.h"
#include "bench/env_share_bench.h"
#include "bench/adapter_learner_bench.h"
#include "bench/learner_bench.h"
#include "bench/model_bench.h"
#include "bench/replay_bench.h"
#include "bench/tokenizer_bench.h"
#include "checkpoint/hf_model_dir.h"
#include "cli/command.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "kernels/matmul.h"
#include "model/presets.h"

namespace prl::cli {

namespace {

struct ModelBenchFlags {
  std::string config = "40m";
  bench::ModelBenchOptions options;
  std::string device = "auto", dtype = "fp32";
  bool json = false;
};

// A preset name, a model directory, or a config.json file.
absl::StatusOr<ModelConfig> ConfigFromFlag(const std::string& flag) {
  struct stat st;
  if (stat(flag.c_str(), &st) != 0) return PresetConfig(flag);
  if (S_ISDIR(st.st_mode)) return ReadModelConfig(flag);
  PRL_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(flag));
  return ParseModelConfig(text, flag);
}

absl::Status RunModelBench(ModelBenchFlags f) {
  PRL_ASSIGN_OR_RETURN(const ModelConfig config, ConfigFromFlag(f.config));
  PRL_ASSIGN_OR_RETURN(f.options.device, ResolveDeviceFlag(f.device));
  PRL_ASSIGN_OR_RETURN(f.options.dtype, ResolveComputeDType(f.dtype, f.options.device));
  PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunModelBench(config, f.options));
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

struct LearnerBenchFlags {
  std::string config = "40m", device = "cpu", dtype = "fp32";
  std::vector<std::string> checkpointing = {"none"};
  std::vector<std::string> context_attention = {"allgather"};
  bench::LearnerBenchOptions options;
  // --adapters N: the learner of a run of adapters instead (bench/adapter_learner_bench.h).
  int adapters = 0;
  int64_t adapter_rank = 8;
  int threads_per_rank = 0;
  int64_t adapter_pass_tokens = 4096;  // --adapters: the joint steps' learner.adapter_pass_tokens
  bool json = false;
  std::vector<std::string> argv;
};

absl::Status RunLearnerBench(const LearnerBenchFlags& f) {
  PRL_ASSIGN_OR_RETURN(const ModelConfig config, ConfigFromFlag(f.config));
  bench::LearnerBenchOptions options = f.options;
  PRL_ASSIGN_OR_RETURN(options.device, ParseEnum(kDeviceTypeNames, f.device, "--device"));
  PRL_ASSIGN_OR_RETURN(const Device device, ResolveDevice(f.device));
  PRL_ASSIGN_OR_RETURN(options.dtype, ResolveComputeDType(f.dtype, device));
  options.checkpointing.clear();
  for (const std::string& name : f.checkpointing) {
    PRL_ASSIGN_OR_RETURN(options.checkpointing.emplace_back(),
                         ParseEnum(kActivationCheckpointingNames, name, "--checkpointing"));
  }
  options.context_attention.clear();
  for (const std::string& name : f.context_attention) {
    PRL_ASSIGN_OR_RETURN(options.context_attention.emplace_back(),
                         ParseEnum(kContextAttentionNames, name, "--context-attention"));
  }
  if (f.adapters > 0) {
    bench::AdapterLearnerBenchOptions a;
    a.adapters = f.adapters;
    a.adapter_rank = f.adapter_rank;
    a.tokens = options.tokens;
    a.seq_len = options.seq_lens.front();
    a.steps = options.iterations;
    a.world_sizes = options.world_sizes;
    a.threads_per_rank = f.threads_per_rank;
    a.pass_tokens = f.adapter_pass_tokens;
    const absl::Status rank = bench::RunAdapterLearnerBenchRank(config, a);
    if (!absl::IsNotFound(rank)) return rank;  // this process was one of the ranks
    PRL_ASSIGN_OR_RETURN(const bench::Report report,
                         bench::RunAdapterLearnerBench(config, a, f.argv));
    std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
    return absl::OkStatus();
  }
  const absl::Status rank = bench::RunLearnerBenchRank(config, options);
  if (!absl::IsNotFound(rank)) return rank;  // this process was one of the ranks
  PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunLearnerBench(config, options, f.argv));
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

struct EngineBenchFlags {
  std::string model, config = "40m", device = "auto", dtype = "fp32";
  bool no_cuda_graphs = false;
  bench::EngineBenchOptions options;
  int64_t kv_cache_mb = 1024;
  bool json = false;
};

absl::Status RunEngineBench(EngineBenchFlags f) {
  PRL_ASSIGN_OR_RETURN(f.options.engine.device, ResolveDevice(f.device));
  PRL_ASSIGN_OR_RETURN(f.options.engine.dtype,
                       ResolveComputeDType(f.dtype, f.options.engine.device));
  f.options.engine.cuda_graphs = !f.no_cuda_graphs;
  f.options.engine.kv_cache_bytes = f.kv_cache_mb << 20;
  std::shared_ptr<const ParameterSet> weights;
  if (!f.model.empty()) {
    PRL_ASSIGN_OR_RETURN(ParameterSet loaded, LoadModel(f.model, f.options.engine.device));
    weights = std::make_shared<const ParameterSet>(std::move(loaded));
  } else {
    PRL_ASSIGN_OR_RETURN(const ModelConfig config, ConfigFromFlag(f.config));
    PRL_ASSIGN_OR_RETURN(ParameterSet init,
                         bench::RandomParameters(config, f.options.engine.device));
    weights = std::make_shared<const ParameterSet>(std::move(init));
  }
  PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunEngineBench(weights, f.options));
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

void RegisterModelBench(CLI::App* bench, CommandRegistry& registry) {
  auto f = std::make_shared<ModelBenchFlags>();
  CLI::App* model = bench->add_subcommand(
      "model",
      "Transformer forward and forward+backward throughput vs a same-shape GEMM (OpenBLAS "
      "SGEMM, cuBLASLt on CUDA), MFU on a GPU, optionally vs PyTorch");
  model
      ->add_option("--config", f->config,
                   "Preset (tiny, 40m, qwen2.5-0.5b, qwen2.5-1.5b), model directory or "
                   "config.json")
      ->capture_default_str();
  model->add_option("--tokens", f->options.tokens, "Tokens per step")->capture_default_str();
  model->add_option("--seq-len", f->options.seq_len, "Length of the packed sequences")
      ->capture_default_str();
  model->add_option("--iters", f->options.iterations, "Timed iterations (median reported)")
      ->capture_default_str();
  model->add_option("--device", f->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  model->add_option("--dtype", f->dtype, "fp32 (exact mode) | bf16 (CUDA)")->capture_default_str();
  model
      ->add_option("--peak-tflops", f->options.peak_tflops,
                   "Peak TFLOP/s for the MFU (default: from the GPU's name; bf16 dense for bf16, "
                   "fp32 non-tensor for f32)")
      ->capture_default_str();
  model->add_option("--torch-baseline", f->options.torch_python,
                    "Python with torch: also run the same model in PyTorch (eager and "
                    "torch.compile) in this run and print prl's ratio to it");
  model->add_option("--torch-script", f->options.torch_script, "The PyTorch baseline's script")
      ->capture_default_str();
  model->add_option("--torch-modes", f->options.torch_modes, "PyTorch modes: eager,compile")
      ->capture_default_str();
  model->add_flag("--tuned-kernels", f->options.tuned_kernels,
                  "CUDA: cuBLASLt algorithm search and residual GEMMs");
  model
      ->add_option("--keep-logits-mb", f->options.keep_logits_mb,
                   "The LM head's logits kept from the forward for the backward when every "
                   "trained row's fit this many MiB (0: recomputed; -1: the device's default, "
                   "kept on the CPU, recomputed on CUDA until verified)")
      ->capture_default_str();
  model->add_flag("--profile", f->options.profile,
                  "CUDA: one extra forward+backward between cudaProfilerStart/Stop (for ncu "
                  "--profile-from-start off; not timed)");
  model->add_flag("--json", f->json, "Print one JSON object instead of the table");
  registry.Add(model, [f] { return RunModelBench(*f); });
}

void RegisterEngineBench(CLI::App* bench, CommandRegistry& registry) {
  auto e = std::make_shared<EngineBenchFlags>();
  CLI::App* engine = bench->add_subcommand(
      "engine",
      "Engine prefill/decode tokens/s at several batch sizes vs the training forward (on CUDA "
      "also vs the HBM roofline and optionally PyTorch), and decode under in-flight weight "
      "swaps vs without");
  engine->add_option("--model", e->model, "Model directory (default: random weights of --config)");
  engine->add_option("--config", e->config, "Preset, model directory or config.json")
      ->capture_default_str();
  engine->add_option("--prompt-len", e->options.prompt_len, "Prompt tokens per request")
      ->capture_default_str();
  engine->add_option("--output-len", e->options.output_len, "Generated tokens per request")
      ->capture_default_str();
  engine->add_option("--batches", e->options.batches, "Batch sizes (requests in flight)")
      ->delimiter(',')
      ->capture_default_str();
  engine
      ->add_option("--swap-interval-ms", e->options.swap_interval_ms,
                   "Weight swap period for the swap measurement (0: skip)")
      ->capture_default_str();
  engine->add_option("--iters", e->options.iterations, "Runs per batch size (best kept)")
      ->capture_default_str();
  engine->add_option("--block-size", e->options.engine.block_size, "Tokens per KV block")
      ->capture_default_str();
  engine->add_option("--kv-cache-mb", e->kv_cache_mb, "KV cache pool")->capture_default_str();
  engine->add_flag("--batch-invariant", e->options.engine.batch_invariant,
                   "Measure the batch-invariant mode");
  engine->add_option("--device", e->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  engine->add_option("--dtype", e->dtype, "fp32 (exact mode) | bf16 (CUDA)")->capture_default_str();
  engine->add_flag("--no-cuda-graphs", e->no_cuda_graphs, "CUDA: run decode steps eagerly");
  engine->add_option("--torch-baseline", e->options.torch_python,
                     "CUDA: Python with torch: also run a PyTorch KV-cache generation loop of the "
                     "same model (eager and CUDA graph) in this run");
  engine->add_option("--torch-script", e->options.torch_script, "The PyTorch baseline's script")
      ->capture_default_str();
  engine->add_option("--torch-modes", e->options.torch_modes, "PyTorch modes: eager,graph")
      ->capture_default_str();
  engine
      ->add_option("--adapters", e->options.adapters,
                   "Also decode with this many LoRA adapters mixed in each batch, beside the "
                   "base model alone (CUDA: with --cuda-lora)")
      ->capture_default_str();
  engine->add_flag("--cuda-lora", e->options.engine.cuda_lora,
                   "CUDA: take the adapters on the GPU (actors.cuda_lora; written, not yet "
                   "verified on a GPU)");
  engine->add_option("--adapter-rank", e->options.adapter_rank, "Rank of those adapters")
      ->capture_default_str();
  engine->add_flag("--invariant-cost", e->options.invariant_cost,
                   "CUDA: also decode in the batch-invariant mode, beside the fast mode");
  engine->add_flag("--tuned-kernels", e->options.engine.tuned_kernels,
                   "CUDA: decode with the tuned kernels (actors.tuned_kernels)");
  AddInvariantTensorCoreFlags(engine);
  engine->add_flag("--norm-in-gemm", e->options.engine.norm_in_gemm,
                   "CUDA, with --tuned-kernels: RMSNorms fused into the small projections "
                   "(actors.norm_in_gemm)");
  engine->add_flag("--tuned-cost", e->options.tuned_cost,
                   "CUDA: also decode with the tuned kernels flipped, beside the main figure");
  engine
      ->add_option("--profile-step", e->options.profile_step,
                   "CUDA: bracket decode step N of each batch's first run with "
                   "cudaProfilerStart/Stop (for ncu --profile-from-start off; 0: none)")
      ->capture_default_str();
  engine->add_flag("--json", e->json, "Print one JSON object instead of the table");
  registry.Add(engine, [e] { return RunEngineBench(*e); });
}

void RegisterLearnerBench(CLI::App* bench, CommandRegistry& registry, int argc, char** argv) {
  auto l = std::make_shared<LearnerBenchFlags>();
  l->argv.assign(argv, argv + argc);
  CLI::App* learner = bench->add_subcommand(
      "learner",
      "Full learner steps (forward, loss, backward, FSDP collectives, AdamW) per world size "
      "vs the GEMM on the same device, and per-rank memory");
  learner->add_option("--config", l->config, "Preset, model directory or config.json")
      ->capture_default_str();
  learner->add_option("--tokens", l->options.tokens, "Input tokens per step (all ranks)")
      ->capture_default_str();
  learner
      ->add_option("--seq-len", l->options.seq_lens,
                   "Rollout lengths, each measured (32 prompt tokens; a step holds at least one)")
      ->delimiter(',')
      ->capture_default_str();
  learner
      ->add_option("--checkpointing", l->checkpointing,
                   "learner.activation_checkpointing modes, each measured (none, selective, full; "
                   "the first is the others' baseline)")
      ->delimiter(',')
      ->capture_default_str();
  learner
      ->add_option("--context-parallel", l->options.context_parallel,
                   "learner.context_parallel group sizes C, each at world sizes --world-sizes x C "
                   "(a group beside one rank)")
      ->delimiter(',')
      ->capture_default_str();
  learner
      ->add_option("--context-attention", l->context_attention,
                   "learner.context_parallel_attention variants for C > 1, each measured "
                   "(allgather, ulysses; the first is the others' baseline)")
      ->delimiter(',')
      ->capture_default_str();
  learner->add_option("--iters", l->options.iterations, "Timed steps (median reported)")
      ->capture_default_str();
  learner
      ->add_option("--world-sizes", l->options.world_sizes,
                   "Local ranks per measurement (with --context-parallel: data-parallel groups)")
      ->delimiter(',')
      ->capture_default_str();
  learner
      ->add_option("--device", l->device, "cpu (ranks over Gloo) or cuda (rank r on GPU r, NCCL)")
      ->capture_default_str();
  learner->add_option("--dtype", l->dtype, "fp32 | bf16 (CUDA: mixed precision)")
      ->capture_default_str();
  learner
      ->add_option("--adapters", l->adapters,
                   "A run of adapters' learner instead: this many LoRA adapters on one frozen "
                   "base, each rank training its share one after another (--tokens per adapter "
                   "step, the first --seq-len, --iters steps each), every world size beside one "
                   "rank")
      ->capture_default_str();
  learner->add_option("--adapter-rank", l->adapter_rank, "With --adapters: their LoRA rank")
      ->capture_default_str();
  learner
      ->add_option("--threads-per-rank", l->threads_per_rank,
                   "With --adapters: OpenMP threads per rank (0: the cores shared between the "
                   "ranks)")
      ->capture_default_str();
  learner
      ->add_option("--adapter-pass-tokens", l->adapter_pass_tokens,
                   "With --adapters: the joint steps' learner.adapter_pass_tokens")
      ->capture_default_str();
  learner->add_flag("--json", l->json, "Print one JSON object instead of the table");
  registry.Add(learner, [l] { return RunLearnerBench(*l); });
}

void RegisterReplayBench(CLI::App* bench, CommandRegistry& registry) {
  auto r = std::make_shared<bench::ReplayBenchOptions>();
  auto r_json = std::make_shared<bool>(false);
  auto r_mb = std::make_shared<int64_t>(2048);
  CLI::App* replay = bench->add_subcommand(
      "replay",
      "Replay buffer records/s and GB/s (1 KB, 64 KB, 4 MB records; 1 and 4 writer processes; "
      "2 reader processes) vs memcpy");
  replay->add_option("--record-bytes", r->record_bytes, "Record sizes")
      ->delimiter(',')
      ->capture_default_str();
  replay->add_option("--writers", r->writers, "Writer process counts")
      ->delimiter(',')
      ->capture_default_str();
  replay->add_option("--readers", r->readers, "Reader processes")->capture_default_str();
  replay->add_option("--mb-per-run", *r_mb, "Payload moved per measurement (MB)")
      ->capture_default_str();
  replay->add_flag("--json", *r_json, "Print one JSON object instead of the table");
  registry.Add(replay, [r, r_json, r_mb] {
    r->bytes_per_run = *r_mb << 20;
    PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunReplayBench(*r));
    std::printf("%s\n", *r_json ? report.ToJson().c_str() : report.ToTable().c_str());
    return absl::OkStatus();
  });
}

void RegisterTokenizerBench(CLI::App* bench, CommandRegistry& registry) {
  auto tk = std::make_shared<bench::TokenizerBenchOptions>();
  auto tk_json = std::make_shared<bool>(false);
  CLI::App* tok = bench->add_subcommand(
      "tokenizer", "Tokenizer encode MB/s on 1 thread and all cores vs transformers.js (node)");
  tok->add_option("--model", tk->model, "Model directory with tokenizer.json")
      ->capture_default_str();
  tok->add_option("--corpus-bytes", tk->corpus_bytes, "Generated corpus size")
      ->capture_default_str();
  tok->add_option("--iters", tk->iterations, "Timed passes")->capture_default_str();
  tok->add_option("--threads", tk->threads, "Threads for all cores (0: every core)")
      ->capture_default_str();
  tok->add_option("--node", tk->node, "node binary (\"\": no JavaScript baseline)")
      ->capture_default_str();
  tok->add_option("--js-driver", tk->js_driver, "The baseline's driver")->capture_default_str();
  tok->add_option("--js-modules", tk->js_modules, "node_modules with @lenml/tokenizers")
      ->capture_default_str();
  tok->add_flag("--json", *tk_json, "Print one JSON object instead of the table");
  registry.Add(tok, [tk, tk_json] {
    PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunTokenizerBench(*tk));
    std::printf("%s\n", *tk_json ? report.ToJson().c_str() : report.ToTable().c_str());
    return absl::OkStatus();
  });
}

void RegisterCoordinatorBench(CLI::App* bench, CommandRegistry& registry) {
  auto c = std::make_shared<bench::CoordinatorBenchOptions>();
  auto c_json = std::make_shared<bool>(false);
  CLI::App* coord = bench->add_subcommand(
      "coordinator",
      "Durable completions/s and lease latency of a coordinator under concurrent actors "
      "(loopback gRPC), group commit vs an fsync per request");
  coord
      ->add_option("--actors", c->actors,
                   "Actors, each with its own channel and one call outstanding")
      ->capture_default_str();
  coord->add_option("--seconds", c->seconds, "Measured time per mode")->capture_default_str();
  coord->add_option("--samples", c->samples_per_prompt, "Samples per prompt (rewards reported)")
      ->capture_default_str();
  coord
      ->add_option("--unrunnable", c->unrunnable_prompts,
                   "Prompts of a set no actor can run (samples per prompt above every actor's "
                   "capacity), queued ahead of the measured ones")
      ->capture_default_str();
  coord->add_option("--dir", c->dir, "Directory of the prompt logs (default: a temporary one)");
  coord->add_flag("--json", *c_json, "Print one JSON object instead of the table");
  registry.Add(coord, [c, c_json] {
    PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunCoordinatorBench(*c));
    std::printf("%s\n", *c_json ? report.ToJson().c_str() : report.ToTable().c_str());
    return absl::OkStatus();
  });
}

void RegisterEnvShareBench(CLI::App* bench, CommandRegistry& registry) {
  auto o = std::make_shared<bench::EnvShareBenchOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = bench->add_subcommand(
      "env-share",
      "A healthy environment's prompt set beside one whose environment hangs, against it alone "
      "(one actor, loopback gRPC): what the fair share of the actor leaves it");
  cmd->add_option("--prompts", o->prompts, "Prompts of the healthy set")->capture_default_str();
  cmd->add_option("--samples", o->samples_per_prompt, "Samples per prompt")->capture_default_str();
  cmd->add_option("--slots", o->max_prompts_in_flight, "The actor's max_prompts_in_flight")
      ->capture_default_str();
  cmd->add_option("--max-turns", o->max_turns, "Turns per episode")->capture_default_str();
  cmd->add_flag("--json", *json, "Print one JSON object instead of the table");
  registry.Add(cmd, [o, json] {
    PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunEnvShareBench(*o));
    std::printf("%s\n", *json ? report.ToJson().c_str() : report.ToTable().c_str());
    return absl::OkStatus();
  });
}

}  // namespace

void RegisterBenchCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (each beside a same-run baseline)");
  bench->require_subcommand(1);
  RegisterModelBench(bench, registry);
  RegisterEngineBench(bench, registry);
  RegisterLearnerBench(bench, registry, argc, argv);
  RegisterReplayBench(bench, registry);
  RegisterTokenizerBench(bench, registry);
  RegisterCoordinatorBench(bench, registry);
  RegisterBroadcastBench(bench, registry);
  RegisterEnvShareBench(bench, registry);
}

}  // namespace prl::cli
