// The token sampler on the GPU (kernels/sampling.h, cuda_ops.h): one block of kRowThreads per
// row, the row's SamplingRow read from device memory, nothing copied to the host, no
// allocation (capturable in a CUDA graph).
//
// Semantics as on the CPU (kernels/cpu/sampling.cc): z = logits / T; greedy for T = 0 (lowest
// id on ties, log-prob under softmax(logits)); otherwise the kept set — the top_k largest z
// (ties by lower id), then the smallest prefix in canonical order (z descending, id ascending)
// whose mass reaches top_p times the kept mass — and a draw by inverse CDF with u =
// Philox(seed, stream, index) (kernels/cuda/philox.cuh, the same function as core/philox.h).
//
// Determinism and agreement: without a filter the log-prob is RowLogSumExp / TokenLogprob
// (row_softmax.cuh), the learner's own log-softmax, so it equals the learner's log-prob bit for
// bit for equal logits. Every sum is in a fixed order (per-thread segments, then thread order),
// so a row's token depends only on its logits and its SamplingRow. The CDF runs in token-id
// order over the kept set: the same distribution as the CPU (whose CDF runs in canonical order
// when a filter is on), so with top-k/top-p the drawn token can differ from the CPU's for the
// same u; without a filter both run in id order. The kept set is a cut found by bisection on
// an order-preserving integer key of z (sampling_cut.cuh, pinned to the CPU's definition by a
// host test): exact, about 50 passes over the row per filter; a radix select is the known
// faster form.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/row_softmax.cuh"
#include "kernels/cuda/sampling_cut.cuh"

namespace prl::kernels::cuda {
namespace {

// Fixed-order block sums (thread order), every thread gets the result.
__device__ double BlockSumDouble(double v) {
  __shared__ double partial[kRowThreads];
  __shared__ double total;
  __syncthreads();
  partial[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int i = 0; i < kRowThreads; ++i) s += partial[i];
    total = s;
  }
  __syncthreads();
  return total;
}

struct RowView {
  const float* row;
  int64_t V;
  float inv_t, max;
  __device__ float Z(int64_t v) const { return ScaledLogit(row[v], inv_t); }
  __device__ float E(int64_t v) const { return expf(__fsub_rn(Z(v), max)); }
};

// FindCut (sampling_cut.cuh) over the tokens of `inner`, measuring counts or masses of e with
// block-wide sums: every thread of the block calls it and gets the same cut.
__device__ Cut FindRowCut(const RowView& r, const Cut& inner, bool mass, double need) {
  auto measure = [&](auto pred) {
    double s = 0.0;
    for (int64_t v = threadIdx.x; v < r.V; v += kRowThreads) {
      const uint32_t k = OrderKey(r.Z(v));
      if (inner.In(k, v) && pred(k, v)) s += mass ? static_cast<double>(r.E(v)) : 1.0;
    }
    return BlockSumDouble(s);
  };
  return FindCut(measure, r.V, need);
}

// Samples row r with one block (every thread of the block calls it).
__device__ void SampleRow(int32_t* tokens, float* logprobs, const float* logits,
                          const SamplingRow& p, int64_t r, int64_t V) {
  const float* row = logits + r * V;
  __shared__ int64_t chosen;
  if (p.temperature == 0.0f) {  // greedy
    float best = -INFINITY;
    int64_t best_id = V;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
      if (row[v] > best) best = row[v], best_id = v;
    }
    __shared__ float values[kRowThreads];
    __shared__ int64_t ids[kRowThreads];
    values[threadIdx.x] = best;
    ids[threadIdx.x] = best_id;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 1; i < kRowThreads; ++i) {
        if (values[i] > values[0] || (values[i] == values[0] && ids[i] < ids[0])) {
          values[0] = values[i];
          ids[0] = ids[i];
        }
      }
      chosen = ids[0] < V ? ids[0] : 0;
    }
    __syncthreads();
    const RowLse lse = RowLogSumExp(row, V, 1.0f);
    if (threadIdx.x == 0) {
      tokens[r] = static_cast<int32_t>(chosen);
      logprobs[r] = TokenLogprob(row, chosen, 1.0f, lse);
    }
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  const RowLse lse = RowLogSumExp(row, V, inv_t);
  const RowView view{row, V, inv_t, lse.max};
  const bool top_k = p.top_k > 0 && p.top_k < V, top_p = p.top_p < 1.0f;
  Cut keep_k{0, V};  // everything
  Cut keep_p{0, V};
  if (top_k) keep_k = FindRowCut(view, Cut{0, V}, /*mass=*/false, static_cast<double>(p.top_k));
  if (top_p) {
    double kept = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
      if (keep_k.In(OrderKey(view.Z(v)), v)) kept += static_cast<double>(view.E(v));
    }
    kept = BlockSumDouble(kept);
    keep_p = FindRowCut(view, keep_k, /*mass=*/true, static_cast<double>(p.top_p) * kept);
  }
  auto kept_weight = [&](int64_t v) -> double {
    const uint32_t k = OrderKey(view.Z(v));
    return keep_k.In(k, v) && keep_p.In(k, v) ? static_cast<double>(view.E(v)) : 0.0;
  };
  // Inverse CDF in id order: per-thread contiguous segments, scanned in thread order.
  const int64_t seg = (V + kRowThreads - 1) / kRowThreads;
  const int64_t first = threadIdx.x * seg, last = min(V, first + seg);
  double mine = 0.0;
  for (int64_t v = first; v < last; ++v) mine += kept_weight(v);
  __shared__ double segment[kRowThreads];
  segment[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < kRowThreads; ++i) total += segment[i];
    const double target = PhiloxUniform(p.seed, p.stream, p.index) * total;
    double cumulative = 0.0;
    int64_t pick = -1, last_positive = 0;
    for (int i = 0; i < kRowThreads && pick < 0; ++i) {
      const int64_t b = i * seg, e = min(V, b + seg);
      if (segment[i] > 0.0) {
        if (cumulative + segment[i] > target) {
          for (int64_t v = b; v < e; ++v) {
            const double w = kept_weight(v);
            if (w > 0.0) last_positive = v;
            cumulative += w;
            if (cumulative > target) {
              pick = v;
              break;
            }
          }
        } else {
          cumulative += segment[i];
        }
      }
    }
    if (pick < 0) {  // rounding left the target unreached: the last id with positive weight
      for (int64_t v = V - 1; v >= 0; --v) {
        if (kept_weight(v) > 0.0) {
          last_positive = v;
          break;
        }
      }
    }
    chosen = pick >= 0 ? pick : last_positive;
    tokens[r] = static_cast<int32_t>(chosen);
    if (!top_k && !top_p) {
      logprobs[r] = TokenLogprob(row, chosen, inv_t, lse);
    } else {
      logprobs[r] = static_cast<float>(log(kept_weight(chosen)) - log(total));
    }
  }
}

__global__ void __launch_bounds__(kRowThreads)
    SampleKernel(int32_t* tokens, float* logprobs, const float* logits, const SamplingRow* rows,
                 int64_t V) {
  SampleRow(tokens, logprobs, logits, rows[blockIdx.x], blockIdx.x, V);
}

// --- Split vocabulary --------------------------------------------------------------------
// A plain row (temperature > 0, no top-k/top-p) in two kernels instead of one block's three
// passes over V: SplitStatsKernel, a block per (split, row), writes each split's (max z, sum of
// exp(z - max)); SplitDrawKernel, a block per row, merges them into the row's total, draws
// u * total, walks the splits' masses to the split that holds the draw and scans only that
// split's tokens, in id order (the same inverse CDF in id order as the one-block kernel, so the
// same u gives the same token up to rounding at a boundary). The log-prob is z - (M + log
// total) with the merged statistics: equal to the learner's log-softmax within rounding, not
// bit for bit, which is why the batch-invariant engine never uses it.

__device__ __forceinline__ bool PlainRow(const SamplingRow& p, int64_t V) {
  return p.temperature != 0.0f && !(p.top_k > 0 && p.top_k < V) && !(p.top_p < 1.0f);
}

__global__ void __launch_bounds__(kRowThreads)
    SplitStatsKernel(float2* stats, const float* logits, const SamplingRow* rows, int64_t V,
                     int64_t split_len) {
  const int64_t split = blockIdx.x, r = blockIdx.y, splits = gridDim.x;
  const SamplingRow p = rows[r];
  if (!PlainRow(p, V)) return;
  const float inv_t = 1.0f / p.temperature;
  const float* row = logits + r * V;
  const int64_t begin = split * split_len, end = min(V, begin + split_len);
  float m = -INFINITY;
  for (int64_t v = begin + threadIdx.x; v < end; v += kRowThreads) {
    m = fmaxf(m, ScaledLogit(row[v], inv_t));
  }
  m = BlockMax(m);
  float sum = 0.0f;
  for (int64_t v = begin + threadIdx.x; v < end; v += kRowThreads) {
    sum += expf(ScaledLogit(row[v], inv_t) - m);
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) stats[r * splits + split] = make_float2(m, sum);
}

__global__ void __launch_bounds__(kRowThreads)
    SplitDrawKernel(int32_t* tokens, float* logprobs, const float* logits, const SamplingRow* rows,
                    const float2* stats, int64_t V, int64_t splits, int64_t split_len) {
  const int64_t r = blockIdx.x;
  const SamplingRow p = rows[r];
  if (!PlainRow(p, V)) {
    SampleRow(tokens, logprobs, logits, p, r, V);
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  const float* row = logits + r * V;
  const float2 mine =
      threadIdx.x < splits ? stats[r * splits + threadIdx.x] : make_float2(-INFINITY, 0.0f);
  const float M = BlockMax(mine.x);
  __shared__ double mass[kRowThreads];
  mass[threadIdx.x] = threadIdx.x < splits
                          ? static_cast<double>(mine.y) * exp(static_cast<double>(mine.x - M))
                          : 0.0;
  __shared__ int64_t pick_split;
  __shared__ double total_s, target_in_split;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int64_t i = 0; i < splits; ++i) total += mass[i];
    const double target = PhiloxUniform(p.seed, p.stream, p.index) * total;
    double before = 0.0;
    int64_t j = 0, last_positive = 0;
    for (; j < splits; ++j) {
      if (mass[j] > 0.0) last_positive = j;
      if (before + mass[j] > target) break;
      before += mass[j];
    }
    if (j == splits) {  // rounding left the target unreached: the last split with mass
      j = last_positive;
      before = target;  // the draw lands on the split's first token with weight
    }
    pick_split = j;
    total_s = total;
    target_in_split = target - before;
  }
  __syncthreads();
  // The chosen split's tokens in id order: per-thread contiguous segments, scanned in thread
  // order by thread 0, then the crossing segment token by token.
  const int64_t begin = pick_split * split_len, end = min(V, begin + split_len);
  const int64_t seg = (end - begin + kRowThreads - 1) / kRowThreads;
  const int64_t first = begin + threadIdx.x * seg, last = min(end, first + seg);
  auto weight = [&](int64_t v) {
    return static_cast<double>(expf(ScaledLogit(row[v], inv_t) - M));
  };
  double own = 0.0;
  for (int64_t v = first; v < last; ++v) own += weight(v);
  __syncthreads();
  mass[threadIdx.x] = own;
  __syncthreads();
  if (threadIdx.x == 0) {
    const double target = target_in_split;
    double cumulative = 0.0;
    int64_t pick = -1;
    int last_segment = -1;
    for (int i = 0; i < kRowThreads && pick < 0; ++i) {
      if (mass[i] <= 0.0) continue;
      last_segment = i;
      if (cumulative + mass[i] <= target) {
        cumulative += mass[i];
        continue;
      }
      const int64_t b = begin + i * seg, e = min(end, b + seg);
      for (int64_t v = b; v < e && pick < 0; ++v) {
        cumulative += weight(v);
        if (cumulative > target) pick = v;
      }
    }
    // Rounding left the target unreached: the last token with weight.
    int64_t last_positive = begin;
    if (pick < 0 && last_segment >= 0) {
      const int64_t b = begin + last_segment * seg, e = min(end, b + seg);
      for (int64_t v = e - 1; v >= b; --v) {
        if (weight(v) > 0.0) {
          last_positive = v;
          break;
        }
      }
    }
    const int64_t chosen = pick >= 0 ? pick : last_positive;
    tokens[r] = static_cast<int32_t>(chosen);
    const float lse = __fadd_rn(M, logf(static_cast<float>(total_s)));
    logprobs[r] = __fsub_rn(ScaledLogit(row[chosen], inv_t), lse);
  }
}

}  // namespace

void SampleTokens(int device, int32_t* tokens, float* logprobs, const float* logits,
                  const SamplingRow* rows, int64_t R, int64_t V, bool split_vocabulary) {
  if (R == 0) return;
  PRL_CHECK(R <= 65535 || !split_vocabulary, "SampleTokens: ", R,
            " rows above the split sampler's grid limit of 65535");
  PRL_CHECK(R <= 2147483647LL, "SampleTokens: ", R, " rows above the grid limit");
  SetDevice(device);
  const cudaStream_t stream = CurrentStream(device);
  if (!split_vocabulary) {
    SampleKernel<<<static_cast<unsigned>(R), kRowThreads, 0, stream>>>(tokens, logprobs, logits,
                                                                       rows, V);
    PRL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // Splits of at least 2048 tokens (8 per thread), at most kRowThreads of them.
  const int64_t split_len = std::max<int64_t>(2048, (V + kRowThreads - 1) / kRowThreads);
  const int64_t splits = (V + split_len - 1) / split_len;
  auto* stats =
      static_cast<float2*>(ScratchAlloc(device, static_cast<size_t>(R * splits) * sizeof(float2)));
  SplitStatsKernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(R)), kRowThreads, 0,
                     stream>>>(stats, logits, rows, V, split_len);
  PRL_CUDA_CHECK(cudaGetLastError());
  SplitDrawKernel<<<static_cast<unsigned>(R), kRowThreads, 0, stream>>>(
      tokens, logprobs, logits, rows, stats, V, splits, split_len);
  PRL_CUDA_CHECK(cudaGetLastError());
  ScratchFree(device, stats);
}

}  // namespace prl::kernels::cuda
