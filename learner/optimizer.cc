#include "learner/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/optimizer.h"

namespace prl::learner {

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  auto bad = [](absl::string_view field, absl::string_view expected, double found) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.", field, ": expected ", expected, ", found ", found));
  };
  if (!(c.lr > 0) || !std::isfinite(c.lr)) return bad("lr", "> 0 and finite", c.lr);
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad("beta1", "in [0, 1)", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad("beta2", "in [0, 1)", c.beta2);
  if (!(c.eps > 0)) return bad("eps", "> 0", c.eps);
  if (!(c.weight_decay >= 0)) return bad("weight_decay", ">= 0", c.weight_decay);
  if (!(c.max_grad_norm >= 0)) return bad("max_grad_norm", ">= 0 (0 disables)", c.max_grad_norm);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(
    const OptimizerConfig& config, FsdpModel* model) {
  PRL_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  std::unique_ptr<ShardedOptimizer> opt(new ShardedOptimizer(config, model));
  if (config.kind == OptimizerKind::kAdamW) {
    const size_t bytes = model->param_shard().size() * sizeof(float);
    const Device device = model->device();
    PRL_ASSIGN_OR_RETURN(opt->m_, Buffer::AllocateZeroed(device, bytes));
    PRL_ASSIGN_OR_RETURN(opt->v_, Buffer::AllocateZeroed(device, bytes));
  }
  return opt;
}

absl::Span<float> ShardedOptimizer::exp_avg() {
  return {static_cast<float*>(m_.data()), m_.bytes() / sizeof(float)};
}
absl::Span<float> ShardedOptimizer::exp_avg_sq() {
  return {static_cast<float*>(v_.data()), v_.bytes() / sizeof(float)};
}

absl::StatusOr<OptimizerStepResult> ShardedOptimizer::Step() {
  const Device device = model_->device();
  const absl::Span<float> p = model_->param_shard(), g = model_->grad_shard();
  const int64_t n = static_cast<int64_t>(p.size());
  const Tensor param(p.data(), DType::kF32, device, {n}), grad(g.data(), DType::kF32, device, {n});

  // Global norm: each rank's sum of squares (padding is zero), summed in float64.
  double sum_sq = kernels::SumOfSquares(grad);
  PRL_RETURN_IF_ERROR(model_->RunCollective([&](collective::Communicator& c) {
    return c.AllReduceHost({&sum_sq, 1}, collective::ReduceOp::kSum);
  }));
  OptimizerStepResult result;
  result.grad_norm = std::sqrt(sum_sq);
  if (!std::isfinite(result.grad_norm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: the gradient norm is ", result.grad_norm,
        " (a non-finite loss or gradient); the step is skipped, parameters are unchanged"));
  }
  // torch.nn.utils.clip_grad_norm_: scale = max_norm / (norm + 1e-6), applied when < 1.
  if (config_.max_grad_norm > 0) {
    const double scale = config_.max_grad_norm / (result.grad_norm + 1e-6);
    if (scale < 1) result.clip_scale = scale;
  }
  ++step_;
  // Runs of the shard alternate between decayed and not: walk them in order.
  const auto& decay = model_->decay_runs();
  auto update = [&](int64_t begin, int64_t end, bool decayed) {
    if (begin >= end) return;
    if (config_.kind == OptimizerKind::kAdamW) {
      kernels::AdamWStep s;
      s.lr = static_cast<float>(config_.lr);
      s.beta1 = static_cast<float>(config_.beta1);
      s.beta2 = static_cast<float>(config_.beta2);
      s.eps = static_cast<float>(config_.eps);
      s.weight_decay = static_cast<float>(config_.weight_decay);
      s.step = step_;
      s.grad_scale = static_cast<float>(result.clip_scale);
      const Tensor m(m_.data(), DType::kF32, device, {n}), v(v_.data(), DType::kF32, device, {n});
      kernels::AdamWUpdate(param, grad, m, v, begin, end, decayed, s);
    } else {
      kernels::SgdUpdate(param, grad, begin, end, decayed, static_cast<float>(config_.lr),
                         static_cast<float>(config_.weight_decay),
                         static_cast<float>(result.clip_scale));
    }
  };
  int64_t at = 0;
  for (const auto& [begin, end] : decay) {
    update(at, begin, false);
    update(begin, end, true);
    at = end;
  }
  update(at, n, false);
  PRL_RETURN_IF_ERROR(model_->ParametersChanged());
  return result;
}

}  // namespace prl::learner
