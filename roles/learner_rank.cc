#include "roles/learner_rank.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/hf_model_dir.h"
#include "checkpoint/peft_adapter.h"
#include "core/status_macros.h"
#include "collective/kv_store.h"
#include "learner/context_exchange.h"
#include "model/context_heads.h"
#include "learner/local_launcher.h"
#include "roles/device_settings.h"

namespace prl::roles {

absl::StatusOr<learner::StepConfig> StepConfigFrom(const config::LearnerSection& l,
                                                   float temperature) {
  learner::StepConfig c;
  c.loss.kind = l.loss;
  c.loss.normalization = l.normalization;
  c.loss.tis_cap = l.tis_cap;
  c.loss.clip_low = l.clip_low;
  c.loss.clip_high = l.clip_high;
  c.micro_batch_tokens = l.micro_batch_tokens;
  c.activation_budget_bytes = l.activation_budget_mb << 20;
  c.moe_routing = l.moe_routing;
  c.router_aux_loss_coef = l.router_aux_loss_coef;
  c.temperature = temperature;
  c.loss.kl.coef = l.kl_coef;
  c.loss.kl.estimator = l.kl_estimator;
  c.loss.kl.penalty = l.kl_penalty;
  PRL_RETURN_IF_ERROR(learner::ValidateStepConfig(c));  // (the reference: CreateLearnerRank)
  return c;
}

absl::StatusOr<learner::OptimizerConfig> OptimizerConfigFrom(const config::LearnerSection& l) {
  learner::OptimizerConfig c;
  c.kind = l.optimizer;
  c.lr = l.lr;
  c.weight_decay = l.weight_decay;
  c.max_grad_norm = l.max_grad_norm;
  c.beta1 = l.beta1;
  c.beta2 = l.beta2;
  PRL_RETURN_IF_ERROR(learner::ValidateOptimizerConfig(c));
  return c;
}

learner::AdvantageConfig AdvantageConfigFrom(const config::LearnerSection& l) {
  learner::AdvantageConfig c;
  c.scale_by_std = l.advantage == learner::AdvantageEstimator::kGrpo;
  c.drop_uniform_groups = l.drop_uniform_groups;
  return c;
}

namespace {

constexpr uint64_t kStartingAdapterSeed = 1;  // as `prl adapter init`'s default

// The frozen reference of learner.kl_coef: its own communicator (so that its collectives never
// interleave with the policy's), the same sharding, no optimizer.
absl::Status CreateReference(const config::LearnerSection& l, const ModelConfig& start,
                             const LoadStartingWeights& load,
                             const collective::RendezvousConfig& rendezvous,
                             const learner::FsdpOptions& fsdp,
                             const collective::CommunicatorOptions& comm_options, LearnerRank* r) {
  std::optional<ParameterSet> loaded;
  const ParameterSet* weights = nullptr;
  // LoRA with the starting model as the reference: the frozen base itself, with an adapter of
  // zeros (B = 0 adds exactly nothing), so that the node keeps one copy of the base.
  const bool base_is_reference = l.kl_reference.empty() && fsdp.lora.has_value();
  if (l.kl_reference.empty() && !base_is_reference) {
    PRL_ASSIGN_OR_RETURN(weights, load());
  } else if (!l.kl_reference.empty()) {
    absl::StatusOr<ParameterSet> reference = LoadModel(l.kl_reference, Device::Cpu());
    if (!reference.ok()) {
      return absl::Status(reference.status().code(),
                          absl::StrCat("learner.kl_reference: ", reference.status().message()));
    }
    loaded.emplace(*std::move(reference));
    weights = &*loaded;
    if (weights->config.vocab_size != start.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "learner.kl_reference: expected a model with the policy's vocabulary (vocab_size ",
          start.vocab_size, "), found vocab_size ", weights->config.vocab_size, " in ",
          l.kl_reference));
    }
  }
  collective::RendezvousConfig group = rendezvous;
  group.group_name = absl::StrCat(rendezvous.group_name, "-reference");
  if (r->device.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(r->reference_comm,
                         collective::ConnectNccl(group, r->device, comm_options));
  } else {
    PRL_ASSIGN_OR_RETURN(r->reference_comm, collective::ConnectGloo(group, comm_options));
  }
  learner::FsdpOptions reference_fsdp = fsdp;
  reference_fsdp.reshard_after_forward = true;  // forward only: nothing to keep for a backward
  if (base_is_reference) {
    PRL_ASSIGN_OR_RETURN(
        r->reference, learner::FsdpModel::Create(start, r->reference_comm.get(), reference_fsdp));
    const std::vector<float> zeros(static_cast<size_t>(r->reference->trained_elements()), 0.0f);
    PRL_RETURN_IF_ERROR(r->reference->LoadFull(zeros));
    r->step.reference = r->reference.get();
    return absl::OkStatus();
  }
  reference_fsdp.lora.reset();  // another model: every weight of its own
  reference_fsdp.frozen_base = nullptr;
  PRL_ASSIGN_OR_RETURN(r->reference, learner::FsdpModel::Create(
                                         weights->config, r->reference_comm.get(), reference_fsdp));
  PRL_RETURN_IF_ERROR(r->reference->LoadFull(
      {weights->data(), static_cast<size_t>(weights->layout.num_elements())}));
  r->step.reference = r->reference.get();
  return absl::OkStatus();
}

// The node's frozen base: written by the node's first rank (LOCAL_RANK 0; RANK 0 where the
// launcher sets no LOCAL_RANK), mapped by all.
absl::StatusOr<std::unique_ptr<learner::FrozenBase>> ShareFrozenBase(
    const LearnerRankOptions& options, const ModelConfig& config, const LoadStartingWeights& load,
    const collective::RendezvousConfig& rendezvous, collective::Communicator& comm) {
  PRL_ASSIGN_OR_RETURN(const int local_rank, LocalRank(rendezvous.rank));
  std::string dir = options.frozen_base_dir;
  if (dir.empty()) {
    PRL_ASSIGN_OR_RETURN(dir, learner::PrivateTempDirectory());
  }
  const std::string path = learner::FrozenBasePath(dir, config);
  // Only the writer reads the checkpoint; a failure to read it fails every rank (Share).
  const ParameterSet* weights = nullptr;
  absl::Status loaded;
  if (local_rank == 0) {
    absl::StatusOr<const ParameterSet*> read = load();
    if (read.ok()) {
      weights = *read;
    } else {
      loaded = read.status();
    }
  }
  return learner::FrozenBase::Share(path, config, weights, loaded, comm);
}

}  // namespace

absl::StatusOr<std::optional<LoraConfig>> AdapterSettings(const config::LearnerSection& l) {
  if (!l.lora()) return std::optional<LoraConfig>();
  if (!l.lora_init.empty()) {
    absl::StatusOr<LoraConfig> read = ReadAdapterConfig(l.lora_init);
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrCat("learner.lora_init: ", read.status().message()));
    }
    return std::optional<LoraConfig>(*read);
  }
  LoraConfig lora;
  lora.rank = l.lora_rank;
  lora.alpha = l.lora_alpha;
  lora.rslora = l.lora_rslora;
  lora.target_modules = absl::StrSplit(l.lora_targets, ',', absl::SkipEmpty());
  return std::optional<LoraConfig>(lora);
}

absl::StatusOr<std::optional<LoraSet>> StartingAdapter(const config::LearnerSection& l,
                                                       const ModelConfig& model) {
  if (!l.lora()) return std::optional<LoraSet>();
  if (!l.lora_init.empty()) {
    absl::StatusOr<LoraSet> loaded = LoadAdapter(l.lora_init, model);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("learner.lora_init: ", loaded.status().message()));
    }
    return std::optional<LoraSet>(*std::move(loaded));
  }
  PRL_ASSIGN_OR_RETURN(const std::optional<LoraConfig> settings, AdapterSettings(l));
  const LoraConfig& lora = *settings;
  if (absl::Status valid = ValidateLoraConfig(lora, model); !valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat("learner.lora_*: ", valid.message()));
  }
  PRL_ASSIGN_OR_RETURN(LoraSet set, LoraSet::Allocate(model, lora, Device::Cpu(), false));
  InitializeLora(set, kStartingAdapterSeed);
  return std::optional<LoraSet>(std::move(set));
}

learner::FsdpOptions FsdpOptionsFrom(const config::LearnerSection& l,
                                     const LearnerRankOptions& options) {
  learner::FsdpOptions fsdp;
  fsdp.transformer.compute_dtype = l.dtype;
  fsdp.transformer.cuda_lora = l.cuda_lora;
  fsdp.transformer.cuda_context_parallel = l.cuda_context_parallel;
  fsdp.transformer.keep_logits_bytes = l.keep_logits_mb << 20;
  fsdp.transformer.activation_checkpointing = l.activation_checkpointing;
  if (l.batch_invariant) {
    fsdp.transformer.reduction_order = kernels::ReductionOrder::kBatchInvariant;
  }
  fsdp.reshard_after_forward = !options.keep_gathered;
  return fsdp;
}

absl::StatusOr<std::unique_ptr<LearnerRank>> CreateLearnerRank(
    const config::LearnerSection& l, const LearnerRankOptions& options, const ParameterSet& weights,
    const collective::RendezvousConfig& rendezvous) {
  return CreateLearnerRank(
      l, options, weights.config,
      [&weights]() -> absl::StatusOr<const ParameterSet*> { return &weights; }, rendezvous);
}

absl::StatusOr<std::unique_ptr<LearnerRank>> CreateLearnerRank(
    const config::LearnerSection& l, const LearnerRankOptions& options, const ModelConfig& config,
    const LoadStartingWeights& load, const collective::RendezvousConfig& rendezvous) {
  if (rendezvous.world_size != l.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("learner.world_size = ", l.world_size,
                     " disagrees with WORLD_SIZE=", rendezvous.world_size));
  }
  auto r = std::make_unique<LearnerRank>();
  PRL_ASSIGN_OR_RETURN(r->step, StepConfigFrom(l, options.temperature));
  PRL_ASSIGN_OR_RETURN(r->optimizer_config, OptimizerConfigFrom(l));
  r->advantages = AdvantageConfigFrom(l);
  PRL_ASSIGN_OR_RETURN(r->device, LearnerRankDevice(l, rendezvous.rank));
  collective::CommunicatorOptions comm_options;
  comm_options.timeout = absl::Seconds(l.timeout_s);
  if (r->device.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(r->comm, collective::ConnectNccl(rendezvous, r->device, comm_options));
  } else {
    PRL_ASSIGN_OR_RETURN(r->comm, collective::ConnectGloo(rendezvous, comm_options));
  }
  learner::FsdpOptions fsdp = FsdpOptionsFrom(l, options);
  if (l.context_parallel > 1) {
    if (l.context_parallel_attention == ContextAttention::kUlysses) {  // before any connection
      PRL_RETURN_IF_ERROR(UlyssesHeads(config.num_attention_heads, config.num_key_value_heads,
                                       /*rank=*/0, l.context_parallel)
                              .status());
      if (r->device.is_cuda()) {
        PRL_RETURN_IF_ERROR(ContextHeadsOnDevice(config.num_attention_heads,
                                                 config.num_key_value_heads, l.context_parallel));
      }
    }
    // The group's communicator, through the learner's rendezvous store.
    PRL_ASSIGN_OR_RETURN(std::shared_ptr<collective::KvStore> store,
                         collective::OpenRendezvousStore(rendezvous));
    collective::RendezvousConfig group = rendezvous;
    group.rank = rendezvous.rank % l.context_parallel;
    group.world_size = l.context_parallel;
    group.group_name =
        absl::StrCat(rendezvous.group_name, "-context-", rendezvous.rank / l.context_parallel);
    // The group's exchanges move the layers' activations: over NCCL where they live on a GPU.
    if (r->device.is_cuda()) {
      PRL_ASSIGN_OR_RETURN(r->context_comm, collective::ConnectNcclThrough(
                                                std::move(store), group, r->device, comm_options));
    } else {
      PRL_ASSIGN_OR_RETURN(r->context_comm,
                           collective::ConnectGlooThrough(std::move(store), group, comm_options));
    }
    r->context_exchange = std::make_unique<learner::CommunicatorExchange>(r->context_comm.get());
    fsdp.context = r->context_exchange.get();
    fsdp.context_attention = l.context_parallel_attention;
  }
  PRL_ASSIGN_OR_RETURN(std::optional<LoraSet> adapter, StartingAdapter(l, config));
  if (adapter.has_value()) {
    PRL_ASSIGN_OR_RETURN(r->frozen_base,
                         ShareFrozenBase(options, config, load, rendezvous, *r->comm));
    fsdp.lora = adapter->lora;
    fsdp.frozen_base = r->frozen_base.get();
  }
  PRL_ASSIGN_OR_RETURN(r->model, learner::FsdpModel::Create(config, r->comm.get(), fsdp));
  if (adapter.has_value()) {
    PRL_RETURN_IF_ERROR(
        r->model->LoadFull({adapter->data(), static_cast<size_t>(adapter->layout.num_elements())}));
  } else {
    PRL_ASSIGN_OR_RETURN(const ParameterSet* weights, load());
    PRL_RETURN_IF_ERROR(
        r->model->LoadFull({weights->data(), static_cast<size_t>(weights->layout.num_elements())}));
  }
  PRL_ASSIGN_OR_RETURN(r->optimizer,
                       learner::ShardedOptimizer::Create(r->optimizer_config, r->model.get()));
  if (r->step.loss.kl.enabled()) {
    PRL_RETURN_IF_ERROR(CreateReference(l, config, load, rendezvous, fsdp, comm_options, r.get()));
  }
  return r;
}

absl::StatusOr<AdapterModel> CreateAdapterModel(const config::LearnerSection& l,
                                                const LearnerRank& rank, const ModelConfig& model,
                                                const LoraConfig& lora, uint64_t seed, double lr,
                                                collective::Communicator* comm,
                                                std::shared_ptr<Arena> workspace) {
  PRL_RETURN_IF_ERROR(ValidateLoraConfig(lora, model));
  if (rank.frozen_base == nullptr) {
    return absl::FailedPreconditionError("an adapter's model needs the rank's frozen base");
  }
  learner::FsdpOptions fsdp = FsdpOptionsFrom(l, LearnerRankOptions{});
  fsdp.lora = lora;
  fsdp.frozen_base = rank.frozen_base.get();
  fsdp.transformer.shared_workspace = std::move(workspace);
  AdapterModel out;
  PRL_ASSIGN_OR_RETURN(out.model, learner::FsdpModel::Create(model, comm, fsdp));
  PRL_ASSIGN_OR_RETURN(LoraSet start, LoraSet::Allocate(model, lora, Device::Cpu(), false));
  InitializeLora(start, seed);
  PRL_RETURN_IF_ERROR(
      out.model->LoadFull({start.data(), static_cast<size_t>(start.layout.num_elements())}));
  learner::OptimizerConfig optimizer = rank.optimizer_config;
  optimizer.lr = lr;
  PRL_ASSIGN_OR_RETURN(out.optimizer, learner::ShardedOptimizer::Create(optimizer, out.model.get()));
  return out;
}

absl::StatusOr<std::unique_ptr<collective::Communicator>> ConnectRankAlone(
    const collective::RendezvousConfig& rendezvous, const std::string& name,
    absl::Duration timeout) {
  PRL_ASSIGN_OR_RETURN(std::shared_ptr<collective::KvStore> store,
                       collective::OpenRendezvousStore(rendezvous));
  collective::RendezvousConfig alone = rendezvous;
  alone.rank = 0;
  alone.world_size = 1;
  alone.group_name = absl::StrCat(rendezvous.group_name, "-", name, "-", rendezvous.rank);
  collective::CommunicatorOptions options;
  options.timeout = timeout;
  return collective::ConnectGlooThrough(std::move(store), alone, options);
}

absl::Status RunLearnerRanks(
    const config::LearnerSection& l, const std::vector<std::string>& argv,
    const std::function<absl::Status(const collective::RendezvousConfig&)>& rank_main) {
  absl::StatusOr<collective::RendezvousConfig> rendezvous = learner::RendezvousForThisRank();
  if (rendezvous.ok()) return rank_main(*rendezvous);
  if (!absl::IsNotFound(rendezvous.status())) return rendezvous.status();
  // The launcher: check what can be checked once, then start the ranks.
  PRL_RETURN_IF_ERROR(StepConfigFrom(l, 1.0f).status());
  PRL_RETURN_IF_ERROR(OptimizerConfigFrom(l).status());
  PRL_RETURN_IF_ERROR(LearnerRankDevice(l, 0).status());
  learner::LaunchOptions launch;
  launch.world_size = l.world_size;
  launch.grace_after_failure = absl::Seconds(l.timeout_s + 5);
  return learner::RunLocalRanks(argv, launch);
}

}  // namespace prl::roles
