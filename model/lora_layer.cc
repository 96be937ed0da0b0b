#include "model/lora_layer.h"

#include <algorithm>

#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"

namespace prl {

namespace k = kernels;

namespace {

// The first rows * cols elements of `t`, as a (rows, cols) matrix.
Tensor Prefix(const Tensor& t, int64_t rows, int64_t cols) {
  return t.Reshape({t.numel()}).Rows(0, rows * cols).Reshape({rows, cols});
}

}  // namespace

LoraScratch TakeLoraScratch(Arena& arena, const ModelConfig& c, int64_t T, int64_t rank,
                            DType activations) {
  const int64_t widest = std::max({c.hidden_size, c.q_dim(), c.intermediate_size});
  LoraScratch s;
  if (activations != DType::kF32) s.xf = arena.Take(DType::kF32, {T * widest});
  s.t = arena.Take(DType::kF32, {T, rank});
  s.dt = arena.Take(DType::kF32, {T, rank});
  s.u = arena.Take(DType::kF32, {T * widest});
  s.dx = arena.Take(DType::kF32, {T * widest});
  s.xg = arena.Take(DType::kF32, {T * widest});
  return s;
}

Tensor LoraInput(const Tensor& x, const LoraScratch& s) {
  if (x.dtype == DType::kF32) return x;
  const Tensor xf = Prefix(s.xf, x.size(0), x.size(1));
  k::ConvertDType(xf, x);
  return xf;
}

void LoraForward(const LoraPair& p, double scale, const LoraSite& site, const Tensor& x,
                 const Tensor& out, const LoraScratch& s, k::ReductionOrder order) {
  const int64_t T = x.size(0);
  const Tensor u = Prefix(s.u, T, site.out);
  const Tensor t = Prefix(s.t, T, p.a.size(0));
  k::MatmulForward(t, LoraInput(x, s), p.a, {}, false, order);  // (T, r)
  k::MatmulForward(u, t, p.b, {}, false, order);  // (T, out)
  k::AddColumns(out, site.out_col, u, 0, site.out, static_cast<float>(scale), /*accumulate=*/true);
}

void LoraForwardRows(const LoraPair& p, double scale, const LoraSite& site, const Tensor& x,
                     const Tensor& out, const Tensor& rows, const LoraScratch& s,
                     k::ReductionOrder order) {
  const int64_t n = rows.size(0);
  if (n == 0) return;
  const Tensor xg = Prefix(s.xg, n, site.in);
  const Tensor t = Prefix(s.t, n, p.a.size(0));
  const Tensor u = Prefix(s.u, n, site.out);
  if (x.dtype == DType::kF32) {
    k::EmbeddingForward(xg, x, rows);  // the row gather
  } else {  // gathered in x's dtype (into the forward's unused dx scratch), then read as F32
    const Tensor xg_x(s.dx.data, x.dtype, s.dx.device, {n, site.in});
    k::EmbeddingForward(xg_x, x, rows);
    k::ConvertDType(xg, xg_x);
  }
  k::MatmulForward(t, xg, p.a, {}, false, order);
  k::MatmulForward(u, t, p.b, {}, false, order);
  k::AddColumnsAtRows(out, rows, site.out_col, u, static_cast<float>(scale));
}

void LoraBackward(const LoraPair& p, const LoraPair& g, double scale, const LoraSite& site,
                  const Tensor& x, const Tensor& dout, const Tensor& dx, const LoraScratch& s) {
  const int64_t T = x.size(0);
  const Tensor du = Prefix(s.u, T, site.out);
  const Tensor dxa = Prefix(s.dx, T, site.in);
  const Tensor t = Prefix(s.t, T, p.a.size(0)), dt = Prefix(s.dt, T, p.a.size(0));
  // y += scale * u, u = t B^T, t = x A^T.
  k::AddColumns(du, 0, dout, site.out_col, site.out, static_cast<float>(scale),
                /*accumulate=*/false);
  const Tensor xf = LoraInput(x, s);
  k::MatmulForward(t, xf, p.a);                // as the forward computed it in the fast order
  k::MatmulBackward(dt, g.b, {}, du, t, p.b);  // dt = du B; dB += du^T t
  k::MatmulBackward(dxa, g.a, {}, dt, xf, p.a);  // dx_a = dt A; dA += dt^T x
  k::AddColumns(dx, 0, dxa, 0, site.in, 1.0f, /*accumulate=*/true);
}

}  // namespace prl
