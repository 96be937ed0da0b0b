// CPU sampler (kernels/sampling.h). Weights exp(z - max) come from the vectorised FastExp8,
// sums are in double. Filtering without a full sort: top-k by nth_element, top-p by widening
// partial sorts until the kept mass reaches p (the mass usually sits in a few hundred tokens,
// even with a 152k vocabulary).
#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/philox.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

namespace {

// Tokens ordered by decreasing z, ties by increasing id: the canonical order of the filters.
struct ByLogit {
  const float* z;
  bool operator()(int32_t a, int32_t b) const { return z[a] > z[b] || (z[a] == z[b] && a < b); }
};

int32_t Argmax(const float* z, int64_t V) {
  int32_t best = 0;
  for (int64_t v = 1; v < V; ++v) {
    if (z[v] > z[best]) best = static_cast<int32_t>(v);
  }
  return best;
}

// Sorts the first `count` candidates (out of ids) into canonical order.
void SortPrefix(std::vector<int32_t>& ids, int64_t count, const float* z) {
  count = std::min<int64_t>(count, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), ByLogit{z});
}

// Inverse CDF: the first index whose cumulative weight exceeds u * total (the last index with
// positive weight when rounding leaves the target unreached).
template <class Weight>
int64_t InverseCdf(int64_t n, double u, double total, Weight weight) {
  const double target = u * total;
  double cumulative = 0.0;
  int64_t last_positive = n - 1;
  for (int64_t i = 0; i < n; ++i) {
    const double w = weight(i);
    if (w > 0.0) last_positive = i;
    cumulative += w;
    if (cumulative > target) return i;
  }
  return last_positive;
}

}  // namespace

double KeepTopKTopP(std::vector<int32_t>& ids, const float* z, const float* e, int64_t V,
                    double total, int32_t top_k, float top_p) {
  // Candidates in canonical order: the top-k set, then the top-p prefix of it.
  ids.resize(V);
  std::iota(ids.begin(), ids.end(), 0);
  int64_t kept = V;
  double kept_total = total;
  if (top_k > 0 && top_k < V) {
    kept = top_k;
    std::nth_element(ids.begin(), ids.begin() + kept, ids.end(), ByLogit{z});
    ids.resize(kept);
    kept_total = 0.0;
    for (int32_t id : ids) kept_total += e[id];
  }
  int64_t sorted = std::min<int64_t>(kept, 256);
  SortPrefix(ids, sorted, z);
  if (top_p < 1.0f) {
    const double threshold = static_cast<double>(top_p) * kept_total;
    double mass = 0.0;
    int64_t n = 0;
    while (true) {
      for (; n < sorted; ++n) {
        mass += e[ids[n]];
        if (mass >= threshold) break;
      }
      if (n < sorted || sorted == kept) break;
      sorted = std::min<int64_t>(kept, sorted * 8);  // widen the sorted prefix, continue
      SortPrefix(ids, sorted, z);
    }
    kept = std::min<int64_t>(n + 1, kept);
  } else {
    SortPrefix(ids, kept, z);
  }
  ids.resize(kept);
  double kept_mass = 0.0;
  for (int32_t id : ids) kept_mass += e[id];
  return kept_mass;
}

namespace {

void SampleRow(const float* logits, int64_t V, const kernels::SamplingRow& p, int32_t* token,
               float* logprob, std::vector<float>& z, std::vector<float>& e,
               std::vector<int32_t>& ids) {
  z.assign(logits, logits + V);
  if (p.temperature == 0.0f) {
    *token = Argmax(logits, V);
    *logprob = logits[*token] - RowLogSumExp(z.data(), V);
    return;
  }
  // z = logits / T as the learner computes it (LogprobForward), then lse exactly as there.
  const float inv_temperature = 1.0f / p.temperature;
  for (int64_t v = 0; v < V; ++v) z[v] = logits[v] * inv_temperature;
  const float m = RowMax(z.data(), V);
  e = z;
  const double total = SumExp</*kStore=*/true>(e.data(), V, m);  // e[v] = exp(z[v] - m)
  const double u = PhiloxUniform(p.seed, p.stream, p.index);
  const bool top_k = p.top_k > 0 && p.top_k < V;
  if (!top_k && p.top_p >= 1.0f) {
    const int64_t chosen = InverseCdf(V, u, total, [&](int64_t v) { return double{e[v]}; });
    *token = static_cast<int32_t>(chosen);
    *logprob = z[chosen] - LogSumExpFromSum(m, total);
    return;
  }
  const double kept_mass = KeepTopKTopP(ids, z.data(), e.data(), V, total, p.top_k, p.top_p);
  const int64_t kept = static_cast<int64_t>(ids.size());
  const int64_t chosen =
      ids[InverseCdf(kept, u, kept_mass, [&](int64_t i) { return double{e[ids[i]]}; })];
  *token = static_cast<int32_t>(chosen);
  *logprob = static_cast<float>(std::log(double{e[chosen]}) - std::log(kept_mass));
}

}  // namespace

std::vector<std::pair<int32_t, float>> TopLogprobs(const float* logits, int64_t V,
                                                   const SamplingRow& p, int32_t k) {
  std::vector<std::pair<int32_t, float>> out;
  if (k <= 0 || V <= 0) return out;
  std::vector<float> z(logits, logits + V);
  std::vector<int32_t> ids;
  const auto most_likely = [&](int64_t count) {  // the first `count` ids in canonical order
    ids.resize(V);
    std::iota(ids.begin(), ids.end(), 0);
    SortPrefix(ids, count, z.data());
    ids.resize(std::min<int64_t>(count, V));
  };
  if (p.temperature == 0.0f) {  // greedy: the untransformed softmax, as SampleRow reports it
    const float lse = RowLogSumExp(z.data(), V);
    most_likely(k);
    for (int32_t id : ids) out.emplace_back(id, logits[id] - lse);
    return out;
  }
  const float inv_temperature = 1.0f / p.temperature;
  for (int64_t v = 0; v < V; ++v) z[v] = logits[v] * inv_temperature;
  const float m = RowMax(z.data(), V);
  std::vector<float> e = z;
  const double total = SumExp</*kStore=*/true>(e.data(), V, m);
  if (!(p.top_k > 0 && p.top_k < V) && p.top_p >= 1.0f) {
    const float lse = static_cast<float>(LogSumExpFromSum(m, total));
    most_likely(k);
    for (int32_t id : ids) out.emplace_back(id, z[id] - lse);
    return out;
  }
  const double kept_mass = KeepTopKTopP(ids, z.data(), e.data(), V, total, p.top_k, p.top_p);
  for (size_t i = 0; i < ids.size() && static_cast<int32_t>(i) < k; ++i) {
    out.emplace_back(ids[i],
                     static_cast<float>(std::log(double{e[ids[i]]}) - std::log(kept_mass)));
  }
  return out;
}

void SampleTokens(int32_t* tokens, float* logprobs, const float* logits,
                  const kernels::SamplingRow* rows, int64_t R, int64_t V) {
#pragma omp parallel
  {
    std::vector<float> z, e;
    std::vector<int32_t> ids;
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < R; ++r) {
      SampleRow(logits + r * V, V, rows[r], tokens + r, logprobs + r, z, e, ids);
    }
  }
}

}  // namespace prl::kernels::cpu
