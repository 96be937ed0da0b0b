// The GPU weight transports on a machine with GPUs (gpu label; every test skips without one):
//   - cuda_ipc: a subscriber in another process receives every version bit-exact, device to
//     device; a publisher killed (SIGKILL) and restarted in new processes is followed through
//     new IPC handles, and the new publisher numbers above the versions already out;
//   - the collective transport on CUDA devices (NCCL): a subscriber on a second GPU receives
//     bit-exact versions (NCCL puts one rank per GPU: needs two).
// CUDA IPC maps only another process's memory: the other side is weight_transport_worker.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "collective/rendezvous.h"
#include "core/cuda_runtime.h"
#include "tests/weight_broadcast/test_weights.h"
#include "tests/weight_broadcast/worker_process.h"
#include "weight_broadcast/collective_transport.h"
#include "weight_broadcast/cuda_ipc_transport.h"

namespace prl::testing {
namespace {

#define PRL_SKIP_WITHOUT_GPUS(n)                                                         \
  if (cuda::DeviceCount() < (n))                                                         \
  GTEST_SKIP() << (n == 1 ? "no CUDA GPU (scripts/gpu_check.sh runs this)"               \
                          : "needs " #n " GPUs: NCCL puts one rank per GPU (this has " + \
                                std::to_string(cuda::DeviceCount()) + ")")

// `version`'s pattern in a ParameterSet on `device`.
ParameterSet PatternOn(const ModelConfig& config, Device device, int64_t version) {
  ParameterSet host = *ParameterSet::Allocate(config, Device::Cpu(), /*zeroed=*/false);
  FillPattern(host, version);
  if (device.is_cpu()) return host;
  ParameterSet set = *ParameterSet::Allocate(config, device, /*zeroed=*/false);
  EXPECT_TRUE(CopyBytes(set.data(), device, host.data(), Device::Cpu(), host.buffer.bytes()).ok());
  return set;
}

// "" if `set` (on any device) holds `version`'s pattern.
std::string CheckOnHost(const ParameterSet& set, int64_t version) {
  ParameterSet host = *ParameterSet::Allocate(set.config, Device::Cpu(), /*zeroed=*/false);
  const absl::Status copied =
      CopyBytes(host.data(), Device::Cpu(), set.data(), set.buffer.device(), set.buffer.bytes());
  if (!copied.ok()) return copied.ToString();
  return CheckPattern(host, version);
}

class CudaWeightTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_);
    RemoveCudaIpcWeightSegment(segment_).IgnoreError();
  }
  void TearDown() override {
    RemoveCudaIpcWeightSegment(segment_).IgnoreError();
    std::filesystem::remove_all(dir_);
  }
  std::string Path(const std::string& file) const { return dir_ + "/" + file; }
  bool WaitForFile(const std::string& path) {
    return WaitUntil([&] { return std::filesystem::exists(path); }, std::chrono::seconds(60));
  }

  std::string segment_ = absl::StrCat("prl-test-cipc-gpu-", getpid());
  std::string dir_ = absl::StrCat(::testing::TempDir(), "/prl_wgpu_", getpid());
};

TEST_F(CudaWeightTransportTest, CudaIpcSubscriberInAnotherProcessReceivesBitExactVersions) {
  PRL_SKIP_WITHOUT_GPUS(1);
  constexpr int64_t kMiB = 16, kLast = 200;
  const ModelConfig config = ModelOfMiB(kMiB);
  CudaIpcPublisherOptions options;
  options.device = Device::Cuda(0);
  auto publisher = CudaIpcWeightPublisher::Create(segment_, config, options);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  const std::string ready = Path("ready");
  const pid_t child = SpawnWorker({"cuda-ipc-subscribe", segment_, "cuda:0", std::to_string(kMiB),
                                   std::to_string(kLast), ready, Path("out")});
  ASSERT_TRUE(WaitForFile(ready)) << "the subscriber process never opened";
  // Back to back from device memory, so that slots are rewritten while the subscriber copies.
  for (int64_t v = 1; v <= kLast; ++v) {
    ASSERT_TRUE((*publisher)->Publish(v, PatternOn(config, Device::Cuda(0), v)).ok());
  }
  EXPECT_EQ(WaitExit(child, std::chrono::seconds(120)), 0)
      << "the subscriber saw a torn (3) or out-of-order (4) version, or failed (2)";
  std::printf("cuda_ipc subscriber: %s", ReadFile(Path("out")).c_str());
  // Host weights publish too (a learner on the CPU, actors on GPUs).
  ASSERT_TRUE((*publisher)->Publish(kLast + 1, PatternOn(config, Device::Cpu(), kLast + 1)).ok());
  EXPECT_EQ((*publisher)->newest_version(), kLast + 1);
}

TEST_F(CudaWeightTransportTest, CudaIpcRestartedPublisherIsFollowedThroughNewHandles) {
  PRL_SKIP_WITHOUT_GPUS(1);
  constexpr int64_t kMiB = 16;
  const ModelConfig config = ModelOfMiB(kMiB);
  std::unique_ptr<CudaIpcWeightSubscriber> subscriber;  // stays open across restarts
  int64_t have = -1;
  for (int round = 0; round < 3; ++round) {
    const std::string log = Path(absl::StrCat("publisher", round, ".log"));
    const pid_t pid =
        SpawnWorker({"cuda-ipc-publish", segment_, "cuda:0", std::to_string(kMiB), "resume", log});
    if (subscriber == nullptr) {
      CudaIpcSubscriberOptions options;
      options.device = Device::Cuda(0);
      options.open_timeout = absl::Seconds(30);
      auto opened = CudaIpcWeightSubscriber::Open(segment_, config, options);
      ASSERT_TRUE(opened.ok()) << opened.status();
      subscriber = *std::move(opened);
    }
    // A few versions of this publisher arrive intact and above everything before.
    for (int i = 0; i < 3; ++i) {
      auto next = subscriber->WaitNewer(have, absl::Seconds(60));
      ASSERT_TRUE(next.ok()) << "round " << round << ": " << next.status();
      ASSERT_GT(next->version, have);
      ASSERT_EQ(CheckOnHost(*next->weights, next->version), "") << "round " << round;
      have = next->version;
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    int64_t first = -1, v = 0;
    for (std::ifstream in(log); in >> v;) {
      if (first < 0) first = v;
    }
    std::printf("round %d: publisher started at version %lld, subscriber has %lld\n", round,
                static_cast<long long>(first), static_cast<long long>(have));
  }
  // The version handed out before the last restart still reads intact: it is the subscriber's
  // own copy, not a mapping of a dead publisher's memory.
  auto kept = subscriber->TakeNewer(-1);
  ASSERT_TRUE(kept.ok() && kept->has_value());
  EXPECT_EQ(CheckOnHost(*(*kept)->weights, (*kept)->version), "");
  EXPECT_GE(subscriber->stats().versions_received, 9);
}

TEST_F(CudaWeightTransportTest, NcclSubscriberOnAnotherGpuReceivesBitExactVersions) {
  PRL_SKIP_WITHOUT_GPUS(2);
  if (!collective::NcclCompiled()) GTEST_SKIP() << "built without NCCL";
  constexpr int64_t kMiB = 16, kLast = 20;
  const ModelConfig config = ModelOfMiB(kMiB);
  CollectivePublisherOptions options;
  options.device = Device::Cuda(0);
  options.timeout = absl::Seconds(60);
  options.keepalive_interval = absl::Seconds(1);
  auto publisher = CollectiveWeightPublisher::Start(config, options);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  const std::string ready = Path("ready");
  const pid_t child =
      SpawnWorker({"collective-subscribe", absl::StrCat("127.0.0.1:", (*publisher)->port()),
                   "cuda:1", std::to_string(kMiB), std::to_string(kLast), ready, Path("out")});
  ASSERT_TRUE(WaitForFile(ready)) << "the subscriber process never connected";
  for (int64_t v = 1; v <= kLast; ++v) {
    ASSERT_TRUE((*publisher)->Publish(v, PatternOn(config, Device::Cuda(0), v)).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(WaitExit(child, std::chrono::seconds(120)), 0)
      << "the subscriber saw a torn (3) or out-of-order (4) version, or failed (2)";
  const PublisherStats s = (*publisher)->stats();
  std::printf("nccl: sent %lld versions, skipped %lld; subscriber: %s",
              static_cast<long long>(s.versions_sent), static_cast<long long>(s.versions_skipped),
              ReadFile(Path("out")).c_str());
  EXPECT_GE(s.versions_sent, 1);
}

}  // namespace
}  // namespace prl::testing
