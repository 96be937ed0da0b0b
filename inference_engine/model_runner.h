// ModelRunner: executes one scheduled step on the model (nano-vllm's model_runner).
//
// It packs the step's chunks into one token batch, runs the shared decoder layers
// (model/decoder_layer.h) with paged attention — each layer first writes the step's K/V into
// the cache slots of its block tables, then attends over the cached context — and returns the
// logits (F32) of the rows that are sampled. Activations live in an arena that only grows, in
// the compute dtype (F32, or BF16 on CUDA). The step's metadata (tokens, positions, slots, block
// tables, ...) reaches the device in two asynchronous copies (StepTransfer); nothing is read
// back, so Execute only queues work on the current stream. Sample then draws the step's tokens
// from those logits on their device (kernels/sampling.h, as vLLM v1's worker samples) and ends
// the step: only the tokens, their behaviour log-probs and the rows whose alternatives were
// asked for come back to the host.
//
// CUDA graphs (vLLM's "cudagraph" decode): a step in which every sequence decodes one token and
// is sampled runs as a replay of a graph captured for the smallest batch bucket (1, 2, 4, 8,
// 16, 24, 32, ... up to max_graph_batch) that holds it; the rows beyond the batch are padding
// (no KV write, one key of attention, logits ignored). Each bucket is captured once, on its
// first use, after a warm-up run. The buckets share one arena laid out for the largest (replays
// are serialised on one stream, as in vLLM), so the graphs cost one bucket's activations. The
// graphs bake in the weight pointers, so they are kept per ModelParams object (by its address):
// the engine passes the same views every step, or alternates between fixed ones (its
// double-buffered weights, weight_slots.h) whose graphs CaptureAlsoFor captures together. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/arena.h"
#include "inference_engine/cuda_graph.h"
#include "inference_engine/kv_cache.h"
#include "inference_engine/scheduler.h"
#include "inference_engine/step_transfer.h"
#include "kernels/reduction_order.h"
#include "model/config.h"
#include "model/decoder_layer.h"
#include "model/parameters.h"

namespace prl {

struct ModelRunnerOptions {
  Device device = Device::Cpu();
  DType dtype = DType::kF32;  // activations (and the KV cache): F32, or BF16 on CUDA
  kernels::ReductionOrder order = kernels::ReductionOrder::kFast;
  bool cuda_graphs = true;         // CUDA only: replay captured decode steps
  int32_t max_graph_batch = 256;   // the largest decode batch with a graph
  int64_t max_blocks_per_seq = 1;  // block-table width of the graphs (max model length / block)
  // CUDA, fast order (EngineOptions::tuned_kernels): residuals in the GEMMs, RoPE fused with the
  // KV write, and graph decode steps without the attention's tile plan.
  bool tuned_kernels = false;
  // CUDA, fast order (EngineOptions::norm_in_gemm): RMSNorms fused into small projections.
  bool norm_in_gemm = false;
};

// The tokens one step drew, one per draw in Sample's order.
struct SampledTokens {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // the behaviour log-prob of each token
  // Per token, with SamplingParams::top_logprobs (multi-turn): the most likely tokens of the
  // distribution it was drawn from (id, log-prob), most likely first; empty otherwise.
  std::vector<std::vector<std::pair<int32_t, float>>> alternatives;
};

struct GraphStats {
  int64_t captures = 0;
  double capture_seconds = 0.0;  // warm-up + capture + instantiate, all buckets
  int64_t replays = 0;
  int64_t eager_steps = 0;
};

class ModelRunner {
 public:
  ModelRunner(const ModelConfig& config, KvCache* cache, const ModelRunnerOptions& options);
  ~ModelRunner();

  // Queues `step` with `params` on the current stream. On success *logits is (R, V) F32: the
  // logits of the last row of every chunk with samples = true, in chunk order (valid until the
  // next Execute). chunk_adapters: empty (params.lora, if any, for every row), or one LoRA
  // adapter (model/lora.h; null: none) per chunk of the step, each applied to its chunks' rows
  // (the step runs eagerly; the engine admits adapters on CUDA with EngineOptions::cuda_lora).
  absl::Status Execute(const ModelParams& params, const SchedulerOutput& step, Tensor* logits,
                       absl::Span<const LoraParams* const> chunk_adapters = {});

  // Draws from Execute's `logits` and ends the step (transfer().Finish()): one draw per sample
  // of every chunk with samples = true, in chunk order — the sequence's next token, or, for the
  // leader of a group not yet forked, the first token of each of its n samples (in sample
  // order) from its one row. Each row draws with its request's params, stream = sample index,
  // index = the sample's completion length (kernels/sampling.h).
  absl::StatusOr<SampledTokens> Sample(const SchedulerOutput& step, const Tensor& logits);

  // Forgets the captured graphs (they are recaptured on their next use).
  void ResetGraphs();
  // A bucket's graph captured for one of `params` is captured for the others too, so that
  // switching between them never captures (they must outlive the runner's use of them).
  void CaptureAlsoFor(std::vector<const ModelParams*> params) { twins_ = std::move(params); }
  const GraphStats& graph_stats() const { return graph_stats_; }
  const ModelRunnerOptions& options() const { return options_; }
  // Qwen3-MoE (CPU): the experts the last Execute routed each of its rows to, (T, Lm, K)
  // token-major in the step's row order (chunk after chunk, positions in order), Lm the MoE
  // layers, K the top-k. Empty for a dense model.
  absl::Span<const int32_t> step_routes() const { return step_routes_; }
  // The step's host <-> device copies (Sample ends them; a one-copy weight swap waits on them).
  StepTransfer& transfer() { return transfer_; }
  // Bucket sizes of the decode graphs.
  static std::vector<int64_t> GraphBuckets(int64_t max_batch);

 private:
  // Device views of one step's inputs and activations.
  struct StepTensors {
    int64_t T = 0, B = 0, R = 0, width = 0;  // tokens, sequences, sampled rows, table width
    Tensor meta;  // I32: tokens (T) | positions (T) | slots (T) | q_start (B+1) | context (B) |
                  // rows (R)
    Tensor tokens, positions, slots, q_start, context, rows;
    Tensor tables, inv_freq, cos, sin;
    LayerActivations slot[2];
    Tensor final_input, gathered, lnf_rstd, head_in, logits;
    LoraScratch lora;  // with a LoRA adapter (ModelParams::lora)
    Tensor adapter_rows;  // (T) I32, several adapters: each adapter's rows, one after another
  };
  // The step's metadata on the host, padded to `pad_to` single-token sequences if larger.
  struct HostStep {
    std::vector<int32_t> meta;    // in StepTensors::meta's order
    std::vector<int32_t> tables;  // B x used_width, packed
    int64_t T = 0, B = 0, R = 0, used_width = 1;
  };
  struct Graph {
    StepTensors tensors;  // views into graph_arena_
    CudaGraph graph;
  };

  HostStep BuildHostStep(const SchedulerOutput& step, int64_t pad_to) const;
  // lora_rank: the adapter's rank (0: none); adapter_rows: room for several adapters' rows.
  absl::Status Layout(Arena& arena, int64_t T, int64_t B, int64_t R, int64_t width,
                      StepTensors* out, int64_t lora_rank = 0, bool adapter_rows = false);
  absl::Status Upload(const HostStep& host, const StepTensors& t);
  // single_token_rows: every sequence of the step decodes one token (a graph decode step).
  void Forward(const ModelParams& params, const StepTensors& t, bool single_token_rows);
  absl::Status CopyBlocks(const SchedulerOutput& step);
  // The graph of the bucket that holds a decode step of B sequences (captured on first use,
  // with the twins').
  absl::StatusOr<Graph*> GraphFor(const ModelParams& params, int64_t B);
  absl::StatusOr<Graph*> Captured(const ModelParams& params, int64_t bucket);
  bool IsGraphDecode(const SchedulerOutput& step) const;

  ModelConfig config_;
  KvCache* cache_;
  ModelRunnerOptions options_;
  std::vector<float> inv_freq_;
  Arena arena_;
  Arena copy_arena_;    // block-copy pairs
  Arena sample_arena_;  // Sample's rows, tokens, log-probs and gathered logits
  // Every graph's tensors; first laid out for the largest bucket, so it never moves.
  Arena graph_arena_;
  StepTransfer transfer_;
  // By bucket and the ModelParams captured.
  std::map<std::pair<int64_t, const ModelParams*>, std::unique_ptr<Graph>> graphs_;
  std::vector<const ModelParams*> twins_;
  GraphStats graph_stats_;
  std::vector<int32_t> step_routes_;  // (T, Lm, K)
  std::vector<int32_t> host_routes_;
  // The step's adapters and their rows (Execute with several adapters), for Forward.
  struct AdapterRows {
    const LoraParams* adapter;
    std::vector<int32_t> rows;
    int64_t offset = 0;  // of its rows in StepTensors::adapter_rows
  };
  std::vector<AdapterRows> step_adapters_;  // (T, K) one MoE layer's routes, copied to the host
};

}  // namespace prl
