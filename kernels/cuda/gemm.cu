// GEMMs through cuBLASLt (kernels/cuda/cuda_ops.h): row-major operands mapped onto cuBLAS's
// column-major convention by computing D^T = op(B)^T op(A)^T; fp32 compute (no TF32), bias
// through the BIAS epilogue. The heuristic's choice is cached per shape, dtype, transposes and
// pointer alignment; one 32 MiB workspace per device.
#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {
namespace {

void CheckCublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "prl: cuBLASLt error: %s failed: %s (%s:%d)\n", call,
               cublasLtGetStatusString(status), file, line);
  std::abort();
}
#define PRL_CUBLAS_CHECK(call) CheckCublas((call), #call, __FILE__, __LINE__)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cudaDataType_t CudaType(DType dt) {
  PRL_CHECK(dt == DType::kF32 || dt == DType::kBF16, "Gemm: F32 or BF16 operands, found ",
            DTypeName(dt));
  return dt == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
}

int Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                       int, bool, int, int, int, float>;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, cublasLtMatmulAlgo_t> algos;
};

std::mutex mu;
std::map<int, DeviceState> states;

}  // namespace

void Gemm(int device, const GemmArgs& g) {
  if (g.M == 0 || g.N == 0) return;
  PRL_CHECK(g.K > 0, "Gemm: K must be positive, found ", g.K);
  SetDevice(device);
  const cudaDataType_t ab = CudaType(g.ab_dtype), d = CudaType(g.d_dtype);
  const cublasOperation_t op_x = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // X = op(B)^T
  const cublasOperation_t op_y = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Y = op(A)^T
  const int align = std::min({Alignment(g.a), Alignment(g.b), Alignment(g.d),
                              g.bias != nullptr ? Alignment(g.bias) : 256});
  const Key key{device,
                g.trans_a,
                g.trans_b,
                g.M,
                g.N,
                g.K,
                g.lda,
                g.ldb,
                g.ldd,
                static_cast<int>(g.ab_dtype),
                static_cast<int>(g.d_dtype),
                g.bias != nullptr,
                align,
                0,
                0,
                g.beta};

  cublasLtMatmulDesc_t desc;
  PRL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  PRL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)));
  PRL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)));
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    PRL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                    sizeof(epilogue)));
    PRL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &g.bias, sizeof(g.bias)));
    PRL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &d, sizeof(d)));
  }
  // Column-major views: X (N, K) [stored (K, N) when transposed], Y (K, M) [stored (M, K)],
  // D (N, M).
  cublasLtMatrixLayout_t lx, ly, ld;
  PRL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&lx, ab, g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, g.ldb));
  PRL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&ly, ab, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.lda));
  PRL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, d, g.N, g.M, g.ldd));

  DeviceState* state;
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(mu);
    state = &states[device];
    if (state->handle == nullptr) {
      PRL_CUBLAS_CHECK(cublasLtCreate(&state->handle));
      PRL_CUDA_CHECK(cudaMalloc(&state->workspace, kWorkspaceBytes));
    }
    auto it = state->algos.find(key);
    if (it == state->algos.end()) {
      cublasLtMatmulPreference_t pref;
      PRL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kWorkspaceBytes;
      PRL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      const uint32_t a32 = static_cast<uint32_t>(align);
      for (auto attr :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        PRL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &a32, sizeof(a32)));
      }
      cublasLtMatmulHeuristicResult_t result;
      int found = 0;
      PRL_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(state->handle, desc, lx, ly, ld, ld, pref, 1,
                                                      &result, &found));
      cublasLtMatmulPreferenceDestroy(pref);
      PRL_CHECK(found > 0, "Gemm: cuBLASLt has no algorithm for M=", g.M, " N=", g.N, " K=", g.K,
                " (", DTypeName(g.ab_dtype), " -> ", DTypeName(g.d_dtype), ", alignment ", align,
                " bytes)");
      it = state->algos.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  PRL_CUBLAS_CHECK(cublasLtMatmul(state->handle, desc, &g.alpha, g.b, lx, g.a, ly, &g.beta, g.d, ld,
                                  g.d, ld, &algo, state->workspace, kWorkspaceBytes,
                                  CurrentStream(device)));
  cublasLtMatrixLayoutDestroy(lx);
  cublasLtMatrixLayoutDestroy(ly);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace prl::kernels::cuda
