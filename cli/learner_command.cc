// `prl learner step`: one FSDP optimizer step on a file of rollouts, with learner.world_size
// local ranks as separate processes, writing the updated Hugging Face model directory; `prl
// learner train`: many steps with sharded checkpoints; `prl export`. The ranks are built by the
// one learner-rank factory (roles/learner_rank.h) from the learner section of the run config:
// Gloo on the CPU; with learner.device = cuda rank r runs on GPU r and the ranks meet over NCCL,
// and learner.dtype = bf16 is the mixed-precision mode there.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/peft_adapter.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "collective/rendezvous.h"
#include "core/status_macros.h"
#include "learner/checkpointer.h"
#include "learner/joint_step.h"
#include "learner/rollouts.h"
#include "learner/train_step.h"
#include "nlohmann/json.hpp"
#include "roles/learner_rank.h"
#include "roles/role_security.h"

namespace prl::cli {

namespace {

// The flags that are not config keys: the data, the outputs and the report.
struct StepFlags {
  std::string rollouts, out, dump_grads;
  int64_t learner_version = 0;
  bool keep_gathered = false;
  bool json = false;
  int64_t samples_per_step = 0;  // learner train
  // learner step --joint: other adapters trained in the same joint step, each
  // "ADAPTER,ROLLOUTS,OUT[,GRADS]" (learner/joint_step.h).
  std::vector<std::string> joint;
  std::shared_ptr<ConfigFlags> config;
  std::vector<std::string> argv;  // as given, for the ranks
};

std::string Report(const learner::StepResult& r, const learner::FsdpMemory& memory,
                   int64_t optimizer_bytes, int world_size, int64_t dropped_groups, bool json) {
  const learner::LossStats& l = r.stats.loss;
  const double tokens_per_s = static_cast<double>(r.stats.input_tokens) / r.stats.seconds;
  if (json) {
    nlohmann::ordered_json j;
    j["loss"] = l.loss;
    j["trained_tokens"] = l.tokens;
    j["sequences"] = l.sequences;
    j["input_tokens"] = r.stats.input_tokens;
    j["micro_batches_per_rank"] = r.stats.micro_batches;
    j["mean_ratio"] = l.mean_ratio();
    j["max_ratio"] = l.ratio_max;
    j["clipped_fraction"] = l.clipped_fraction();
    j["effective_sample_size"] = l.effective_sample_size();
    j["kl_behaviour_learner"] = l.kl();
    j["entropy"] = l.entropy();
    j["policy_entropy"] = r.stats.policy_entropy;
    j["dropped_groups"] = dropped_groups;  // --drop-uniform-groups: groups of uniform reward
    j["reference_kl"] = r.stats.reference_kl;
    j["lag_mean"] = r.stats.lag_mean;
    j["lag_max"] = r.stats.lag_max;
    j["grad_norm"] = r.optimizer.grad_norm;
    j["clip_scale"] = r.optimizer.clip_scale;
    j["seconds"] = r.stats.seconds;
    j["tokens_per_second"] = tokens_per_s;
    j["world_size"] = world_size;
    j["peak_activation_bytes"] = r.stats.peak_activation_bytes;
    j["rank0_memory_bytes"] = {{"params", memory.param_shard_bytes},
                               {"grads", memory.grad_shard_bytes},
                               {"optimizer", optimizer_bytes},
                               {"unit_buffers", memory.unit_buffer_bytes}};
    return j.dump();
  }
  return absl::StrFormat(
      "step: loss %.6g, %.0f trained tokens in %.0f sequences, grad norm %.4g (clip x%.3g)\n"
      "  ratio mean %.4f max %.4f, clipped %.2f%%, ESS %.4f, KL(mu||pi) %.3g, entropy %.4f, "
      "policy entropy %.4f; %lld groups dropped\n"
      "  lag mean %.2f max %.0f; %lld input tokens, %lld micro-batches per rank, %.2f s "
      "(%.0f tok/s)\n"
      "  rank 0 memory: params %.1f MB, grads %.1f MB, optimizer %.1f MB, unit buffers %.1f MB "
      "(full model %.1f MB, world size %d); peak pass workspace %.1f MB",
      l.loss, l.tokens, l.sequences, r.optimizer.grad_norm, r.optimizer.clip_scale, l.mean_ratio(),
      l.ratio_max, 100 * l.clipped_fraction(), l.effective_sample_size(), l.kl(), l.entropy(),
      r.stats.policy_entropy, static_cast<long long>(dropped_groups), r.stats.lag_mean,
      r.stats.lag_max, static_cast<long long>(r.stats.input_tokens),
      static_cast<long long>(r.stats.micro_batches), r.stats.seconds, tokens_per_s,
      memory.param_shard_bytes / 1e6, memory.grad_shard_bytes / 1e6, optimizer_bytes / 1e6,
      memory.unit_buffer_bytes / 1e6, memory.full_model_bytes / 1e6, world_size,
      r.stats.peak_activation_bytes / 1e6);
}

// What every rank sets up: the learner rank (roles/learner_rank.h), the full model (read once,
// when every weight trains, then sharded; kept for export) and the samples with their advantages.
struct Rank {
  std::unique_ptr<roles::LearnerRank> learner;
  std::optional<ParameterSet> full;
  std::optional<LoraSet> adapter;  // LoRA: the trained adapter, gathered for output
  std::vector<learner::TrainSample> samples;
  int64_t dropped_groups = 0;  // by --drop-uniform-groups

  absl::Span<float> full_span() {
    return {full->data(), static_cast<size_t>(full->layout.num_elements())};
  }
  // What the learner trains: the model's parameters, or the adapter's.
  absl::Span<float> trained_span() {
    if (!adapter.has_value()) return full_span();
    return {adapter->data(), static_cast<size_t>(adapter->layout.num_elements())};
  }
  bool rank0() const { return learner->rank0(); }
};

absl::StatusOr<std::unique_ptr<Rank>> SetUpRank(const StepFlags& f, const config::RunConfig& c,
                                                const collective::RendezvousConfig& rendezvous) {
  auto r = std::make_unique<Rank>();
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(c.model.path));
  PRL_ASSIGN_OR_RETURN(r->samples, learner::ReadTrainSamples(f.rollouts, model));
  PRL_ASSIGN_OR_RETURN(
      const learner::Advantages advantages,
      learner::ApplyGroupAdvantages(&r->samples, roles::AdvantageConfigFrom(c.learner)));
  if (r->samples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(f.rollouts, ": every group was dropped (",
                                                   advantages.dropped_groups,
                                                   " with uniform rewards); nothing to train on"));
  }
  r->dropped_groups = advantages.dropped_groups;
  roles::LearnerRankOptions options;
  options.temperature = static_cast<float>(c.task.temperature);
  options.keep_gathered = f.keep_gathered;
  PRL_ASSIGN_OR_RETURN(
      r->learner, roles::CreateLearnerRank(
                      c.learner, options, model,
                      [&]() -> absl::StatusOr<const ParameterSet*> {
                        if (!r->full.has_value()) {  // with LoRA: the node's first rank only
                          PRL_ASSIGN_OR_RETURN(r->full, LoadModel(c.model.path, Device::Cpu()));
                        }
                        return &*r->full;
                      },
                      rendezvous));
  if (const LoraConfig* lora = r->learner->model->lora_config(); lora != nullptr) {
    PRL_ASSIGN_OR_RETURN(r->adapter, LoraSet::Allocate(model, *lora, Device::Cpu(), true));
  }
  return r;
}

// The trained model, with the tokenizer files of the model it started from; with LoRA the
// trained adapter as a PEFT directory.
absl::Status SaveFull(Rank& r, const std::string& start_model, const std::string& out) {
  PRL_RETURN_IF_ERROR(r.learner->model->GatherFullParams(r.trained_span()));
  if (!r.rank0()) return absl::OkStatus();
  if (r.adapter.has_value()) return SaveAdapter(out, *r.adapter, start_model);
  PRL_RETURN_IF_ERROR(SaveModel(out, *r.full));
  return CopyTokenizerFiles(start_model, out);
}

absl::Status RunStepRank(const StepFlags& f, const config::RunConfig& c,
                         const collective::RendezvousConfig& rendezvous) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, SetUpRank(f, c, rendezvous));
  roles::LearnerRank& l = *r->learner;
  PRL_RETURN_IF_ERROR(l.model->ZeroGrad());
  learner::StepResult result;
  PRL_ASSIGN_OR_RETURN(
      result.stats, learner::AccumulateGradients(*l.model, r->samples, l.step, f.learner_version));
  if (!f.dump_grads.empty()) {
    PRL_RETURN_IF_ERROR(l.model->GatherFullGrads(r->trained_span()));
    if (r->rank0()) {
      PRL_RETURN_IF_ERROR(r->adapter.has_value() ? SaveAdapterTensors(f.dump_grads, *r->adapter)
                                                 : SaveParameterSetTensors(f.dump_grads, *r->full));
    }
  }
  PRL_ASSIGN_OR_RETURN(result.optimizer, l.optimizer->Step());
  PRL_RETURN_IF_ERROR(SaveFull(*r, c.model.path, f.out));
  if (r->rank0()) {
    std::printf("%s\n", Report(result, l.model->memory(), l.optimizer->state_bytes(),
                               l.comm->world_size(), r->dropped_groups, f.json)
                            .c_str());
    if (!f.json) std::printf("wrote %s%s\n", f.out.c_str(), r->adapter ? " (a PEFT adapter)" : "");
  }
  return l.comm->Barrier();
}

// --joint ADAPTER,ROLLOUTS,OUT[,GRADS]: another adapter of the joint step, read from a PEFT
// directory, with its rollouts, its output directory and where to dump its gradient.
struct JointAdapter {
  std::string adapter, rollouts, out, grads;
  learner::FsdpModel* model = nullptr;
  learner::ShardedOptimizer* optimizer = nullptr;
  roles::AdapterModel made;
  std::optional<LoraSet> set;  // gathered for output
  std::vector<learner::TrainSample> samples;
  int64_t dropped_groups = 0;
};

absl::StatusOr<JointAdapter> ParseJointAdapter(const std::string& spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ',');
  if (parts.size() < 3 || parts.size() > 4 ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--joint: expected ADAPTER,ROLLOUTS,OUT[,GRADS] (a PEFT directory, a rollouts file, the "
        "output directory, optionally the gradient's file), found '", spec, "'"));
  }
  JointAdapter j;
  j.adapter = parts[0];
  j.rollouts = parts[1];
  j.out = parts[2];
  if (parts.size() == 4) j.grads = parts[3];
  return j;
}

// `learner step --joint`: the adapter of learner.lora_init and the --joint ones in one joint step
// on one rank (learner/joint_step.h), each written and reported as its own step would be.
absl::Status RunJointStepRank(const StepFlags& f, const config::RunConfig& c,
                              const collective::RendezvousConfig& rendezvous) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, SetUpRank(f, c, rendezvous));
  roles::LearnerRank& l = *r->learner;
  if (!r->adapter.has_value()) {
    return absl::InvalidArgumentError(
        "--joint: trains several LoRA adapters: the first is learner.lora_init (--lora-init) or "
        "learner.lora_rank's, found a learner of every weight");
  }
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(c.model.path));
  std::vector<JointAdapter> others;
  for (const std::string& spec : f.joint) {
    PRL_ASSIGN_OR_RETURN(JointAdapter j, ParseJointAdapter(spec));
    PRL_ASSIGN_OR_RETURN(LoraSet start, LoadAdapter(j.adapter, model));
    PRL_ASSIGN_OR_RETURN(j.made, roles::CreateAdapterModel(c.learner, l, model, start.lora, 0,
                                                           c.learner.lr, l.comm.get(), nullptr));
    PRL_RETURN_IF_ERROR(j.made.model->LoadFull(
        {start.data(), static_cast<size_t>(start.layout.num_elements())}));
    j.model = j.made.model.get();
    j.optimizer = j.made.optimizer.get();
    j.set.emplace(std::move(start));
    PRL_ASSIGN_OR_RETURN(j.samples, learner::ReadTrainSamples(j.rollouts, model));
    PRL_ASSIGN_OR_RETURN(
        const learner::Advantages advantages,
        learner::ApplyGroupAdvantages(&j.samples, roles::AdvantageConfigFrom(c.learner)));
    j.dropped_groups = advantages.dropped_groups;
    others.push_back(std::move(j));
  }
  std::vector<learner::AdapterStep> steps = {
      {l.model.get(), l.optimizer.get(), r->samples, &l.step, f.learner_version}};
  for (const JointAdapter& j : others) {
    steps.push_back({j.model, j.optimizer, j.samples, &l.step, f.learner_version});
  }
  PRL_ASSIGN_OR_RETURN(
      const std::vector<learner::StepStats> stats,
      learner::AccumulateJointGradients(steps, std::max<int64_t>(c.learner.adapter_pass_tokens, 1)));
  if (!f.dump_grads.empty()) {
    PRL_RETURN_IF_ERROR(l.model->GatherFullGrads(r->trained_span()));
    PRL_RETURN_IF_ERROR(SaveAdapterTensors(f.dump_grads, *r->adapter));
  }
  for (JointAdapter& j : others) {
    if (j.grads.empty()) continue;
    PRL_RETURN_IF_ERROR(j.model->GatherFullGrads(
        {j.set->data(), static_cast<size_t>(j.set->layout.num_elements())}));
    PRL_RETURN_IF_ERROR(SaveAdapterTensors(j.grads, *j.set));
  }
  std::vector<learner::StepResult> results(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    results[k].stats = stats[k];
    PRL_ASSIGN_OR_RETURN(results[k].optimizer, steps[k].optimizer->Step());
  }
  PRL_RETURN_IF_ERROR(SaveFull(*r, c.model.path, f.out));
  for (JointAdapter& j : others) {
    PRL_RETURN_IF_ERROR(j.model->GatherFullParams(
        {j.set->data(), static_cast<size_t>(j.set->layout.num_elements())}));
    PRL_RETURN_IF_ERROR(SaveAdapter(j.out, *j.set, c.model.path));
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    const learner::FsdpModel& m = *steps[k].model;
    std::printf("%s\n", Report(results[k], m.memory(), steps[k].optimizer->state_bytes(), 1,
                               k == 0 ? r->dropped_groups : others[k - 1].dropped_groups, f.json)
                            .c_str());
    if (!f.json) std::printf("wrote %s (a PEFT adapter)\n", k == 0 ? f.out.c_str() : others[k - 1].out.c_str());
  }
  return absl::OkStatus();
}

void PrintTrainStep(const learner::StepResult& result, int64_t step, int64_t steps,
                    bool checkpointed) {
  const learner::LossStats& l = result.stats.loss;
  std::printf(
      "step %lld/%lld: loss %.6g, ratio %.4f, clipped %.2f%%, KL %.3g, ref KL %.3g, "
      "grad norm %.4g, %.0f tok/s%s\n",
      static_cast<long long>(step), static_cast<long long>(steps), l.loss, l.mean_ratio(),
      100 * l.clipped_fraction(), l.kl(), result.stats.reference_kl, result.optimizer.grad_norm,
      result.stats.input_tokens / result.stats.seconds, checkpointed ? ", checkpointed" : "");
  std::fflush(stdout);
}

// Steps over the rollouts file, samples_per_step at a time (wrapping around), checkpointing as
// the learner section says (learner/checkpointer.h); resumes from the latest checkpoint.
absl::Status RunTrainRank(const StepFlags& f, const config::RunConfig& c,
                          const collective::RendezvousConfig& rendezvous) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, SetUpRank(f, c, rendezvous));
  roles::LearnerRank& l = *r->learner;
  const learner::Checkpointer checkpointer({.dir = c.checkpoint_dir(),
                                            .every = c.learner.checkpoint_every,
                                            .keep_last = c.learner.keep_checkpoints,
                                            .last_step = c.learner.steps});
  learner::TrainingState state;
  PRL_ASSIGN_OR_RETURN(const std::optional<learner::TrainingState> resumed,
                       checkpointer.Resume(*l.model, *l.optimizer));
  if (resumed.has_value()) {
    state = *resumed;
    if (r->rank0()) {
      std::printf("resumed from %s: step %lld, version %lld, %lld samples consumed\n",
                  c.checkpoint_dir().c_str(), static_cast<long long>(state.step),
                  static_cast<long long>(state.weight_version),
                  static_cast<long long>(state.data_position));
    }
  }
  const int64_t n = static_cast<int64_t>(r->samples.size());
  const int64_t per_step = f.samples_per_step > 0 ? f.samples_per_step : n;
  std::vector<learner::TrainSample> batch;
  while (state.step < c.learner.steps) {
    batch.clear();
    for (int64_t k = 0; k < per_step; ++k)
      batch.push_back(r->samples[(state.data_position + k) % n]);
    PRL_ASSIGN_OR_RETURN(
        const learner::StepResult result,
        learner::TrainStep(*l.model, *l.optimizer, batch, l.step, state.weight_version));
    ++state.step;
    ++state.weight_version;
    state.data_position += per_step;
    PRL_ASSIGN_OR_RETURN(const bool saved, checkpointer.AfterStep(state, *l.model, *l.optimizer));
    if (r->rank0()) PrintTrainStep(result, state.step, c.learner.steps, saved);
  }
  if (!f.out.empty()) {
    PRL_RETURN_IF_ERROR(SaveFull(*r, c.model.path, f.out));
    if (r->rank0()) std::printf("wrote %s\n", f.out.c_str());
  }
  return l.comm->Barrier();
}

absl::Status Launch(const StepFlags& f, const config::RunConfig& c, bool train) {
  PRL_RETURN_IF_ERROR(roles::ConfigureRoleSecurity(c, rpc::Role::kLearner, {}));
  if (c.model.path.empty()) {
    return absl::InvalidArgumentError("learner: --model (model.path) is required");
  }
  if (train && c.learner.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner train: --steps (learner.steps): expected >= 1, found ", c.learner.steps));
  }
  if (train && f.samples_per_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner train: --samples-per-step: expected >= 0, found ", f.samples_per_step));
  }
  if (!f.joint.empty() && (c.learner.world_size != 1 || c.learner.context_parallel != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--joint: a joint step of adapters runs on one rank (a run of adapters' rank), found "
        "learner.world_size ", c.learner.world_size, ", learner.context_parallel ",
        c.learner.context_parallel));
  }
  return roles::RunLearnerRanks(
      c.learner, f.argv, [&](const collective::RendezvousConfig& rendezvous) {
        if (train) return RunTrainRank(f, c, rendezvous);
        return f.joint.empty() ? RunStepRank(f, c, rendezvous)
                               : RunJointStepRank(f, c, rendezvous);
      });
}

absl::Status Launch(const StepFlags& f, bool train) {
  return f.config->Run([&](const config::RunConfig& c) { return Launch(f, c, train); });
}

// The flags `learner step` and `learner train` share.
void AddStepFlags(CLI::App* cmd, StepFlags* f) {
  f->config = std::make_shared<ConfigFlags>(cmd);
  f->config->Shorthand("--model", "model.path")
      .Shorthand("--world-size", "learner.world_size")
      .Shorthand("--device", "learner.device")
      .Shorthand("--dtype", "learner.dtype")
      .Shorthand("--micro-batch-tokens", "learner.micro_batch_tokens")
      .Shorthand("--activation-checkpointing", "learner.activation_checkpointing")
      .Shorthand("--activation-budget-mb", "learner.activation_budget_mb")
      .Shorthand("--context-parallel", "learner.context_parallel")
      .Shorthand("--context-attention", "learner.context_parallel_attention")
      .Shorthand("--router-aux-loss-coef", "learner.router_aux_loss_coef")
      .Shorthand("--loss", "learner.loss")
      .Shorthand("--normalization", "learner.normalization")
      .Shorthand("--advantage", "learner.advantage")
      .Shorthand("--drop-uniform-groups", "learner.drop_uniform_groups")
      .Shorthand("--kl-coef", "learner.kl_coef")
      .Shorthand("--kl-estimator", "learner.kl_estimator")
      .Shorthand("--kl-penalty", "learner.kl_penalty")
      .Shorthand("--kl-reference", "learner.kl_reference")
      .Shorthand("--optimizer", "learner.optimizer")
      .Shorthand("--lr", "learner.lr")
      .Shorthand("--weight-decay", "learner.weight_decay")
      .Shorthand("--beta1", "learner.beta1")
      .Shorthand("--beta2", "learner.beta2")
      .Shorthand("--max-grad-norm", "learner.max_grad_norm")
      .Shorthand("--temperature", "task.temperature")
      .Shorthand("--tis-cap", "learner.tis_cap")
      .Shorthand("--clip-low", "learner.clip_low")
      .Shorthand("--clip-high", "learner.clip_high")
      .Shorthand("--timeout-s", "learner.timeout_s")
      .Shorthand("--lora-rank", "learner.lora_rank")
      .Shorthand("--lora-alpha", "learner.lora_alpha")
      .Shorthand("--lora-rslora", "learner.lora_rslora")
      .Shorthand("--lora-targets", "learner.lora_targets")
      .Shorthand("--lora-init", "learner.lora_init");
  cmd->add_option("--rollouts", f->rollouts,
                  "JSONL: {prompt, completion, behaviour_logprobs, advantage | reward + group}")
      ->required();
  cmd->add_flag("--keep-gathered", f->keep_gathered,
                "Keep gathered parameter units from forward to backward (more memory)");
}

absl::Status RunExport(const std::string& checkpoint_dir, const std::string& out,
                       const std::string& dtype, bool adapter) {
  SaveModelOptions options;
  if (dtype == "f32") {
    options.dtype = DType::kF32;
  } else if (dtype == "bf16") {
    options.dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: expected f32 or bf16, found '", dtype, "'"));
  }
  PRL_ASSIGN_OR_RETURN(const learner::ExportedCheckpoint ckpt,
                       learner::ReadCheckpointFull(checkpoint_dir));
  if (ckpt.adapter.has_value() != adapter) {
    return absl::InvalidArgumentError(
        adapter ? absl::StrCat("--adapter: ", ckpt.path,
                               " holds every weight of a model, not a LoRA adapter (export it "
                               "without --adapter)")
                : absl::StrCat(ckpt.path,
                               " holds a LoRA adapter (learner.lora_*): pass --adapter to write "
                               "it as a PEFT directory"));
  }
  if (adapter) {
    if (options.dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype: expected f32 with --adapter, found '", dtype, "'"));
    }
    PRL_RETURN_IF_ERROR(SaveAdapter(out, *ckpt.adapter, ""));
  } else {
    PRL_RETURN_IF_ERROR(SaveModel(out, *ckpt.params, options));
  }
  std::printf("exported %s (step %lld, weight version %lld) to %s\n", ckpt.path.c_str(),
              static_cast<long long>(ckpt.state.step),
              static_cast<long long>(ckpt.state.weight_version), out.c_str());
  return absl::OkStatus();
}

}  // namespace

void RegisterLearnerCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv) {
  CLI::App* learner = app.add_subcommand("learner", "The learner: FSDP training steps");
  learner->require_subcommand(1);

  auto f = std::make_shared<StepFlags>();
  f->argv.assign(argv, argv + argc);
  CLI::App* step = learner->add_subcommand(
      "step",
      "One optimizer step on a rollouts file with learner.world_size local ranks (separate "
      "processes; Gloo on the CPU, NCCL on GPUs); writes the updated model directory");
  AddStepFlags(step, f.get());
  step->add_option("--out", f->out, "Where to write the updated model directory")->required();
  step->add_option("--learner-version", f->learner_version,
                   "The learner's weight version (for the lag of lines with versions)")
      ->capture_default_str();
  step->add_option("--dump-grads", f->dump_grads,
                   "Write the full gradient of the loss (HF names, F32 safetensors)");
  step->add_flag("--json", f->json, "Print the step report as one JSON object");
  step->add_option("--joint", f->joint,
                   "ADAPTER,ROLLOUTS,OUT[,GRADS]: another LoRA adapter (a PEFT directory) trained "
                   "with --lora-init's in one joint step on the shared base, its rollouts, output "
                   "directory and gradient file; repeatable; one report line each, --lora-init's "
                   "first");
  f->config->Shorthand("--adapter-pass-tokens", "learner.adapter_pass_tokens");
  registry.Add(step, [f] { return Launch(*f, /*train=*/false); });

  auto t = std::make_shared<StepFlags>();
  t->argv.assign(argv, argv + argc);
  CLI::App* train = learner->add_subcommand(
      "train",
      "Several steps over a rollouts file with sharded checkpoints; resumes from the latest "
      "checkpoint in the checkpoint directory");
  AddStepFlags(train, t.get());
  t->config->Shorthand("--checkpoint-dir", "learner.checkpoint_dir")
      .Shorthand("--steps", "learner.steps")
      .Shorthand("--checkpoint-every", "learner.checkpoint_every")
      .Shorthand("--keep-checkpoints", "learner.keep_checkpoints");
  train
      ->add_option("--samples-per-step", t->samples_per_step,
                   "Rollout lines per step, taken in file order and wrapping (0: all)")
      ->capture_default_str();
  train->add_option("--out", t->out, "Also write the final model directory here");
  registry.Add(train, [t] { return Launch(*t, /*train=*/true); });

  auto e_dir = std::make_shared<std::string>(), e_out = std::make_shared<std::string>();
  auto e_dtype = std::make_shared<std::string>("f32");
  CLI::App* exp = app.add_subcommand(
      "export", "Write the latest learner checkpoint as a Hugging Face model directory");
  exp->add_option("--checkpoint-dir", *e_dir, "A learner checkpoint directory")->required();
  exp->add_option("--out", *e_out, "Model directory to write")->required();
  exp->add_option("--dtype", *e_dtype, "f32 | bf16")->capture_default_str();
  auto e_adapter = std::make_shared<bool>(false);
  exp->add_flag("--adapter", *e_adapter,
                "The checkpoint is a LoRA learner's: write its adapter as a PEFT directory "
                "(adapter_config.json, adapter_model.safetensors)");
  registry.Add(exp, [e_dir, e_out, e_dtype, e_adapter] {
    return RunExport(*e_dir, *e_out, *e_dtype, *e_adapter);
  });
}

}  // namespace prl::cli
