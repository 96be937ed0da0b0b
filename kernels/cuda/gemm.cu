// GEMMs through cuBLASLt (kernels/cuda/gemm.h): row-major operands mapped onto cuBLAS's
// column-major convention by computing D^T = op(B)^T op(A)^T (a row-major (R, C) matrix with
// row stride ld is a column-major (C, R) one with leading dimension ld); fp32 compute (never
// TF32); bias through the BIAS epilogue where cuBLASLt offers it, else a small row kernel.
//
// State: one cuBLASLt handle per device (shared; cublasLtMatmul carries no stream in the
// handle). Per thread: the plans (descriptors, layouts and the chosen algorithm) keyed by
// shape, strides, dtypes, transposes, bias and pointer alignment, and one 32 MiB workspace per
// (device, stream) from the caching allocator — a workspace is never shared by two streams
// that could run at once (two threads' cudaStreamPerThread are different streams with the same
// handle value, hence per thread).
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "core/cuda/caching_allocator.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_skinny.h"

namespace prl::kernels::cuda {
namespace {

void CheckCublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  ::prl::internal::CheckFailed(file, line, call,
                               absl::StrCat("failed: ", cublasLtGetStatusString(status)));
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

cublasLtHandle_t Handle(int device) {
  static std::mutex mu;
  static cublasLtHandle_t handles[prl::cuda::kMaxDevices] = {};
  PRL_CHECK(device >= 0 && device < prl::cuda::kMaxDevices, "Gemm: device index ", device);
  std::lock_guard<std::mutex> lock(mu);
  if (handles[device] == nullptr) PRL_CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

// Everything that decides the algorithm (the pointers only through their alignment).
using PlanKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           DType, DType, bool, int, bool, bool>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // false with a bias: AddBiasKernel adds it after the GEMM
};

struct ThreadState {
  std::map<PlanKey, Plan> plans;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;
  ~ThreadState() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.lx);
      cublasLtMatrixLayoutDestroy(p.ly);
      cublasLtMatrixLayoutDestroy(p.ld);
      cublasLtMatmulDescDestroy(p.desc);
    }
    for (auto& [where, ws] : workspaces) prl::cuda::CachingFree(where.first, ws);
  }
};
thread_local ThreadState tls;

void* Workspace(int device, cudaStream_t stream) {
  void*& ws = tls.workspaces[{device, stream}];
  if (ws == nullptr) {
    absl::StatusOr<void*> got = prl::cuda::CachingMalloc(device, kWorkspaceBytes);
    PRL_CHECK(got.ok(), "Gemm: cuBLASLt workspace: ", got.status().ToString());
    ws = *got;
  }
  return ws;
}

std::atomic<bool> search_algorithms{false};

// Times `algo` on the plan's shapes with a scratch output: the median of 5 runs after one
// warm-up, in milliseconds; a negative value when the algorithm refuses to run.
float TimeAlgo(cublasLtHandle_t handle, const Plan& p, const GemmArgs& g,
               const cublasLtMatmulAlgo_t& algo, void* scratch_d, void* workspace,
               cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  float times[5];
  for (int i = -1; i < 5; ++i) {
    if (i >= 0) PRL_CUDA_CHECK(cudaEventRecord(start, stream));
    if (cublasLtMatmul(handle, p.desc, &g.alpha, g.b, p.lx, g.a, p.ly, &g.beta, scratch_d, p.ld,
                       scratch_d, p.ld, &algo, workspace, kWorkspaceBytes,
                       stream) != CUBLAS_STATUS_SUCCESS) {
      return -1.0f;
    }
    if (i >= 0) {
      PRL_CUDA_CHECK(cudaEventRecord(stop, stream));
      PRL_CUDA_CHECK(cudaEventSynchronize(stop));
      PRL_CUDA_CHECK(cudaEventElapsedTime(&times[i], start, stop));
    }
  }
  std::sort(times, times + 5);
  return times[2];
}

bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PRL_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Asks the heuristic for algorithms into p.algo; `found` says whether there is one. With
// `search` (and a stream not being captured), the fastest of the first kGemmSearchCandidates.
cublasStatus_t FindAlgo(cublasLtHandle_t handle, Plan& p, int align, bool* found,
                        const GemmArgs* search, int device, cudaStream_t stream) {
  cublasLtMatmulPreference_t pref;
  PRL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  PRL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t a32 = static_cast<uint32_t>(align);
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    PRL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &a32, sizeof(a32)));
  }
  const bool timed = search != nullptr && !Capturing(stream);
  cublasLtMatmulHeuristicResult_t results[kGemmSearchCandidates];
  int count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.lx, p.ly, p.ld, p.ld, pref,
                                     timed ? kGemmSearchCandidates : 1, results, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  *found = status == CUBLAS_STATUS_SUCCESS && count > 0;
  if (!*found) return status;
  p.algo = results[0].algo;
  if (!timed || count == 1) return status;
  const GemmArgs& g = *search;
  const size_t d_bytes =
      static_cast<size_t>(g.M * g.ldd) * static_cast<size_t>(DTypeSize(g.d_dtype));
  absl::StatusOr<void*> scratch = prl::cuda::CachingMalloc(device, d_bytes);
  PRL_CHECK(scratch.ok(), "Gemm: algorithm search scratch: ", scratch.status().ToString());
  PRL_CUDA_CHECK(cudaMemsetAsync(*scratch, 0, d_bytes, stream));
  cudaEvent_t start, stop;
  PRL_CUDA_CHECK(cudaEventCreate(&start));
  PRL_CUDA_CHECK(cudaEventCreate(&stop));
  float best = -1.0f;
  for (int i = 0; i < count; ++i) {
    const float ms = TimeAlgo(handle, p, g, results[i].algo, *scratch, Workspace(device, stream),
                              stream, start, stop);
    if (ms >= 0.0f && (best < 0.0f || ms < best)) {
      best = ms;
      p.algo = results[i].algo;
    }
  }
  PRL_CUDA_CHECK(cudaEventDestroy(start));
  PRL_CUDA_CHECK(cudaEventDestroy(stop));
  PRL_CUDA_CHECK(cudaStreamSynchronize(stream));
  prl::cuda::CachingFree(device, *scratch);
  return status;
}

Plan MakePlan(cublasLtHandle_t handle, const GemmArgs& g, int align, bool search, int device,
              cudaStream_t stream) {
  const GemmArgs* timed = search ? &g : nullptr;
  const cudaDataType_t ab = CudaType(g.ab_dtype), d = CudaType(g.d_dtype);
  const cublasOperation_t op_x = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // X = op(B)^T
  const cublasOperation_t op_y = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Y = op(A)^T
  Plan p;
  PRL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  PRL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)));
  PRL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)));
  // Column-major views: X (N, K) [stored (K, N) when transposed], Y (K, M) [stored (M, K)
  // when transposed], D (N, M).
  PRL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.lx, ab, g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, g.ldb));
  PRL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.ly, ab, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.lda));
  PRL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, d, g.N, g.M, g.ldd));
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    PRL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &epilogue, sizeof(epilogue)));
    PRL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &d, sizeof(d)));
    // Set per call in Gemm; here for the algorithm search's timed runs.
    PRL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &g.bias, sizeof(g.bias)));
    // Any refusal of the epilogue (no algorithm, or a status saying the combination is not
    // supported) falls back to the bias kernel.
    bool found = false;
    FindAlgo(handle, p, align, &found, timed, device, stream);
    if (found) {
      p.bias_epilogue = true;
      return p;
    }
    const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;  // bias by AddBiasKernel
    PRL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof(none)));
  }
  bool found = false;
  PRL_CUBLAS_CHECK(FindAlgo(handle, p, align, &found, timed, device, stream));
  PRL_CHECK(found, "Gemm: cuBLASLt has no algorithm for M=", g.M, " N=", g.N, " K=", g.K, " (",
            DTypeName(g.ab_dtype), " -> ", DTypeName(g.d_dtype), ", alignment ", align,
            " bytes, lda ", g.lda, " ldb ", g.ldb, " ldd ", g.ldd, ")");
  return p;
}

// d (M rows, stride ldd) += bias (N) on every row.
template <typename T>
__global__ void AddBiasKernel(T* d, const T* bias, int64_t M, int64_t N, int64_t ldd) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    d[m * ldd + n] = FromF32<T>(ToF32(d[m * ldd + n]) + ToF32(bias[n]));
  }
}

// ---- One algorithm for every M ----------------------------------------------------------

std::atomic<bool> tc_invariant{true};

// Everything but M, which the pinned algorithm must not depend on.
using PinnedKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, DType,
                             DType, bool, bool>;

PinnedKey PinnedKeyOf(int device, const GemmArgs& g) {
  return {device, g.trans_a, g.trans_b, g.N,       g.K,       g.lda,
          g.ldb,  g.ldd,     g.ab_dtype, g.d_dtype, g.bias != nullptr, g.beta != 0};
}

struct PinnedState {
  std::map<PinnedKey, Plan> reference;  // the algorithm, found for kPinnedReferenceRows
  std::map<std::pair<PinnedKey, int64_t>, Plan> by_rows;  // per M: its layouts, checked algo
  ~PinnedState() {
    for (auto* plans : {&reference}) {
      for (auto& [key, p] : *plans) {
        cublasLtMatrixLayoutDestroy(p.lx);
        cublasLtMatrixLayoutDestroy(p.ly);
        cublasLtMatrixLayoutDestroy(p.ld);
        cublasLtMatmulDescDestroy(p.desc);
      }
    }
    for (auto& [key, p] : by_rows) {  // the descriptor is the reference plan's
      cublasLtMatrixLayoutDestroy(p.ly);
      cublasLtMatrixLayoutDestroy(p.ld);
    }
  }
};
thread_local PinnedState pinned;

const Plan& PinnedPlan(int device, cudaStream_t stream, const GemmArgs& g) {
  const PinnedKey key = PinnedKeyOf(device, g);
  auto ref = pinned.reference.find(key);
  if (ref == pinned.reference.end()) {
    GemmArgs r = g;  // the reference shape: the same operands' layout with more rows
    r.M = kPinnedReferenceRows;
    // (Without a bias epilogue the bias kernel adds it after the product, as in Gemm: the same
    // two roundings for every M.)
    Plan p = MakePlan(Handle(device), r, /*align=*/16, /*search=*/false, device, stream);
    const int32_t one = 1;
    const cublasLtReductionScheme_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    PRL_CUBLAS_CHECK(cublasLtMatmulAlgoConfigSetAttribute(
        &p.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)));
    PRL_CUBLAS_CHECK(cublasLtMatmulAlgoConfigSetAttribute(
        &p.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none)));
    ref = pinned.reference.emplace(key, p).first;
  }
  const std::pair<PinnedKey, int64_t> rows_key{key, g.M};
  auto it = pinned.by_rows.find(rows_key);
  if (it != pinned.by_rows.end()) return it->second;
  Plan p = ref->second;  // the descriptor, the weights' layout and the algorithm, shared
  const cudaDataType_t ab = CudaType(g.ab_dtype), d = CudaType(g.d_dtype);
  PRL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.ly, ab, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.lda));
  PRL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.ld, d, g.N, g.M, g.ldd));
  cublasLtMatmulHeuristicResult_t checked{};
  const cublasStatus_t status = cublasLtMatmulAlgoCheck(Handle(device), p.desc, p.lx, p.ly, p.ld,
                                                        p.ld, &p.algo, &checked);
  PRL_CHECK(status == CUBLAS_STATUS_SUCCESS, "PinnedAlgorithmGemm: the algorithm pinned for N=",
            g.N, " K=", g.K, " refuses M=", g.M, ": ", cublasLtGetStatusString(status));
  return pinned.by_rows.emplace(rows_key, p).first->second;
}

}  // namespace

void SetTensorCoreInvariantGemm(bool on) { tc_invariant.store(on, std::memory_order_relaxed); }
bool TensorCoreInvariantGemm() { return tc_invariant.load(std::memory_order_relaxed); }

bool PinnedAlgorithmGemmSupported(const GemmArgs& g) {
  const void* c = g.c != nullptr ? g.c : g.d;
  return g.M >= 1 && g.N >= 1 && g.K >= 1 && g.alpha == 1.0f && Alignment(g.a) >= 16 &&
         Alignment(g.b) >= 16 && Alignment(g.d) >= 16 && Alignment(c) >= 16 &&
         (g.bias == nullptr || Alignment(g.bias) >= 16) && (g.c == nullptr || g.c == g.d);
}

void PinnedAlgorithmGemm(int device, cudaStream_t stream, const GemmArgs& g) {
  PRL_CHECK(PinnedAlgorithmGemmSupported(g), "PinnedAlgorithmGemm: unsupported operands (M=",
            g.M, " N=", g.N, " K=", g.K, ")");
  SetDevice(device);
  const Plan& p = PinnedPlan(device, stream, g);
  if (p.bias_epilogue) {
    PRL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &g.bias, sizeof(g.bias)));
  }
  PRL_CUBLAS_CHECK(cublasLtMatmul(Handle(device), p.desc, &g.alpha, g.b, p.lx, g.a, p.ly, &g.beta,
                                  g.d, p.ld, g.d, p.ld, &p.algo, Workspace(device, stream),
                                  kWorkspaceBytes, stream));
  if (g.bias != nullptr && !p.bias_epilogue) {
    DispatchDType(g.d_dtype, [&](auto tag) {
      using T = decltype(tag);
      AddBiasKernel<T><<<Blocks(g.M * g.N, 256), 256, 0, stream>>>(
          static_cast<T*>(g.d), static_cast<const T*>(g.bias), g.M, g.N, g.ldd);
    });
    PRL_CUDA_CHECK(cudaGetLastError());
  }
}

void SetGemmAlgorithmSearch(bool on) { search_algorithms.store(on, std::memory_order_relaxed); }
bool GemmAlgorithmSearch() { return search_algorithms.load(std::memory_order_relaxed); }

void Gemm(int device, cudaStream_t stream, const GemmArgs& g) {
  if (g.M == 0 || g.N == 0) return;
  PRL_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "Gemm: M, N, K must be positive, found M=", g.M,
            " N=", g.N, " K=", g.K);
  PRL_CHECK(g.lda >= (g.trans_a ? g.M : g.K) && g.ldb >= (g.trans_b ? g.K : g.N) && g.ldd >= g.N,
            "Gemm: a row stride is shorter than its row (lda ", g.lda, " ldb ", g.ldb, " ldd ",
            g.ldd, " for M=", g.M, " N=", g.N, " K=", g.K, ")");
  if (SkinnyGemm() && SkinnyGemmSupported(g)) return SkinnyGemmRun(device, stream, g);
  SetDevice(device);
  const cublasLtHandle_t handle = Handle(device);
  const void* c = g.c != nullptr ? g.c : g.d;
  const int align = std::min({Alignment(g.a), Alignment(g.b), Alignment(g.d), Alignment(c),
                              g.bias != nullptr ? Alignment(g.bias) : 256});
  const bool search = GemmAlgorithmSearch();
  const PlanKey key{device, g.trans_a,   g.trans_b, g.M,        g.N,       g.K,
                    g.lda,  g.ldb,       g.ldd,     g.ab_dtype, g.d_dtype, g.bias != nullptr,
                    align,  g.beta != 0, search};
  auto it = tls.plans.find(key);
  if (it == tls.plans.end()) {
    it = tls.plans.emplace(key, MakePlan(handle, g, align, search, device, stream)).first;
  }
  Plan& p = it->second;
  if (p.bias_epilogue) {
    PRL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &g.bias, sizeof(g.bias)));
  }
  PRL_CUBLAS_CHECK(cublasLtMatmul(handle, p.desc, &g.alpha, g.b, p.lx, g.a, p.ly, &g.beta, c, p.ld,
                                  g.d, p.ld, &p.algo, Workspace(device, stream), kWorkspaceBytes,
                                  stream));
  if (g.bias != nullptr && !p.bias_epilogue) {
    DispatchDType(g.d_dtype, [&](auto tag) {
      using T = decltype(tag);
      AddBiasKernel<T><<<Blocks(g.M * g.N, 256), 256, 0, stream>>>(
          static_cast<T*>(g.d), static_cast<const T*>(g.bias), g.M, g.N, g.ldd);
    });
    PRL_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace prl::kernels::cuda
