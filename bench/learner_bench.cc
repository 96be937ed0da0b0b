#include "bench/learner_bench.h"

#include <cblas.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <tuple>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "bench/stats.h"
#include "collective/rendezvous.h"
#include "config/run_config.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "learner/fsdp.h"
#include "learner/local_launcher.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "model/flops.h"
#include "nlohmann/json.hpp"
#include "roles/learner_rank.h"

namespace prl::bench {

namespace {

constexpr char kOutEnv[] = "PRL_BENCH_LEARNER_OUT";
// The measurement a rank runs:
// "<rollout length>:<checkpointing mode>:<context parallel>:<context attention>".
constexpr char kCaseEnv[] = "PRL_BENCH_LEARNER_CASE";
constexpr int64_t kPromptTokens = 32;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One measurement: rollouts of seq_len, under a checkpointing mode.
struct Case {
  int64_t seq_len = 0;
  ActivationCheckpointing mode = ActivationCheckpointing::kNone;
  int context_parallel = 1;
  ContextAttention attention = ContextAttention::kAllGather;
  // Input tokens per step: the options' tokens, at least one rollout.
  int64_t Tokens(const LearnerBenchOptions& o) const { return std::max(o.tokens, seq_len); }
};

// Sequence lengths (input tokens) of one step's rollouts.
std::vector<int64_t> SequenceLengths(const LearnerBenchOptions& o, const Case& c) {
  std::vector<int64_t> lens;
  const int64_t tokens = c.Tokens(o);
  for (int64_t start = 0; start < tokens; start += c.seq_len) {
    lens.push_back(std::min(c.seq_len, tokens - start));
  }
  return lens;
}

absl::StatusOr<Case> CaseOfThisRank() {
  const char* text = getenv(kCaseEnv);
  const std::vector<std::string> parts = absl::StrSplit(text == nullptr ? "" : text, ':');
  Case c;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &c.seq_len) ||
      !absl::SimpleAtoi(parts[2], &c.context_parallel)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kCaseEnv, ": expected <length>:<mode>:<context parallel>:<context attention>"));
  }
  PRL_ASSIGN_OR_RETURN(c.mode, ParseEnum(kActivationCheckpointingNames, parts[1],
                                         "learner.activation_checkpointing"));
  PRL_ASSIGN_OR_RETURN(c.attention, ParseEnum(kContextAttentionNames, parts[3],
                                              "learner.context_parallel_attention"));
  return c;
}

std::vector<learner::TrainSample> RandomSamples(const ModelConfig& config,
                                                const LearnerBenchOptions& o, const Case& c) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::uniform_real_distribution<float> logprob(-4.0f, -0.01f), adv(-1.0f, 1.0f);
  std::vector<learner::TrainSample> samples;
  for (int64_t len : SequenceLengths(o, c)) {
    learner::TrainSample s;
    const int64_t prompt = std::min(kPromptTokens, len);  // input tokens = prompt + completion - 1
    s.prompt.resize(prompt);
    s.completion.resize(len + 1 - prompt);
    for (auto& t : s.prompt) t = token(rng);
    for (auto& t : s.completion) t = token(rng);
    for (size_t i = 0; i < s.completion.size(); ++i) s.behaviour_logprobs.push_back(logprob(rng));
    s.has_advantage = true;
    s.advantage = adv(rng);
    samples.push_back(std::move(s));
  }
  return samples;
}

double SgemmGflops(const ModelConfig& config, int64_t tokens) {
  const int64_t M = tokens, N = 2 * config.intermediate_size, K = config.hidden_size;
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  std::vector<double> runs;
  for (int r = 0; r < 4; ++r) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K,
                0.0f, c.data(), N);
    if (r > 0) runs.push_back(2.0 * M * N * K / Seconds(start) / 1e9);  // first: warm-up
  }
  return Median(runs);
}

// cuBLASLt on the MLP shape in `dtype` on `device` (best of 5 after a warm-up).
absl::StatusOr<double> GpuGemmGflops(const ModelConfig& config, int64_t tokens, Device device,
                                     DType dtype) {
  const int64_t M = tokens, N = 2 * config.intermediate_size, K = config.hidden_size;
  OwnedTensor a32, b32, a, b, c;
  PRL_ASSIGN_OR_RETURN(a32, AllocateTensor(DType::kF32, device, {M, K}));
  PRL_ASSIGN_OR_RETURN(b32, AllocateTensor(DType::kF32, device, {N, K}));
  PRL_RETURN_IF_ERROR(cuda::FillF32(device.index, a32.view.f32(), M * K, 0.5f));
  PRL_RETURN_IF_ERROR(cuda::FillF32(device.index, b32.view.f32(), N * K, 0.25f));
  PRL_ASSIGN_OR_RETURN(a, AllocateTensor(dtype, device, {M, K}));
  PRL_ASSIGN_OR_RETURN(b, AllocateTensor(dtype, device, {N, K}));
  PRL_ASSIGN_OR_RETURN(c, AllocateTensor(dtype, device, {M, N}));
  kernels::ConvertDType(a.view, a32.view);
  kernels::ConvertDType(b.view, b32.view);
  double best = 0;
  for (int r = 0; r < 6; ++r) {
    PRL_RETURN_IF_ERROR(cuda::Synchronize(device.index));
    const auto start = std::chrono::steady_clock::now();
    kernels::MatmulForward(c.view, a.view, b.view);
    PRL_RETURN_IF_ERROR(cuda::Synchronize(device.index));
    if (r > 0) best = std::max(best, 2.0 * M * N * K / Seconds(start) / 1e9);
  }
  return best;
}

}  // namespace

absl::Status RunLearnerBenchRank(const ModelConfig& config, const LearnerBenchOptions& o) {
  const char* out_path = getenv(kOutEnv);
  absl::StatusOr<collective::RendezvousConfig> rendezvous = learner::RendezvousForThisRank();
  if (out_path == nullptr || !rendezvous.ok()) {
    return absl::NotFoundError("not a bench learner rank");
  }
  PRL_ASSIGN_OR_RETURN(const Case c, CaseOfThisRank());
  config::LearnerSection section;
  section.world_size = rendezvous->world_size;
  section.device = o.device;
  section.dtype = o.dtype;
  section.lr = 1e-6;
  section.micro_batch_tokens = c.Tokens(o);  // one micro-batch per rank
  section.activation_checkpointing = c.mode;
  section.context_parallel = c.context_parallel;
  section.context_parallel_attention = c.attention;
  PRL_ASSIGN_OR_RETURN(ParameterSet init, ParameterSet::Allocate(config, Device::Cpu(), false));
  InitializeParameters(init, /*seed=*/1);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<roles::LearnerRank> rank,
                       roles::CreateLearnerRank(section, {}, init, *rendezvous));
  const std::vector<learner::TrainSample> samples = RandomSamples(config, o, c);
  std::vector<double> seconds;
  int64_t peak_activation_bytes = 0;
  for (int i = 0; i <= o.iterations; ++i) {
    PRL_ASSIGN_OR_RETURN(
        const learner::StepResult r,
        learner::TrainStep(*rank->model, *rank->optimizer, samples, rank->step, 0));
    if (i > 0) seconds.push_back(r.stats.seconds);  // the first step warms up
    peak_activation_bytes = std::max(peak_activation_bytes, r.stats.peak_activation_bytes);
    if (o.progress && rank->rank0()) {
      std::fprintf(stderr,
                   "bench learner: length %lld, %s, context parallel %d, world size %d, step "
                   "%d/%d: %.3f s%s\n",
                   static_cast<long long>(c.seq_len),
                   std::string(EnumName(kActivationCheckpointingNames, c.mode)).c_str(),
                   c.context_parallel, section.world_size, i, o.iterations, r.stats.seconds,
                   i == 0 ? " (warm-up)" : "");
    }
  }
  if (rank->rank0()) {
    const learner::FsdpMemory m = rank->model->memory();
    nlohmann::json j;
    j["step_seconds"] = Median(seconds);
    j["param_bytes"] = m.param_shard_bytes;
    j["grad_bytes"] = m.grad_shard_bytes;
    j["optimizer_bytes"] = rank->optimizer->state_bytes();
    j["unit_buffer_bytes"] = m.unit_buffer_bytes;
    j["compute_copy_bytes"] = m.compute_copy_bytes;
    j["peak_activation_bytes"] = peak_activation_bytes;
    if (rank->device.is_cuda()) {
      PRL_ASSIGN_OR_RETURN(j["gemm_gflops"],
                           GpuGemmGflops(config, o.tokens, rank->device, o.dtype));
    }
    std::ofstream(out_path) << j.dump();
  }
  return rank->comm->Barrier();
}

absl::StatusOr<Report> RunLearnerBench(const ModelConfig& config, const LearnerBenchOptions& o,
                                       const std::vector<std::string>& argv) {
  if (o.tokens <= 0 || o.seq_lens.empty() || o.iterations <= 0 || o.world_sizes.empty() ||
      o.checkpointing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench learner: expected --tokens > 0, at least one --seq-len, --iters > 0, "
                     "at least one world size and one checkpointing mode"));
  }
  for (const int64_t len : o.seq_lens) {
    if (len <= kPromptTokens || len > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bench learner: --seq-len ", len, ": expected more than ", kPromptTokens,
          " (the prompt) and at most max_position_embeddings ", config.max_position_embeddings));
    }
  }
  const int64_t full_state = ParameterCount(config) * 16;  // fp32 params, grads, Adam m and v
  // Several lengths or modes: each figure's name says its case.
  const bool sweep = o.seq_lens.size() > 1 || o.checkpointing.size() > 1 ||
                     o.checkpointing[0] != ActivationCheckpointing::kNone;
  const bool context_sweep = o.context_parallel.size() > 1 || o.context_parallel[0] != 1;
  const bool attention_sweep = o.context_attention.size() > 1;
  if (o.context_attention.empty()) {
    return absl::InvalidArgumentError("bench learner: expected at least one --context-attention");
  }
  for (const int context : o.context_parallel) {
    if (context < 1 || context > 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bench learner: --context-parallel ", context, ": expected a group size of 1 to 64"));
    }
  }

  char path[] = "/tmp/prl-bench-learner-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("bench learner: cannot create a result file in /tmp");
  close(fd);
  setenv(kOutEnv, path, 1);

  Report report;
  report.bench = "learner";
  report.machine = MachineInfo();
  std::string modes;
  for (const ActivationCheckpointing m : o.checkpointing) {
    absl::StrAppend(&modes, modes.empty() ? "" : ", ", EnumName(kActivationCheckpointingNames, m));
  }
  report.setup = {
      {"model",
       absl::StrFormat("%s hidden=%d layers=%d heads=%d kv_heads=%d intermediate=%d "
                       "vocab=%d tied=%d (%d parameters)",
                       ArchitectureName(config.arch), config.hidden_size, config.num_hidden_layers,
                       config.num_attention_heads, config.num_key_value_heads,
                       config.intermediate_size, config.vocab_size, config.tie_word_embeddings,
                       ParameterCount(config))},
      {"step", absl::StrFormat("max(%d, the rollout length) input tokens in rollouts of %s "
                               "(%d prompt), reinforce_tis, AdamW, FSDP over %s on %s, %s",
                               o.tokens, absl::StrJoin(o.seq_lens, ", "), kPromptTokens,
                               o.device == DeviceType::kCpu ? "Gloo" : "NCCL",
                               EnumName(kDeviceTypeNames, o.device),
                               o.dtype == DType::kBF16 ? "bf16 mixed precision" : "fp32")},
      {"activation_checkpointing",
       absl::StrCat(modes, sweep && o.checkpointing.size() > 1
                               ? absl::StrCat(" (each beside ",
                                              EnumName(kActivationCheckpointingNames,
                                                       o.checkpointing[0]),
                                              " of the same length and world size)")
                               : "")},
      {"context_parallel",
       absl::StrCat(absl::StrJoin(o.context_parallel, ", "),
                    " (world size = each --world-sizes entry x the group size; a group beside "
                    "one rank, context parallel 1 at world size 1, of the same length and mode)")},
      {"context_attention",
       absl::StrCat(absl::StrJoin(o.context_attention, ", ",
                                  [](std::string* out, ContextAttention a) {
                                    absl::StrAppend(out, EnumName(kContextAttentionNames, a));
                                  }),
                    attention_sweep ? " (each beside the first of the same group size, world "
                                      "size, length and mode)"
                                    : "")},
      {"iterations", absl::StrCat(o.iterations, " timed steps after one warm-up (median)")},
      {"baseline",
       o.device == DeviceType::kCpu
           ? "SGEMM on the MLP shape (tokens x hidden times hidden x 2 intermediate), "
             "best of the runs just before and just after each world size"
           : "cuBLASLt GEMM in the compute dtype on the MLP shape (tokens x hidden times "
             "hidden x 2 intermediate) on rank 0's GPU, best of 5, after the steps"}};
  for (const int64_t len : o.seq_lens) {
    // Per (context parallel, world size), the first mode's tokens/s and peak workspace: the
    // other modes' baseline; per mode, one rank's (C = 1, world size 1): the groups' baseline.
    std::map<std::pair<int, int>, std::pair<double, double>> first;
    std::map<ActivationCheckpointing, std::pair<double, double>> one_rank;
    // Per (mode, context parallel, world size), the first attention variant's: the others'.
    std::map<std::tuple<ActivationCheckpointing, int, int>, std::pair<double, double>>
        by_attention;
    for (const ActivationCheckpointing mode : o.checkpointing) {
      for (const int context : o.context_parallel) {
        for (const ContextAttention attention : o.context_attention) {
          if (context == 1 && attention != o.context_attention[0]) continue;  // nothing to cross
          const Case c{len, mode, context, attention};
          const std::string mode_name(EnumName(kActivationCheckpointingNames, mode));
          const std::string attention_name(EnumName(kContextAttentionNames, attention));
          setenv(kCaseEnv,
                 absl::StrCat(len, ":", mode_name, ":", context, ":", attention_name).c_str(), 1);
          const std::vector<int64_t> lens = SequenceLengths(o, c);
          const int64_t tokens = c.Tokens(o);
          // Every position but the prompt's first kPromptTokens - 1 is scored.
          int64_t head_rows = 0;
          for (int64_t l : lens) head_rows += l - std::min(kPromptTokens, l) + 1;
          const double step_flops = TrainingFlops(config, lens, head_rows);
          for (const int data_parallel : o.world_sizes) {
            const int world = data_parallel * context;  // D x C ranks
            const double before = SgemmGflops(config, tokens);
            learner::LaunchOptions launch;
            launch.world_size = world;
            const absl::Status ran = learner::RunLocalRanks(argv, launch);
            double sgemm = std::max(before, SgemmGflops(config, tokens));
            if (!ran.ok()) {
              unlink(path);
              return ran;
            }
            std::ifstream in(path);
            std::stringstream text;
            text << in.rdbuf();
            nlohmann::json j;
            try {
              j = nlohmann::json::parse(text.str());
            } catch (const nlohmann::json::exception& e) {
              unlink(path);
              return absl::InternalError(
                  absl::StrCat("bench learner: rank 0 wrote no result: ", e.what()));
            }
            const double s = j["step_seconds"].get<double>();
            if (j.contains("gemm_gflops")) sgemm = j["gemm_gflops"].get<double>();  // the GPU's
            const int64_t state = j["param_bytes"].get<int64_t>() + j["grad_bytes"].get<int64_t>() +
                                  j["optimizer_bytes"].get<int64_t>();
            const double peak_mb = j["peak_activation_bytes"].get<int64_t>() / 1e6;
            const double tokens_per_s = tokens / s;
            const std::string w = absl::StrCat(
                sweep ? absl::StrCat("s", len, "_", mode_name, "_") : "",
                context_sweep ? absl::StrCat("c", context, "_") : "",
                attention_sweep && context > 1 ? attention_name + "_" : "", "w", world);
            const bool gpu = j.contains("gemm_gflops");
            const bool first_attention = attention == o.context_attention[0];
            const bool is_first = mode == o.checkpointing[0] && first_attention;
            if (is_first) first[{context, world}] = {tokens_per_s, peak_mb};
            if (first_attention) by_attention[{mode, context, world}] = {tokens_per_s, peak_mb};
            if (context == 1 && world == 1) one_rank[mode] = {tokens_per_s, peak_mb};
            const std::string first_name(
                EnumName(kActivationCheckpointingNames, o.checkpointing[0]));
            // Baselines: one rank holding everything for a group; else the first mode's figures.
            const bool vs_one_rank = context > 1 && one_rank.count(mode) > 0;
            std::string speed_base = gpu ? "at_gemm_speed" : "at_sgemm_speed";
            double speed_value = sgemm * 1e9 / (step_flops / tokens);
            std::string memory_base;
            double memory_value = 0.0;
            if (!first_attention) {  // beside the first variant of the same case
              const std::string base(EnumName(kContextAttentionNames, o.context_attention[0]));
              speed_base = base + "_tokens_per_s";
              speed_value = by_attention[{mode, context, world}].first;
              memory_base = base + "_peak_activation_mb";
              memory_value = by_attention[{mode, context, world}].second;
            } else if (vs_one_rank) {
              speed_base = "one_rank_tokens_per_s";
              speed_value = one_rank[mode].first;
              memory_base = "one_rank_peak_activation_mb";
              memory_value = one_rank[mode].second;
            } else if (!is_first) {
              speed_base = first_name + "_tokens_per_s";
              speed_value = first[{context, world}].first;
              memory_base = first_name + "_peak_activation_mb";
              memory_value = first[{context, world}].second;
            }
            report.results.push_back(
                {w + "_tokens_per_s", tokens_per_s, "tok/s", speed_base, speed_value});
            report.results.push_back({w + "_gflops", step_flops / s / 1e9, "GFLOP/s",
                                      gpu ? "cublaslt_gemm" : "sgemm", sgemm});
            report.results.push_back(
                {w + "_peak_activation_mb_per_rank", peak_mb, "MB", memory_base, memory_value});
            report.results.push_back({w + "_state_mb_per_rank", state / 1e6, "MB",
                                      "unsharded_state_mb", full_state / 1e6});
            report.results.push_back({w + "_unit_buffers_mb_per_rank",
                                      j["unit_buffer_bytes"].get<int64_t>() / 1e6, "MB", "", 0.0});
          }
        }
      }
    }
  }
  unlink(path);
  return report;
}

}  // namespace prl::bench
