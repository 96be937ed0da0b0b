#include "learner/fsdp.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/convert.h"
#include "kernels/optimizer.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::learner {

namespace {
constexpr int kGradSlots = 3;  // the unit in backward, one being reduce-scattered, tied embed
}

std::vector<UnitShard> PlanShards(const ParameterLayout& layout, int world_size) {
  std::vector<UnitShard> plan;
  int64_t offset = 0;
  for (const auto& [begin, end] : layout.unit_ranges()) {
    UnitShard u;
    u.begin = begin;
    u.numel = end - begin;
    u.shard = (u.numel + world_size - 1) / world_size;
    u.shard_offset = offset;
    offset += u.shard;
    plan.push_back(u);
  }
  return plan;
}

int64_t ShardElements(const std::vector<UnitShard>& plan) {
  return plan.empty() ? 0 : plan.back().shard_offset + plan.back().shard;
}

absl::StatusOr<std::unique_ptr<FsdpModel>> FsdpModel::Create(const ModelConfig& config,
                                                             collective::Communicator* comm,
                                                             const FsdpOptions& options) {
  if (options.prefetch_units < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fsdp prefetch_units: expected >= 0, found ", options.prefetch_units));
  }
  const DType compute = options.transformer.compute_dtype;
  if (compute != DType::kF32 && !(compute == DType::kBF16 && comm->device().is_cuda())) {
    return absl::InvalidArgumentError(
        absl::StrCat("fsdp compute dtype: expected f32, or bf16 on a CUDA device; found ",
                     DTypeName(compute), " on ", comm->device().ToString()));
  }
  if (options.lora.has_value()) {
    const bool device_ok = comm->device().is_cpu() || options.transformer.cuda_lora;
    if (options.frozen_base == nullptr || !device_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("fsdp with LoRA: expected a frozen base, on the CPU (or CUDA with "
                       "TransformerOptions::cuda_lora, written, not yet verified on a GPU); found ",
                       options.frozen_base == nullptr ? "no frozen base" : "a frozen base", " on ",
                       comm->device().ToString()));
    }
    PRL_RETURN_IF_ERROR(ValidateLoraConfig(*options.lora, config));
    if (ModelFingerprint(options.frozen_base->config()) != ModelFingerprint(config)) {
      return absl::InvalidArgumentError(
          "fsdp with LoRA: the frozen base was mapped for another model config");
    }
  }
  std::unique_ptr<FsdpModel> model(new FsdpModel(config, comm, options));
  PRL_RETURN_IF_ERROR(model->Init());
  return model;
}

FsdpModel::FsdpModel(const ModelConfig& config, collective::Communicator* comm,
                     const FsdpOptions& options)
    : config_(config),
      layout_(config),
      comm_(comm),
      options_(options),
      device_(comm->device()),
      transformer_(config, comm->device(), options.transformer) {}

FsdpModel::~FsdpModel() { WaitPending().IgnoreError(); }

absl::Status FsdpModel::Init() {
  if (options_.lora.has_value()) return InitLora();
  const int64_t W = comm_->world_size(), r = comm_->rank();
  units_ = PlanShards(layout_, static_cast<int>(W));
  shard_elems_ = ShardElements(units_);
  for (const Unit& u : units_) max_unit_padded_ = std::max(max_unit_padded_, u.shard * W);
  const size_t shard_bytes = static_cast<size_t>(shard_elems_) * sizeof(float);
  PRL_ASSIGN_OR_RETURN(param_shard_, Buffer::AllocateZeroed(device_, shard_bytes));
  PRL_ASSIGN_OR_RETURN(grad_shard_, Buffer::AllocateZeroed(device_, shard_bytes));

  // Weight decay on matrices only (embeddings, projections, head), as runs of the local shard.
  for (const ParamEntry& e : layout_.entries()) {
    if (e.shape.size() < 2) continue;
    for (const Unit& u : units_) {
      // This rank's slice of the unit, in full-layout coordinates, intersected with e.
      const int64_t own_begin = u.begin + std::min(r * u.shard, u.numel);
      const int64_t own_end = u.begin + std::min((r + 1) * u.shard, u.numel);
      const int64_t b = std::max(own_begin, e.offset), en = std::min(own_end, e.offset + e.numel);
      if (b < en) {
        const int64_t local = u.shard_offset + (b - own_begin);
        decay_runs_.push_back({local, local + (en - b)});
      }
    }
  }
  std::sort(decay_runs_.begin(), decay_runs_.end());

  if (!sharded()) {  // the shard is the whole model, laid out as ParameterLayout
    params_ = layout_.Bind(static_cast<float*>(param_shard_.data()), device_);
    grads_ = layout_.Bind(static_cast<float*>(grad_shard_.data()), device_);
    if (mixed()) {
      const DType dt = options_.transformer.compute_dtype;
      PRL_ASSIGN_OR_RETURN(
          compute_, Buffer::Allocate(device_, static_cast<size_t>(shard_elems_) * DTypeSize(dt)));
      compute_params_ = layout_.Bind(compute_.data(), dt, device_);
    }
    return absl::OkStatus();
  }
  params_.layers.resize(config_.num_hidden_layers);
  grads_.layers.resize(config_.num_hidden_layers);
  const int num_param_slots = options_.reshard_after_forward
                                  ? 3 + options_.prefetch_units
                                  : layout_.num_units() + options_.prefetch_units;
  const size_t unit_bytes = static_cast<size_t>(max_unit_padded_) * sizeof(float);
  param_slots_.resize(num_param_slots);
  for (ParamSlot& s : param_slots_) {
    PRL_ASSIGN_OR_RETURN(s.buffer, Buffer::AllocateZeroed(device_, unit_bytes));
    if (mixed()) {
      PRL_ASSIGN_OR_RETURN(
          s.compute, Buffer::Allocate(device_, static_cast<size_t>(max_unit_padded_) *
                                                   DTypeSize(options_.transformer.compute_dtype)));
    }
  }
  grad_slots_.resize(kGradSlots);
  for (GradSlot& s : grad_slots_) {
    PRL_ASSIGN_OR_RETURN(s.buffer, Buffer::AllocateZeroed(device_, unit_bytes));
    PRL_ASSIGN_OR_RETURN(s.scratch, Buffer::AllocateZeroed(device_, unit_bytes / W + 64));
  }
  param_acquires_.assign(layout_.num_units(), 0);
  return absl::OkStatus();
}

Tensor FsdpModel::ShardView(float* base, int unit) const {
  return Tensor(base + units_[unit].shard_offset, DType::kF32, device_, {units_[unit].shard});
}

absl::Span<float> FsdpModel::param_shard() {
  return {static_cast<float*>(param_shard_.data()), static_cast<size_t>(shard_elems_)};
}
absl::Span<float> FsdpModel::grad_shard() {
  return {static_cast<float*>(grad_shard_.data()), static_cast<size_t>(shard_elems_)};
}

absl::Status FsdpModel::RunCollective(
    const std::function<absl::Status(collective::Communicator&)>& fn) {
  // What the caller queued (the kernels that wrote what fn reads) is done first: on CUDA the
  // collectives run on NCCL's stream, which is not ordered with the caller's.
  PRL_ASSIGN_OR_RETURN(std::shared_ptr<cuda::StreamMarker> marker, Mark());
  return comm_thread_
      .Submit([&]() -> absl::Status {
        PRL_RETURN_IF_ERROR(marker->Wait());
        return fn(*comm_);
      })
      .get();
}

int64_t FsdpModel::trained_elements() const {
  return lora() ? lora_layout_->num_elements() : layout_.num_elements();
}

absl::Status FsdpModel::LoadFull(absl::Span<const float> full) {
  if (static_cast<int64_t>(full.size()) != trained_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FsdpModel::LoadFull: expected ", trained_elements(), " parameters",
                     lora() ? " (the adapter's)" : "", ", found ", full.size()));
  }
  PRL_RETURN_IF_ERROR(ParametersChanged());
  const int64_t r = comm_->rank();
  float* shard = static_cast<float*>(param_shard_.data());
  PRL_RETURN_IF_ERROR(param_shard_.Zero());  // the padding
  for (const Unit& u : units_) {
    const int64_t b = std::min(r * u.shard, u.numel), e = std::min((r + 1) * u.shard, u.numel);
    PRL_RETURN_IF_ERROR(CopyBytes(shard + u.shard_offset, device_, full.data() + u.begin + b,
                                  Device::Cpu(), static_cast<size_t>(e - b) * sizeof(float)));
  }
  return absl::OkStatus();
}

absl::Status FsdpModel::GatherFull(Buffer& shard, absl::Span<float> full) {
  if (static_cast<int64_t>(full.size()) != trained_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FsdpModel: expected a buffer of ", trained_elements(), " parameters",
                     lora() ? " (the adapter's)" : "", ", found ", full.size()));
  }
  PRL_RETURN_IF_ERROR(WaitPending());
  // The shard's last writes (optimizer, gradient accumulation) come before the gathers.
  if (device_.is_cuda()) PRL_RETURN_IF_ERROR(cuda::SynchronizeCurrentStream(device_.index));
  const int64_t W = comm_->world_size();
  PRL_ASSIGN_OR_RETURN(
      Buffer gathered,
      Buffer::Allocate(device_, static_cast<size_t>(max_unit_padded_) * sizeof(float)));
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const Unit& unit = units_[u];
    const Tensor out(gathered.data(), DType::kF32, device_, {unit.shard * W});
    PRL_RETURN_IF_ERROR(RunCollective([&](collective::Communicator& c) {
      return c.AllGather(ShardView(static_cast<float*>(shard.data()), u), out);
    }));
    PRL_RETURN_IF_ERROR(CopyBytes(full.data() + unit.begin, Device::Cpu(), gathered.data(), device_,
                                  static_cast<size_t>(unit.numel) * sizeof(float)));
  }
  return absl::OkStatus();
}

absl::Status FsdpModel::GatherFullParams(absl::Span<float> full) {
  return GatherFull(param_shard_, full);
}
absl::Status FsdpModel::GatherFullGrads(absl::Span<float> full) {
  return GatherFull(grad_shard_, full);
}

absl::Status FsdpModel::ParametersChanged() {
  for (ParamSlot& s : param_slots_) {
    if (s.ready.valid()) PRL_RETURN_IF_ERROR(s.ready.get());
    s.unit = -1;
    s.users = 0;
    s.ready = {};
    s.converted = false;
  }
  compute_stale_ = true;
  lora_gathered_ = false;
  return absl::OkStatus();
}

absl::StatusOr<const ModelParams*> FsdpModel::PassParams() {
  if (sharded() || !mixed()) return &params_;
  if (compute_stale_) {
    kernels::ConvertDType(
        Tensor(compute_.data(), options_.transformer.compute_dtype, device_, {shard_elems_}),
        Tensor(param_shard_.data(), DType::kF32, device_, {shard_elems_}));
    compute_stale_ = false;
  }
  return &compute_params_;
}

absl::StatusOr<std::shared_ptr<cuda::StreamMarker>> FsdpModel::Mark() {
  auto marker = std::make_shared<cuda::StreamMarker>();
  if (device_.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(*marker, cuda::StreamMarker::Record(device_.index));
  }
  return marker;
}

absl::Status FsdpModel::ZeroGrad() {
  PRL_RETURN_IF_ERROR(WaitPending());
  return ZeroTensor(Tensor(grad_shard_.data(), DType::kF32, device_, {shard_elems_}));
}

absl::Status FsdpModel::Forward(const PackedBatch& batch, float temperature,
                                absl::Span<float> logprobs, bool for_backward,
                                const ContextShard* shard) {
  if (lora()) {
    PRL_RETURN_IF_ERROR(GatherAdapter());
    return transformer_.Forward(params_, batch, temperature, logprobs, for_backward, nullptr,
                                shard);
  }
  PRL_ASSIGN_OR_RETURN(const ModelParams* params, PassParams());
  return transformer_.Forward(*params, batch, temperature, logprobs, for_backward,
                              sharded() ? this : nullptr, shard);
}

absl::Status FsdpModel::Backward(absl::Span<const float> dlogprobs, double load_balancing_weight) {
  if (lora()) return LoraBackward(dlogprobs, load_balancing_weight);
  PRL_ASSIGN_OR_RETURN(const ModelParams* params, PassParams());
  const absl::Status pass = transformer_.Backward(
      *params, dlogprobs, grads_, sharded() ? this : nullptr, load_balancing_weight);
  const absl::Status pending = WaitPending();
  PRL_RETURN_IF_ERROR(pass);
  return pending;
}

// ---- Unit buffers --------------------------------------------------------------------------

FsdpModel::ParamSlot* FsdpModel::FreeSlot() {
  ParamSlot* best = nullptr;
  for (ParamSlot& s : param_slots_) {
    if (s.users > 0) continue;
    const bool settled =
        !s.ready.valid() || s.ready.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    if (!settled) continue;  // a prefetch in flight
    if (s.unit < 0) return &s;
    if (best == nullptr || s.last_use < best->last_use) best = &s;
  }
  return best;
}

void FsdpModel::StartGather(ParamSlot* slot, int unit) {
  const Unit& u = units_[unit];
  slot->unit = unit;
  slot->last_use = ++clock_;
  slot->converted = false;
  const Tensor in = ShardView(static_cast<float*>(param_shard_.data()), unit);
  const Tensor out(slot->buffer.data(), DType::kF32, device_, {u.shard * comm_->world_size()});
  // The compute work queued so far (the buffer's last readers, the shard's last writer) must
  // be done before the gather overwrites the buffer.
  absl::StatusOr<std::shared_ptr<cuda::StreamMarker>> marker = Mark();
  slot->ready = comm_thread_.Submit([this, in, out, marker] {
    PRL_RETURN_IF_ERROR(marker.status());
    PRL_RETURN_IF_ERROR((*marker)->Wait());
    return comm_->AllGather(in, out);
  });
}

void FsdpModel::Prefetch(int unit) {
  if (unit < 0 || unit >= layout_.num_units()) return;
  for (const ParamSlot& s : param_slots_) {
    if (s.unit == unit) return;
  }
  ParamSlot* slot = FreeSlot();
  if (slot != nullptr) StartGather(slot, unit);
}

absl::Status FsdpModel::Acquire(int unit, Pass pass, bool need_params) {
  if (!sharded()) return absl::OkStatus();
  if (need_params) {
    ParamSlot* slot = nullptr;
    for (ParamSlot& s : param_slots_) {
      if (s.unit == unit) slot = &s;
    }
    if (slot == nullptr) {
      slot = FreeSlot();
      if (slot == nullptr) {
        return absl::InternalError(absl::StrCat("fsdp: no free unit buffer for unit ", unit, " (",
                                                param_slots_.size(), " buffers)"));
      }
      StartGather(slot, unit);
    }
    PRL_RETURN_IF_ERROR(slot->ready.get());
    ++slot->users;
    ++param_acquires_[unit];
    slot->last_use = ++clock_;
    if (mixed()) {
      const DType dt = options_.transformer.compute_dtype;
      const int64_t n = units_[unit].numel;
      if (!slot->converted) {
        kernels::ConvertDType(Tensor(slot->compute.data(), dt, device_, {n}),
                              Tensor(slot->buffer.data(), DType::kF32, device_, {n}));
        slot->converted = true;
      }
      layout_.BindUnit(unit, slot->compute.data(), dt, device_, &params_);
    } else {
      layout_.BindUnit(unit, static_cast<float*>(slot->buffer.data()), device_, &params_);
    }
    const int last = layout_.num_units() - 1;
    for (int k = 1; k <= options_.prefetch_units; ++k) {
      const int next = pass == Pass::kForward ? unit + k : unit - k;
      // Backward reads no parameters of unit 0 (the embedding's gradient is a scatter).
      if (pass == Pass::kForward ? next <= last : next >= 1) Prefetch(next);
    }
  }
  if (pass == Pass::kBackward) {
    PRL_ASSIGN_OR_RETURN(GradSlot * slot, GradSlotFor(unit));
    layout_.BindUnit(unit, static_cast<float*>(slot->buffer.data()), device_, &grads_);
  }
  return absl::OkStatus();
}

absl::StatusOr<FsdpModel::GradSlot*> FsdpModel::GradSlotFor(int unit) {
  for (GradSlot& s : grad_slots_) {
    if (s.active && s.unit == unit) return &s;  // still accumulating (tied embedding)
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (GradSlot& s : grad_slots_) {
      if (s.active) continue;
      if (s.done.valid()) {
        if (attempt == 0 && s.done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          continue;
        }
        PRL_RETURN_IF_ERROR(s.done.get());
        s.done = {};
      }
      const Unit& u = units_[unit];
      s.unit = unit;
      s.active = true;
      PRL_RETURN_IF_ERROR(ZeroTensor(
          Tensor(s.buffer.data(), DType::kF32, device_, {u.shard * comm_->world_size()})));
      return &s;
    }
  }
  return absl::InternalError(absl::StrCat("fsdp: no free gradient buffer for unit ", unit));
}

absl::Status FsdpModel::Release(int unit, Pass pass, bool gradient_done) {
  if (!sharded()) return absl::OkStatus();
  if (param_acquires_[unit] > 0) {
    --param_acquires_[unit];
    for (ParamSlot& s : param_slots_) {
      if (s.unit == unit && s.users > 0) --s.users;
    }
  }
  if (pass != Pass::kBackward || !gradient_done) return absl::OkStatus();
  GradSlot* slot = nullptr;
  for (GradSlot& s : grad_slots_) {
    if (s.active && s.unit == unit) slot = &s;
  }
  if (slot == nullptr) {
    return absl::InternalError(absl::StrCat("fsdp: unit ", unit, " released without gradient"));
  }
  slot->active = false;
  const Unit& u = units_[unit];
  const Tensor full(slot->buffer.data(), DType::kF32, device_, {u.shard * comm_->world_size()});
  const Tensor mine(slot->scratch.data(), DType::kF32, device_, {u.shard});
  const Tensor accumulated = ShardView(static_cast<float*>(grad_shard_.data()), unit);
  // The unit's gradient kernels queued so far must be done before the reduce-scatter reads it.
  absl::StatusOr<std::shared_ptr<cuda::StreamMarker>> marker = Mark();
  slot->done = comm_thread_.Submit([this, full, mine, accumulated, marker] {
    PRL_RETURN_IF_ERROR(marker.status());
    PRL_RETURN_IF_ERROR((*marker)->Wait());
    PRL_RETURN_IF_ERROR(comm_->ReduceScatter(full, mine));
    kernels::AddInPlace(accumulated, mine);
    // Done means done: the accumulation runs on this thread's stream.
    if (device_.is_cuda()) PRL_RETURN_IF_ERROR(cuda::SynchronizeCurrentStream(device_.index));
    return absl::OkStatus();
  });
  pending_.push_back(slot->done);
  return absl::OkStatus();
}

absl::Status FsdpModel::WaitPending() {
  absl::Status first;
  for (auto& f : pending_) {
    if (f.valid()) first.Update(f.get());
  }
  pending_.clear();
  for (GradSlot& s : grad_slots_) {
    if (s.done.valid()) first.Update(s.done.get());
    s.done = {};
    s.active = false;
  }
  return first;
}

FsdpMemory FsdpModel::memory() const {
  FsdpMemory m;
  m.param_shard_bytes = shard_elems_ * static_cast<int64_t>(sizeof(float));
  m.grad_shard_bytes = m.param_shard_bytes;
  for (const ParamSlot& s : param_slots_) m.unit_buffer_bytes += s.buffer.bytes();
  for (const GradSlot& s : grad_slots_) m.unit_buffer_bytes += s.buffer.bytes() + s.scratch.bytes();
  m.compute_copy_bytes = compute_.bytes();
  for (const ParamSlot& s : param_slots_) m.compute_copy_bytes += s.compute.bytes();
  m.unit_buffer_bytes +=
      static_cast<int64_t>(lora_full_.bytes() + lora_full_grad_.bytes() + lora_scratch_.bytes());
  m.full_model_bytes = layout_.num_elements() * static_cast<int64_t>(sizeof(float));
  if (options_.frozen_base != nullptr && lora()) {
    m.frozen_base_bytes = options_.frozen_base->bytes();
    m.frozen_base_device_bytes = options_.frozen_base->device_bytes();
  }
  return m;
}

}  // namespace prl::learner
