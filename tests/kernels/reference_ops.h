// Naive float64 reference implementations of the kernel library's operations, written
// independently of kernels/ (plain loops, no BLAS, no blocking, no fused tricks). The kernel
// tests compare the fp32 kernels' forwards against these, and their backwards against central
// finite differences of these.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace prl::testing {

using Vec = std::vector<double>;

inline Vec RandomVec(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  Vec v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

inline std::vector<float> ToF32(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
inline Vec ToF64(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// ||a - b|| / ||b|| (b the reference); 0 when both are zero.
inline double RelativeError(const Vec& a, const Vec& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  if (ref == 0.0) return std::sqrt(diff);
  return std::sqrt(diff / ref);
}

inline double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central finite differences of the scalar function f at x, for every coordinate.
inline Vec FiniteDifferenceGradient(const std::function<double(const Vec&)>& f, Vec x,
                                    double h = 1e-6) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f(x);
    x[i] = saved - h;
    const double down = f(x);
    x[i] = saved;
    grad[i] = (up - down) / (2.0 * h);
  }
  return grad;
}

// out (M, N) = a (M, K) w (N, K)^T + bias (N, may be empty)
inline Vec MatmulRef(const Vec& a, const Vec& w, const Vec& bias, int64_t M, int64_t N, int64_t K) {
  Vec out(M * N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = bias.empty() ? 0.0 : bias[n];
      for (int64_t k = 0; k < K; ++k) s += a[m * K + k] * w[n * K + k];
      out[m * N + n] = s;
    }
  }
  return out;
}

inline Vec RmsNormRef(const Vec& x, const Vec& w, int64_t T, int64_t C, double eps) {
  Vec y(T * C);
  for (int64_t t = 0; t < T; ++t) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += x[t * C + c] * x[t * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int64_t c = 0; c < C; ++c) y[t * C + c] = w[c] * x[t * C + c] * r;
  }
  return y;
}

// Rotates the first num_heads heads of each row (width W) by angle(t, i) (rotate_half).
inline Vec RopeRef(const Vec& x, const std::vector<double>& cos, const std::vector<double>& sin,
                   int64_t T, int64_t W, int64_t num_heads, int64_t D) {
  Vec y = x;
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const double x1 = x[t * W + h * D + i], x2 = x[t * W + h * D + i + half];
        const double c = cos[t * half + i], s = sin[t * half + i];
        y[t * W + h * D + i] = x1 * c - x2 * s;
        y[t * W + h * D + i + half] = x2 * c + x1 * s;
      }
    }
  }
  return y;
}

// Causal GQA attention per sequence; qkv (T, (H + 2 KV) D) -> out (T, H D).
inline Vec AttentionRef(const Vec& qkv, const std::vector<int32_t>& cu_seqlens, int64_t H,
                        int64_t KV, int64_t D) {
  const int64_t W = (H + 2 * KV) * D;
  const int64_t T = cu_seqlens.back();
  Vec out(T * H * D, 0.0);
  for (size_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
    const int64_t start = cu_seqlens[b], end = cu_seqlens[b + 1];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = start; i < end; ++i) {
        std::vector<double> scores;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = start; j <= i; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < D; ++d)
            s += qkv[i * W + h * D + d] * qkv[j * W + (H + g) * D + d];
          s /= std::sqrt(static_cast<double>(D));
          scores.push_back(s);
          mx = std::max(mx, s);
        }
        double z = 0.0;
        for (double& s : scores) z += (s = std::exp(s - mx));
        for (int64_t j = start; j <= i; ++j) {
          const double p = scores[j - start] / z;
          for (int64_t d = 0; d < D; ++d) {
            out[i * H * D + h * D + d] += p * qkv[j * W + (H + KV + g) * D + d];
          }
        }
      }
    }
  }
  return out;
}

inline Vec SwiGluRef(const Vec& gate_up, int64_t T, int64_t I) {
  Vec act(T * I);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      const double g = gate_up[t * 2 * I + i], u = gate_up[t * 2 * I + I + i];
      act[t * I + i] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  return act;
}

// logprob[r] = log softmax(h[r] W^T / temperature)[target[r]]
inline Vec LogprobRef(const Vec& h, const Vec& W, const std::vector<int32_t>& targets, int64_t R,
                      int64_t V, int64_t C, double temperature) {
  Vec out(R);
  for (int64_t r = 0; r < R; ++r) {
    std::vector<double> z(V);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) {
      double s = 0.0;
      for (int64_t c = 0; c < C; ++c) s += h[r * C + c] * W[v * C + c];
      z[v] = s / temperature;
      mx = std::max(mx, z[v]);
    }
    double sum = 0.0;
    for (double s : z) sum += std::exp(s - mx);
    out[r] = z[targets[r]] - mx - std::log(sum);
  }
  return out;
}

}  // namespace prl::testing
