// FsdpModel's LoRA mode (learner/fsdp.h): the adapter sharded as one unit over the ranks, the
// base read from the node's frozen mapping, no base gradients.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/optimizer.h"
#include "learner/fsdp.h"

namespace prl::learner {

absl::Status FsdpModel::InitLora() {
  PRL_ASSIGN_OR_RETURN(LoraLayout layout, LoraLayout::Make(config_, *options_.lora));
  lora_layout_.emplace(std::move(layout));
  const int64_t W = comm_->world_size(), r = comm_->rank();
  const int64_t n = lora_layout_->num_elements();
  UnitShard unit;
  unit.numel = n;
  unit.shard = (n + W - 1) / W;
  units_ = {unit};
  shard_elems_ = unit.shard;
  max_unit_padded_ = unit.shard * W;
  const size_t shard_bytes = static_cast<size_t>(shard_elems_) * sizeof(float);
  PRL_ASSIGN_OR_RETURN(param_shard_, Buffer::AllocateZeroed(device_, shard_bytes));
  PRL_ASSIGN_OR_RETURN(grad_shard_, Buffer::AllocateZeroed(device_, shard_bytes));
  // Every adapter tensor is a matrix: weight decay applies to this rank's real elements.
  const int64_t own = std::clamp<int64_t>(n - r * unit.shard, 0, unit.shard);
  if (own > 0) decay_runs_.push_back({0, own});

  // The base's views: the node's mapping on the CPU; on CUDA the process's one copy on the GPU.
  PRL_ASSIGN_OR_RETURN(params_,
                       options_.frozen_base->BindOn(device_, options_.transformer.compute_dtype));
  params_.lora = &lora_params_;
  grads_ = ModelParams{};  // no layers: the base is frozen (model/transformer.h)
  grads_.lora = &lora_grads_;
  if (!sharded()) {  // the shard is the whole adapter
    lora_params_ = lora_layout_->Bind(static_cast<float*>(param_shard_.data()), device_);
    lora_grads_ = lora_layout_->Bind(static_cast<float*>(grad_shard_.data()), device_);
  } else {
    const size_t full_bytes = static_cast<size_t>(max_unit_padded_) * sizeof(float);
    PRL_ASSIGN_OR_RETURN(lora_full_, Buffer::AllocateZeroed(device_, full_bytes));
    PRL_ASSIGN_OR_RETURN(lora_full_grad_, Buffer::AllocateZeroed(device_, full_bytes));
    PRL_ASSIGN_OR_RETURN(lora_scratch_, Buffer::AllocateZeroed(device_, shard_bytes));
    lora_params_ = lora_layout_->Bind(static_cast<float*>(lora_full_.data()), device_);
    lora_grads_ = lora_layout_->Bind(static_cast<float*>(lora_full_grad_.data()), device_);
  }
  return absl::OkStatus();
}

absl::Status FsdpModel::GatherAdapter() {
  if (!sharded() || lora_gathered_) return absl::OkStatus();
  const Tensor in = ShardView(static_cast<float*>(param_shard_.data()), 0);
  const Tensor out(lora_full_.data(), DType::kF32, device_, {max_unit_padded_});
  PRL_RETURN_IF_ERROR(
      RunCollective([&](collective::Communicator& c) { return c.AllGather(in, out); }));
  lora_gathered_ = true;
  return absl::OkStatus();
}

absl::Status FsdpModel::LoraBackward(absl::Span<const float> dlogprobs,
                                     double load_balancing_weight) {
  if (!sharded()) {  // accumulates straight into the gradient shard
    return transformer_.Backward(params_, dlogprobs, grads_, nullptr, load_balancing_weight);
  }
  const Tensor full(lora_full_grad_.data(), DType::kF32, device_, {max_unit_padded_});
  PRL_RETURN_IF_ERROR(ZeroTensor(full));
  PRL_RETURN_IF_ERROR(
      transformer_.Backward(params_, dlogprobs, grads_, nullptr, load_balancing_weight));
  const Tensor mine(lora_scratch_.data(), DType::kF32, device_, {shard_elems_});
  PRL_RETURN_IF_ERROR(
      RunCollective([&](collective::Communicator& c) { return c.ReduceScatter(full, mine); }));
  kernels::AddInPlace(ShardView(static_cast<float*>(grad_shard_.data()), 0), mine);
  return absl::OkStatus();
}

absl::Status FsdpModel::JointForward(const PackedBatch& batch, float temperature,
                                     absl::Span<float> logprobs,
                                     absl::Span<const JointSegment> segments) {
  joint_params_.clear();
  joint_grads_.clear();
  for (size_t i = 0; i < segments.size(); ++i) {
    const FsdpModel* m = segments[i].model;
    if (m == nullptr || !m->lora() || m->sharded() || m->frozen_base() != frozen_base() ||
        !lora() || sharded()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "joint pass: segment ", i, ": expected an adapter's model at world size 1 on this "
          "model's frozen base (a run of adapters' rank), found ",
          m == nullptr              ? "none"
          : !m->lora() || !lora()   ? "a model that trains every weight"
          : m->sharded() || sharded() ? "a sharded adapter"
                                      : "another base"));
    }
    joint_params_.push_back({&m->lora_params_, segments[i].begin, segments[i].end});
    joint_grads_.push_back({&m->lora_grads_, segments[i].begin, segments[i].end});
  }
  ModelParams params = params_;
  params.lora = nullptr;
  params.lora_segments = joint_params_;
  return transformer_.Forward(params, batch, temperature, logprobs, /*for_backward=*/true);
}

absl::Status FsdpModel::JointBackward(absl::Span<const float> dlogprobs) {
  ModelParams params = params_, grads;
  params.lora = nullptr;
  params.lora_segments = joint_params_;
  grads.lora_segments = joint_grads_;  // each adapter's grad shard (world size 1: bound to it)
  return transformer_.Backward(params, dlogprobs, grads);
}

}  // namespace prl::learner
