// `prl adapter init`: a new LoRA adapter for a model, written as a PEFT directory
// (checkpoint/peft_adapter.h): A uniform in +-1/sqrt(in), B zero, as peft creates one.
// `prl adapter merge`: the base with an adapter merged in, as a model directory.
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/peft_adapter.h"
#include "cli/command.h"
#include "core/status_macros.h"
#include "model/lora.h"
#include "model/lora_merge.h"

namespace prl::cli {
namespace {

struct AdapterInitFlags {
  std::string model, out, targets = "q_proj,k_proj,v_proj,o_proj";
  int64_t rank = 8;
  double alpha = 16;
  bool rslora = false;
  uint64_t seed = 1;
  double b_std = 0.0;
};

absl::Status RunAdapterInit(const AdapterInitFlags& f) {
  PRL_ASSIGN_OR_RETURN(const ModelConfig config, ReadModelConfig(f.model));
  LoraConfig lora;
  lora.rank = f.rank;
  lora.alpha = f.alpha;
  lora.rslora = f.rslora;
  lora.target_modules = absl::StrSplit(f.targets, ',', absl::SkipEmpty());
  PRL_ASSIGN_OR_RETURN(LoraSet set, LoraSet::Allocate(config, lora, Device::Cpu(), false));
  InitializeLora(set, f.seed);
  if (f.b_std > 0.0) {  // a trained-looking adapter (tests): B ~ N(0, b_std^2)
    std::mt19937_64 rng(f.seed + 1);
    std::normal_distribution<double> normal(0.0, f.b_std);
    for (const LoraEntry& e : set.layout.entries()) {
      if (e.is_a) continue;
      for (int64_t i = 0; i < e.numel; ++i) {
        set.data()[e.offset + i] = static_cast<float>(normal(rng));
      }
    }
  }
  PRL_RETURN_IF_ERROR(SaveAdapter(f.out, set, f.model));
  std::printf("wrote %s: LoRA rank %lld, alpha %g%s, %zu tensors (%lld parameters)\n",
              f.out.c_str(), static_cast<long long>(lora.rank), lora.alpha,
              lora.rslora ? " (rsLoRA)" : "", set.layout.entries().size(),
              static_cast<long long>(set.layout.num_elements()));
  return absl::OkStatus();
}

struct AdapterMergeFlags {
  std::string model, adapter, out;
};

// peft's merge_and_unload: the base with the adapter added into its weights, a plain model.
absl::Status RunAdapterMerge(const AdapterMergeFlags& f) {
  PRL_ASSIGN_OR_RETURN(const ParameterSet base, LoadModel(f.model, Device::Cpu()));
  PRL_ASSIGN_OR_RETURN(const LoraSet adapter, LoadAdapter(f.adapter, base.config));
  MergeLora(adapter.params, base.config, base.params);
  PRL_RETURN_IF_ERROR(SaveModel(f.out, base));
  PRL_RETURN_IF_ERROR(CopyTokenizerFiles(f.model, f.out));
  std::printf("wrote %s: %s with %s merged in\n", f.out.c_str(), f.model.c_str(),
              f.adapter.c_str());
  return absl::OkStatus();
}

}  // namespace

void RegisterAdapterCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* adapter = app.add_subcommand("adapter", "LoRA adapters (PEFT directories)");
  adapter->require_subcommand(1);
  auto f = std::make_shared<AdapterInitFlags>();
  CLI::App* init = adapter->add_subcommand(
      "init", "A new LoRA adapter for a model (A random, B zero, as peft creates one)");
  init->add_option("--model", f->model, "The base model's directory (its config.json)")->required();
  init->add_option("--out", f->out, "The adapter directory to write")->required();
  init->add_option("--rank", f->rank, "r")->capture_default_str();
  init->add_option("--alpha", f->alpha, "lora_alpha")->capture_default_str();
  init->add_flag("--rslora", f->rslora, "Scale alpha / sqrt(r) instead of alpha / r");
  init->add_option("--targets", f->targets,
                   "Comma-separated modules: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                   "up_proj, down_proj, or all-linear")
      ->capture_default_str();
  init->add_option("--seed", f->seed, "Seed of A")->capture_default_str();
  init->add_option("--b-std", f->b_std,
                   "For tests: B ~ N(0, std^2) instead of zero (an adapter that changes the "
                   "model)")
      ->capture_default_str();
  registry.Add(init, [f] { return RunAdapterInit(*f); });

  auto m = std::make_shared<AdapterMergeFlags>();
  CLI::App* merge = adapter->add_subcommand(
      "merge",
      "A model directory with the adapter merged into the base's weights (W + scale B A, "
      "peft's merge_and_unload)");
  merge->add_option("--model", m->model, "The base model's directory")->required();
  merge->add_option("--adapter", m->adapter, "The PEFT adapter directory")->required();
  merge->add_option("--out", m->out, "The model directory to write")->required();
  registry.Add(merge, [m] { return RunAdapterMerge(*m); });
}

}  // namespace prl::cli
