// `prl learner step`: one FSDP optimizer step on a file of rollouts, with W local ranks as
// separate processes, writing the updated Hugging Face model directory; `prl learner train`:
// many steps with sharded checkpoints. On the CPU the ranks meet over Gloo; with --device cuda
// rank r runs on GPU (N + r) for --device cuda:N and the ranks meet over NCCL (rendezvous
// through the same store, which carries NCCL's unique id); --dtype bf16 is the mixed-precision
// mode there (bf16 weights and activations, fp32 master weights, gradients and AdamW state).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_model_dir.h"
#include "cli/command.h"
#include "collective/rendezvous.h"
#include "core/device.h"
#include "core/status_macros.h"
#include "learner/checkpoint.h"
#include "learner/fsdp.h"
#include "learner/local_launcher.h"
#include "learner/optimizer.h"
#include "learner/rollouts.h"
#include "learner/train_step.h"
#include "nlohmann/json.hpp"

namespace prl::cli {

namespace {

using learner::LossKind;

struct StepFlags {
  std::string model, rollouts, out, dump_grads;
  int world_size = 1;
  int64_t micro_batch_tokens = 4096;
  std::string loss = "reinforce_tis", optimizer = "adamw", normalization = "tokens";
  std::string advantage = "grpo";
  std::string device = "cpu", dtype = "f32";
  bool drop_uniform_groups = false;
  double lr = 1e-5, weight_decay = 0.0, max_grad_norm = 1.0, beta1 = 0.9, beta2 = 0.95;
  double temperature = 1.0;
  double tis_cap = 2.0, clip_low = 0.2, clip_high = 0.2;
  int64_t learner_version = 0;
  double timeout_s = 300;
  bool keep_gathered = false;
  bool json = false;
  // learner train
  std::string checkpoint_dir;
  int64_t steps = 10, samples_per_step = 0, checkpoint_every = 1;
  int keep_checkpoints = 2;
  std::vector<std::string> argv;  // as given, for the ranks
};

absl::StatusOr<learner::StepConfig> StepConfigFrom(const StepFlags& f) {
  learner::StepConfig c;
  PRL_ASSIGN_OR_RETURN(c.loss.kind, learner::ParseLossKind(f.loss));
  if (f.normalization == "tokens") {
    c.loss.normalization = learner::LossNormalization::kGlobalTokens;
  } else if (f.normalization == "sequence") {
    c.loss.normalization = learner::LossNormalization::kSequenceMean;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--normalization: expected tokens or sequence, found '", f.normalization, "'"));
  }
  c.loss.tis_cap = f.tis_cap;
  c.loss.clip_low = f.clip_low;
  c.loss.clip_high = f.clip_high;
  c.micro_batch_tokens = f.micro_batch_tokens;
  c.temperature = static_cast<float>(f.temperature);
  PRL_RETURN_IF_ERROR(learner::ValidateStepConfig(c));
  return c;
}

absl::StatusOr<learner::OptimizerConfig> OptimizerConfigFrom(const StepFlags& f) {
  learner::OptimizerConfig c;
  PRL_ASSIGN_OR_RETURN(c.kind, learner::ParseOptimizerKind(f.optimizer));
  c.lr = f.lr;
  c.weight_decay = f.weight_decay;
  c.max_grad_norm = f.max_grad_norm;
  c.beta1 = f.beta1;
  c.beta2 = f.beta2;
  PRL_RETURN_IF_ERROR(learner::ValidateOptimizerConfig(c));
  return c;
}

absl::StatusOr<learner::AdvantageConfig> AdvantageConfigFrom(const StepFlags& f) {
  learner::AdvantageConfig c;
  if (f.advantage == "grpo") {
    c.scale_by_std = true;
  } else if (f.advantage == "dr_grpo") {
    c.scale_by_std = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--advantage: expected grpo or dr_grpo, found '", f.advantage, "'"));
  }
  c.drop_uniform_groups = f.drop_uniform_groups;
  return c;
}

std::string Report(const learner::StepResult& r, const learner::FsdpMemory& memory,
                   int64_t optimizer_bytes, int world_size, bool json) {
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
    j["lag_mean"] = r.stats.lag_mean;
    j["lag_max"] = r.stats.lag_max;
    j["grad_norm"] = r.optimizer.grad_norm;
    j["clip_scale"] = r.optimizer.clip_scale;
    j["seconds"] = r.stats.seconds;
    j["tokens_per_second"] = tokens_per_s;
    j["world_size"] = world_size;
    j["rank0_memory_bytes"] = {{"params", memory.param_shard_bytes},
                               {"grads", memory.grad_shard_bytes},
                               {"optimizer", optimizer_bytes},
                               {"unit_buffers", memory.unit_buffer_bytes}};
    return j.dump();
  }
  return absl::StrFormat(
      "step: loss %.6g, %.0f trained tokens in %.0f sequences, grad norm %.4g (clip x%.3g)\n"
      "  ratio mean %.4f max %.4f, clipped %.2f%%, ESS %.4f, KL(mu||pi) %.3g, entropy %.4f\n"
      "  lag mean %.2f max %.0f; %lld input tokens, %lld micro-batches per rank, %.2f s "
      "(%.0f tok/s)\n"
      "  rank 0 memory: params %.1f MB, grads %.1f MB, optimizer %.1f MB, unit buffers %.1f MB "
      "(full model %.1f MB, world size %d)",
      l.loss, l.tokens, l.sequences, r.optimizer.grad_norm, r.optimizer.clip_scale, l.mean_ratio(),
      l.ratio_max, 100 * l.clipped_fraction(), l.effective_sample_size(), l.kl(), l.entropy(),
      r.stats.lag_mean, r.stats.lag_max, static_cast<long long>(r.stats.input_tokens),
      static_cast<long long>(r.stats.micro_batches), r.stats.seconds, tokens_per_s,
      memory.param_shard_bytes / 1e6, memory.grad_shard_bytes / 1e6, optimizer_bytes / 1e6,
      memory.unit_buffer_bytes / 1e6, memory.full_model_bytes / 1e6, world_size);
}

// What every rank sets up: configs, the full model (read once, then sharded), the samples
// with their advantages, the communicator, the FSDP model and the optimizer.
struct Rank {
  learner::StepConfig step;
  std::optional<ParameterSet> full;  // the full model, rank-local (load and export)
  std::vector<learner::TrainSample> samples;
  std::unique_ptr<collective::Communicator> comm;
  std::unique_ptr<learner::FsdpModel> model;
  std::unique_ptr<learner::ShardedOptimizer> optimizer;

  absl::Span<float> full_span() {
    return {full->data(), static_cast<size_t>(full->layout.num_elements())};
  }
};

absl::StatusOr<std::unique_ptr<Rank>> SetUpRank(const StepFlags& f,
                                                const collective::RendezvousConfig& rendezvous) {
  if (rendezvous.world_size != f.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--world-size ", f.world_size, " disagrees with WORLD_SIZE=", rendezvous.world_size));
  }
  auto r = std::make_unique<Rank>();
  PRL_ASSIGN_OR_RETURN(r->step, StepConfigFrom(f));
  PRL_ASSIGN_OR_RETURN(const learner::OptimizerConfig opt_config, OptimizerConfigFrom(f));
  PRL_ASSIGN_OR_RETURN(const learner::AdvantageConfig adv, AdvantageConfigFrom(f));
  PRL_ASSIGN_OR_RETURN(r->full, LoadModel(f.model, Device::Cpu()));
  PRL_ASSIGN_OR_RETURN(r->samples, learner::ReadTrainSamples(f.rollouts, r->full->config));
  PRL_ASSIGN_OR_RETURN(const learner::Advantages advantages,
                       learner::ApplyGroupAdvantages(&r->samples, adv));
  if (r->samples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(f.rollouts, ": every group was dropped (",
                                                   advantages.dropped_groups,
                                                   " with uniform rewards); nothing to train on"));
  }
  collective::CommunicatorOptions comm_options;
  comm_options.timeout = absl::Seconds(f.timeout_s);
  PRL_ASSIGN_OR_RETURN(const Device device, learner::LocalRankDevice(f.device, rendezvous.rank));
  learner::FsdpOptions fsdp_options;
  PRL_ASSIGN_OR_RETURN(fsdp_options.transformer.compute_dtype,
                       ResolveComputeDType(f.dtype, device));
  if (device.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(r->comm, collective::ConnectNccl(rendezvous, device, comm_options));
  } else {
    PRL_ASSIGN_OR_RETURN(r->comm, collective::ConnectGloo(rendezvous, comm_options));
  }
  fsdp_options.reshard_after_forward = !f.keep_gathered;
  PRL_ASSIGN_OR_RETURN(r->model,
                       learner::FsdpModel::Create(r->full->config, r->comm.get(), fsdp_options));
  PRL_RETURN_IF_ERROR(r->model->LoadFull(r->full_span()));
  PRL_ASSIGN_OR_RETURN(r->optimizer, learner::ShardedOptimizer::Create(opt_config, r->model.get()));
  return r;
}

absl::Status SaveFull(Rank& r, const std::string& out) {
  PRL_RETURN_IF_ERROR(r.model->GatherFullParams(r.full_span()));
  if (r.comm->rank() == 0) PRL_RETURN_IF_ERROR(SaveModel(out, *r.full));
  return absl::OkStatus();
}

absl::Status RunStepRank(const StepFlags& f, const collective::RendezvousConfig& rendezvous) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, SetUpRank(f, rendezvous));
  PRL_RETURN_IF_ERROR(r->model->ZeroGrad());
  learner::StepResult result;
  PRL_ASSIGN_OR_RETURN(result.stats, learner::AccumulateGradients(*r->model, r->samples, r->step,
                                                                  f.learner_version));
  if (!f.dump_grads.empty()) {
    PRL_RETURN_IF_ERROR(r->model->GatherFullGrads(r->full_span()));
    if (r->comm->rank() == 0) PRL_RETURN_IF_ERROR(SaveParameterSetTensors(f.dump_grads, *r->full));
  }
  PRL_ASSIGN_OR_RETURN(result.optimizer, r->optimizer->Step());
  PRL_RETURN_IF_ERROR(SaveFull(*r, f.out));
  if (r->comm->rank() == 0) {
    std::printf("%s\n", Report(result, r->model->memory(), r->optimizer->state_bytes(),
                               r->comm->world_size(), f.json)
                            .c_str());
    if (!f.json) std::printf("wrote %s\n", f.out.c_str());
  }
  return r->comm->Barrier();
}

// Steps over the rollouts file, samples_per_step at a time (wrapping around), checkpointing
// every checkpoint_every steps; resumes from the latest checkpoint when there is one.
absl::Status RunTrainRank(const StepFlags& f, const collective::RendezvousConfig& rendezvous) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, SetUpRank(f, rendezvous));
  const bool rank0 = r->comm->rank() == 0;
  learner::TrainingState state;
  PRL_ASSIGN_OR_RETURN(const std::optional<learner::TrainingState> resumed,
                       learner::LoadLatestCheckpoint(f.checkpoint_dir, *r->model, *r->optimizer));
  if (resumed.has_value()) {
    state = *resumed;
    if (rank0) {
      std::printf("resumed from %s: step %lld, version %lld, %lld samples consumed\n",
                  f.checkpoint_dir.c_str(), static_cast<long long>(state.step),
                  static_cast<long long>(state.weight_version),
                  static_cast<long long>(state.data_position));
    }
  }
  const int64_t n = static_cast<int64_t>(r->samples.size());
  const int64_t per_step = f.samples_per_step > 0 ? f.samples_per_step : n;
  std::vector<learner::TrainSample> batch;
  while (state.step < f.steps) {
    batch.clear();
    for (int64_t k = 0; k < per_step; ++k)
      batch.push_back(r->samples[(state.data_position + k) % n]);
    PRL_ASSIGN_OR_RETURN(
        const learner::StepResult result,
        learner::TrainStep(*r->model, *r->optimizer, batch, r->step, state.weight_version));
    ++state.step;
    ++state.weight_version;
    state.data_position += per_step;
    const bool checkpoint = state.step % f.checkpoint_every == 0 || state.step == f.steps;
    if (checkpoint) {
      PRL_RETURN_IF_ERROR(learner::SaveCheckpoint(f.checkpoint_dir, *r->model, *r->optimizer, state,
                                                  f.keep_checkpoints));
    }
    if (rank0) {
      const learner::LossStats& l = result.stats.loss;
      std::printf(
          "step %lld/%lld: loss %.6g, ratio %.4f, clipped %.2f%%, KL %.3g, grad norm %.4g, "
          "%.0f tok/s%s\n",
          static_cast<long long>(state.step), static_cast<long long>(f.steps), l.loss,
          l.mean_ratio(), 100 * l.clipped_fraction(), l.kl(), result.optimizer.grad_norm,
          result.stats.input_tokens / result.stats.seconds, checkpoint ? ", checkpointed" : "");
      std::fflush(stdout);
    }
  }
  if (!f.out.empty()) {
    PRL_RETURN_IF_ERROR(SaveFull(*r, f.out));
    if (rank0) std::printf("wrote %s\n", f.out.c_str());
  }
  return r->comm->Barrier();
}

absl::Status Launch(const StepFlags& f, bool train) {
  absl::StatusOr<collective::RendezvousConfig> rendezvous = learner::RendezvousForThisRank();
  if (rendezvous.ok()) return train ? RunTrainRank(f, *rendezvous) : RunStepRank(f, *rendezvous);
  if (!absl::IsNotFound(rendezvous.status())) return rendezvous.status();
  // The launcher: check what can be checked once, then start the ranks.
  PRL_RETURN_IF_ERROR(StepConfigFrom(f).status());
  PRL_RETURN_IF_ERROR(OptimizerConfigFrom(f).status());
  PRL_RETURN_IF_ERROR(AdvantageConfigFrom(f).status());
  {
    PRL_ASSIGN_OR_RETURN(const Device device, ResolveDeviceFlag(f.device));
    PRL_RETURN_IF_ERROR(ResolveComputeDType(f.dtype, device).status());
  }
  if (train && (f.steps < 1 || f.checkpoint_every < 1 || f.samples_per_step < 0 ||
                f.keep_checkpoints < 1 || f.checkpoint_dir.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner train: expected --steps >= 1 (found ", f.steps, "), --checkpoint-every >= 1 (",
        f.checkpoint_every, "), --samples-per-step >= 0 (", f.samples_per_step,
        "), --keep-checkpoints >= 1 (", f.keep_checkpoints, ") and a --checkpoint-dir"));
  }
  if (f.world_size < 1 || f.world_size > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world-size: expected 1 to 64 local ranks, found ", f.world_size));
  }
  learner::LaunchOptions launch;
  launch.world_size = f.world_size;
  launch.grace_after_failure = absl::Seconds(f.timeout_s + 5);
  return learner::RunLocalRanks(f.argv, launch);
}

// The flags `learner step` and `learner train` share.
void AddStepFlags(CLI::App* cmd, StepFlags* f) {
  cmd->add_option("--model", f->model, "Hugging Face model directory (the starting weights)")
      ->required();
  cmd->add_option("--rollouts", f->rollouts,
                  "JSONL: {prompt, completion, behaviour_logprobs, advantage | reward + group}")
      ->required();
  cmd->add_option("--world-size", f->world_size, "Local ranks (processes)")->capture_default_str();
  cmd->add_option("--device", f->device,
                  "cpu (ranks over Gloo), cuda or cuda:N (rank r on GPU N + r, ranks over NCCL), "
                  "or auto")
      ->capture_default_str();
  cmd->add_option("--dtype", f->dtype,
                  "f32 (exact mode, every backend) | bf16 (CUDA: bf16 weights and activations, "
                  "fp32 master weights, gradients and optimizer state)")
      ->capture_default_str();
  cmd->add_option("--micro-batch-tokens", f->micro_batch_tokens,
                  "Input tokens per micro-batch (a longer sequence gets one of its own)")
      ->capture_default_str();
  cmd->add_option("--loss", f->loss,
                  "reinforce_tis | ppo_clip | decoupled_ppo | icepop | cispo | gspo | sft")
      ->capture_default_str();
  cmd->add_option("--normalization", f->normalization,
                  "tokens (sum / global trained tokens) | sequence (mean per sequence)")
      ->capture_default_str();
  cmd->add_option("--advantage", f->advantage,
                  "For reward + group lines: grpo ((r - mean) / (std + eps)) | dr_grpo (r - mean)")
      ->capture_default_str();
  cmd->add_flag("--drop-uniform-groups", f->drop_uniform_groups,
                "Drop groups whose rewards are all equal");
  cmd->add_option("--optimizer", f->optimizer, "adamw | sgd")->capture_default_str();
  cmd->add_option("--lr", f->lr, "Learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", f->weight_decay, "Decoupled weight decay (matrices only)")
      ->capture_default_str();
  cmd->add_option("--beta1", f->beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", f->beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--max-grad-norm", f->max_grad_norm, "Global-norm clipping (0: off)")
      ->capture_default_str();
  cmd->add_option("--temperature", f->temperature,
                  "Temperature of the learner's log-probs (the sampling temperature)")
      ->capture_default_str();
  cmd->add_option("--tis-cap", f->tis_cap, "Importance-weight cap c")->capture_default_str();
  cmd->add_option("--clip-low", f->clip_low, "PPO ratio clip below 1")->capture_default_str();
  cmd->add_option("--clip-high", f->clip_high, "PPO ratio clip above 1")->capture_default_str();
  cmd->add_option("--timeout-s", f->timeout_s,
                  "Per-collective time-out: a dead rank becomes an error after this")
      ->capture_default_str();
  cmd->add_flag("--keep-gathered", f->keep_gathered,
                "Keep gathered parameter units from forward to backward (more memory)");
  cmd->add_flag("--json", f->json, "Print the step report as one JSON object");
}

absl::Status RunExport(const std::string& checkpoint_dir, const std::string& out,
                       const std::string& dtype) {
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
  PRL_RETURN_IF_ERROR(SaveModel(out, ckpt.params, options));
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
      "One optimizer step on a rollouts file with W local ranks (separate processes; Gloo on "
      "the CPU, NCCL on GPUs); "
      "writes the updated model directory");
  AddStepFlags(step, f.get());
  step->add_option("--out", f->out, "Where to write the updated model directory")->required();
  step->add_option("--learner-version", f->learner_version,
                   "The learner's weight version (for the lag of lines with versions)")
      ->capture_default_str();
  step->add_option("--dump-grads", f->dump_grads,
                   "Write the full gradient of the loss (HF names, F32 safetensors)");
  registry.Add(step, [f] { return Launch(*f, /*train=*/false); });

  auto t = std::make_shared<StepFlags>();
  t->argv.assign(argv, argv + argc);
  CLI::App* train = learner->add_subcommand(
      "train",
      "Several steps over a rollouts file with sharded checkpoints; resumes from the latest "
      "checkpoint in --checkpoint-dir");
  AddStepFlags(train, t.get());
  train->add_option("--checkpoint-dir", t->checkpoint_dir, "Sharded checkpoints (resumed from)")
      ->required();
  train->add_option("--steps", t->steps, "Total optimizer steps")->capture_default_str();
  train
      ->add_option("--samples-per-step", t->samples_per_step,
                   "Rollout lines per step, taken in file order and wrapping (0: all)")
      ->capture_default_str();
  train->add_option("--checkpoint-every", t->checkpoint_every, "Steps between checkpoints")
      ->capture_default_str();
  train->add_option("--keep-checkpoints", t->keep_checkpoints, "Newest checkpoints kept")
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
  registry.Add(exp, [e_dir, e_out, e_dtype] { return RunExport(*e_dir, *e_out, *e_dtype); });
}

}  // namespace prl::cli
