#include "inference_engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "kernels/matmul.h"
#if PRL_WITH_CUDA
#include "core/cuda/stream.h"
#endif

namespace prl {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

absl::Status ValidateEngineOptions(const EngineOptions& o) {
  auto bad = [](absl::string_view flag, absl::string_view expected, int64_t found) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: ", flag, " must be ", expected, ", found ", found));
  };
  if (o.block_size < 1 || o.block_size > 4096)
    return bad("block_size", "in [1, 4096]", o.block_size);
  if (o.kv_cache_bytes < 1) return bad("kv_cache_bytes", ">= 1", o.kv_cache_bytes);
  if (o.max_num_seqs < 1) return bad("max_num_seqs", ">= 1", o.max_num_seqs);
  if (o.max_num_batched_tokens < o.max_num_seqs) {
    return bad("max_num_batched_tokens", absl::StrCat(">= max_num_seqs = ", o.max_num_seqs),
               o.max_num_batched_tokens);
  }
  if (o.max_graph_batch < 0) return bad("max_graph_batch", ">= 0", o.max_graph_batch);
  if (o.max_model_len < 0) return bad("max_model_len", ">= 0", o.max_model_len);
  if (o.max_adapters < 0 || o.max_adapters > 1024) {
    return bad("max_adapters", "in [0, 1024]", o.max_adapters);
  }
  if (o.dtype != DType::kF32 && !(o.dtype == DType::kBF16 && o.device.is_cuda())) {
    return absl::InvalidArgumentError(absl::StrCat("engine: dtype ", DTypeName(o.dtype), " on ",
                                                   o.device.ToString(),
                                                   " (expected f32, or bf16 on CUDA)"));
  }
  return absl::OkStatus();
}

#if PRL_WITH_CUDA
struct Engine::DeviceState {
  cuda::Stream stream;
};
#else
struct Engine::DeviceState {};
#endif

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const ParameterSet> weights,
                                                       int64_t version,
                                                       const EngineOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateEngineOptions(options));
  if (weights == nullptr) return absl::InvalidArgumentError("engine: no weights");
  if (options.device.is_cuda() && !cuda::KernelsCompiled()) {
    return absl::UnimplementedError(absl::StrCat("engine on ", options.device.ToString(),
                                                 ": prl was built without the CUDA kernels"));
  }
  if (weights->buffer.device() != options.device) {
    return absl::InvalidArgumentError(absl::StrCat("engine: weights on ",
                                                   weights->buffer.device().ToString(),
                                                   ", engine on ", options.device.ToString()));
  }
  const int64_t context = weights->config.max_position_embeddings;
  if (options.max_model_len > context) {
    return absl::InvalidArgumentError(absl::StrCat("engine: max_model_len ", options.max_model_len,
                                                   " exceeds the model's context of ", context));
  }
  PRL_ASSIGN_OR_RETURN(
      KvCache cache, KvCache::Allocate(weights->config, options.kv_cache_bytes, options.block_size,
                                       options.device, options.dtype));
  // On CUDA the weights' copies in the compute dtype, which the CUDA graphs capture.
  const ModelConfig config = weights->config;
  PRL_ASSIGN_OR_RETURN(
      std::unique_ptr<WeightSlots> slots,
      WeightSlots::Create(std::move(weights), version,
                          {options.device, options.dtype, options.double_buffered_weights}));
  auto engine =
      std::unique_ptr<Engine>(new Engine(config, std::move(slots), options, std::move(cache)));
  if (options.device.is_cuda()) {
#if PRL_WITH_CUDA
    kernels::SetGemmAlgorithmSearch(options.tuned_kernels && !options.batch_invariant);
    kernels::SetSkinnyGemm(options.tuned_kernels && !options.batch_invariant);
    PRL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(options.device.index));
    engine->device_state_ = std::make_unique<DeviceState>(DeviceState{std::move(stream)});
#endif
    engine->runner_.CaptureAlsoFor(engine->weights_->copies());
    PRL_RETURN_IF_ERROR(cuda::Synchronize(options.device.index));
  }
  return engine;
}

Engine::~Engine() {
#if PRL_WITH_CUDA
  // A failed step may leave work queued that reads the buffers destroyed below.
  // (WeightSlots waits for its conversions itself.)
  if (device_state_ != nullptr) (void)device_state_->stream.Synchronize();
#endif
}

namespace {
int64_t MaxModelLen(const ModelConfig& config, const EngineOptions& o) {
  return o.max_model_len > 0 ? o.max_model_len : config.max_position_embeddings;
}

ModelRunnerOptions RunnerOptions(const ModelConfig& config, const EngineOptions& o) {
  ModelRunnerOptions r;
  r.device = o.device;
  r.dtype = o.dtype;
  r.order =
      o.batch_invariant ? kernels::ReductionOrder::kBatchInvariant : kernels::ReductionOrder::kFast;
  // A MoE layer reads its experts' row ranges on the host (model/moe_layer.h), which a
  // captured graph cannot: a MoE model's steps run eagerly.
  r.cuda_graphs = o.cuda_graphs && !config.has_moe();
  r.max_graph_batch = o.max_graph_batch > 0 ? o.max_graph_batch : o.max_num_seqs;
  r.max_blocks_per_seq = (MaxModelLen(config, o) + o.block_size - 1) / o.block_size;
  r.tuned_kernels = o.tuned_kernels && o.device.is_cuda() && !o.batch_invariant;
  r.norm_in_gemm = r.tuned_kernels && o.norm_in_gemm;
  return r;
}
}  // namespace

int64_t Engine::max_sequence_tokens() const {
  return std::min<int64_t>(MaxModelLen(config_, options_),
                           int64_t{blocks_.num_blocks()} * options_.block_size);
}

Engine::Engine(const ModelConfig& config, std::unique_ptr<WeightSlots> weights,
               const EngineOptions& options, KvCache cache)
    : config_(config),
      options_(options),
      weights_(std::move(weights)),
      cache_(std::move(cache)),
      blocks_(static_cast<int32_t>(cache_.num_blocks), options.block_size,
              options.enable_prefix_caching),
      scheduler_({options.max_num_seqs, options.max_num_batched_tokens}, &blocks_),
      runner_(config_, &cache_, RunnerOptions(config_, options)) {}

absl::StatusOr<uint64_t> Engine::AddRequest(std::vector<int32_t> prompt,
                                            const SamplingParams& params,
                                            const std::string& adapter) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  int32_t slot = -1;
  if (!adapter.empty()) {
    for (size_t i = 0; i < adapter_slots_.size(); ++i) {
      if (adapter_slots_[i].name == adapter) slot = static_cast<int32_t>(i);
    }
    if (slot < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter: '", adapter, "' is not one of the engine's adapters (AddAdapter)"));
    }
  }
  PRL_RETURN_IF_ERROR(CheckTokenIds(prompt, "prompt"));
  PRL_RETURN_IF_ERROR(ValidateSamplingParams(params, config_.vocab_size));
  const std::vector<int32_t>& context = params.context_after_prompt;
  if (!context.empty() && !params.multi_turn) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_after_prompt: expected only with multi_turn (its tokens' sources), ",
                     "found ", context.size(), " tokens in a single-turn request"));
  }
  PRL_RETURN_IF_ERROR(CheckTokenIds(context, "context_after_prompt"));
  const int64_t total = static_cast<int64_t>(prompt.size() + context.size()) + params.max_tokens;
  if (total > MaxModelLen(config_, options_)) {
    const std::string with_context =
        context.empty() ? "" : absl::StrCat(" and its context of ", context.size(), " tokens");
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt.size(), " tokens", with_context, ") + max_tokens (", params.max_tokens,
        ") exceeds ", options_.max_model_len > 0 ? "the engine's max_model_len of " : "the model's context of ",
        MaxModelLen(config_, options_), " tokens"));
  }
  const int64_t blocks_needed = (total + options_.block_size - 1) / options_.block_size;
  if (blocks_needed > blocks_.num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs ", blocks_needed, " KV blocks for ", total, " tokens but the cache holds ",
        blocks_.num_blocks(), "; raise the KV cache size or lower max_tokens"));
  }
  if (params.n > options_.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling params: n = ", params.n, " exceeds max_num_seqs = ", options_.max_num_seqs));
  }
  auto request = std::make_unique<Request>();
  request->id = next_request_id_++;
  request->params = params;
  for (int32_t j = 0; j < params.n; ++j) {
    auto seq = std::make_unique<Sequence>();
    seq->request = request.get();
    seq->sample_index = j;
    seq->tokens = prompt;
    seq->num_prompt_tokens = static_cast<int64_t>(prompt.size());
    // The context after the prompt: computed with the prompt, never sampled (as Continue's).
    seq->tokens.insert(seq->tokens.end(), context.begin(), context.end());
    seq->logprobs.assign(context.size(), 0.0f);
    seq->versions.assign(context.size(), TokenVersion(slot));
    seq->sources.assign(context.size(), 1);
    seq->turn_start = static_cast<int64_t>(seq->tokens.size());
    seq->turn_max_tokens = params.max_tokens;
    request->samples.push_back(std::move(seq));
  }
  request->params.context_after_prompt.clear();  // held by the samples now
  request->forked = params.n == 1;
  request->route_width = config_.num_moe_layers() * config_.num_experts_per_tok;
  if (slot >= 0) {
    AdapterSlot& s = adapter_slots_[slot];
    request->adapter_slot = slot;
    request->cache_salt = s.salt;
    for (auto& seq : request->samples) seq->last_block_hash = s.salt;  // the hash chain's start
    ++s.requests;
    s.last_use = ++adapter_clock_;
  }
  scheduler_.AddWaiting(request->samples[0].get());
  const uint64_t id = request->id;
  requests_.emplace(id, std::move(request));
  return id;
}

bool Engine::Abort(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  Request& r = *it->second;
  for (auto& s : r.samples) {
    if (s->status == SequenceStatus::kFinished) continue;
    scheduler_.Remove(s.get());
    s->status = SequenceStatus::kFinished;
    s->finish_reason = FinishReason::kAbort;
    ++r.num_finished;
  }
  FinishRequestIfDone(r);
  EraseRequest(request_id);
  return true;
}

absl::Status Engine::SwapWeights(std::shared_ptr<const ParameterSet> weights, int64_t version) {
  return weights_->Stage(std::move(weights), version);
}

void Engine::AfterSwap() {
  blocks_.ClearPrefixCache();  // cached K/V belong to the old weights
  if (options_.recompute_kv_on_swap) scheduler_.PreemptAll();  // paused samples included
}

absl::Status Engine::Step() {
#if PRL_WITH_CUDA
  if (device_state_ != nullptr) {
    // Every kernel and copy of the step on the engine's stream (graphs cannot be captured on
    // the default stream).
    cuda::StreamGuard guard(options_.device.index, device_state_->stream.get());
    return StepOnStream();
  }
#endif
  return StepOnStream();
}

absl::StatusOr<std::shared_ptr<const LoraSet>> Engine::AdmitAdapter(
    std::shared_ptr<const LoraSet> adapter) const {
  if (!options_.device.is_cpu() && !options_.cuda_lora) {
    return absl::UnimplementedError(
        absl::StrCat("engine on ", options_.device.ToString(),
                     ": LoRA adapters run on the CPU backend unless EngineOptions::cuda_lora "
                     "(actors.cuda_lora, prl generate --cuda-lora) is set: written, not yet "
                     "verified on a GPU"));
  }
  const Device held = adapter->buffer.device();
  PRL_RETURN_IF_ERROR(ValidateLoraParams(adapter->params, config_, held));
  if (held == options_.device) return adapter;
  PRL_ASSIGN_OR_RETURN(LoraSet copy, adapter->CopyTo(options_.device));
  return std::make_shared<const LoraSet>(std::move(copy));
}

absl::Status Engine::AddAdapter(const std::string& name, std::shared_ptr<const LoraSet> adapter,
                                int64_t version) {
  if (name.empty() || adapter == nullptr) {
    return absl::InvalidArgumentError("AddAdapter: a name and an adapter are needed");
  }
  PRL_ASSIGN_OR_RETURN(adapter, AdmitAdapter(std::move(adapter)));
  if (adapter_slots_.empty()) adapter_slots_.resize(std::max(options_.max_adapters, 0));
  AdapterSlot* slot = nullptr;
  for (AdapterSlot& s : adapter_slots_) {
    if (s.name == name) slot = &s;  // replaced: its requests go on with the new weights
  }
  for (AdapterSlot& s : adapter_slots_) {
    if (slot == nullptr && s.name.empty()) slot = &s;
  }
  if (slot == nullptr) {  // evict the least recently used adapter no request uses
    for (AdapterSlot& s : adapter_slots_) {
      if (s.requests == 0 && (slot == nullptr || s.last_use < slot->last_use)) slot = &s;
    }
  }
  if (slot == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("AddAdapter('", name, "'): every one of the engine's ", adapter_slots_.size(),
                     " adapter slots (max_adapters) is used by requests in flight"));
  }
  if (slot->name != name) {
    slot->requests = 0;
    slot->last_use = ++adapter_clock_;
  }
  slot->name = name;
  slot->set = std::move(adapter);
  slot->version = version;
  slot->salt = next_adapter_salt_++ * 0x9E3779B97F4A7C15ull;  // new weights, new K/V
  return absl::OkStatus();
}

std::optional<int64_t> Engine::AdapterVersion(const std::string& name) const {
  for (const AdapterSlot& s : adapter_slots_) {
    if (s.name == name) return s.version;
  }
  return std::nullopt;
}

absl::Status Engine::RemoveAdapter(const std::string& name) {
  for (AdapterSlot& s : adapter_slots_) {
    if (s.name != name) continue;
    if (s.requests > 0) {
      return absl::FailedPreconditionError(absl::StrCat("RemoveAdapter('", name, "'): ", s.requests,
                                                        " request(s) in flight use it"));
    }
    s = AdapterSlot{};
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("RemoveAdapter: no adapter '", name, "'"));
}

std::vector<std::string> Engine::adapters() const {
  std::vector<std::string> names;
  for (const AdapterSlot& s : adapter_slots_) {
    if (!s.name.empty()) names.push_back(s.name);
  }
  return names;
}

void Engine::EraseRequest(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  const int32_t slot = it->second->adapter_slot;
  if (slot >= 0 && adapter_slots_[slot].requests > 0) --adapter_slots_[slot].requests;
  requests_.erase(it);
}

absl::Status Engine::SetAdapter(std::shared_ptr<const LoraSet> adapter) {
  if (adapter != nullptr) {
    PRL_ASSIGN_OR_RETURN(adapter, AdmitAdapter(std::move(adapter)));
  }
  weights_->SetAdapter(std::move(adapter));
  blocks_.ClearPrefixCache();  // cached K/V belong to the model without (or with another) adapter
  return absl::OkStatus();
}

absl::Status Engine::SwapAdapter(std::shared_ptr<const LoraSet> adapter, int64_t version) {
  if (adapter == nullptr) {
    return absl::InvalidArgumentError("SwapAdapter: expected an adapter, found none");
  }
  PRL_ASSIGN_OR_RETURN(adapter, AdmitAdapter(std::move(adapter)));
  weights_->StageAdapter(std::move(adapter), version);
  return absl::OkStatus();
}

absl::Status Engine::StepOnStream() {
  bool swapped = false;
  const absl::Status applied = weights_->ApplyAtStepStart(runner_.transfer(), &swapped);
  if (swapped) AfterSwap();
  PRL_RETURN_IF_ERROR(applied);
  const SchedulerOutput step = scheduler_.Schedule();
  if (step.empty()) return absl::OkStatus();
  Tensor logits;
  // The adapter of each chunk: its request's (AddAdapter), else SetAdapter's.
  std::vector<const LoraParams*> chunk_adapters;
  const LoraSet* active = weights_->adapter();
  const LoraParams* fallback = active != nullptr ? &active->params : nullptr;
  const bool named = std::any_of(step.chunks.begin(), step.chunks.end(),
                                 [](const auto& c) { return c.seq->request->adapter_slot >= 0; });
  if (named || fallback != nullptr) {
    for (const ScheduledChunk& c : step.chunks) {
      const int32_t slot = c.seq->request->adapter_slot;
      chunk_adapters.push_back(slot >= 0 ? &adapter_slots_[slot].set->params : fallback);
    }
  }
  PRL_RETURN_IF_ERROR(runner_.Execute(weights_->active(), step, &logits, chunk_adapters));
  RecordRoutes(step);
  ++stats_.steps;
  for (const ScheduledChunk& c : step.chunks) {
    const bool decode =
        c.num_tokens == 1 && c.seq->num_completion_tokens() > 0 &&
        c.seq->num_computed_tokens + 1 == static_cast<int64_t>(c.seq->tokens.size());
    if (!decode) stats_.prefill_tokens += c.num_tokens;
  }
  PRL_ASSIGN_OR_RETURN(SampledTokens sampled, runner_.Sample(step, logits));
  Advance(step, sampled);
  return absl::OkStatus();
}

void Engine::Advance(const SchedulerOutput& step, SampledTokens& sampled) {
  scheduler_.OnStepComputed(step);
  std::vector<uint64_t> done;
  int64_t k = 0;
  for (const ScheduledChunk& c : step.chunks) {
    if (!c.samples) continue;
    Request& req = *c.seq->request;
    if (!req.forked) {
      scheduler_.Fork(&req);
      for (auto& s : req.samples) s->routes = req.samples[0]->routes;  // the shared prompt's
      for (auto& s : req.samples) {
        Append(*s, sampled.tokens[k], sampled.logprobs[k], std::move(sampled.alternatives[k]));
        ++k;
      }
    } else {
      Append(*c.seq, sampled.tokens[k], sampled.logprobs[k], std::move(sampled.alternatives[k]));
      ++k;
    }
    if (req.num_finished == req.params.n) done.push_back(req.id);
  }
  for (uint64_t id : done) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // reported already (several samples ended together)
    FinishRequestIfDone(*it->second);
    EraseRequest(it->first);
  }
}

void Engine::RecordRoutes(const SchedulerOutput& step) {
  const int64_t LK = config_.num_moe_layers() * config_.num_experts_per_tok;
  if (LK == 0) return;
  const absl::Span<const int32_t> routes = runner_.step_routes();
  int64_t row = 0;
  for (const ScheduledChunk& c : step.chunks) {
    Sequence& seq = *c.seq;
    for (int64_t p = seq.num_computed_tokens; p < seq.num_computed_tokens + c.num_tokens;
         ++p, ++row) {
      // Completion token t is predicted at position P - 1 + t; record it the first time only.
      const int64_t t = p - (seq.num_prompt_tokens - 1);
      if (t < 0 || t != static_cast<int64_t>(seq.routes.size()) / LK) continue;
      for (int64_t i = 0; i < LK; ++i) {
        seq.routes.push_back(static_cast<uint8_t>(routes[row * LK + i]));
      }
    }
  }
}

absl::Status Engine::CheckTokenIds(absl::Span<const int32_t> ids,
                                   absl::string_view field) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] = ", ids[i],
                                                     " is not a token id in [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

int64_t Engine::TokenVersion(int32_t slot) const {
  const int64_t adapter_version = slot >= 0 ? adapter_slots_[slot].version : -1;
  return adapter_version >= 0 ? adapter_version : weights_->version();
}

void Engine::Append(Sequence& seq, int32_t token, float logprob,
                    std::vector<std::pair<int32_t, float>> alternatives) {
  seq.tokens.push_back(token);
  seq.logprobs.push_back(logprob);
  seq.versions.push_back(TokenVersion(seq.request->adapter_slot));
  ++stats_.generated_tokens;
  const SamplingParams& p = seq.request->params;
  if (p.multi_turn) seq.sources.push_back(0);
  if (p.multi_turn && p.top_logprobs > 0) seq.turn_alternatives.push_back(std::move(alternatives));
  FinishReason reason = FinishReason::kNone;
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
      p.stop_token_ids.end()) {
    reason = FinishReason::kStop;
  } else if (p.multi_turn && p.end_turn &&
             p.end_turn(absl::MakeConstSpan(seq.tokens).subspan(seq.turn_start))) {
    reason = FinishReason::kStop;  // e.g. an environment's stop string, also on the last token
  } else if (static_cast<int64_t>(seq.tokens.size()) - seq.turn_start >= seq.turn_max_tokens) {
    reason = FinishReason::kLength;  // (single-turn: turn_start is the prompt's end)
  } else {
    return;
  }
  if (p.multi_turn) {
    turns_.push_back(PauseTurn(seq, reason));
    return;
  }
  seq.finish_reason = reason;
  scheduler_.Finish(&seq);
  ++seq.request->num_finished;
}

void Engine::FinishRequestIfDone(Request& r) {
  if (r.num_finished != r.params.n) return;
  RequestOutput out;
  out.request_id = r.id;
  out.prompt.assign(r.samples[0]->tokens.begin(),
                    r.samples[0]->tokens.begin() + r.samples[0]->num_prompt_tokens);
  for (auto& s : r.samples) {
    SampleOutput o;
    o.sample_index = s->sample_index;
    o.tokens.assign(s->tokens.begin() + s->num_prompt_tokens, s->tokens.end());
    o.logprobs = s->logprobs;
    o.versions = s->versions;
    o.sources = s->sources;
    const int64_t LK = config_.num_moe_layers() * config_.num_experts_per_tok;
    if (LK > 0 && static_cast<int64_t>(s->routes.size()) == LK * s->num_completion_tokens()) {
      o.route_layers = static_cast<uint16_t>(config_.num_moe_layers());
      o.route_top_k = static_cast<uint8_t>(config_.num_experts_per_tok);
      o.routes = s->routes;
    }
    o.finish_reason = s->finish_reason;
    out.samples.push_back(std::move(o));
  }
  finished_.push_back(std::move(out));
}

std::vector<RequestOutput> Engine::TakeFinished() {
  std::vector<RequestOutput> out;
  out.swap(finished_);
  return out;
}

EngineStats Engine::Stats() const {
  EngineStats s = stats_;
  s.num_waiting = scheduler_.num_waiting();
  s.num_running = scheduler_.num_running();
  s.free_blocks = blocks_.num_free_blocks();
  s.total_blocks = blocks_.num_blocks();
  s.preemptions = scheduler_.num_preemptions();
  s.prefix_cache_hit_tokens = scheduler_.prefix_cache_hit_tokens();
  s.weight_version = weights_->version();
  s.weight_swaps = weights_->swaps();
  s.weight_swap_seconds = weights_->swap_seconds();
  s.unfinished_requests = static_cast<int64_t>(requests_.size());
  s.paused_samples = scheduler_.num_paused();
  s.paused_evictions = scheduler_.paused_evictions();
  const GraphStats& g = runner_.graph_stats();
  s.graph_captures = g.captures;
  s.graph_capture_seconds = g.capture_seconds;
  s.graph_replays = g.replays;
  s.eager_steps = g.eager_steps;
  return s;
}

}  // namespace prl
