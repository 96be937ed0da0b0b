// The caching device allocator behind every CUDA Buffer (core/buffer.h via cuda::Malloc/Free).
//
// cudaMalloc and cudaFree synchronise the device and cost tens of microseconds to
// milliseconds, so freed blocks are kept in a per-device free list and handed out again: a
// training step that frees and re-allocates the same sizes calls cudaMalloc only in its first
// step. Sizes are rounded (up to 1 MiB: to 512 bytes; above: to 2 MiB), and a request takes
// the smallest cached block that fits and wastes at most an eighth of the request (blocks are
// not split). Every block is at least 256-byte aligned (cudaMalloc's guarantee).
//
// Out of memory: the device's cache is emptied (and the stream-ordered pool of the kernels'
// scratch trimmed) and the cudaMalloc retried once; if that fails too the allocation returns
// RESOURCE_EXHAUSTED naming the size and the device.
//
// The free rule (what makes reuse safe without recording an event per block): Free first
// synchronises the freeing thread's current stream for the device (core/cuda/stream.h), so a
// block is idle when it re-enters the cache. Work on *other* streams that touches the memory
// (a side Stream, another thread's stream) must have finished, or be ordered before that
// stream, when the Buffer is freed — the caller's business, as with any free. Frees are rare
// in prl (arenas and parameters live for many steps; per-step scratch comes from the
// stream-ordered pool), so the synchronisation costs nothing measurable.
//
// Thread-safe (one mutex). Never destroyed: cached blocks go back to the driver at exit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prl::cuda {

struct CachingAllocatorStats {
  size_t bytes_in_use = 0;        // sum of the (rounded) blocks handed out and not yet freed
  size_t peak_bytes_in_use = 0;   // maximum of bytes_in_use since the process started
  size_t bytes_cached = 0;        // sum of the free blocks kept for reuse
  int64_t cuda_malloc_calls = 0;  // successful cudaMalloc calls
  int64_t cuda_free_calls = 0;    // cudaFree calls (EmptyCache and the out-of-memory retry)
  int64_t cache_hits = 0;         // allocations served from the cache
  int64_t oom_retries = 0;        // cudaMalloc failures that emptied the cache and retried
};

// At least `bytes` (> 0) of device memory on `device`, uninitialised.
absl::StatusOr<void*> CachingMalloc(int device, size_t bytes);
// Returns a block from CachingMalloc to the cache (see the free rule above). Null is a no-op.
void CachingFree(int device, void* ptr);
// Gives every cached (free) block of `device` back to the driver.
absl::Status EmptyCache(int device);
CachingAllocatorStats GetCachingAllocatorStats(int device);
// The block size an allocation of `bytes` occupies (exposed for tests).
size_t CachingAllocatorRoundSize(size_t bytes);

}  // namespace prl::cuda
