#include "kernels/context_attention.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

namespace {

// Shapes, dtypes and the pieces' bounds; the device (the CPU: the kernels' only backend).
void Check(const char* op, const AttentionShape& s, const Tensor& qkv, const Tensor& kv,
           const std::vector<QueryPiece>& pieces) {
  PRL_CHECK(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0, op, ": ",
            s.num_heads, " query heads are not a multiple of ", s.num_kv_heads, " kv heads");
  const int64_t T = qkv.size(0), T_kv = kv.size(0);
  ExpectTensor(op, "qkv", qkv, DType::kF32,
               {T, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  ExpectTensor(op, "kv", kv, DType::kF32, {T_kv, 2 * s.num_kv_heads * s.head_dim});
  PRL_CHECK(qkv.device.is_cpu() && kv.device.is_cpu(), op,
            ": context-parallel attention runs on the CPU only (its CUDA kernels wait for a GPU "
            "session)");
  for (const QueryPiece& p : pieces) {
    PRL_CHECK(p.len > 0 && p.row0 >= 0 && p.row0 + p.len <= T && p.pos0 >= 0 && p.kv0 >= 0 &&
                  p.keys >= 0 && p.kv0 + (p.keys > 0 ? p.keys : p.pos0 + p.len) <= T_kv,
              op, ": a piece (rows ", p.row0, " + ", p.len, ", position ", p.pos0, ", kv row ",
              p.kv0, ") outside ", T, " local and ", T_kv, " gathered rows");
  }
}

}  // namespace

void ContextAttentionForward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                             const Tensor& kv, const std::vector<QueryPiece>& pieces,
                             const AttentionShape& shape) {
  const char* op = "ContextAttentionForward";
  Check(op, shape, qkv, kv, pieces);
  const int64_t T = qkv.size(0), H = shape.num_heads, D = shape.head_dim;
  ExpectTensor(op, "out", out, DType::kF32, {T, H * D});
  ExpectTensor(op, "lse", lse, DType::kF32, {T, H});
  const int64_t KV = shape.num_kv_heads;
  cpu::ContextAttentionForward(out.f32(), lse.f32(), qkv.f32(), {kv.f32(), 2 * KV * D, 0, KV * D},
                               pieces.data(), static_cast<int64_t>(pieces.size()), H, KV, D);
}

void ContextAttentionBackward(const Tensor& dqkv, const Tensor& dkv, const Tensor& dout,
                              const Tensor& qkv, const Tensor& kv, const Tensor& out,
                              const Tensor& lse, const std::vector<QueryPiece>& pieces,
                              const AttentionShape& shape) {
  const char* op = "ContextAttentionBackward";
  Check(op, shape, qkv, kv, pieces);
  const int64_t T = qkv.size(0), H = shape.num_heads, D = shape.head_dim;
  ExpectTensor(op, "dqkv", dqkv, DType::kF32, {T, qkv.size(1)});
  ExpectTensor(op, "dkv", dkv, DType::kF32, {kv.size(0), kv.size(1)});
  ExpectTensor(op, "dout", dout, DType::kF32, {T, H * D});
  ExpectTensor(op, "out", out, DType::kF32, {T, H * D});
  ExpectTensor(op, "lse", lse, DType::kF32, {T, H});
  const int64_t KV = shape.num_kv_heads;
  cpu::ContextAttentionBackward(
      dqkv.f32(), {dkv.f32(), 2 * KV * D, 0, KV * D, /*accumulate=*/true}, dout.f32(), qkv.f32(),
      {kv.f32(), 2 * KV * D, 0, KV * D}, out.f32(), lse.f32(), pieces.data(),
      static_cast<int64_t>(pieces.size()), H, KV, D, kv.size(0));
}

}  // namespace prl::kernels
