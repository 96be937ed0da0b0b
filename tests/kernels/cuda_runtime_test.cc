// The CUDA runtime pieces the kernels stand on: the per-thread current stream and StreamGuard,
// Stream and Event, and the caching allocator behind CUDA Buffers (reuse without cudaMalloc,
// size rounding, EmptyCache, out-of-memory as RESOURCE_EXHAUSTED naming the size). The
// current-stream and rounding tests run everywhere; the rest skip without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "tests/kernels/cuda_test_util.h"

#if PRL_WITH_CUDA
#include "core/cuda/caching_allocator.h"
#include "core/cuda/stream.h"

namespace prl::cuda {
namespace {

cudaStream_t FakeStream(uintptr_t id) { return reinterpret_cast<cudaStream_t>(id); }

TEST(CurrentStreamTest, DefaultsToThePerThreadStreamAndGuardsNestAndRestore) {
  EXPECT_EQ(CurrentStream(0), cudaStreamPerThread);
  {
    StreamGuard outer(0, FakeStream(0x100));
    EXPECT_EQ(CurrentStream(0), FakeStream(0x100));
    EXPECT_EQ(CurrentStream(1), cudaStreamPerThread) << "per device";
    {
      StreamGuard inner(0, nullptr);  // the legacy stream can be made current too
      EXPECT_EQ(CurrentStream(0), nullptr);
    }
    EXPECT_EQ(CurrentStream(0), FakeStream(0x100));
    // Per thread: another thread still sees the default.
    cudaStream_t seen = FakeStream(0x1);
    std::thread([&] { seen = CurrentStream(0); }).join();
    EXPECT_EQ(seen, cudaStreamPerThread);
  }
  EXPECT_EQ(CurrentStream(0), cudaStreamPerThread);
}

TEST(CachingAllocatorTest, RoundsSmallSizesTo512BytesAndLargeOnesTo2MiB) {
  EXPECT_EQ(CachingAllocatorRoundSize(1), 512u);
  EXPECT_EQ(CachingAllocatorRoundSize(512), 512u);
  EXPECT_EQ(CachingAllocatorRoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocatorRoundSize(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocatorRoundSize((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocatorRoundSize(size_t{3} << 20), size_t{4} << 20);
}

class CudaRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { PRL_SKIP_WITHOUT_GPU(); }
};

TEST_F(CudaRuntimeTest, AFreedBlockIsReusedWithoutAnotherCudaMalloc) {
  ASSERT_TRUE(EmptyCache(0).ok());  // no other cached block of this size
  const size_t bytes = (size_t{3} << 20) + 5;
  void* first_ptr = nullptr;
  const CachingAllocatorStats before = GetCachingAllocatorStats(0);
  {
    absl::StatusOr<Buffer> first = Buffer::Allocate(Device::Cuda(0), bytes);
    ASSERT_TRUE(first.ok()) << first.status();
    first_ptr = first->data();
    EXPECT_EQ(GetCachingAllocatorStats(0).bytes_in_use,
              before.bytes_in_use + CachingAllocatorRoundSize(bytes));
  }
  const CachingAllocatorStats freed = GetCachingAllocatorStats(0);
  EXPECT_EQ(freed.bytes_in_use, before.bytes_in_use);
  EXPECT_GE(freed.bytes_cached, CachingAllocatorRoundSize(bytes));
  absl::StatusOr<Buffer> second = Buffer::Allocate(Device::Cuda(0), bytes);
  ASSERT_TRUE(second.ok()) << second.status();
  const CachingAllocatorStats after = GetCachingAllocatorStats(0);
  EXPECT_EQ(after.cuda_malloc_calls, freed.cuda_malloc_calls) << "served from the cache";
  EXPECT_EQ(after.cache_hits, freed.cache_hits + 1);
  EXPECT_EQ(second->data(), first_ptr);
  // The reused block works like a fresh one.
  ASSERT_TRUE(second->Zero().ok());
  std::vector<char> host(bytes, 1);
  ASSERT_TRUE(CopyBytes(host.data(), Device::Cpu(), second->data(), Device::Cuda(0), bytes).ok());
  EXPECT_EQ(host.front(), 0);
  EXPECT_EQ(host.back(), 0);
}

TEST_F(CudaRuntimeTest, ACachedBlockServesOnlyRequestsItFitsWithLittleWaste) {
  ASSERT_TRUE(EmptyCache(0).ok());
  { ASSERT_TRUE(Buffer::Allocate(Device::Cuda(0), size_t{8} << 20).ok()); }  // cached: 8 MiB
  const int64_t mallocs = GetCachingAllocatorStats(0).cuda_malloc_calls;
  {
    // 4 MiB would waste half the block: a new cudaMalloc.
    absl::StatusOr<Buffer> small = Buffer::Allocate(Device::Cuda(0), size_t{4} << 20);
    ASSERT_TRUE(small.ok());
    EXPECT_EQ(GetCachingAllocatorStats(0).cuda_malloc_calls, mallocs + 1);
    // 7.5 MiB rounds to 8 MiB: the cached block.
    absl::StatusOr<Buffer> close = Buffer::Allocate(Device::Cuda(0), (size_t{15} << 19));
    ASSERT_TRUE(close.ok());
    EXPECT_EQ(GetCachingAllocatorStats(0).cuda_malloc_calls, mallocs + 1);
  }
  EXPECT_GE(GetCachingAllocatorStats(0).bytes_cached, size_t{12} << 20);
  const int64_t frees = GetCachingAllocatorStats(0).cuda_free_calls;
  ASSERT_TRUE(EmptyCache(0).ok());
  EXPECT_EQ(GetCachingAllocatorStats(0).bytes_cached, 0u);
  EXPECT_GE(GetCachingAllocatorStats(0).cuda_free_calls, frees + 2);
}

TEST_F(CudaRuntimeTest, OutOfMemoryIsResourceExhaustedNamingTheSizeAndLeavesTheAllocatorUsable) {
  const size_t huge = size_t{1} << 50;  // 1 PiB
  const int64_t retries = GetCachingAllocatorStats(0).oom_retries;
  absl::StatusOr<Buffer> b = Buffer::Allocate(Device::Cuda(0), huge);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_NE(b.status().message().find(std::to_string(huge)), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("cuda:0"), std::string::npos) << b.status();
  EXPECT_EQ(GetCachingAllocatorStats(0).oom_retries, retries + 1);
  EXPECT_TRUE(Buffer::Allocate(Device::Cuda(0), 4096).ok());
}

TEST_F(CudaRuntimeTest, EventsOrderAStreamAfterAnotherAndTimeIt) {
  absl::StatusOr<Stream> producer = Stream::Create(0), consumer = Stream::Create(0);
  ASSERT_TRUE(producer.ok() && consumer.ok());
  absl::StatusOr<Event> start = Event::Create(0, /*timing=*/true),
                        done = Event::Create(0, /*timing=*/true);
  ASSERT_TRUE(start.ok() && done.ok());
  const int64_t n = int64_t{1} << 22;
  testing::DeviceTensor x(DType::kF32, {n}), y(DType::kF32, {n});
  ASSERT_TRUE(start->Record(producer->get()).ok());
  {
    StreamGuard guard(0, producer->get());
    kernels::cuda::Fill(0, DType::kF32, x.t.data, n, 3.0f);
  }
  ASSERT_TRUE(done->Record(producer->get()).ok());
  ASSERT_TRUE(consumer->Wait(*done).ok());
  {
    StreamGuard guard(0, consumer->get());
    // y = x (copy through a conversion kernel): reads what the producer wrote.
    kernels::cuda::Convert(0, DType::kF32, y.t.data, DType::kF32, x.t.data, n);
  }
  ASSERT_TRUE(consumer->Synchronize().ok());
  absl::StatusOr<bool> finished = done->Done();
  ASSERT_TRUE(finished.ok());
  EXPECT_TRUE(*finished);
  absl::StatusOr<float> ms = Event::ElapsedMs(*start, *done);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);
  const std::vector<float> got = y.Download();
  EXPECT_EQ(got.front(), 3.0f);
  EXPECT_EQ(got.back(), 3.0f);
}

}  // namespace
}  // namespace prl::cuda
#endif  // PRL_WITH_CUDA
