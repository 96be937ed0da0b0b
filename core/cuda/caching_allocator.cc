// The caching device allocator (core/cuda/caching_allocator.h).
#include "core/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#include "core/status_macros.h"

namespace prl::cuda {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // up to here: 512-byte granularity
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

struct DeviceCache {
  std::multimap<size_t, void*> free_blocks;  // block size -> block, idle (see the free rule)
  std::unordered_map<void*, size_t> live;    // block -> block size, handed out
  CachingAllocatorStats stats;
};

struct Allocator {
  std::mutex mu;
  DeviceCache devices[kMaxDevices];
};

Allocator& Get() {
  static Allocator* allocator = new Allocator;  // leaked: usable from static destructors
  return *allocator;
}

DeviceCache& CacheOf(Allocator& a, int device) {
  PRL_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index out of range: ", device);
  return a.devices[device];
}

// Gives the device's free blocks back to the driver. Caller holds the mutex.
absl::Status ReleaseCachedLocked(int device, DeviceCache& cache) {
  if (cache.free_blocks.empty()) return absl::OkStatus();
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  absl::Status status;
  for (auto& [size, ptr] : cache.free_blocks) {
    const absl::Status freed = PRL_CUDA_STATUS(cudaFree(ptr));
    if (freed.ok()) ++cache.stats.cuda_free_calls;
    status.Update(freed);
    cache.stats.bytes_cached -= size;
  }
  cache.free_blocks.clear();
  return status;
}

// The out-of-memory retry also returns what the kernels' stream-ordered scratch pool holds
// (kernels/cuda/context.cu raises its release threshold, so it never shrinks by itself).
void TrimScratchPool(int device) {
  cudaMemPool_t pool;
  if (cudaDeviceSynchronize() == cudaSuccess &&
      cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    cudaMemPoolTrimTo(pool, 0);
  }
  cudaGetLastError();
}

}  // namespace

size_t CachingAllocatorRoundSize(size_t bytes) {
  const size_t round = bytes <= kSmallLimit ? kSmallRound : kLargeRound;
  return std::max<size_t>(1, (bytes + round - 1) / round) * round;
}

absl::StatusOr<void*> CachingMalloc(int device, size_t bytes) {
  PRL_CHECK(bytes > 0, "CachingMalloc of zero bytes");
  const size_t size = CachingAllocatorRoundSize(bytes);
  Allocator& a = Get();
  std::lock_guard<std::mutex> lock(a.mu);
  DeviceCache& cache = CacheOf(a, device);
  CachingAllocatorStats& stats = cache.stats;

  void* ptr = nullptr;
  size_t block = size;
  // Best fit among the cached blocks, wasting at most an eighth of the request.
  auto it = cache.free_blocks.lower_bound(size);
  if (it != cache.free_blocks.end() && it->first <= size + size / 8) {
    block = it->first;
    ptr = it->second;
    cache.free_blocks.erase(it);
    stats.bytes_cached -= block;
    ++stats.cache_hits;
  } else {
    PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky, but keep the error slot clean
      ++stats.oom_retries;
      PRL_RETURN_IF_ERROR(ReleaseCachedLocked(device, cache));
      TrimScratchPool(device);
      err = cudaMalloc(&ptr, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of memory on cuda:", device, ": cudaMalloc of ", bytes, " bytes (block of ", size,
          ") failed after emptying the cache; prl's buffers hold ", stats.bytes_in_use, " bytes"));
    }
    PRL_CUDA_RETURN_IF_ERROR(err);
    ++stats.cuda_malloc_calls;
  }
  cache.live.emplace(ptr, block);
  stats.bytes_in_use += block;
  stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
  return ptr;
}

void CachingFree(int device, void* ptr) {
  if (ptr == nullptr) return;
  // The free rule: the block is idle once the freeing thread's current stream has drained.
  // Errors are ignored: at process exit the runtime may already be unloading, and a sticky
  // kernel error has already been reported by the kernel's own check.
  if (cudaSetDevice(device) == cudaSuccess) cudaStreamSynchronize(CurrentStream(device));
  cudaGetLastError();
  Allocator& a = Get();
  std::lock_guard<std::mutex> lock(a.mu);
  DeviceCache& cache = CacheOf(a, device);
  auto it = cache.live.find(ptr);
  PRL_CHECK(it != cache.live.end(),
            "CachingFree of a pointer that is not a live block of cuda:", device);
  const size_t block = it->second;
  cache.live.erase(it);
  cache.stats.bytes_in_use -= block;
  cache.free_blocks.emplace(block, ptr);
  cache.stats.bytes_cached += block;
}

absl::Status EmptyCache(int device) {
  Allocator& a = Get();
  std::lock_guard<std::mutex> lock(a.mu);
  return ReleaseCachedLocked(device, CacheOf(a, device));
}

CachingAllocatorStats GetCachingAllocatorStats(int device) {
  Allocator& a = Get();
  std::lock_guard<std::mutex> lock(a.mu);
  return CacheOf(a, device).stats;
}

}  // namespace prl::cuda
