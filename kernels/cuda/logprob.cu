// The LM head fused with log-softmax and the target gather, on the GPU (cuda_ops.h): per chunk
// of rows, the logits chunk comes from one cuBLASLt GEMM into an F32 scratch, then one block
// per row takes the max, the log-sum-exp and the target's log-prob. The backward recomputes
// the chunk, turns it into dlogits (in the activations' dtype, for the tensor-core GEMMs) and
// runs two GEMMs: dh = dlogits . W and dW += dlogits^T . h. The (rows, V) logits never exist
// beyond one chunk.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/row_softmax.cuh"

namespace prl::kernels::cuda {
namespace {

constexpr int kThreads = kRowThreads;  // the row log-softmax order depends on it

__global__ void RowLogprobKernel(float* logprob, float* lse, float* entropy, const float* logits,
                                 const int32_t* targets, int64_t V, float inv_temperature) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * V;
  const RowLse stats = RowLogSumExp(row, V, inv_temperature);
  if (threadIdx.x == 0) {
    lse[r] = stats.lse;
    logprob[r] = TokenLogprob(row, targets[r], inv_temperature, stats);
  }
  if (entropy == nullptr) return;  // (uniform over the block: no thread waits alone)
  float expected_z = 0.0f;  // sum_v p_v z_v
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const float z = ScaledLogit(row[v], inv_temperature);
    expected_z += expf(z - stats.lse) * z;
  }
  expected_z = BlockSum(expected_z);
  if (threadIdx.x == 0) entropy[r] = stats.lse - expected_z;
}

template <typename T>
__global__ void DlogitsKernel(T* dlogits, const float* logits, const float* dlogprob,
                              const int32_t* targets, const float* lse, int64_t V,
                              float inv_temperature) {
  const int64_t r = blockIdx.y;
  const float scale = dlogprob[r] * inv_temperature, l = lse[r];
  const int32_t target = targets[r];
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < V;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float p = expf(logits[r * V + v] * inv_temperature - l);
    dlogits[r * V + v] = FromF32<T>(scale * ((v == target ? 1.0f : 0.0f) - p));
  }
}

void LogitsChunk(int device, DType dt, float* scratch, const void* h, const void* W, int64_t rows,
                 int64_t V, int64_t C) {
  Gemm(device, CurrentStream(device),
       LinearGemmArgs(rows, V, C, h, W, scratch, dt, DType::kF32));
}

const char* Offset(const void* p, int64_t elements, DType dt) {
  return static_cast<const char*>(p) + elements * static_cast<int64_t>(DTypeSize(dt));
}

}  // namespace

void LogprobForward(int device, DType dt, float* logprob, float* lse, const void* h, const void* W,
                    const int32_t* targets, int64_t R, int64_t V, int64_t C, float temperature,
                    float* scratch, int64_t chunk_rows, bool invariant, float* entropy) {
  SetDevice(device);
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, R - r0);
    if (invariant) {
      InvariantGemm(device, dt, DType::kF32, scratch, Offset(h, r0 * C, dt), W, nullptr, n, V, C,
                    /*accumulate=*/false);
    } else {
      LogitsChunk(device, dt, scratch, Offset(h, r0 * C, dt), W, n, V, C);
    }
    RowLogprobKernel<<<n, kThreads, 0, CurrentStream(device)>>>(
        logprob + r0, lse + r0, entropy != nullptr ? entropy + r0 : nullptr, scratch,
        targets + r0, V, 1.0f / temperature);
    PRL_CUDA_CHECK(cudaGetLastError());
  }
}

void LogprobBackward(int device, DType dt, void* dh, void* dW, DType dW_dtype,
                     const float* dlogprob, const void* h, const void* W, const int32_t* targets,
                     const float* lse, int64_t R, int64_t V, int64_t C, float temperature,
                     float* scratch, void* dlogits_scratch, int64_t chunk_rows, bool logits_kept) {
  SetDevice(device);
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, R - r0);
    if (!logits_kept) LogitsChunk(device, dt, scratch, Offset(h, r0 * C, dt), W, n, V, C);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((V + kThreads - 1) / kThreads, 64)),
                    static_cast<unsigned>(n));
    DispatchDType(dt, [&](auto tag) {
      using T = decltype(tag);
      DlogitsKernel<T><<<grid, kThreads, 0, CurrentStream(device)>>>(
          static_cast<T*>(dlogits_scratch), scratch, dlogprob + r0, targets + r0, lse + r0, V,
          1.0f / temperature);
    });
    PRL_CUDA_CHECK(cudaGetLastError());
    GemmArgs dh_args;  // dh (n, C) = dlogits (n, V) . W (V, C)
    dh_args.M = n;
    dh_args.N = C;
    dh_args.K = V;
    dh_args.a = dlogits_scratch;
    dh_args.lda = V;
    dh_args.b = W;
    dh_args.ldb = C;
    dh_args.d = const_cast<char*>(Offset(dh, r0 * C, dt));
    dh_args.ldd = C;
    dh_args.ab_dtype = dt;
    dh_args.d_dtype = dt;
    Gemm(device, CurrentStream(device), dh_args);
    if (dW == nullptr) continue;  // a frozen LM head
    GemmArgs dw_args;  // dW (V, C) += dlogits^T (V, n) . h (n, C)
    dw_args.trans_a = true;
    dw_args.M = V;
    dw_args.N = C;
    dw_args.K = n;
    dw_args.a = dlogits_scratch;
    dw_args.lda = V;
    dw_args.b = Offset(h, r0 * C, dt);
    dw_args.ldb = C;
    dw_args.d = dW;
    dw_args.ldd = C;
    dw_args.ab_dtype = dt;
    dw_args.d_dtype = dW_dtype;
    dw_args.beta = 1;
    Gemm(device, CurrentStream(device), dw_args);
  }
}

}  // namespace prl::kernels::cuda
