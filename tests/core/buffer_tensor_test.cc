#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/arena.h"
#include "core/buffer.h"
#include "core/cuda_runtime.h"
#include "core/device.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace prl {
namespace {

TEST(BufferTest, HostBuffersAreAlignedZeroableAndMovable) {
  absl::StatusOr<Buffer> b = Buffer::AllocateZeroed(Device::Cpu(), 1000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(static_cast<uint8_t*>(b->data())[i], 0);
  void* data = b->data();
  Buffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_TRUE(Buffer::Allocate(Device::Cpu(), 0)->empty());
}

TEST(BufferTest, HugeAllocationIsAnErrorNotACrash) {
  absl::StatusOr<Buffer> b = Buffer::Allocate(Device::Cpu(), size_t{1} << 62);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(BufferTest, CudaBuffersRoundTripThroughTheDevice) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU here: " << DescribeBackends();
  absl::StatusOr<Buffer> device = Buffer::Allocate(Device::Cuda(0), 16 * sizeof(float));
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<float> host(16), back(16, -1.0f);
  for (int i = 0; i < 16; ++i) host[i] = static_cast<float>(i);
  ASSERT_TRUE(CopyBytes(device->data(), Device::Cuda(0), host.data(), Device::Cpu(), 64).ok());
  ASSERT_TRUE(CopyBytes(back.data(), Device::Cpu(), device->data(), Device::Cuda(0), 64).ok());
  EXPECT_EQ(back, host);
  ASSERT_TRUE(device->Zero().ok());
  ASSERT_TRUE(CopyBytes(back.data(), Device::Cpu(), device->data(), Device::Cuda(0), 64).ok());
  EXPECT_EQ(back, std::vector<float>(16, 0.0f));
}

TEST(TensorTest, RowsAndReshapeAreViewsOfTheSameMemory) {
  std::vector<float> v(12);
  Tensor t(v.data(), DType::kF32, Device::Cpu(), {4, 3});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.ShapeString(), "(4, 3)");
  const Tensor rows = t.Rows(1, 3);
  EXPECT_EQ(rows.f32(), v.data() + 3);
  EXPECT_EQ(rows.size(0), 2);
  const Tensor flat = t.Reshape({12});
  EXPECT_EQ(flat.f32(), v.data());
  EXPECT_TRUE(t.SameShape(Tensor(nullptr, DType::kF32, Device::Cpu(), {4, 3})));
}

TEST(TensorDeathTest, WrongDtypeAccessAborts) {
  std::vector<float> v(2);
  Tensor t(v.data(), DType::kF32, Device::Cpu(), {2});
  EXPECT_DEATH(t.i32(), "expected an I32 tensor, found F32");
}

TEST(ArenaTest, BuildsAlignedNonOverlappingTensorsAndOnlyGrows) {
  Arena arena(Device::Cpu());
  Tensor a, b;
  ASSERT_TRUE(arena
                  .Build([&](Arena& ar) {
                    a = ar.Take(DType::kF32, {3});
                    b = ar.Take(DType::kI32, {5, 2});
                  })
                  .ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 64, 0u);
  EXPECT_GE(static_cast<char*>(b.data) - static_cast<char*>(a.data), 12);
  const size_t capacity = arena.capacity_bytes();
  ASSERT_TRUE(arena.Build([&](Arena& ar) { a = ar.Take(DType::kF32, {1}); }).ok());
  EXPECT_EQ(arena.capacity_bytes(), capacity);
}

TEST(DeviceTest, ResolvesFlagsAndExplainsWhyCudaIsUnavailable) {
  EXPECT_TRUE(ResolveDevice("cpu")->is_cpu());
  const absl::StatusOr<Device> bad = ResolveDevice("gpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--device"), absl::string_view::npos);
  const absl::StatusOr<Device> autodev = ResolveDevice("auto");
  ASSERT_TRUE(autodev.ok());
  if (!KernelBackendAvailable(DeviceType::kCuda)) {
    EXPECT_TRUE(autodev->is_cpu()) << "auto falls back to the CPU";
    const absl::StatusOr<Device> cuda = ResolveDevice("cuda");
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(cuda.status().message().empty());
  }
  EXPECT_EQ(ResolveDevice("cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MappedFileTest, MissingFileIsNotFoundAndAtomicWritesReplace) {
  const std::string dir = ::testing::TempDir() + "/prl_mapped_file_test";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(MappedFile::Open(dir + "/absent").status().code(), absl::StatusCode::kNotFound);
  const std::string path = dir + "/file";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(*ReadFileToString(path), "second");
  {
    absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("abandoned", 9).ok());
    // Destroyed without Commit: the old contents stay.
  }
  EXPECT_EQ(*ReadFileToString(path), "second");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1) << "no temporary file is left behind";
}

}  // namespace
}  // namespace prl
