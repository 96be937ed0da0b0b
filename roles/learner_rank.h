// LearnerRank: one rank of a learner group, built in one place for every command that trains
// (`prl learner serve`, `prl learner step|train`, `prl bench learner`) on either device: the
// device (the CPU, or one GPU per rank), the communicator (Gloo on the CPU, NCCL on GPUs, both
// through the rendezvous of collective/rendezvous.h), the FSDP model holding the starting
// weights in the compute dtype, the sharded optimizer, and the step's loss and advantage
// settings, all from the learner section of the run config.
//
// RunLearnerRanks is the launcher half: a process started as a rank (RANK set, by prl's local
// launcher or by an external one such as a PyTorchJob or a StatefulSet) runs `rank_main`;
// otherwise it starts learner.world_size local ranks that re-execute `argv`.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collective/communicator.h"
#include "collective/rendezvous.h"
#include "config/run_config.h"
#include "learner/advantages.h"
#include "learner/fsdp.h"
#include "learner/frozen_base.h"
#include "learner/optimizer.h"
#include "learner/train_step.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace prl::roles {

struct LearnerRank {
  Device device;
  learner::StepConfig step;
  learner::OptimizerConfig optimizer_config;
  learner::AdvantageConfig advantages;
  std::unique_ptr<collective::Communicator> comm;
  // learner.context_parallel > 1: the communicator of this rank's group (ranks [g C, (g + 1) C))
  // and the exchange the model splits sequences with (FsdpOptions::context); null otherwise.
  std::unique_ptr<collective::Communicator> context_comm;
  std::unique_ptr<ContextExchange> context_exchange;
  // learner.lora_*: the node's read-only base the adapter trains on (outlives the models).
  std::unique_ptr<learner::FrozenBase> frozen_base;
  std::unique_ptr<learner::FsdpModel> model;
  std::unique_ptr<learner::ShardedOptimizer> optimizer;
  // learner.kl_coef > 0: the frozen reference model (step.reference points at it), sharded like
  // the policy over a communicator of its own; null otherwise.
  std::unique_ptr<collective::Communicator> reference_comm;
  std::unique_ptr<learner::FsdpModel> reference;

  int rank() const { return comm->rank(); }
  bool rank0() const { return comm->rank() == 0; }
};

struct LearnerRankOptions {
  float temperature = 1.0f;    // the actors' sampling temperature (the learner's log-probs use it)
  bool keep_gathered = false;  // keep gathered units from forward to backward (more memory)
  // LoRA mode: the node-local directory of the node's frozen base file while the ranks map it
  // (learner/frozen_base.h), the same on every rank of a node; empty: prl-<uid> (mode 0700) in
  // the system's temporary directory.
  std::string frozen_base_dir;
};

// learner.lora_*'s settings: learner.lora_init's adapter_config.json, or the lora_* keys;
// nullopt without LoRA. Errors name the setting.
absl::StatusOr<std::optional<LoraConfig>> AdapterSettings(const config::LearnerSection& learner);

// learner.lora_*'s adapter for `model`: read from learner.lora_init (a PEFT directory), or new
// (A random with a fixed seed, B zero). nullopt without LoRA.
absl::StatusOr<std::optional<LoraSet>> StartingAdapter(const config::LearnerSection& learner,
                                                       const ModelConfig& model);

// The step, optimizer and advantage settings of `learner`, validated. Launchers call these
// before starting ranks so that a bad setting fails once, not once per rank.
absl::StatusOr<learner::StepConfig> StepConfigFrom(const config::LearnerSection& learner,
                                                   float temperature);
absl::StatusOr<learner::OptimizerConfig> OptimizerConfigFrom(const config::LearnerSection& learner);
learner::AdvantageConfig AdvantageConfigFrom(const config::LearnerSection& learner);

// The FSDP settings of the learner section (compute dtype, reduction order, resharding), without
// LoRA (CreateLearnerRank adds the adapter and the frozen base).
learner::FsdpOptions FsdpOptionsFrom(const config::LearnerSection& learner,
                                     const LearnerRankOptions& options);

// A collective: every rank of the group calls it. `weights` are the full starting weights
// (every rank passes the same; they are sharded, not kept). With learner.kl_coef > 0 the
// reference model is loaded too: learner.kl_reference's weights, or the starting weights.
// With LoRA (learner.lora_rank or lora_init) `weights` are the frozen base: the node's first
// rank writes them to the node's file, every rank maps it, and the model trains the starting
// adapter (StartingAdapter).
absl::StatusOr<std::unique_ptr<LearnerRank>> CreateLearnerRank(
    const config::LearnerSection& learner, const LearnerRankOptions& options,
    const ParameterSet& weights, const collective::RendezvousConfig& rendezvous);

// The starting weights on demand (loaded once, kept by the caller): every rank reads them to
// train every weight; with LoRA only the node's first rank does (the others map the frozen base
// it writes), and a KL reference of the starting model is that base with an adapter of zeros.
using LoadStartingWeights = std::function<absl::StatusOr<const ParameterSet*>()>;
absl::StatusOr<std::unique_ptr<LearnerRank>> CreateLearnerRank(
    const config::LearnerSection& learner, const LearnerRankOptions& options,
    const ModelConfig& config, const LoadStartingWeights& load,
    const collective::RendezvousConfig& rendezvous);

// A run of adapters (roles/adapter_learner.h): one adapter's model on the rank's frozen base over
// `comm` (a world of one: each adapter trains on one rank), started as peft starts one (A random
// seeded by `seed`, B zero), and its AdamW optimizer at learning rate `lr`. `workspace`: the
// activations' workspace of the rank's adapters, which take turns (TransformerOptions::
// shared_workspace; null: the model's own).
struct AdapterModel {
  std::unique_ptr<learner::FsdpModel> model;
  std::unique_ptr<learner::ShardedOptimizer> optimizer;
};
absl::StatusOr<AdapterModel> CreateAdapterModel(const config::LearnerSection& learner,
                                                const LearnerRank& rank, const ModelConfig& model,
                                                const LoraConfig& lora, uint64_t seed, double lr,
                                                collective::Communicator* comm,
                                                std::shared_ptr<Arena> workspace);

// A communicator of this rank alone (a world of one), through the rendezvous' store, named
// `name` and the rank: a run of adapters' trainers step over it.
absl::StatusOr<std::unique_ptr<collective::Communicator>> ConnectRankAlone(
    const collective::RendezvousConfig& rendezvous, const std::string& name,
    absl::Duration timeout);

// Runs `rank_main` in a rank; otherwise validates `learner` and starts world_size local ranks
// re-executing `argv` (each with RANK, WORLD_SIZE, LOCAL_RANK and a FileStore rendezvous).
absl::Status RunLearnerRanks(
    const config::LearnerSection& learner, const std::vector<std::string>& argv,
    const std::function<absl::Status(const collective::RendezvousConfig&)>& rank_main);

}  // namespace prl::roles
