// FsdpModel: a transformer whose parameters, gradients and optimizer state are sharded across
// the ranks of a Communicator (ZeRO-3 / PyTorch FSDP "full shard").
//
// Sharding unit: ParameterLayout's units (the embedding, each transformer block, the final
// norm with the untied head). A unit of n elements is padded to W * s (s = ceil(n / W)) and
// rank r owns its elements [r s, (r + 1) s); the local shard is the concatenation of this
// rank's slices of every unit, fp32 (the master weights). Padding stays zero.
//
// Passes (model/transformer.h UnitHooks): a unit's full parameters are all-gathered into a
// small pool of unit buffers right before the pass reads them, while the next unit is
// prefetched on the communication thread; after its backward, a unit's gradient is
// reduce-scattered (sum) on that thread into the local gradient shard while the previous
// unit's backward runs. With reshard_after_forward = false every unit stays gathered from
// forward to backward (more memory, fewer gathers). World size 1 binds the shard directly:
// no copies.
//
// Every collective runs on one communication thread, in the order the passes issue them; all
// ranks must make the same calls in the same order.
//
// On a GPU (NCCL) the communication thread's collectives run on the communicator's own stream
// while the compute kernels run on the pass's stream, so the next unit's all-gather overlaps
// the current unit's compute. Ordering across the two is by events (cuda::StreamMarker): a
// gather into a unit buffer, or a reduce-scatter of a unit gradient, first waits for the
// compute work queued before it was issued (the last reads of the buffer, the writes of the
// gradient); a collective's result is complete when its future is ready.
//
// Mixed precision (options.transformer.compute_dtype BF16, CUDA): the master weights, the
// gradients and the optimizer state stay fp32; the passes read a BF16 copy of each gathered
// unit (of the whole model at world size 1), made once per gather (per optimizer step).
//
// LoRA mode (FsdpOptions::lora, learner/fsdp_lora.cc): the model trains an adapter
// (model/lora.h) on a frozen base. The base is not sharded: every rank reads the node's one
// read-only mapping (learner/frozen_base.h) and no gradient of it is computed. What is sharded
// is the adapter, as one unit: the parameter, gradient and optimizer shards are the adapter's
// (param_shard() and the rest speak of the adapter, in LoraLayout order); the whole adapter is
// all-gathered once per optimizer step before the first forward, and each backward's adapter
// gradient is reduce-scattered into the gradient shard. LoadFull, GatherFullParams and
// GatherFullGrads take and give the adapter. CPU, fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collective/communicator.h"
#include "core/buffer.h"
#include "core/cuda_runtime.h"
#include "learner/comm_thread.h"
#include "learner/frozen_base.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/packed_batch.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace prl::learner {

// Where unit u lives: its elements [begin, begin + numel) of the full layout, padded to
// world_size * shard; rank r holds [r * shard, (r + 1) * shard) of it at shard_offset of its
// local shard.
struct UnitShard {
  int64_t begin = 0, numel = 0;
  int64_t shard = 0;
  int64_t shard_offset = 0;
};
std::vector<UnitShard> PlanShards(const ParameterLayout& layout, int world_size);
// Elements of the local shard (the same on every rank).
int64_t ShardElements(const std::vector<UnitShard>& plan);

struct FsdpOptions {
  bool reshard_after_forward = true;
  int prefetch_units = 1;  // units gathered ahead of the pass (0: gather on demand)
  // Gather and reduce-scatter every unit even at world size 1 (where the shard is otherwise
  // the whole model, bound directly): runs the sharded path on one device, for tests.
  bool always_gather = false;
  TransformerOptions transformer;
  // LoRA mode: the adapter's settings and the frozen base (not owned; outlives the model).
  std::optional<LoraConfig> lora;
  const FrozenBase* frozen_base = nullptr;
  // Context parallelism (model/context_parallel.h): the group this rank splits sequences with,
  // or null. Not owned.
  ContextExchange* context = nullptr;
  ContextAttention context_attention = ContextAttention::kAllGather;
};

// Bytes held by one rank.
struct FsdpMemory {
  int64_t param_shard_bytes = 0;  // fp32 master weights
  int64_t grad_shard_bytes = 0;   // fp32 gradient accumulator
  int64_t unit_buffer_bytes = 0;  // gathered parameter units and unit gradients (transient)
  int64_t compute_copy_bytes = 0;  // the BF16 copies the passes read (mixed precision)
  int64_t full_model_bytes = 0;   // one fp32 copy of the whole model, for comparison
  int64_t frozen_base_bytes = 0;  // LoRA mode: the mapped base (shared by the node's ranks)
  int64_t frozen_base_device_bytes = 0;  // LoRA on CUDA: its copy on the GPU (one per process)
};

class FsdpModel : public UnitHooks {
 public:
  // `comm` must outlive the model; its device is where the shards live.
  static absl::StatusOr<std::unique_ptr<FsdpModel>> Create(const ModelConfig& config,
                                                           collective::Communicator* comm,
                                                           const FsdpOptions& options);
  ~FsdpModel() override;

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  // LoRA mode: the adapter's layout (the trained parameters); null when every weight trains.
  const LoraLayout* lora_layout() const { return lora_layout_ ? &*lora_layout_ : nullptr; }
  const LoraConfig* lora_config() const { return options_.lora ? &*options_.lora : nullptr; }
  const FrozenBase* frozen_base() const { return options_.frozen_base; }
  // Elements of the trained parameters: the model's, or in LoRA mode the adapter's.
  int64_t trained_elements() const;
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }
  Device device() const { return device_; }

  // This rank's shard from the full trained parameters (every rank passes the same values).
  absl::Status LoadFull(absl::Span<const float> full);
  // The full parameters or the full accumulated gradient (an all-gather of every unit). A
  // collective: every rank calls it; every rank receives the result.
  absl::Status GatherFullParams(absl::Span<float> full);
  absl::Status GatherFullGrads(absl::Span<float> full);

  // Transformer passes over this rank's micro-batch; Backward accumulates into grad_shard().
  // With `shard`, `batch` is this rank's share of a batch split over options.context's group.
  absl::Status Forward(const PackedBatch& batch, float temperature, absl::Span<float> logprobs,
                       bool for_backward, const ContextShard* shard = nullptr);
  // The context-parallel group (FsdpOptions::context), or null.
  ContextExchange* context() const { return options_.context; }
  ContextAttention context_attention() const { return options_.context_attention; }
  // load_balancing_weight: Transformer::Backward's (the Qwen3-MoE load-balancing loss's).
  absl::Status Backward(absl::Span<const float> dlogprobs, double load_balancing_weight = 0.0);
  // LoRA mode at world size 1, a run of adapters on one rank (learner/joint_step.h): one pass
  // over several adapters' micro-batches packed into `batch`, segments[i].model's adapter on
  // tokens [begin, end) (whole sequences; this model among them or not, every model on this
  // model's frozen base). JointBackward accumulates each adapter's gradient into its own
  // model's grad_shard(). The last pass's results (entropies, routes, bytes) are this model's.
  struct JointSegment {
    FsdpModel* model = nullptr;
    int64_t begin = 0, end = 0;  // tokens
  };
  absl::Status JointForward(const PackedBatch& batch, float temperature,
                            absl::Span<float> logprobs, absl::Span<const JointSegment> segments);
  absl::Status JointBackward(absl::Span<const float> dlogprobs);
  // Each segment's load-balancing loss in the last JointForward (Qwen3-MoE; 0 for a dense model).
  absl::Span<const double> segment_load_balancing_losses() const {
    return transformer_.segment_load_balancing_losses();
  }
  // Qwen3-MoE: the router's own routes of the last Forward (Transformer::recomputed_routes).
  absl::Span<const uint8_t> recomputed_routes() const { return transformer_.recomputed_routes(); }
  // Transformer::entropies of the last Forward.
  absl::Span<const float> entropies() const { return transformer_.entropies(); }
  double load_balancing_loss() const { return transformer_.load_balancing_loss(); }
  // Transformer::last_pass_bytes: the last pass's workspace (activations and scratch).
  int64_t last_pass_bytes() const { return static_cast<int64_t>(transformer_.last_pass_bytes()); }
  const TransformerOptions& transformer_options() const { return options_.transformer; }
  absl::Status ZeroGrad();
  // Call after changing param_shard() (an optimizer step): drops gathered copies.
  absl::Status ParametersChanged();

  // The local shards (same length): the optimizer works on these.
  absl::Span<float> param_shard();
  absl::Span<float> grad_shard();
  // Whether local shard element i belongs to a tensor that takes weight decay (matrices:
  // embeddings, projections, head; not norms or biases), as runs [begin, end) of elements.
  const std::vector<std::pair<int64_t, int64_t>>& decay_runs() const { return decay_runs_; }

  // Runs fn on the communication thread after everything already queued there and after the
  // kernels the caller queued on its stream, and waits: use it for collectives outside the
  // passes (statistics, grad norm) so the order stays the same on every rank.
  absl::Status RunCollective(const std::function<absl::Status(collective::Communicator&)>& fn);

  FsdpMemory memory() const;

  // UnitHooks.
  absl::Status Acquire(int unit, Pass pass, bool need_params) override;
  absl::Status Release(int unit, Pass pass, bool gradient_done) override;

 private:
  using Unit = UnitShard;
  struct ParamSlot {
    Buffer buffer;
    Buffer compute;          // the BF16 copy of buffer (mixed precision)
    bool converted = false;  // compute holds this gather's values
    int unit = -1;  // the unit it holds, -1: none
    int users = 0;  // acquires not yet released
    int64_t last_use = 0;
    std::shared_future<absl::Status> ready;  // the gather that fills it
  };
  struct GradSlot {
    Buffer buffer;   // the full unit gradient
    Buffer scratch;  // this rank's reduce-scattered slice before it is added
    int unit = -1;
    bool active = false;  // bound and accumulating; its reduce-scatter not yet started
    std::shared_future<absl::Status> done;  // the reduce-scatter that empties it
  };

  FsdpModel(const ModelConfig& config, collective::Communicator* comm, const FsdpOptions& options);
  absl::Status Init();
  bool sharded() const { return comm_->world_size() > 1 || options_.always_gather; }
  bool mixed() const { return options_.transformer.compute_dtype != DType::kF32; }
  // The parameters the passes read: params_, or at world size 1 in mixed precision the
  // (refreshed) compute copy of the whole model.
  absl::StatusOr<const ModelParams*> PassParams();
  // Work queued so far on this thread's stream for the device, for the communication thread
  // to wait for (an empty marker on the CPU, whose kernels are done when they return).
  absl::StatusOr<std::shared_ptr<cuda::StreamMarker>> Mark();
  ParamSlot* FreeSlot();
  void StartGather(ParamSlot* slot, int unit);
  absl::Status GatherFull(Buffer& shard, absl::Span<float> full);
  void Prefetch(int unit);
  absl::StatusOr<GradSlot*> GradSlotFor(int unit);
  absl::Status WaitPending();
  Tensor ShardView(float* base, int unit) const;
  // LoRA mode (fsdp_lora.cc).
  bool lora() const { return lora_layout_.has_value(); }
  absl::Status InitLora();
  absl::Status GatherAdapter();  // the whole adapter into lora_full_, once per optimizer step
  absl::Status LoraBackward(absl::Span<const float> dlogprobs, double load_balancing_weight);

  ModelConfig config_;
  ParameterLayout layout_;
  collective::Communicator* comm_;
  FsdpOptions options_;
  Device device_;
  std::vector<Unit> units_;
  int64_t shard_elems_ = 0, max_unit_padded_ = 0;
  Buffer param_shard_, grad_shard_;
  Buffer compute_;  // world size 1, mixed precision: the BF16 copy of param_shard_
  ModelParams compute_params_;
  bool compute_stale_ = true;
  std::vector<std::pair<int64_t, int64_t>> decay_runs_;

  Transformer transformer_;
  ModelParams params_, grads_;  // views the passes read, rebound by Acquire when sharded
  std::vector<ParamSlot> param_slots_;
  std::vector<GradSlot> grad_slots_;
  std::vector<int> param_acquires_;  // per unit: acquires with parameters not yet released
  std::vector<std::shared_future<absl::Status>> pending_;  // reduce-scatters in flight
  int64_t clock_ = 0;
  // LoRA mode: the adapter's layout; its gathered weights and gradient (sharded only) and the
  // views the passes read (params_.lora, grads_.lora point at them).
  std::optional<LoraLayout> lora_layout_;
  Buffer lora_full_, lora_full_grad_, lora_scratch_;
  LoraParams lora_params_, lora_grads_;
  std::vector<LoraSegment> joint_params_, joint_grads_;  // the last JointForward's segments
  bool lora_gathered_ = false;
  CommThread comm_thread_;
};

}  // namespace prl::learner
