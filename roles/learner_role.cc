#include "roles/learner_role.h"

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_model_dir.h"
#include "core/status_macros.h"
#include "roles/adapter_learner.h"
#include "roles/learner_rank.h"
#include "roles/learner_step_sink.h"
#include "roles/replay_role.h"
#include "roles/role_metrics.h"
#include "roles/role_security.h"
#include "roles/weight_transports.h"

namespace prl::roles {

namespace {

// The run's replay segment: joined when it exists (this learner restarted; the actors still
// write into it), else created.
absl::StatusOr<std::unique_ptr<ReplayBuffer>> OpenOrCreateReplay(const config::RunConfig& c) {
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> opened = ReplayBuffer::Open(c.replay_segment());
  if (!absl::IsNotFound(opened.status())) return opened;
  return ReplayBuffer::Create(c.replay_segment(), ReplayConfigFrom(c));
}

// What only rank 0 holds: the replay segment, the publisher, /metrics and the step sink.
struct RankZero {
  std::unique_ptr<ReplayBuffer> replay;
  WeightEndpoint weights;
  std::unique_ptr<RoleMetrics> endpoint;
  std::unique_ptr<StepSink> sink;
};

absl::StatusOr<RankZero> StartRankZero(const config::RunConfig& c, const ModelConfig& model,
                                       Device device, std::unique_ptr<RoleMetrics> endpoint) {
  RankZero z;
  z.endpoint = std::move(endpoint);
  PRL_ASSIGN_OR_RETURN(z.replay, OpenOrCreateReplay(c));
  PRL_ASSIGN_OR_RETURN(const WeightSpec spec, RunWeightSpec(c, model));
  PRL_ASSIGN_OR_RETURN(z.weights, StartWeightPublisher(c, spec, device));
  PRL_ASSIGN_OR_RETURN(z.sink, StepSink::Create(c, *z.endpoint->registry, z.replay.get()));
  WeightPublisher* publisher = z.weights.publisher.get();  // ready: checkpoint loaded, published
  z.endpoint->SetReadiness([publisher] {
    return publisher->stats().versions_published > 0
               ? absl::OkStatus()
               : absl::UnavailableError("loading the checkpoint; no weights published yet");
  });
  return z;
}

// ", LoRA r=8 alpha=16 ... on a frozen base (its adapter alone is published)" or "".
std::string Lora(const LearnerRank& rank) {
  const LoraConfig* lora = rank.model->lora_config();
  if (lora == nullptr) return "";
  return absl::StrCat(", LoRA ", LoraFingerprint(*lora),
                      " on a frozen base (the adapter alone is published)");
}

void PrintStart(const config::RunConfig& c, const LearnerRank& rank, const RankZero& z) {
  const config::LearnerSection& l = c.learner;
  std::printf(
      "learner: %d rank(s) on %s (%s)%s, %s loss, %s advantages, %s lr %g, %lld groups per "
      "step, max lag %lld; replay %s (%lld MiB); weights over %s%s; checkpoints every %lld steps "
      "in %s\n",
      l.world_size, rank.device.ToString().c_str(),
      std::string(EnumName(kComputeDTypeNames, l.dtype)).c_str(), Lora(rank).c_str(),
      std::string(learner::LossKindName(l.loss)).c_str(),
      std::string(EnumName(learner::kAdvantageEstimatorNames, l.advantage)).c_str(),
      std::string(EnumName(learner::kOptimizerKindNames, l.optimizer)).c_str(), l.lr,
      static_cast<long long>(l.groups_per_step), static_cast<long long>(l.max_lag),
      c.replay_segment().c_str(), static_cast<long long>(c.replay.capacity_mb),
      z.weights.description.c_str(), z.endpoint->Describe().c_str(),
      static_cast<long long>(l.checkpoint_every), c.checkpoint_dir().c_str());
  std::fflush(stdout);
}

absl::Status ServeRank(const config::RunConfig& c, const collective::RendezvousConfig& rendezvous,
                       const std::atomic<bool>& stop) {
  // A run of adapters (docs/tenants.md): one trainer per adapter on a shared frozen base.
  if (c.coordinator.adapters) return RunAdapterLearner(c, rendezvous, stop);
  // The endpoint before the slow part (rendezvous, weights): rank 0's, and every rank's when
  // each runs on its own node (an outside launcher: no local FileStore), for its probes.
  std::unique_ptr<RoleMetrics> endpoint;
  if (rendezvous.rank == 0 || rendezvous.file_store_dir.empty()) {
    PRL_ASSIGN_OR_RETURN(endpoint, StartRoleMetrics(c.metrics));
  }
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(c.model.path));
  std::optional<ParameterSet> full;  // read on demand (with LoRA: by the node's first rank only)
  auto load = [&]() -> absl::StatusOr<const ParameterSet*> {
    if (!full.has_value()) {
      PRL_ASSIGN_OR_RETURN(full, LoadModel(c.model.path, Device::Cpu()));
    }
    return &*full;
  };
  LearnerRankOptions rank_options;
  rank_options.temperature = static_cast<float>(c.task.temperature);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<LearnerRank> rank,
                       CreateLearnerRank(c.learner, rank_options, model, load, rendezvous));
  full.reset();  // sharded (or mapped): not kept
  RankZero z;
  learner::LearnerServiceOptions options = LearnerServiceOptionsFrom(c);
  options.step = rank->step;
  if (rank->rank0()) {
    PRL_ASSIGN_OR_RETURN(z, StartRankZero(c, model, rank->device, std::move(endpoint)));
    PrintStart(c, *rank, z);
  } else if (endpoint != nullptr) {
    endpoint->SetReadiness([] { return absl::OkStatus(); });  // in the group, with its shard
  }
  if (z.sink != nullptr && z.sink->has_coordinator()) {
    StepSink* sink = z.sink.get();  // outlives the service
    options.reopen_stale = [sink](const std::vector<learner::StalePrompt>& prompts) {
      return sink->ReopenPrompts(prompts);
    };
    options.retired_prompt_sets = [sink] { return sink->RetiredPromptSets(); };
    if (c.learner.drop_uniform_groups) {  // (LearnerServiceOptions::on_started)
      options.on_started = [sink](int64_t version, int64_t consumed) {
        sink->Started(version, consumed);
      };
    }
  }
  learner::LearnerService service(rank->model.get(), rank->optimizer.get(), z.replay.get(),
                                  z.weights.publisher.get(), options);
  if (z.sink != nullptr) z.sink->SetGroupsInStep([&service] { return service.groups_in_step(); });
  absl::Status run = service.Run(&stop, [&](const learner::LearnerStepReport& step) {
    z.sink->Observe(step, service.groups_consumed(), service.dead_letters());
  });
  if (z.sink != nullptr) z.sink->SetGroupsInStep(nullptr);  // the service goes first
  if (z.endpoint != nullptr) z.endpoint->SetReadiness(nullptr);
  return run;
}

}  // namespace

learner::LearnerServiceOptions LearnerServiceOptionsFrom(const config::RunConfig& c) {
  learner::LearnerServiceOptions o;
  o.groups_per_step = c.learner.groups_per_step;
  o.max_lag = c.learner.max_lag;
  o.max_steps = c.learner.steps;
  o.checkpoint.dir = c.checkpoint_dir();
  o.checkpoint.every = c.learner.checkpoint_every;
  o.checkpoint.keep_last = c.learner.keep_checkpoints;
  o.advantages = AdvantageConfigFrom(c.learner);
  o.lr = c.learner.lr;
  o.dead_letter_path = c.dead_letter_file("learner");
  return o;
}

absl::Status RunLearnerRole(const config::RunConfig& c, const std::vector<std::string>& argv,
                            const std::atomic<bool>& stop) {
  if (c.model.path.empty()) {
    return absl::InvalidArgumentError(
        "model.path is empty: the learner needs the starting "
        "weights; set model.path or pass --model");
  }
  PRL_RETURN_IF_ERROR(ConfigureRoleSecurity(c, rpc::Role::kLearner, {rpc::Role::kActor}));
  return RunLearnerRanks(c.learner, argv, [&](const collective::RendezvousConfig& rendezvous) {
    return ServeRank(c, rendezvous, stop);
  });
}

}  // namespace prl::roles
