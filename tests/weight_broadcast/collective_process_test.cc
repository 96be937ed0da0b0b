// The collective ("nccl") weight transport over Gloo with subscribers in processes of their own
// (weight_transport_worker): a subscriber SIGKILLed while versions flow does not hang the
// publisher, which re-forms the group and keeps serving the survivor; a subscriber that stops
// (SIGSTOP) holds up the broadcaster but never Publish, and the versions published meanwhile
// are skipped and counted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "tests/weight_broadcast/test_weights.h"
#include "tests/weight_broadcast/worker_process.h"
#include "weight_broadcast/collective_transport.h"

namespace prl::testing {
namespace {

class CollectiveProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void StartPublisher(int64_t mib, absl::Duration timeout) {
    config_ = ModelOfMiB(mib);
    weights_ = std::make_unique<ParameterSet>(
        *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/false));
    CollectivePublisherOptions o;
    o.timeout = timeout;
    o.keepalive_interval = absl::Milliseconds(500);
    o.member_timeout = absl::Seconds(3);
    auto started = CollectiveWeightPublisher::Start(config_, o);
    ASSERT_TRUE(started.ok()) << started.status();
    publisher_ = *std::move(started);
  }

  // A subscriber process that receives until version `last`; waits until it is connected.
  pid_t StartSubscriber(const std::string& name, int64_t mib, int64_t last) {
    const std::string ready = Path(name + ".ready");
    const pid_t pid =
        SpawnWorker({"collective-subscribe", absl::StrCat("127.0.0.1:", publisher_->port()), "cpu",
                     std::to_string(mib), std::to_string(last), ready, Path(name + ".out")});
    EXPECT_GT(pid, 0);
    EXPECT_TRUE(WaitUntil([&] { return std::filesystem::exists(ready); }, std::chrono::seconds(60)))
        << name << " never connected";
    return pid;
  }

  absl::Status Publish(int64_t version) {
    FillPattern(*weights_, version);
    return publisher_->Publish(version, *weights_);
  }

  std::string Path(const std::string& file) const { return dir_ + "/" + file; }

  std::string dir_ = absl::StrCat(::testing::TempDir(), "/prl_wcoll_", getpid());
  ModelConfig config_;
  std::unique_ptr<ParameterSet> weights_;
  std::unique_ptr<CollectiveWeightPublisher> publisher_;
};

TEST_F(CollectiveProcessTest, AKilledSubscriberDoesNotHangThePublisherWhichServesTheSurvivor) {
  constexpr int64_t kMiB = 8, kLast = 400;
  StartPublisher(kMiB, absl::Seconds(10));
  const pid_t survivor = StartSubscriber("survivor", kMiB, kLast);
  const pid_t victim = StartSubscriber("victim", kMiB, 1'000'000);
  // Versions flow to both until the group of three has carried a few.
  int64_t version = 1;
  ASSERT_TRUE(WaitUntil(
      [&] {
        EXPECT_TRUE(Publish(version++).ok());
        const PublisherStats s = publisher_->stats();
        return s.subscribers == 2 && s.versions_sent >= 5;
      },
      std::chrono::seconds(60)))
      << "the group of two subscribers never formed";
  // Kill the victim at a random moment of the broadcasts, and keep publishing.
  std::mt19937 rng(7);
  std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
  kill(victim, SIGKILL);
  waitpid(victim, nullptr, 0);
  const auto killed = std::chrono::steady_clock::now();
  const int64_t groups_before = publisher_->stats().groups_formed;
  for (; version <= kLast; ++version) {
    ASSERT_TRUE(Publish(version).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // The survivor gets the last version once the group is re-formed without the victim.
  EXPECT_EQ(WaitExit(survivor, std::chrono::seconds(120)), 0)
      << "the survivor saw a torn (3) or out-of-order (4) version, or failed (2)";
  const double recovered_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const PublisherStats s = publisher_->stats();
  std::printf(
      "survivor had version %lld %.1f s after the kill; groups formed %lld, failed %lld (last: "
      "%s)\n",
      static_cast<long long>(kLast), recovered_s, static_cast<long long>(s.groups_formed),
      static_cast<long long>(s.groups_failed), s.last_error.c_str());
  EXPECT_LT(recovered_s, 60.0);
  EXPECT_GT(s.groups_formed, groups_before) << "the group was re-formed without the victim";
  EXPECT_GE(s.groups_failed, 1) << s.last_error;
  EXPECT_EQ(s.versions_published, kLast);
}

TEST_F(CollectiveProcessTest, AStoppedSubscriberNeverHoldsUpPublishAndSkipsAreCounted) {
  // A version is larger than what loopback TCP buffers: a stopped reader blocks the broadcast.
  constexpr int64_t kMiB = 32, kBurst = 12;
  StartPublisher(kMiB, absl::Seconds(60));
  const pid_t subscriber = StartSubscriber("slow", kMiB, kBurst + 1);
  ASSERT_TRUE(Publish(0).ok());
  ASSERT_TRUE(
      WaitUntil([&] { return publisher_->stats().versions_sent >= 1; }, std::chrono::seconds(60)));
  kill(subscriber, SIGSTOP);
  const PublisherStats before = publisher_->stats();
  // The burst runs on a thread of its own so that a Publish that waited for the stopped
  // subscriber fails the test instead of hanging it.
  std::atomic<bool> burst_done{false};
  std::thread burst([&] {
    for (int64_t v = 1; v <= kBurst; ++v) EXPECT_TRUE(Publish(v).ok());
    burst_done = true;
  });
  const bool returned = WaitUntil([&] { return burst_done.load(); }, std::chrono::seconds(30));
  const PublisherStats during = publisher_->stats();
  kill(subscriber, SIGCONT);
  burst.join();
  ASSERT_TRUE(returned) << "Publish waited for a stopped subscriber";
  // Every Publish returned while the broadcaster could send at most the one version it had
  // started: the learner never waited for the stopped subscriber.
  EXPECT_EQ(during.versions_published - before.versions_published, kBurst);
  EXPECT_LE(during.versions_sent - before.versions_sent, 1);
  ASSERT_TRUE(Publish(kBurst + 1).ok());
  EXPECT_EQ(WaitExit(subscriber, std::chrono::seconds(120)), 0);
  const PublisherStats after = publisher_->stats();
  EXPECT_GE(after.versions_skipped, 1) << "versions published while the group was busy";
  const std::string out = ReadFile(Path("slow.out"));
  int64_t received = 0, skipped = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "received %ld skipped %ld", &received, &skipped), 2) << out;
  EXPECT_GE(skipped, 1) << out;
  EXPECT_EQ(received + skipped, kBurst + 2) << "every version received or counted as skipped";
  std::printf("published %lld, sent %lld, skipped %lld by the publisher; subscriber: %s",
              static_cast<long long>(after.versions_published),
              static_cast<long long>(after.versions_sent),
              static_cast<long long>(after.versions_skipped), out.c_str());
}

}  // namespace
}  // namespace prl::testing
