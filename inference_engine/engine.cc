#include "inference_engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/sampling.h"

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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const ParameterSet> weights,
                                                       int64_t version,
                                                       const EngineOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateEngineOptions(options));
  if (weights == nullptr) return absl::InvalidArgumentError("engine: no weights");
  if (!options.device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        "engine: no CUDA kernels for paged attention and sampling yet; run the engine on the CPU "
        "(requested ",
        options.device.ToString(), ")"));
  }
  if (weights->buffer.device() != options.device) {
    return absl::InvalidArgumentError(absl::StrCat("engine: weights on ",
                                                   weights->buffer.device().ToString(),
                                                   ", engine on ", options.device.ToString()));
  }
  PRL_ASSIGN_OR_RETURN(KvCache cache, KvCache::Allocate(weights->config, options.kv_cache_bytes,
                                                        options.block_size, options.device));
  return std::unique_ptr<Engine>(
      new Engine(std::move(weights), version, options, std::move(cache)));
}

Engine::Engine(std::shared_ptr<const ParameterSet> weights, int64_t version,
               const EngineOptions& options, KvCache cache)
    : config_(weights->config),
      options_(options),
      weights_(std::move(weights)),
      version_(version),
      cache_(std::move(cache)),
      blocks_(static_cast<int32_t>(cache_.num_blocks), options.block_size,
              options.enable_prefix_caching),
      scheduler_({options.max_num_seqs, options.max_num_batched_tokens}, &blocks_),
      runner_(config_, options.device, &cache_,
              options.batch_invariant ? kernels::ReductionOrder::kBatchInvariant
                                      : kernels::ReductionOrder::kFast) {}

absl::StatusOr<uint64_t> Engine::AddRequest(std::vector<int32_t> prompt,
                                            const SamplingParams& params) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt[", i, "] = ", prompt[i], " is not a token id in [0, ", config_.vocab_size, ")"));
    }
  }
  PRL_RETURN_IF_ERROR(ValidateSamplingParams(params, config_.vocab_size));
  const int64_t total = static_cast<int64_t>(prompt.size()) + params.max_tokens;
  if (total > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt.size(), " tokens) + max_tokens (", params.max_tokens,
        ") exceeds the model's context of ", config_.max_position_embeddings, " tokens"));
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
    request->samples.push_back(std::move(seq));
  }
  request->forked = params.n == 1;
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
  requests_.erase(request_id);
  return true;
}

absl::Status Engine::SwapWeights(std::shared_ptr<const ParameterSet> weights, int64_t version) {
  if (weights == nullptr || weights->layout.num_elements() != weights_->layout.num_elements() ||
      weights->buffer.device() != options_.device) {
    return absl::InvalidArgumentError(
        "SwapWeights: the new weights must have the engine's model shape and device");
  }
  std::lock_guard<std::mutex> lock(swap_mutex_);
  pending_weights_ = std::move(weights);
  pending_version_ = version;
  return absl::OkStatus();
}

void Engine::ApplyPendingSwap() {
  {
    std::lock_guard<std::mutex> lock(swap_mutex_);
    if (!pending_version_) return;
    weights_ = std::move(pending_weights_);  // the pointer flip
    version_ = *pending_version_;
    pending_version_.reset();
  }
  ++stats_.weight_swaps;
  blocks_.ClearPrefixCache();  // cached K/V belong to the old weights
  if (options_.recompute_kv_on_swap) scheduler_.PreemptAll();
}

absl::Status Engine::Step() {
  ApplyPendingSwap();
  const SchedulerOutput step = scheduler_.Schedule();
  if (step.empty()) return absl::OkStatus();
  Tensor logits;
  PRL_RETURN_IF_ERROR(runner_.Execute(weights_->params, step, &logits));
  ++stats_.steps;
  for (const ScheduledChunk& c : step.chunks) {
    const bool decode =
        c.num_tokens == 1 && c.seq->num_completion_tokens() > 0 &&
        c.seq->num_computed_tokens + 1 == static_cast<int64_t>(c.seq->tokens.size());
    if (!decode) stats_.prefill_tokens += c.num_tokens;
  }
  return SampleAndAdvance(step, logits);
}

absl::Status Engine::SampleAndAdvance(const SchedulerOutput& step, const Tensor& logits) {
  // One sampling row per drawn token; an unforked leader draws the first token of all n samples
  // from its single logits row.
  std::vector<kernels::SamplingRow> rows;
  std::vector<int64_t> source_row;
  int64_t r = 0;
  for (const ScheduledChunk& c : step.chunks) {
    if (!c.samples) continue;
    const Request& req = *c.seq->request;
    const bool fork = !req.forked;
    for (int32_t j = 0; j < (fork ? req.params.n : 1); ++j) {
      const Sequence& s = *req.samples[fork ? j : c.seq->sample_index];
      rows.push_back({req.params.temperature, req.params.top_p, req.params.top_k, req.params.seed,
                      static_cast<uint64_t>(s.sample_index),
                      static_cast<uint64_t>(s.num_completion_tokens())});
      source_row.push_back(r);
    }
    ++r;
  }
  const int64_t n = static_cast<int64_t>(rows.size()), V = config_.vocab_size;
  std::vector<int32_t> tokens(n);
  std::vector<float> logprobs(n);
  if (n > 0) {
    Tensor sample_logits = logits;
    OwnedTensor expanded;
    if (n != r) {
      PRL_ASSIGN_OR_RETURN(expanded, AllocateTensor(DType::kF32, options_.device, {n, V}));
      for (int64_t i = 0; i < n; ++i) {
        PRL_RETURN_IF_ERROR(CopyTensor(expanded.view.Rows(i, i + 1),
                                       logits.Rows(source_row[i], source_row[i] + 1)));
      }
      sample_logits = expanded.view;
    }
    PRL_ASSIGN_OR_RETURN(OwnedTensor d_tokens, AllocateTensor(DType::kI32, options_.device, {n}));
    PRL_ASSIGN_OR_RETURN(OwnedTensor d_logprobs, AllocateTensor(DType::kF32, options_.device, {n}));
    kernels::SampleTokens(d_tokens.view, d_logprobs.view, sample_logits, rows);
    PRL_RETURN_IF_ERROR(CopyBytes(tokens.data(), Device::Cpu(), d_tokens.view.data, options_.device,
                                  n * sizeof(int32_t)));
    PRL_RETURN_IF_ERROR(CopyBytes(logprobs.data(), Device::Cpu(), d_logprobs.view.data,
                                  options_.device, n * sizeof(float)));
  }

  scheduler_.OnStepComputed(step);
  std::vector<uint64_t> done;
  int64_t k = 0;
  for (const ScheduledChunk& c : step.chunks) {
    if (!c.samples) continue;
    Request& req = *c.seq->request;
    if (!req.forked) {
      scheduler_.Fork(&req);
      for (auto& s : req.samples) {
        Append(*s, tokens[k], logprobs[k]);
        ++k;
      }
    } else {
      Append(*c.seq, tokens[k], logprobs[k]);
      ++k;
    }
    if (req.num_finished == req.params.n) done.push_back(req.id);
  }
  for (uint64_t id : done) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // reported already (several samples ended together)
    FinishRequestIfDone(*it->second);
    requests_.erase(it);
  }
  return absl::OkStatus();
}

void Engine::Append(Sequence& seq, int32_t token, float logprob) {
  seq.tokens.push_back(token);
  seq.logprobs.push_back(logprob);
  seq.versions.push_back(version_);
  ++stats_.generated_tokens;
  const SamplingParams& p = seq.request->params;
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
      p.stop_token_ids.end()) {
    seq.finish_reason = FinishReason::kStop;
  } else if (seq.num_completion_tokens() >= p.max_tokens) {
    seq.finish_reason = FinishReason::kLength;
  } else {
    return;
  }
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
  s.weight_version = version_;
  s.unfinished_requests = static_cast<int64_t>(requests_.size());
  return s;
}

}  // namespace prl
