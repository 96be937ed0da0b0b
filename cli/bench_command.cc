// `prl bench ...`: benchmarks that print their figure beside a baseline from the same run.
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench/model_bench.h"
#include "checkpoint/hf_model_dir.h"
#include "cli/command.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "model/presets.h"

namespace prl::cli {

namespace {

struct ModelBenchFlags {
  std::string config = "40m";
  bench::ModelBenchOptions options;
  std::string device = "auto";
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
  PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunModelBench(config, f.options));
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

}  // namespace

void RegisterBenchCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (each beside a same-run baseline)");
  bench->require_subcommand(1);

  auto f = std::make_shared<ModelBenchFlags>();
  CLI::App* model = bench->add_subcommand(
      "model", "Transformer forward and forward+backward throughput vs OpenBLAS SGEMM");
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
  model->add_flag("--json", f->json, "Print one JSON object instead of the table");
  registry.Add(model, [f] { return RunModelBench(*f); });
}

}  // namespace prl::cli
