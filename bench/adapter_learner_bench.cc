#include "bench/adapter_learner_bench.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "learner/joint_step.h"
#include "learner/local_launcher.h"
#include "learner/train_step.h"
#include "model/parameters.h"
#include "nlohmann/json.hpp"
#include "roles/learner_rank.h"

namespace prl::bench {

namespace {

// Where each rank writes its figures: "<this>.<rank>".
constexpr char kOutEnv[] = "PRL_BENCH_ADAPTERS_OUT";
constexpr int64_t kPromptTokens = 32;

// One step's rollouts: `tokens` input tokens in rollouts of seq_len, random tokens, log-probs
// and advantages (the same for every adapter: only the adapters differ).
std::vector<learner::TrainSample> Rollouts(const ModelConfig& config,
                                           const AdapterLearnerBenchOptions& o) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::uniform_real_distribution<float> logprob(-4.0f, -0.01f), advantage(-1.0f, 1.0f);
  std::vector<learner::TrainSample> out;
  for (int64_t start = 0; start < o.tokens; start += o.seq_len) {
    const int64_t len = std::min(o.seq_len, o.tokens - start);
    learner::TrainSample& s = out.emplace_back();
    const int64_t prompt = std::min(kPromptTokens, len);
    s.prompt.resize(prompt);
    s.completion.resize(len + 1 - prompt);
    for (int32_t& t : s.prompt) t = token(rng);
    for (int32_t& t : s.completion) t = token(rng);
    s.behaviour_logprobs.resize(s.completion.size());
    for (float& l : s.behaviour_logprobs) l = logprob(rng);
    s.has_advantage = true;
    s.advantage = advantage(rng);
  }
  return out;
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::Status RunAdapterLearnerBenchRank(const ModelConfig& config,
                                        const AdapterLearnerBenchOptions& o) {
  const char* out_path = getenv(kOutEnv);
  absl::StatusOr<collective::RendezvousConfig> rendezvous = learner::RendezvousForThisRank();
  if (out_path == nullptr || !rendezvous.ok()) {
    return absl::NotFoundError("not a bench adapters rank");
  }
  config::LearnerSection section;
  section.world_size = rendezvous->world_size;
  section.lr = 1e-4;
  section.lora_rank = o.adapter_rank;
  section.lora_alpha = 2 * o.adapter_rank;
  section.lora_targets = "all-linear";
  section.micro_batch_tokens = o.tokens;
  PRL_ASSIGN_OR_RETURN(ParameterSet base, ParameterSet::Allocate(config, Device::Cpu(), false));
  InitializeParameters(base, /*seed=*/1);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<roles::LearnerRank> rank,
                       roles::CreateLearnerRank(section, {}, base, *rendezvous));
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<collective::Communicator> alone,
                       roles::ConnectRankAlone(*rendezvous, "bench-adapters", absl::Minutes(5)));
  PRL_ASSIGN_OR_RETURN(const std::optional<LoraConfig> lora, roles::AdapterSettings(section));
  // Adapter i on rank i mod the world size: the coordinator's least-loaded placement of
  // adapters made one after another.
  // The rank's adapters take turns: one activations' workspace (as the learner's trainers).
  auto workspace = std::make_shared<Arena>(rank->device);
  std::vector<roles::AdapterModel> adapters;
  for (int i = rank->rank(); i < o.adapters; i += rank->comm->world_size()) {
    PRL_ASSIGN_OR_RETURN(adapters.emplace_back(),
                         roles::CreateAdapterModel(section, *rank, config, *lora, /*seed=*/i + 1,
                                                   section.lr, alone.get(), workspace));
  }
  const std::vector<learner::TrainSample> rollouts = Rollouts(config, o);
  for (roles::AdapterModel& a : adapters) {  // warm-up: one step each
    PRL_RETURN_IF_ERROR(
        learner::TrainStep(*a.model, *a.optimizer, rollouts, rank->step, 0).status());
  }
  // The same steps, each round of them one joint step (the learner role on the CPU).
  std::vector<learner::AdapterStep> steps;
  for (roles::AdapterModel& a : adapters) {
    steps.push_back({a.model.get(), a.optimizer.get(), rollouts, &rank->step, 0});
  }
  PRL_RETURN_IF_ERROR(learner::TrainJointStep(steps, o.pass_tokens).status());  // warm-up
  // Each iteration times one round of steps one after another, then the same round as one joint
  // step: the two alternate, so that a drift of the machine's speed reaches both alike. The ranks
  // start each phase together.
  double seconds = 0, joint_seconds = 0;
  int64_t tokens = 0;
  for (int step = 0; step < o.steps; ++step) {
    PRL_RETURN_IF_ERROR(rank->comm->Barrier());
    auto start = std::chrono::steady_clock::now();
    for (roles::AdapterModel& a : adapters) {  // the trainers' turns
      PRL_RETURN_IF_ERROR(
          learner::TrainStep(*a.model, *a.optimizer, rollouts, rank->step, 0).status());
      tokens += o.tokens;
    }
    seconds += Since(start);
    PRL_RETURN_IF_ERROR(rank->comm->Barrier());
    start = std::chrono::steady_clock::now();
    PRL_RETURN_IF_ERROR(learner::TrainJointStep(steps, o.pass_tokens).status());
    joint_seconds += Since(start);
    if (o.progress && rank->rank0()) {
      std::fprintf(stderr,
                   "bench learner --adapters: world size %d, step %d/%d: %.2f s in turns, %.2f s "
                   "joint\n",
                   rank->comm->world_size(), step + 1, o.steps, seconds, joint_seconds);
    }
  }
  nlohmann::json j;
  j["seconds"] = seconds;
  j["joint_seconds"] = joint_seconds;
  j["tokens"] = tokens;
  j["adapters"] = adapters.size();
  j["pss_bytes"] = ProcessPssBytes();  // the node's base file split between the ranks
  std::ofstream(absl::StrCat(out_path, ".", rank->rank())) << j.dump();
  return rank->comm->Barrier();
}

absl::StatusOr<Report> RunAdapterLearnerBench(const ModelConfig& config,
                                              const AdapterLearnerBenchOptions& o,
                                              const std::vector<std::string>& argv) {
  if (o.adapters < 1 || o.steps < 1 || o.tokens < 1 || o.seq_len <= kPromptTokens ||
      o.world_sizes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench learner --adapters: expected --adapters >= 1, --iters >= 1, --tokens >= 1, "
        "--seq-len > ", kPromptTokens, " and at least one world size"));
  }
  for (const int w : o.world_sizes) {
    if (w < 1 || w > o.adapters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bench learner --adapters: world size ", w, ": expected 1 to --adapters (", o.adapters,
          "; every rank trains at least one adapter)"));
    }
  }
  char path[] = "/tmp/prl-bench-adapters-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("bench learner --adapters: cannot create /tmp files");
  close(fd);
  setenv(kOutEnv, path, 1);
  Report report;
  report.bench = "learner --adapters";
  report.machine = MachineInfo();
  report.setup = {
      {"model", absl::StrFormat("hidden=%d layers=%d heads=%d kv_heads=%d intermediate=%d "
                                "vocab=%d (%d parameters), frozen, one base file per node",
                                config.hidden_size, config.num_hidden_layers,
                                config.num_attention_heads, config.num_key_value_heads,
                                config.intermediate_size, config.vocab_size,
                                ParameterCount(config))},
      {"adapters", absl::StrFormat("%d LoRA adapters, rank %d, alpha %d, all-linear; adapter i "
                                   "on rank i mod world size, each over a world of one",
                                   o.adapters, o.adapter_rank, 2 * o.adapter_rank)},
      {"step", absl::StrFormat("%d input tokens per adapter step in rollouts of %d (%d prompt), "
                               "reinforce_tis, AdamW; %d timed steps per adapter after one "
                               "warm-up, the ranks' adapters one after another",
                               o.tokens, o.seq_len, kPromptTokens, o.steps)},
      {"joint", absl::StrFormat("the same steps again, each round of them one joint step "
                                "(learner.adapter_pass_tokens %d: every adapter of a rank in one "
                                "set of passes over the base); baseline: the steps one after "
                                "another at the same world size, measured in the same run",
                                o.pass_tokens)},
      {"threads", o.threads_per_rank > 0
                      ? absl::StrCat(o.threads_per_rank, " per rank (a rank added brings its own)")
                      : "each world size shares the machine's cores (threads per rank: cores / "
                        "world size)"},
      {"memory", "the ranks' summed proportional set sizes at the end (the node's one base file "
                 "counted once)"},
      {"baseline", "world size 1: one rank training every adapter, measured in the same run"}};
  double one_rank = 0, one_rank_mb = 0;
  for (const int world : o.world_sizes) {
    learner::LaunchOptions launch;
    launch.world_size = world;
    launch.threads_per_rank = o.threads_per_rank;
    PRL_RETURN_IF_ERROR(learner::RunLocalRanks(argv, launch));
    double seconds = 0, joint_seconds = 0;
    int64_t tokens = 0, pss = 0;
    for (int r = 0; r < world; ++r) {
      const std::string file = absl::StrCat(path, ".", r);
      std::ifstream in(file);
      std::stringstream text;
      text << in.rdbuf();
      unlink(file.c_str());
      const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
      if (j.is_discarded() || !j.contains("seconds")) {
        unlink(path);
        return absl::InternalError(absl::StrCat("bench learner --adapters: rank ", r,
                                                " of world size ", world, " wrote no result"));
      }
      seconds = std::max(seconds, j["seconds"].get<double>());
      joint_seconds = std::max(joint_seconds, j["joint_seconds"].get<double>());
      tokens += j["tokens"].get<int64_t>();
      pss += j["pss_bytes"].get<int64_t>();
    }
    const double tokens_per_s = tokens / seconds;
    if (world == 1) {
      one_rank = tokens_per_s;
      one_rank_mb = pss / 1e6;
    }
    report.results.push_back({absl::StrCat("w", world, "_adapter_tokens_per_s"), tokens_per_s,
                              "tok/s", one_rank > 0 ? "w1_adapter_tokens_per_s" : "",
                              one_rank});
    report.results.push_back({absl::StrCat("w", world, "_joint_adapter_tokens_per_s"),
                              tokens / joint_seconds, "tok/s",
                              absl::StrCat("w", world, "_adapter_tokens_per_s"), tokens_per_s});
    report.results.push_back({absl::StrCat("w", world, "_ranks_memory_mb"), pss / 1e6, "MB",
                              one_rank_mb > 0 ? "w1_ranks_memory_mb" : "", one_rank_mb});
  }
  unlink(path);
  return report;
}

}  // namespace prl::bench
