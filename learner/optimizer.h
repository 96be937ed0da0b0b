// ShardedOptimizer: AdamW (torch.optim.AdamW semantics, fp32 moments) or SGD over an
// FsdpModel's local shard, with global-norm gradient clipping across all ranks.
//
// Each rank updates only its shard; the moments live beside it, so optimizer memory falls as
// 1 / world_size with the parameters. Weight decay applies to matrices only
// (FsdpModel::decay_runs).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config/learner_kinds.h"
#include "core/buffer.h"
#include "core/enum_names.h"
#include "learner/fsdp.h"

namespace prl::learner {

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-5;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // clip the global gradient norm to this; 0 disables
};
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

struct OptimizerStepResult {
  double grad_norm = 0;   // global L2 norm before clipping
  double clip_scale = 1;  // factor applied to the gradient
};

class ShardedOptimizer {
 public:
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(const OptimizerConfig& config,
                                                                  FsdpModel* model);

  // A collective: every rank calls it after the step's backward passes. Updates the shard and
  // tells the model its parameters changed.
  absl::StatusOr<OptimizerStepResult> Step();

  int64_t step() const { return step_; }
  const OptimizerConfig& config() const { return config_; }
  // The moments (empty for SGD), for checkpoints.
  absl::Span<float> exp_avg();
  absl::Span<float> exp_avg_sq();
  void set_step(int64_t step) { step_ = step; }
  int64_t state_bytes() const { return static_cast<int64_t>(m_.bytes() + v_.bytes()); }

 private:
  ShardedOptimizer(const OptimizerConfig& config, FsdpModel* model)
      : config_(config), model_(model) {}

  OptimizerConfig config_;
  FsdpModel* model_;
  Buffer m_, v_;
  int64_t step_ = 0;
};

}  // namespace prl::learner
