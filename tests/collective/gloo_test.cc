// The Gloo communicator in one process: world size 1 copies, bad arguments are
// InvalidArgument naming the tensor and poison the communicator, and a rendezvous that a
// rank never joins times out naming what it waited for. (Groups of real processes:
// multiprocess_test.cc.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/kv_store.h"
#include "collective/rendezvous.h"
#include "tests/free_port.h"
#include "tests/status_testing.h"

namespace prl::collective {
namespace {

using ::prl::testing::FreePort;

using ::prl::testing::IsError;

Tensor F32(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, Device::Cpu(), {static_cast<int64_t>(v.size())});
}

class GlooTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A world of one through a FileStore.
  std::unique_ptr<Communicator> Connect() {
    RendezvousConfig config;
    config.file_store_dir = dir_;
    config.group_name = absl::StrCat("g", next_group_++);
    absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectGloo(config, {});
    EXPECT_TRUE(comm.ok()) << comm.status();
    return comm.ok() ? std::move(comm).value() : nullptr;
  }

  std::string dir_ = absl::StrCat(::testing::TempDir(), "/prl_gloo_test_", getpid());
  int next_group_ = 0;
};

TEST_F(GlooTest, WorldSizeOneCopies) {
  std::unique_ptr<Communicator> c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->backend(), "gloo");
  EXPECT_TRUE(c->device().is_cpu());
  std::vector<float> shard = {1, 2, 3}, out(3, 0.0f);
  ASSERT_TRUE(c->AllGather(F32(shard), F32(out)).ok());
  EXPECT_EQ(out, shard);
  std::vector<float> in = {4, 5, 6};
  ASSERT_TRUE(c->ReduceScatter(F32(in), F32(out)).ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE(c->AllReduce(F32(in), ReduceOp::kMax).ok());
  EXPECT_EQ(in, (std::vector<float>{4, 5, 6}));
  ASSERT_TRUE(c->Broadcast(F32(in), 0).ok());
  std::vector<double> host = {1.5, -2};
  ASSERT_TRUE(c->AllReduceHost(absl::MakeSpan(host), ReduceOp::kSum).ok());
  EXPECT_EQ(host, (std::vector<double>{1.5, -2}));
  std::vector<uint8_t> bytes = {7, 8};
  ASSERT_TRUE(c->BroadcastHost(absl::MakeSpan(bytes), 0).ok());
  ASSERT_TRUE(c->Barrier().ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "the rendezvous keys were deleted";
}

TEST_F(GlooTest, SizeMismatchesAreInvalidArgumentNamingTheTensor) {
  std::vector<float> four(4), three(3), two(2);
  EXPECT_TRUE(IsError(Connect()->AllGather(F32(two), F32(three)),
                      absl::StatusCode::kInvalidArgument,
                      {"collective all_gather on rank 0 of 1", "out (3) has 3 elements",
                       "world_size (1) * shard (2) = 2"}));
  EXPECT_TRUE(IsError(Connect()->ReduceScatter(F32(four), F32(three)),
                      absl::StatusCode::kInvalidArgument,
                      {"reduce_scatter", "in (4) has 4 elements", "= 3"}));
  EXPECT_TRUE(IsError(Connect()->Broadcast(F32(two), 1), absl::StatusCode::kInvalidArgument,
                      {"root 1 is not a rank"}));
  EXPECT_TRUE(
      IsError(Connect()->BroadcastHost({}, -1), absl::StatusCode::kInvalidArgument, {"root -1"}));
}

TEST_F(GlooTest, DtypeAndDeviceMismatchesAreInvalidArgumentNamingTheTensor) {
  std::vector<float> a(4), b(4);
  std::vector<uint16_t> half(4);
  const Tensor bf16(half.data(), DType::kBF16, Device::Cpu(), {4});
  EXPECT_TRUE(IsError(Connect()->ReduceScatter(bf16, F32(a)), absl::StatusCode::kInvalidArgument,
                      {"reduce_scatter", "in is BF16, expected F32"}));
  EXPECT_TRUE(IsError(Connect()->AllReduce(bf16, ReduceOp::kSum),
                      absl::StatusCode::kInvalidArgument, {"data is BF16, expected F32"}));
  EXPECT_TRUE(IsError(Connect()->AllGather(F32(a), bf16), absl::StatusCode::kInvalidArgument,
                      {"out is BF16, expected F32"}));
  const Tensor on_gpu(a.data(), DType::kF32, Device::Cuda(0), {4});
  EXPECT_TRUE(IsError(Connect()->AllGather(on_gpu, F32(b)), absl::StatusCode::kInvalidArgument,
                      {"shard is on cuda:0", "CPU tensors"}));
}

TEST_F(GlooTest, TheFirstErrorPoisonsEveryLaterCall) {
  std::unique_ptr<Communicator> c = Connect();
  std::vector<float> a(4), b(3);
  const absl::Status first = c->AllGather(F32(a), F32(b));
  ASSERT_EQ(first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->AllGather(F32(a), F32(a)), first);
  EXPECT_EQ(c->ReduceScatter(F32(a), F32(a)), first);
  EXPECT_EQ(c->AllReduce(F32(a), ReduceOp::kSum), first);
  EXPECT_EQ(c->Barrier(), first);
  std::vector<double> host(1);
  EXPECT_EQ(c->AllReduceHost(absl::MakeSpan(host), ReduceOp::kSum), first);
}

TEST(GlooConnectTest, ARankThatNeverArrivesTimesOutNamingItsKey) {
  RendezvousConfig config;
  config.world_size = 2;
  config.master_port = FreePort();
  config.timeout = absl::Seconds(1);
  config.group_name = "lonely";
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = ConnectGloo(config, {}).status();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kDeadlineExceeded,
                      {"gloo rendezvous of rank 0 of 2", "'lonely/gloo/1'", "1 s"}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(GlooConnectTest, WithoutRankZeroTheStoreIsNamed) {
  RendezvousConfig config;
  config.rank = 1;
  config.world_size = 2;
  config.master_port = FreePort();
  config.timeout = absl::Seconds(1);
  const absl::Status s = ConnectGloo(config, {}).status();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kDeadlineExceeded,
                      {"gloo rendezvous of rank 1 of 2",
                       absl::StrCat("127.0.0.1:", config.master_port), "is rank 0 running"}));
}

// A service with a store of its own (the weight broadcaster's) forms groups through it: two
// ranks on threads, one store shared in memory, two groups one after another.
TEST(GlooConnectTest, ThroughAGivenStoreGroupsFormOneAfterAnother) {
  auto store = std::make_shared<MemoryStore>();
  for (const std::string group : {"epoch1", "epoch2"}) {
    std::unique_ptr<Communicator> comms[2];
    std::thread ranks[2];
    absl::Status status[2];
    for (int r = 0; r < 2; ++r) {
      ranks[r] = std::thread([&, r] {
        RendezvousConfig config;
        config.rank = r;
        config.world_size = 2;
        config.master_port = 0;  // ignored: the store is given
        config.timeout = absl::Seconds(30);
        config.group_name = group;
        auto comm = ConnectGlooThrough(store, config, {});
        status[r] = comm.status();
        if (comm.ok()) comms[r] = *std::move(comm);
      });
    }
    for (auto& t : ranks) t.join();
    ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << status[1];
    std::vector<uint8_t> bytes[2] = {{1, 2, 3}, {0, 0, 0}};
    std::thread receiver([&] { status[1] = comms[1]->BroadcastHost(absl::MakeSpan(bytes[1]), 0); });
    status[0] = comms[0]->BroadcastHost(absl::MakeSpan(bytes[0]), 0);
    receiver.join();
    ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << status[1];
    EXPECT_EQ(bytes[1], bytes[0]) << group;
    EXPECT_TRUE(store->List(group).empty()) << "the group's rendezvous keys were deleted";
  }
  RendezvousConfig config;
  EXPECT_TRUE(IsError(ConnectGlooThrough(nullptr, config, {}).status(),
                      absl::StatusCode::kInvalidArgument, {"no store"}));
}

TEST(GlooConnectTest, ABadTimeoutIsRejected) {
  RendezvousConfig config;
  CommunicatorOptions options;
  options.timeout = absl::ZeroDuration();
  EXPECT_TRUE(IsError(ConnectGloo(config, options).status(), absl::StatusCode::kInvalidArgument,
                      {"CommunicatorOptions::timeout"}));
}

}  // namespace
}  // namespace prl::collective
