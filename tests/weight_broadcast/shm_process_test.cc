// The shared-memory weight transport across real processes (weight_shm_worker): a subscriber in
// another process only ever sees complete versions, in increasing order, while the publisher
// laps it; a publisher SIGKILLed mid-write leaves the previous version readable, and the next
// publisher adopts the segment under the subscribers' feet.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/shm_transport.h"

extern char** environ;

namespace prl::testing {
namespace {

pid_t Spawn(std::vector<std::string> args) {
  args.insert(args.begin(), PRL_WEIGHT_SHM_WORKER);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

// Waits up to `timeout` for `pid` to exit; its exit code, or -1 (then it was killed).
int WaitExit(pid_t pid, std::chrono::seconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ShmProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RemoveShmWeightSegment(segment_).IgnoreError();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    RemoveShmWeightSegment(segment_).IgnoreError();
    std::filesystem::remove_all(dir_);
  }

  std::string segment_ = absl::StrCat("prl-test-wshm-proc-", getpid());
  std::string dir_ = absl::StrCat(::testing::TempDir(), "/prl_wshm_", getpid());
};

TEST_F(ShmProcessTest, SubscriberInAnotherProcessSeesOnlyCompleteIncreasingVersions) {
  constexpr int64_t kMiB = 16, kLast = 300;
  const ModelConfig config = ModelOfMiB(kMiB);
  auto publisher = ShmWeightPublisher::Create(segment_, config);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  const std::string ready = dir_ + "/ready";
  const pid_t child =
      Spawn({"subscribe", segment_, std::to_string(kMiB), std::to_string(kLast), ready});
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(ready) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(std::filesystem::exists(ready)) << "the subscriber process never opened";
  // Back to back, so that the publisher rewrites slots while the subscriber copies them.
  auto weights = *ParameterSet::Allocate(config, Device::Cpu(), /*zeroed=*/false);
  for (int64_t version = 1; version <= kLast; ++version) {
    FillPattern(weights, version);
    ASSERT_TRUE((*publisher)->Publish(version, weights).ok());
  }
  EXPECT_EQ(WaitExit(child, std::chrono::seconds(60)), 0)
      << "the subscriber saw a torn (3) or out-of-order (4) version, or failed (2)";
  EXPECT_EQ((*publisher)->stats().versions_published, kLast);
}

TEST_F(ShmProcessTest, PublisherKilledMidWriteLeavesPreviousVersionReadable) {
  constexpr int64_t kMiB = 48;
  const ModelConfig config = ModelOfMiB(kMiB);
  std::mt19937 rng(42);
  std::unique_ptr<ShmWeightSubscriber> subscriber;  // stays open across publisher restarts
  int64_t first = 1, mid_write_kills = 0, have = -1;
  int round = 0;
  for (; round < 20 && (round < 6 || mid_write_kills < 2); ++round) {
    const std::string log = absl::StrCat(dir_, "/publisher", round, ".log");
    const pid_t pid =
        Spawn({"publish", segment_, std::to_string(kMiB), std::to_string(first), log});
    if (subscriber == nullptr) {
      ShmSubscriberOptions options;
      options.open_timeout = absl::Seconds(20);
      auto opened = ShmWeightSubscriber::Open(segment_, config, options);
      ASSERT_TRUE(opened.ok()) << opened.status();
      subscriber = *std::move(opened);
    }
    // Let it publish a few versions, then kill it at a random moment of its loop.
    auto next = subscriber->WaitNewer(first + 1, absl::Seconds(30));
    ASSERT_TRUE(next.ok()) << next.status();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30'000));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);

    auto info = InspectShmWeightSegment(segment_);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_FALSE(info->publisher_alive);
    mid_write_kills += info->write_in_progress;
    int64_t logged = -1, v = 0;
    for (std::ifstream in(log); in >> v;) logged = v;
    // Killed after Publish returned but before the log line, or not.
    EXPECT_TRUE(info->newest_version == logged || info->newest_version == logged + 1)
        << "newest " << info->newest_version << ", log says " << logged;

    auto newest = subscriber->WaitNewer(have, absl::Seconds(30));
    while (newest.ok() && newest->version < info->newest_version) {
      newest = subscriber->WaitNewer(newest->version, absl::Seconds(30));
    }
    ASSERT_TRUE(newest.ok()) << newest.status();
    ASSERT_EQ(newest->version, info->newest_version);
    ASSERT_EQ(CheckPattern(*newest->weights, newest->version), "");
    // A new subscriber reads the same intact version.
    auto late = ShmWeightSubscriber::Open(segment_, config);
    ASSERT_TRUE(late.ok()) << late.status();
    auto again = (*late)->WaitNewer(-1, absl::Seconds(30));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->version, info->newest_version);
    EXPECT_EQ(CheckPattern(*again->weights, again->version), "");
    have = newest->version;
    first = info->newest_version + 1;
  }
  std::printf("%d publishers killed, %lld of them mid-write; newest version %lld\n", round,
              static_cast<long long>(mid_write_kills), static_cast<long long>(have));
  EXPECT_GT(mid_write_kills, 0) << "no kill landed inside a write: the test proved nothing";
}

}  // namespace
}  // namespace prl::testing
