// The NCCL communicator: Unimplemented in builds without it, FailedPrecondition without a
// GPU, and on a GPU a world of one that runs every collective on device tensors. Skips the
// GPU part where no GPU is present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/rendezvous.h"
#include "core/device.h"
#include "tests/status_testing.h"

namespace prl::collective {
namespace {

using ::prl::testing::IsError;

class NcclTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(config_.file_store_dir); }
  RendezvousConfig config_ = [] {
    RendezvousConfig c;
    c.file_store_dir = absl::StrCat(::testing::TempDir(), "/prl_nccl_test_", getpid());
    c.timeout = absl::Seconds(60);
    return c;
  }();
};

TEST_F(NcclTest, UnavailableBackendsSayWhy) {
  const absl::Status s = ConnectNccl(config_, Device::Cuda(0), {}).status();
  if (!NcclCompiled()) {
    EXPECT_TRUE(IsError(s, absl::StatusCode::kUnimplemented, {"NCCL is unavailable"}));
  } else if (CudaDeviceCount() == 0) {
    EXPECT_TRUE(IsError(s, absl::StatusCode::kFailedPrecondition, {"no CUDA GPU is visible"}));
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
  if (NcclCompiled()) {
    EXPECT_TRUE(IsError(ConnectNccl(config_, Device::Cpu(), {}).status(),
                        absl::StatusCode::kInvalidArgument, {"cpu is not a CUDA device"}));
  }
}

TEST_F(NcclTest, WorldOfOneRunsEveryCollectiveOnTheGpu) {
  if (!NcclCompiled() || CudaDeviceCount() == 0) GTEST_SKIP() << "needs NCCL and a GPU";
  const Device gpu = Device::Cuda(0);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectNccl(config_, gpu, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  EXPECT_EQ(c.backend(), "nccl");
  EXPECT_EQ(c.device(), gpu);

  std::vector<float> host = {1, 2, 3, 4};
  auto a = *AllocateTensor(DType::kF32, gpu, {4});
  auto b = *AllocateTensor(DType::kF32, gpu, {4});
  const Tensor cpu_view(host.data(), DType::kF32, Device::Cpu(), {4});
  ASSERT_TRUE(CopyTensor(a.view, cpu_view).ok());
  ASSERT_TRUE(c.AllGather(a.view, b.view).ok());
  ASSERT_TRUE(c.ReduceScatter(b.view, a.view).ok());
  ASSERT_TRUE(c.AllReduce(a.view, ReduceOp::kSum).ok());
  ASSERT_TRUE(c.Broadcast(a.view, 0).ok());
  std::vector<float> back(4);
  ASSERT_TRUE(CopyTensor(Tensor(back.data(), DType::kF32, Device::Cpu(), {4}), a.view).ok());
  EXPECT_EQ(back, host);
  // The exchanges of context parallelism (model/context_heads.h, model/context_ring.h): with one
  // rank, its own data back.
  ASSERT_TRUE(c.AllToAll(a.view, b.view).ok());
  ASSERT_TRUE(c.SendRecv(b.view, 0, a.view, 0).ok());
  ASSERT_TRUE(CopyTensor(Tensor(back.data(), DType::kF32, Device::Cpu(), {4}), a.view).ok());
  EXPECT_EQ(back, host);

  std::vector<double> values = {1.25, -3};
  ASSERT_TRUE(c.AllReduceHost(absl::MakeSpan(values), ReduceOp::kMax).ok());
  EXPECT_EQ(values, (std::vector<double>{1.25, -3}));
  std::vector<uint8_t> bytes = {1, 2, 3};
  ASSERT_TRUE(c.BroadcastHost(absl::MakeSpan(bytes), 0).ok());
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  ASSERT_TRUE(c.Barrier().ok());

  // CPU tensors are rejected, naming the tensor; the communicator is then poisoned.
  const absl::Status s = c.AllReduce(cpu_view, ReduceOp::kSum);
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, {"data is on cpu", "cuda:0"}));
  EXPECT_EQ(c.Barrier(), s);
}

}  // namespace
}  // namespace prl::collective
