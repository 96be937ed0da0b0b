// Sharded learner checkpoints: every rank writes its own shard of the parameters and of the
// optimizer state, plus the training state (step, weight version, data position, RNG state),
// so that a restarted learner resumes bit-identically.
//
// Layout of a checkpoint directory:
//   step-00000012/rank-00000-of-00002.safetensors   param_shard, exp_avg, exp_avg_sq (F32, 1-D)
//                                                   + metadata: the training state and shapes
//   step-00000012/config.json                       the model's config
//   step-00000012/adapter_config.json               LoRA mode: the adapter's (PEFT) settings
//   latest                                          "step-00000012"
// A save writes step-N.partial/ first; after every rank has written (a barrier), rank 0
// renames it to step-N/ and then atomically rewrites `latest`. Every file is fsync'd, and every
// directory after an entry in it was created or renamed, before `latest` names the step: a
// crash at any moment leaves `latest` naming a complete checkpoint (or none); partial
// directories are removed by the next save. Only the newest keep_last checkpoints are kept.
// Each shard's metadata holds the XXH3-64 of each of its tensors ("xxh3_<tensor>").
//
// Loading checks the shards (metadata, sizes, checksums). If `latest` names a checkpoint that
// is missing, incomplete or damaged, the newest complete one is loaded instead and stderr says
// which was skipped and why; every rank loads the same step.
//
// Resuming needs the same model config, world size and optimizer; anything else is an error
// saying which (resharding to another world size is not supported yet: export, then start a
// new run from the exported model).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace prl::learner {

struct TrainingState {
  int64_t step = 0;            // optimizer steps taken
  int64_t weight_version = 0;  // version of the weights after `step`
  int64_t data_position = 0;   // training samples consumed
  uint64_t rng_seed = 0;       // the learner's Philox stream (key, next counter)
  uint64_t rng_counter = 0;
};

// Files rank 0 adds to a checkpoint's directory before it becomes complete (called with the
// directory being written): they are part of the checkpoint, or absent with it.
using CheckpointExtras = std::function<absl::Status(const std::string& dir)>;

// A collective: every rank calls it.
absl::Status SaveCheckpoint(const std::string& dir, FsdpModel& model, ShardedOptimizer& optimizer,
                            const TrainingState& state, int keep_last = 2,
                            const CheckpointExtras& extras = nullptr);

// The directory of the checkpoint of `step` in `dir` (where its extras are).
std::string CheckpointStepDir(const std::string& dir, int64_t step);

// A collective: loads the checkpoint `latest` names (or, if it cannot be used, the newest
// complete one) into model and optimizer. nullopt when the directory has none (a fresh run);
// DataLoss when it has some but none is complete.
absl::StatusOr<std::optional<TrainingState>> LoadLatestCheckpoint(const std::string& dir,
                                                                  FsdpModel& model,
                                                                  ShardedOptimizer& optimizer);

// `prl export`: the full trained parameters of the latest checkpoint in `dir` (the model's, or
// a LoRA checkpoint's adapter; read from every rank's file and the config.json and
// adapter_config.json saved beside them; no collectives; falling back as above), and its
// training state.
struct ExportedCheckpoint {
  std::optional<ParameterSet> params;  // a checkpoint of every weight
  std::optional<LoraSet> adapter;      // a LoRA checkpoint (learner.lora_*): the adapter
  TrainingState state;
  std::string path;  // the step directory read
};
absl::StatusOr<ExportedCheckpoint> ReadCheckpointFull(const std::string& dir);

}  // namespace prl::learner
