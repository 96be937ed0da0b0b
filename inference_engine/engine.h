// Engine: the actor's inference engine — a library, driven by a loop (prl generate, the actor):
//
//   auto engine = *Engine::Create(weights, /*version=*/0, options);
//   uint64_t id = *engine->AddRequest(prompt, params);   // n samples share the prompt
//   while (engine->HasUnfinishedRequests()) {
//     PRL_RETURN_IF_ERROR(engine->Step());               // one batch: decodes + prefill chunks
//     for (RequestOutput& done : engine->TakeFinished()) ...;
//   }
//
// The engine owns the requests and their sequences; its parts own the rest: the Scheduler
// (what runs), the ModelRunner (the forward pass and the sampler), the WeightSlots (the weights
// and their swaps).
//
// Every completion token comes with its behaviour log-prob and the weight version that
// produced it. SwapWeights (thread-safe, non-blocking) stages new weights: load the next
// version into a spare ParameterSet on another thread while generation goes on, then hand it
// over; a later Step applies it (inference_engine/weight_slots.h: a pointer flip on the CPU; on
// CUDA a conversion into the engine's copy, or with double_buffered_weights into the idle one
// of two copies beside decoding). Running sequences keep their KV cache across a swap by
// default; tokens sampled after it carry the new version (Stats().weight_version is the one in
// use); a swap forgets the prefix cache.
//
// Multi-turn requests (SamplingParams::multi_turn, agentic episodes; inference_engine/
// engine_turns.cc): a sample whose turn ends is paused with its KV cache and reported by
// TakeTurns; the caller appends the environment's reply with Continue (only the new tokens and
// what the pool had to take back are computed; the reply's tokens are part of the completion,
// source 1, log-prob 0, the version of the token before them) or ends the episode with
// FinishSample. Weight swaps happen within and between turns; every sampled token keeps the
// version that produced it.
//
// Thread-safety: SwapWeights may be called from any thread; everything else from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/service_defaults.h"
#include "inference_engine/block_manager.h"
#include "inference_engine/kv_cache.h"
#include "inference_engine/model_runner.h"
#include "inference_engine/sampling_params.h"
#include "inference_engine/scheduler.h"
#include "inference_engine/sequence.h"
#include "inference_engine/weight_slots.h"
#include "kernels/reduction_order.h"
#include "model/parameters.h"

namespace prl {

struct EngineOptions {
  int32_t block_size = defaults::kBlockSize;            // tokens per KV block (vLLM's default)
  int64_t kv_cache_bytes = defaults::kKvCacheMb << 20;  // KV pool, allocated once
  int32_t max_num_seqs = defaults::kMaxNumSeqs;         // sequences in flight
  int32_t max_adapters = 8;  // LoRA adapters held by name at once (Engine::AddAdapter)
  // Tokens per step; long prompts are chunked.
  int32_t max_num_batched_tokens = defaults::kMaxNumBatchedTokens;
  bool enable_prefix_caching = true;  // reuse full blocks of equal prefixes (per version)
  bool recompute_kv_on_swap = false;  // on a weight swap, recompute running sequences' KV
  // Bit-exact results whatever the batch, chunking or preemption, and equal to the learner's
  // log-probs in the same mode (kernels/reduction_order.h); slower.
  bool batch_invariant = false;
  Device device = Device::Cpu();
  // Compute dtype of the weights' copy, the activations and the KV cache: F32 (every device,
  // the exact mode) or BF16 (CUDA). The engine keeps its own copy of the weights in it on CUDA.
  DType dtype = DType::kF32;
  bool cuda_graphs = true;      // CUDA: replay captured decode steps (ModelRunner)
  int32_t max_graph_batch = 0;  // the largest decode batch with a graph (0: max_num_seqs)
  int64_t max_model_len = 0;    // prompt + completion limit (0: the model's context)
  // CUDA: two copies of the weights in the compute dtype, so that a swap converts into the idle
  // one beside decoding and a Step flips to it without waiting (one more copy of the weights
  // in memory). False: one copy, converted into before the Step after SwapWeights runs.
  bool double_buffered_weights = true;
  // CUDA, fast order: the tuned decode kernels — cuBLASLt's algorithms searched per shape and
  // a weight-bandwidth kernel for products of at most 8 rows (process-wide choices:
  // kernels/cuda/gemm.h, gemm_skinny.h), residuals read by the projections' GEMMs, RoPE fused
  // with the KV-cache write, decode attention on tensor cores without a per-layer tile plan
  // (kernels/cuda/decode_attention.h), and split-vocabulary sampling (kernels/sampling.h). The
  // batch-invariant mode ignores it. Off here (the kernels of before, which the engine tests pin);
  // the actors' config turns it on (actors.tuned_kernels).
  bool tuned_kernels = false;
  // CUDA, fast order, with tuned_kernels: the input and post-attention RMSNorms fused into the
  // QKV and gate|up projections, and the final norm into the LM head, of single-row decode steps
  // (kernels/norm_matmul.h, kNormInGemmMaxRows). Verified on an H200; off here like
  // tuned_kernels (the engine tests pin the kernels of before); the actors' config turns it on
  // (actors.norm_in_gemm).
  bool norm_in_gemm = false;
  // CUDA: LoRA adapters (AddAdapter, SetAdapter, SwapAdapter) copied to the GPU and run in the
  // steps that name them (F32 adapters beside F32 or BF16 weights; model/lora_layer.h). Written,
  // not yet run on a GPU: off (adapters refused on CUDA, Unimplemented) until a GPU session
  // passes cuda_lora_test's engine cases.
  bool cuda_lora = false;
};

absl::Status ValidateEngineOptions(const EngineOptions& options);

struct SampleOutput {
  int32_t sample_index = 0;
  std::vector<int32_t> tokens;    // completion only
  std::vector<float> logprobs;    // behaviour log-prob per completion token
  std::vector<int64_t> versions;  // weight version per completion token
  // Multi-turn: per completion token, 0 the model sampled it, 1 an environment's (Continue).
  std::vector<uint8_t> sources;
  // Qwen3-MoE: per completion token t, the top-k experts of each of route_layers MoE layers at
  // the position that predicts t (the row it was sampled from; an environment's token: the
  // prefill of its predecessor): routes[(t * route_layers + l) * route_top_k + k], the layout
  // of RolloutRecord::routes. Empty (and 0, 0) for a dense model or an aborted sample whose
  // prompt was never computed to its end.
  uint16_t route_layers = 0;
  uint8_t route_top_k = 0;
  std::vector<uint8_t> routes;
  FinishReason finish_reason = FinishReason::kNone;
};

// A multi-turn sample's turn that ended; the sample is paused until Continue or FinishSample.
struct TurnOutput {
  uint64_t request_id = 0;
  int32_t sample_index = 0;
  std::vector<int32_t> tokens;    // the turn's sampled tokens (a stop token included)
  std::vector<float> logprobs;    // their behaviour log-probs
  std::vector<int64_t> versions;  // their weight versions
  // With SamplingParams::top_logprobs: per token, the most likely tokens of the distribution it
  // was drawn from (id, log-prob), most likely first; empty otherwise.
  std::vector<std::vector<std::pair<int32_t, float>>> alternatives;
  // kStop: a stop token (or EndTurn); kLength: the turn's max_tokens.
  FinishReason reason = FinishReason::kNone;
};

struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<int32_t> prompt;
  std::vector<SampleOutput> samples;  // by sample index
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;    // prompt (and recomputed) tokens run through the model
  int64_t generated_tokens = 0;  // tokens sampled
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  int64_t preemptions = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t weight_version = 0;
  int64_t weight_swaps = 0;
  // Host time Steps spent applying swaps (CUDA, one copy: the conversion into the engine's
  // weights, waited for; double-buffered: launching the conversion and flipping).
  double weight_swap_seconds = 0.0;
  int64_t graph_captures = 0;
  double graph_capture_seconds = 0.0;
  int64_t graph_replays = 0;  // decode steps run as a CUDA graph
  int64_t eager_steps = 0;
  int64_t unfinished_requests = 0;
  // Multi-turn: turns continued, the context tokens they had computed before their pause (all
  // before the reply but the last sampled one), and how many of those the KV cache still held
  // (the rest was computed again: its blocks were taken back while the sample was paused). Paused
  // samples now, and pauses whose blocks the pool took back.
  int64_t turns_continued = 0, turn_context_tokens = 0, turn_kept_tokens = 0;
  int64_t paused_samples = 0, paused_evictions = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<const ParameterSet> weights,
                                                        int64_t version,
                                                        const EngineOptions& options);
  ~Engine();

  // Validates and queues a request; errors name the field (prompt token ids, sampling params,
  // context length, a request that could never fit in the KV pool, an unknown adapter).
  // adapter: the name of a LoRA adapter added with AddAdapter, or empty (SetAdapter's, if any).
  absl::StatusOr<uint64_t> AddRequest(std::vector<int32_t> prompt, const SamplingParams& params,
                                      const std::string& adapter = {});
  // LoRA adapters by name (model/lora.h, sets for this model on any device: an engine on CUDA
  // keeps its own copy on the GPU, EngineOptions::cuda_lora), for the requests that name
  // one; a step runs the requests of several adapters together, each adapter's products on its
  // rows. At most EngineOptions::max_adapters are held: adding a new name when every slot is
  // taken evicts the least recently used adapter that no request in flight uses
  // (ResourceExhausted if each is in use). Adding a name again replaces its weights from the
  // next step on (its requests in flight go on with them, as across a weight swap; no other
  // request is touched). The prefix cache keeps each adapter's K/V apart. On CUDA only with
  // EngineOptions::cuda_lora (Unimplemented otherwise). `version` >= 0: the adapter's own version
  // (a run of adapters, docs/tenants.md), recorded as the token version of every token its requests
  // sample; -1: their tokens carry the weights' version.
  absl::Status AddAdapter(const std::string& name, std::shared_ptr<const LoraSet> adapter,
                          int64_t version = -1);
  // NotFound if unknown; FailedPrecondition while a request in flight names it.
  absl::Status RemoveAdapter(const std::string& name);
  // The adapters held, in slot order.
  std::vector<std::string> adapters() const;
  // The version AddAdapter gave the adapter, or nullopt when it is not held.
  std::optional<int64_t> AdapterVersion(const std::string& name) const;
  // Ends a request now; its samples are reported with finish_reason abort and the tokens they
  // have. False if the id is unknown or already finished.
  bool Abort(uint64_t request_id);
  // One engine step. A no-op when nothing is queued.
  absl::Status Step();
  // Requests whose samples have all finished since the last call.
  std::vector<RequestOutput> TakeFinished();

  // ---- Multi-turn (engine_turns.cc); errors name the request, sample and what is wrong ----
  // Turns that ended in the Steps since the last call (their samples are paused).
  std::vector<TurnOutput> TakeTurns();
  // Ends a running sample's turn now (the caller saw a stop string in its text): it is paused
  // as if its last token had been a stop token. Returns the turn.
  absl::StatusOr<TurnOutput> EndTurn(uint64_t request_id, int32_t sample_index);
  // Appends `tokens` (the environment's reply, rendered) to a paused sample and starts its next
  // turn of at most max_tokens. OutOfRange when the sequence would outgrow
  // max_sequence_tokens() (the caller ends the episode as truncated instead). `sampling`: the
  // next turn samples with these (a request of one sample only: samples share their params).
  absl::Status Continue(uint64_t request_id, int32_t sample_index, absl::Span<const int32_t> tokens,
                        int32_t max_tokens, const std::optional<TurnSampling>& sampling = {});
  // Ends a paused sample's episode; the request is reported by TakeFinished once all its
  // samples ended.
  absl::Status FinishSample(uint64_t request_id, int32_t sample_index);
  // ---- end ----
  bool HasUnfinishedRequests() const { return !requests_.empty(); }

  // Stages new weights (same shapes) for the next Step; thread-safe and non-blocking. A later
  // call before that Step replaces the staged weights.
  absl::Status SwapWeights(std::shared_ptr<const ParameterSet> weights, int64_t version);
  // A LoRA adapter (model/lora.h, a set for this model on any device) on the weights, for
  // every step from the next on; null removes it. Weight swaps keep it. Clears the prefix cache
  // (cached K/V belong to the model without it). On CUDA only with EngineOptions::cuda_lora
  // (Unimplemented otherwise; the engine keeps its own copy on the GPU). From the stepping
  // thread, like Step.
  absl::Status SetAdapter(std::shared_ptr<const LoraSet> adapter);
  // Stages a LoRA adapter (a set for this model) with its version for the next Step, as
  // SwapWeights stages weights (thread-safe; the later call wins): from that Step on the engine
  // runs the base with this adapter, and version() is its version (a LoRA learner's actors:
  // each published version is an adapter, inference_engine/weight_slots.h). On CUDA the call
  // copies a set held elsewhere to the GPU before it returns (the adapter's size, not the
  // model's).
  absl::Status SwapAdapter(std::shared_ptr<const LoraSet> adapter, int64_t version);

  EngineStats Stats() const;
  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  // The longest sequence (prompt + max_tokens) AddRequest accepts: the context (or
  // max_model_len), and what the KV pool holds.
  int64_t max_sequence_tokens() const;

 private:
  Engine(const ModelConfig& config, std::unique_ptr<WeightSlots> weights,
         const EngineOptions& options, KvCache cache);
  absl::Status StepOnStream();
  // What every applied swap implies beyond the weights.
  void AfterSwap();
  // Appends the step's draws (in ModelRunner::Sample's order) and finishes what they end.
  void Advance(const SchedulerOutput& step, SampledTokens& sampled);
  // `alternatives`: the token's top log-probs, kept when its request asks for them.
  void Append(Sequence& seq, int32_t token, float logprob,
              std::vector<std::pair<int32_t, float>> alternatives = {});
  // OK when every id is in [0, vocab); else InvalidArgument naming `field`[i] and the id.
  absl::Status CheckTokenIds(absl::Span<const int32_t> ids, absl::string_view field) const;
  // The version a token of a request in adapter slot `slot` (-1: none) carries: the adapter's
  // own (a run of adapters, AddAdapter's version >= 0), else the weights'.
  int64_t TokenVersion(int32_t slot) const;
  // Qwen3-MoE: appends the step's routes of the positions each chunk computed first.
  void RecordRoutes(const SchedulerOutput& step);
  void FinishRequestIfDone(Request& request);
  // Multi-turn (engine_turns.cc): the sample of a request, or an error naming them.
  absl::StatusOr<Sequence*> FindSample(uint64_t request_id, int32_t sample_index);
  // Pauses a sample whose turn ended for `reason` and returns the turn.
  TurnOutput PauseTurn(Sequence& seq, FinishReason reason);

  ModelConfig config_;
  EngineOptions options_;
  std::unique_ptr<WeightSlots> weights_;
  // AddAdapter's slots (max_adapters; an empty name is a free slot).
  struct AdapterSlot {
    std::string name;
    std::shared_ptr<const LoraSet> set;
    uint64_t salt = 0;      // the prefix cache's key for this adapter's K/V
    int64_t last_use = 0;   // adapter_clock_ at the last AddRequest naming it
    int32_t requests = 0;   // requests in flight naming it
    int64_t version = -1;   // AddAdapter's (-1: its tokens carry the weights' version)
  };
  std::vector<AdapterSlot> adapter_slots_;
  int64_t adapter_clock_ = 0;
  uint64_t next_adapter_salt_ = 1;
  // Checks an adapter against this engine (this model; CUDA with cuda_lora) and returns it on
  // the engine's device (a copy when it is elsewhere).
  absl::StatusOr<std::shared_ptr<const LoraSet>> AdmitAdapter(
      std::shared_ptr<const LoraSet> adapter) const;
  // Removes a request, releasing its adapter slot.
  void EraseRequest(uint64_t request_id);
  struct DeviceState;  // CUDA: the engine's stream
  std::unique_ptr<DeviceState> device_state_;
  KvCache cache_;
  BlockManager blocks_;
  Scheduler scheduler_;
  ModelRunner runner_;
  uint64_t next_request_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<RequestOutput> finished_;
  std::vector<TurnOutput> turns_;  // multi-turn: ended since TakeTurns
  EngineStats stats_;
};

}  // namespace prl
