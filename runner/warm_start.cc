#include "runner/warm_start.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_model_dir.h"
#include "core/child_process.h"
#include "core/status_macros.h"
#include "model/presets.h"
#include "nlohmann/json.hpp"
#include "runner/demonstrations.h"
#include "runner/role_specs.h"
#include "runner/task_source.h"
#include "task/char_tokenizer.h"

namespace prl::runner {

namespace fs = std::filesystem;

std::string RlStartModel(const config::RunConfig& c) {
  const std::string dir = c.run_dir();
  if (fs::exists(dir + "/model-sft/config.json")) return dir + "/model-sft";
  return c.model.path.empty() ? dir + "/model-init" : c.model.path;
}

absl::StatusOr<std::string> PrepareStartModel(const config::RunConfig& c, bool resume) {
  if (!c.model.path.empty()) {
    std::printf("model: %s\n", c.model.path.c_str());
    return c.model.path;
  }
  if (c.task.name == config::TaskName::kPrompts) {
    return absl::InvalidArgumentError(
        "model.path: task.name = prompts needs a model directory with tokenizer files (prl model "
        "init --tokenizer DIR creates one with random weights)");
  }
  const std::string path = c.run_dir() + "/model-init";
  if (resume && fs::exists(path + "/config.json")) return path;
  PRL_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(c.model.preset));
  config.vocab_size = task::CharTokenizer().vocab_size();
  config.max_position_embeddings = c.model.max_position_embeddings;
  PRL_ASSIGN_OR_RETURN(ParameterSet params, ParameterSet::Allocate(config, Device::Cpu(), false));
  InitializeParameters(params, c.model.init_seed, 0.02f);
  PRL_RETURN_IF_ERROR(SaveModel(path, params));
  std::printf("model: created %s (preset %s, %lld parameters, character vocabulary of %lld)\n",
              path.c_str(), c.model.preset.c_str(), static_cast<long long>(ParameterCount(config)),
              static_cast<long long>(config.vocab_size));
  return path;
}

namespace {

// `n` warm-start examples of one task: completion = the reference, or with a built-in
// environment its demonstrations (runner/demonstrations.h).
absl::StatusOr<std::vector<SftExample>> TaskExamples(const SftTask& t, int64_t n,
                                                     int64_t vocab_size,
                                                     int64_t max_sequence_tokens) {
  const config::RunConfig& c = *t.config;
  PRL_ASSIGN_OR_RETURN(const std::vector<prl::v1::Prompt> prompts, t.task->SftPrompts(n));
  const prl::v1::EnvironmentSpec environment = EnvironmentOf(c);
  return HasDemonstrations(environment, c.task.name)
             ? Demonstrations(environment, c.task.name, t.task->text(), prompts, vocab_size,
                              c.sft.env_demo_fraction, max_sequence_tokens)
             : SftExamples(*t.task, prompts, vocab_size);
}

// The tasks' warm-start examples as supervised rollout lines, an equal share of each,
// interleaved (so that every step of the warm-start sees every task).
absl::Status WriteSftExamples(const config::RunConfig& c, const std::vector<SftTask>& tasks,
                              int64_t vocab_size, int64_t max_sequence_tokens,
                              const std::string& path) {
  const int64_t n = std::min<int64_t>(c.sft.steps * c.sft.examples_per_step, 50'000);
  const int64_t k = static_cast<int64_t>(tasks.size());
  std::vector<std::vector<SftExample>> each;
  for (int64_t i = 0; i < k; ++i) {
    PRL_ASSIGN_OR_RETURN(each.emplace_back(), TaskExamples(tasks[i], n / k + (i < n % k ? 1 : 0),
                                                           vocab_size, max_sequence_tokens));
  }
  std::vector<SftExample> examples;
  for (size_t row = 0; examples.size() < static_cast<size_t>(n); ++row) {
    const size_t before = examples.size();
    for (const std::vector<SftExample>& e : each) {
      if (row < e.size()) examples.push_back(e[row]);
    }
    if (examples.size() == before) break;
  }
  std::ofstream f(path);
  for (const SftExample& e : examples) {
    nlohmann::ordered_json line;
    line["prompt"] = e.prompt;
    line["completion"] = e.completion;
    if (!e.sources.empty()) line["sources"] = e.sources;
    line["behaviour_logprobs"] = std::vector<float>(e.completion.size(), 0.0f);
    line["advantage"] = 1.0;
    f << line.dump() << "\n";
  }
  if (!f) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

std::vector<std::string> SftArgv(const config::RunConfig& c, const std::string& prl_path,
                                 const std::string& start_model, const std::string& out) {
  const std::string dir = c.run_dir();
  return {prl_path,
          "learner",
          "train",
          "--model",
          start_model,
          "--rollouts",
          dir + "/sft.jsonl",
          "--loss",
          "sft",
          "--steps",
          absl::StrCat(c.sft.steps),
          "--samples-per-step",
          absl::StrCat(c.sft.examples_per_step),
          "--lr",
          absl::StrCat(c.sft.lr),
          "--checkpoint-dir",
          dir + "/sft-checkpoints",
          "--checkpoint-every",
          absl::StrCat(c.sft.steps),
          "--keep-checkpoints",
          "1",
          "--out",
          out};
}

}  // namespace

absl::StatusOr<WarmStartResult> WarmStart(const config::RunConfig& c,
                                          const std::vector<SftTask>& tasks,
                                          const std::string& start_model,
                                          const std::string& prl_path, bool resume,
                                          const std::atomic<bool>* interrupted) {
  const std::string dir = c.run_dir(), out = dir + "/model-sft";
  if (c.sft.steps == 0) return WarmStartResult{start_model, 0};
  if (resume && fs::exists(out + "/config.json")) {
    std::printf("warm-start: reusing %s\n", out.c_str());
    return WarmStartResult{out, 0};
  }
  const absl::Time start = absl::Now();
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(start_model));
  PRL_RETURN_IF_ERROR(WriteSftExamples(c, tasks, model.vocab_size, model.max_position_embeddings,
                                       dir + "/sft.jsonl"));
  std::printf("warm-start: %lld supervised steps of %lld examples (lr %g)%s\n",
              static_cast<long long>(c.sft.steps), static_cast<long long>(c.sft.examples_per_step),
              c.sft.lr, tasks.size() > 1 ? ", every tenant's task alike" : "");
  std::fflush(stdout);
  const std::string log = dir + "/logs/sft.log";
  PRL_ASSIGN_OR_RETURN(ChildProcess sft,
                       ChildProcess::Start({"sft", SftArgv(c, prl_path, start_model, out), log,
                                            ThreadEnv(Cores())}));
  while (sft.running()) {
    if (interrupted != nullptr && *interrupted) {
      return absl::CancelledError("interrupted during the warm-start");
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  const int status = *sft.Poll();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("warm-start (prl learner train) ",
                                            DescribeWaitStatus(status), "; ", log, ":\n",
                                            TailOfFile(log)));
  }
  WarmStartResult result{out, absl::ToDoubleSeconds(absl::Now() - start)};
  std::printf("warm-start: done in %.1f s -> %s\n", result.seconds, out.c_str());
  return result;
}

}  // namespace prl::runner
