#include "inference_engine/model_runner.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/norm_matmul.h"
#include "kernels/paged_attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

namespace prl {

namespace k = kernels;

ModelRunner::ModelRunner(const ModelConfig& config, KvCache* cache,
                         const ModelRunnerOptions& options)
    : config_(config),
      cache_(cache),
      options_(options),
      inv_freq_(RopeInverseFrequencies(config)),
      arena_(options.device),
      copy_arena_(options.device),
      sample_arena_(options.device),
      graph_arena_(options.device),
      transfer_(options.device) {}

ModelRunner::~ModelRunner() = default;

std::vector<int64_t> ModelRunner::GraphBuckets(int64_t max_batch) {
  std::vector<int64_t> buckets;
  for (int64_t b : {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256}) {
    if (b < max_batch) buckets.push_back(b);
  }
  for (int64_t b = 384; b < max_batch; b *= 2) buckets.push_back(b);
  buckets.push_back(max_batch);
  return buckets;
}

void ModelRunner::ResetGraphs() { graphs_.clear(); }

ModelRunner::HostStep ModelRunner::BuildHostStep(const SchedulerOutput& step,
                                                 int64_t pad_to) const {
  const int64_t bs = cache_->block_size;
  HostStep h;
  h.B = static_cast<int64_t>(step.chunks.size());
  for (const ScheduledChunk& ch : step.chunks) {
    h.used_width = std::max<int64_t>(h.used_width, ch.seq->block_table.size());
  }
  std::vector<int32_t> tokens, positions, slots, q_start = {0}, context_lens, sample_rows;
  // Padding rows are uploaded as zeros every step: the buckets' graphs share one arena, so a
  // row no step wrote may hold another bucket's activations, not a block id.
  h.tables.assign(std::max(h.B, pad_to) * h.used_width, 0);
  for (int64_t b = 0; b < h.B; ++b) {
    const Sequence& seq = *step.chunks[b].seq;
    const int64_t first = seq.num_computed_tokens, n = step.chunks[b].num_tokens;
    for (int64_t p = first; p < first + n; ++p) {
      tokens.push_back(seq.tokens[p]);
      positions.push_back(static_cast<int32_t>(p));
      slots.push_back(static_cast<int32_t>(seq.block_table[p / bs] * bs + p % bs));
    }
    q_start.push_back(static_cast<int32_t>(tokens.size()));
    context_lens.push_back(static_cast<int32_t>(first + n));
    std::copy(seq.block_table.begin(), seq.block_table.end(), h.tables.begin() + b * h.used_width);
    if (step.chunks[b].samples) sample_rows.push_back(q_start.back() - 1);
  }
  // Padding sequences of a graph bucket: one token at position 0 that writes no K/V and
  // attends to one key of block 0 (their table rows are zero).
  for (int64_t b = h.B; b < pad_to; ++b) {
    sample_rows.push_back(static_cast<int32_t>(tokens.size()));
    tokens.push_back(0);
    positions.push_back(0);
    slots.push_back(-1);
    q_start.push_back(static_cast<int32_t>(tokens.size()));
    context_lens.push_back(1);
  }
  h.T = static_cast<int64_t>(tokens.size());
  h.R = static_cast<int64_t>(sample_rows.size());
  h.B = static_cast<int64_t>(context_lens.size());
  for (const auto* part : {&tokens, &positions, &slots, &q_start, &context_lens, &sample_rows}) {
    h.meta.insert(h.meta.end(), part->begin(), part->end());
  }
  return h;
}

absl::Status ModelRunner::Layout(Arena& arena, int64_t T, int64_t B, int64_t R, int64_t width,
                                 StepTensors* t, int64_t lora_rank, bool adapter_rows) {
  const ModelConfig& c = config_;
  const DType dt = options_.dtype;
  const int64_t meta_len = 3 * T + (B + 1) + B + R;
  PRL_RETURN_IF_ERROR(arena.Build([&](Arena& a) {
    t->meta = a.Take(DType::kI32, {meta_len});
    t->tables = a.Take(DType::kI32, {B, width});
    t->inv_freq = a.Take(DType::kF32, {c.head_dim / 2});
    t->cos = a.Take(DType::kF32, {T, c.head_dim / 2});
    t->sin = a.Take(DType::kF32, {T, c.head_dim / 2});
    for (LayerActivations& l : t->slot) l = TakeLayerActivations(a, c, T, /*lse=*/false, dt);
    t->final_input = a.Take(dt, {T, c.hidden_size});
    t->gathered = a.Take(dt, {R, c.hidden_size});
    t->lnf_rstd = a.Take(DType::kF32, {R});
    t->head_in = a.Take(dt, {R, c.hidden_size});
    t->logits = a.Take(DType::kF32, {R, c.vocab_size});
    if (lora_rank > 0) t->lora = TakeLoraScratch(a, c, T, lora_rank, dt);
    if (adapter_rows) t->adapter_rows = a.Take(DType::kI32, {T});
  }));
  t->T = T;
  t->B = B;
  t->R = R;
  t->width = width;
  int32_t* base = t->meta.i32();
  auto slice = [&](int64_t n) {
    Tensor v(base, DType::kI32, options_.device, {n});
    base += n;
    return v;
  };
  t->tokens = slice(T);
  t->positions = slice(T);
  t->slots = slice(T);
  t->q_start = slice(B + 1);
  t->context = slice(B);
  t->rows = slice(R);
  return absl::OkStatus();
}

absl::Status ModelRunner::Upload(const HostStep& h, const StepTensors& t) {
  PRL_RETURN_IF_ERROR(transfer_.ToDevice(t.meta, h.meta.data(), h.meta.size() * sizeof(int32_t)));
  PRL_RETURN_IF_ERROR(
      transfer_.ToDevice(t.inv_freq, inv_freq_.data(), inv_freq_.size() * sizeof(float)));
  const int64_t rows = static_cast<int64_t>(h.tables.size()) / h.used_width;
  return transfer_.ToDevice2D(t.tables, t.width * sizeof(int32_t), h.tables.data(),
                              h.used_width * sizeof(int32_t), rows);
}

void ModelRunner::Forward(const ModelParams& params, const StepTensors& t, bool single_token_rows) {
  const ModelConfig& c = config_;
  const k::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  const bool tuned = options_.tuned_kernels;
  k::RopeTables(t.cos, t.sin, t.positions, t.inv_freq);
  k::EmbeddingForward(t.slot[0].input, params.embed, t.tokens);
  LayerContext ctx{&config_, t.cos, t.sin, options_.order};
  ctx.residual_in_gemm = tuned;
  ctx.attention_applies_rope = tuned;
  ctx.norm_in_gemm = options_.norm_in_gemm && params.lora == nullptr && step_adapters_.empty();
  if (params.lora != nullptr) ctx.lora_scale = params.lora->scale;
  ctx.lora_scratch = &t.lora;
  std::vector<LoraRows> layer_rows(step_adapters_.size());
  const int64_t Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  step_routes_.assign(t.T * Lm * K, 0);
  for (int64_t l = 0, moe_index = 0; l < c.num_hidden_layers; ++l) {
    const LayerActivations& a = t.slot[l % 2];
    const Tensor& next = l + 1 < c.num_hidden_layers ? t.slot[(l + 1) % 2].input : t.final_input;
    if (params.lora != nullptr) ctx.lora = &params.lora->layers[l];
    for (size_t i = 0; i < step_adapters_.size(); ++i) {  // several adapters: each on its rows
      const AdapterRows& r = step_adapters_[i];
      layer_rows[i] = {
          &r.adapter->layers[l], r.adapter->scale,
          t.adapter_rows.Rows(r.offset, r.offset + static_cast<int64_t>(r.rows.size()))};
    }
    ctx.lora_rows = layer_rows;
    DecoderLayerForward(ctx, params.layers[l], a, next, [&](const LayerActivations& act) {
      if (tuned) {
        k::RopeKvCacheWrite(cache_->k[l], cache_->v[l], act.qkv, t.slots, t.cos, t.sin, shape);
      } else {
        k::KvCacheWrite(cache_->k[l], cache_->v[l], act.qkv, t.slots, shape);
      }
      k::PagedAttentionForward(act.attn, act.qkv, cache_->k[l], cache_->v[l], t.tables, t.q_start,
                               t.context, shape, options_.order, tuned && single_token_rows);
    });
    if (!params.layers[l].is_moe()) continue;
    MoeRoutesToHost(a.moe, &host_routes_, nullptr, nullptr);  // (T, K)
    for (int64_t row = 0; row < t.T; ++row) {
      std::copy_n(host_routes_.data() + row * K, K,
                  step_routes_.data() + (row * Lm + moe_index) * K);
    }
    ++moe_index;
  }
  if (t.R > 0) {
    // Only the sampled rows need the final norm and the head (RMSNorm is per row).
    k::EmbeddingForward(t.gathered, t.final_input, t.rows);  // row gather
    const float eps = static_cast<float>(c.rms_norm_eps);
    if (options_.norm_in_gemm && t.R <= k::kNormInGemmMaxRows &&
        k::NormMatmulSupported(t.logits, t.gathered, params.final_norm, params.lm_head, {},
                               options_.order)) {
      k::NormMatmulForward(t.logits, t.gathered, params.final_norm, eps, params.lm_head);
      return;  // the final norm in the LM head's GEMM (F32 logits)
    }
    k::RmsNormForward(t.head_in, t.lnf_rstd, t.gathered, params.final_norm, eps);
    k::MatmulForward(t.logits, t.head_in, params.lm_head, {}, /*accumulate=*/false, options_.order);
  }
}

absl::Status ModelRunner::CopyBlocks(const SchedulerOutput& step) {
  const int64_t P = static_cast<int64_t>(step.block_copies.size());
  Tensor pairs;
  PRL_RETURN_IF_ERROR(copy_arena_.Build([&](Arena& a) { pairs = a.Take(DType::kI32, {P, 2}); }));
  std::vector<int32_t> flat;
  for (const auto& [src, dst] : step.block_copies) flat.insert(flat.end(), {src, dst});
  PRL_RETURN_IF_ERROR(transfer_.ToDevice(pairs, flat.data(), flat.size() * sizeof(int32_t)));
  // One call copies its pairs in parallel. A destination that is also a source (a block freed
  // by a preemption and reused as a copy target within the step) must be read first: such a
  // step copies pair by pair, in the scheduler's order, as the CPU does.
  std::unordered_set<int32_t> sources;
  for (const auto& pair : step.block_copies) sources.insert(pair.first);
  const bool overlap =
      std::any_of(step.block_copies.begin(), step.block_copies.end(),
                  [&](const auto& pair) { return sources.count(pair.second) > 0; });
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (!overlap) {
      k::KvCacheCopyBlocks(cache_->k[l], cache_->v[l], pairs);
      continue;
    }
    for (int64_t i = 0; i < P; ++i) {
      k::KvCacheCopyBlocks(cache_->k[l], cache_->v[l], pairs.Rows(i, i + 1));
    }
  }
  return absl::OkStatus();
}

bool ModelRunner::IsGraphDecode(const SchedulerOutput& step) const {
  if (!options_.device.is_cuda() || !options_.cuda_graphs || step.chunks.empty() ||
      static_cast<int64_t>(step.chunks.size()) > options_.max_graph_batch) {
    return false;
  }
  for (const ScheduledChunk& ch : step.chunks) {
    if (ch.num_tokens != 1 || !ch.samples ||
        static_cast<int64_t>(ch.seq->block_table.size()) > options_.max_blocks_per_seq) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<ModelRunner::Graph*> ModelRunner::GraphFor(const ModelParams& params, int64_t B) {
  int64_t bucket = 0;
  for (int64_t b : GraphBuckets(options_.max_graph_batch)) {
    if (b >= B) {
      bucket = b;
      break;
    }
  }
  PRL_ASSIGN_OR_RETURN(Graph * graph, Captured(params, bucket));
  for (const ModelParams* twin : twins_) {
    if (twin != &params) PRL_RETURN_IF_ERROR(Captured(*twin, bucket).status());
  }
  return graph;
}

absl::StatusOr<ModelRunner::Graph*> ModelRunner::Captured(const ModelParams& params,
                                                          int64_t bucket) {
  std::unique_ptr<Graph>& slot = graphs_[{bucket, &params}];
  if (slot != nullptr && slot->graph.valid()) return slot.get();
  const auto start = std::chrono::steady_clock::now();
  slot = std::make_unique<Graph>();
  Graph& g = *slot;
  const int64_t width = options_.max_blocks_per_seq;
  if (graph_arena_.capacity_bytes() == 0) {  // sized once, for the largest bucket
    const int64_t largest = GraphBuckets(options_.max_graph_batch).back();
    StepTensors sizing;
    PRL_RETURN_IF_ERROR(Layout(graph_arena_, largest, largest, largest, width, &sizing));
  }
  PRL_RETURN_IF_ERROR(Layout(graph_arena_, bucket, bucket, bucket, width, &g.tensors));
  // A warm-up run of an all-padding step (zeroed tables: every key read is block 0): it sizes
  // the scratch pools and initialises cuBLASLt, so the capture allocates nothing new.
  const std::vector<int32_t> zeros(bucket * width, 0);
  PRL_RETURN_IF_ERROR(
      transfer_.ToDevice(g.tensors.tables, zeros.data(), zeros.size() * sizeof(int32_t)));
  const HostStep padding = BuildHostStep(SchedulerOutput{}, bucket);
  PRL_RETURN_IF_ERROR(Upload(padding, g.tensors));
  Forward(params, g.tensors, /*single_token_rows=*/true);
  PRL_RETURN_IF_ERROR(transfer_.Finish());
  absl::StatusOr<CudaGraph> graph = CudaGraph::Capture(
      options_.device, [&] { Forward(params, g.tensors, /*single_token_rows=*/true); });
  if (!graph.ok()) {
    return absl::Status(graph.status().code(),
                        absl::StrCat("decode batch ", bucket, ": ", graph.status().message(),
                                     " (--no-cuda-graphs decodes without graphs)"));
  }
  g.graph = *std::move(graph);
  ++graph_stats_.captures;
  graph_stats_.capture_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return &g;
}

absl::Status ModelRunner::Execute(const ModelParams& params, const SchedulerOutput& step,
                                  Tensor* logits,
                                  absl::Span<const LoraParams* const> chunk_adapters) {
  if (!step.block_copies.empty()) PRL_RETURN_IF_ERROR(CopyBlocks(step));
  // Several adapters: each adapter's rows (chunks are contiguous rows, in order). One adapter
  // for every row runs as params.lora (no gathers).
  step_adapters_.clear();
  ModelParams one;  // params with the step's single adapter
  const ModelParams* run = &params;
  int64_t lora_rank = params.lora != nullptr ? params.lora->rank : 0;
  if (!chunk_adapters.empty()) {
    if (chunk_adapters.size() != step.chunks.size()) {
      return absl::InternalError("ModelRunner::Execute: one adapter per chunk expected");
    }
    const bool uniform = std::all_of(chunk_adapters.begin(), chunk_adapters.end(),
                                     [&](const LoraParams* a) { return a == chunk_adapters[0]; });
    if (uniform) {
      one = params;
      one.lora = chunk_adapters[0];
      run = &one;
      lora_rank = one.lora != nullptr ? one.lora->rank : 0;
    } else {
      int32_t row = 0;
      lora_rank = 0;
      for (size_t c = 0; c < step.chunks.size(); ++c) {
        const LoraParams* a = chunk_adapters[c];
        const int32_t n = static_cast<int32_t>(step.chunks[c].num_tokens);
        if (a != nullptr) {
          auto it = std::find_if(step_adapters_.begin(), step_adapters_.end(),
                                 [&](const AdapterRows& r) { return r.adapter == a; });
          if (it == step_adapters_.end()) {
            step_adapters_.push_back({a, {}});
            it = step_adapters_.end() - 1;
          }
          for (int32_t i = 0; i < n; ++i) it->rows.push_back(row + i);
          lora_rank = std::max(lora_rank, a->rank);
        }
        row += n;
      }
    }
  }
  if (IsGraphDecode(step) && run->lora == nullptr && step_adapters_.empty()) {
    const int64_t B = static_cast<int64_t>(step.chunks.size());
    PRL_ASSIGN_OR_RETURN(Graph * g, GraphFor(params, B));
    const HostStep host = BuildHostStep(step, g->tensors.B);
    PRL_RETURN_IF_ERROR(Upload(host, g->tensors));
    PRL_RETURN_IF_ERROR(g->graph.Launch());
    ++graph_stats_.replays;
    *logits = g->tensors.logits.Rows(0, B);
    return absl::OkStatus();
  }
  const HostStep host = BuildHostStep(step, 0);
  StepTensors t;
  PRL_RETURN_IF_ERROR(Layout(arena_, host.T, host.B, host.R, host.used_width, &t, lora_rank,
                             /*adapter_rows=*/!step_adapters_.empty()));
  PRL_RETURN_IF_ERROR(Upload(host, t));
  if (!step_adapters_.empty()) {  // every adapter's rows, one after another
    std::vector<int32_t> rows;
    for (AdapterRows& r : step_adapters_) {
      r.offset = static_cast<int64_t>(rows.size());
      rows.insert(rows.end(), r.rows.begin(), r.rows.end());
    }
    PRL_RETURN_IF_ERROR(
        transfer_.ToDevice(t.adapter_rows.Rows(0, static_cast<int64_t>(rows.size())), rows.data(),
                           rows.size() * sizeof(int32_t)));
  }
  Forward(*run, t, /*single_token_rows=*/false);
  ++graph_stats_.eager_steps;
  *logits = t.logits;
  return absl::OkStatus();
}

absl::StatusOr<SampledTokens> ModelRunner::Sample(const SchedulerOutput& step,
                                                  const Tensor& logits) {
  // One sampling row per drawn token; an unforked leader draws the first token of all n samples
  // from its single logits row.
  std::vector<k::SamplingRow> rows;
  std::vector<int32_t> source_row;
  std::vector<int32_t> top_logprobs;  // per drawn token: alternatives asked for (0: none)
  int64_t r = 0;
  for (const ScheduledChunk& c : step.chunks) {
    if (!c.samples) continue;
    const Request& req = *c.seq->request;
    const bool fork = !req.forked;
    for (int32_t j = 0; j < (fork ? req.params.n : 1); ++j) {
      const Sequence& s = *req.samples[fork ? j : c.seq->sample_index];
      k::SamplingRow row;
      row.temperature = req.params.temperature;
      row.top_p = req.params.top_p;
      row.top_k = req.params.top_k;
      row.seed = req.params.seed;
      row.stream = static_cast<uint64_t>(s.sample_index);
      row.index = static_cast<uint64_t>(s.num_completion_tokens());
      rows.push_back(row);
      source_row.push_back(static_cast<int32_t>(r));
      top_logprobs.push_back(req.params.multi_turn ? req.params.top_logprobs : 0);
    }
    ++r;
  }
  const int64_t n = static_cast<int64_t>(rows.size()), V = config_.vocab_size;
  SampledTokens out;
  out.tokens.resize(n);
  out.logprobs.resize(n);
  // Rows whose alternatives were asked for: their logits come to the host (a row of V each).
  std::vector<int64_t> listed;
  for (int64_t i = 0; i < n; ++i) {
    if (top_logprobs[i] > 0) listed.push_back(i);
  }
  std::vector<float> listed_logits(listed.size() * V);
  if (n > 0) {
    // Sampled on the logits' device; only the tokens and their log-probs come back.
    Tensor d_rows, d_source, d_tokens, d_logprobs, expanded;
    PRL_RETURN_IF_ERROR(sample_arena_.Build([&](Arena& a) {
      d_rows = a.Take(DType::kI32, {n, k::kSamplingRowWords});
      d_source = a.Take(DType::kI32, {n});
      d_tokens = a.Take(DType::kI32, {n});
      d_logprobs = a.Take(DType::kF32, {n});
      if (n != r) expanded = a.Take(DType::kF32, {n, V});
    }));
    PRL_RETURN_IF_ERROR(transfer_.ToDevice(d_rows, rows.data(), rows.size() * sizeof(rows[0])));
    Tensor sample_logits = logits;
    if (n != r) {  // an unforked leader's row, once per sample: a row gather
      PRL_RETURN_IF_ERROR(transfer_.ToDevice(d_source, source_row.data(), n * sizeof(int32_t)));
      k::EmbeddingForward(expanded, logits, d_source);
      sample_logits = expanded;
    }
    k::SampleTokens(d_tokens, d_logprobs, sample_logits, d_rows,
                    /*split_vocabulary=*/options_.tuned_kernels);
    PRL_RETURN_IF_ERROR(transfer_.ToHost(out.tokens.data(), d_tokens, n * sizeof(int32_t)));
    PRL_RETURN_IF_ERROR(transfer_.ToHost(out.logprobs.data(), d_logprobs, n * sizeof(float)));
    for (size_t l = 0; l < listed.size(); ++l) {
      PRL_RETURN_IF_ERROR(transfer_.ToHost(listed_logits.data() + l * V,
                                           sample_logits.Rows(listed[l], listed[l] + 1),
                                           V * sizeof(float)));
    }
  }
  PRL_RETURN_IF_ERROR(transfer_.Finish());
  out.alternatives.resize(n);
  for (size_t l = 0; l < listed.size(); ++l) {
    const int64_t i = listed[l];
    out.alternatives[i] = k::TopLogprobs(absl::MakeConstSpan(listed_logits.data() + l * V, V),
                                         rows[i], top_logprobs[i]);
  }
  return out;
}

}  // namespace prl
