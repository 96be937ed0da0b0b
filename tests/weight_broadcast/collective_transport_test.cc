// The collective ("nccl") weight transport on the CPU over Gloo, publisher and subscribers on
// threads of one process: versions arrive bit-exact at every subscriber, a late joiner gets the
// newest version, a mismatch of model or data path fails Connect naming it, and a subscriber
// follows a restarted publisher, which learns from it where to resume. (Killed and stopped
// subscribers in processes of their own: collective_process_test.cc.)
#include "weight_broadcast/collective_transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "collective/rendezvous.h"
#include "tests/status_testing.h"
#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/versioning.h"

namespace prl::testing {
namespace {

// Generous for a loaded 2-core machine, short enough to fail in seconds.
CollectivePublisherOptions PublisherOptions() {
  CollectivePublisherOptions o;
  o.timeout = absl::Seconds(10);
  o.keepalive_interval = absl::Milliseconds(500);
  o.member_timeout = absl::Seconds(3);
  return o;
}

CollectiveSubscriberOptions SubscriberOptions() {
  CollectiveSubscriberOptions o;
  o.timeout = absl::Seconds(10);
  o.heartbeat_interval = absl::Milliseconds(100);
  return o;
}

// Waits until `subscriber` holds `version` (or a later one, which fails the test).
void WaitFor(WeightSubscriber& subscriber, int64_t version, const std::string& who) {
  auto got = subscriber.WaitNewer(-1, absl::Seconds(60));
  while (got.ok() && got->version < version) {
    got = subscriber.WaitNewer(got->version, absl::Seconds(60));
  }
  ASSERT_TRUE(got.ok()) << who << ": " << got.status();
  ASSERT_EQ(got->version, version) << who;
  EXPECT_EQ(CheckPattern(*got->weights, version), "") << who;
}

class CollectiveTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = CollectiveWeightPublisher::Start(config_, PublisherOptions());
    ASSERT_TRUE(started.ok()) << started.status();
    publisher_ = *std::move(started);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", publisher_->port()); }

  std::unique_ptr<CollectiveWeightSubscriber> Subscribe() {
    auto s = CollectiveWeightSubscriber::Connect(address(), config_, SubscriberOptions());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  void Publish(int64_t version) {
    FillPattern(weights_, version);
    ASSERT_TRUE(publisher_->Publish(version, weights_).ok());
  }

  ModelConfig config_ = ModelOfMiB(2);
  ParameterSet weights_ = *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/false);
  std::unique_ptr<CollectiveWeightPublisher> publisher_;
};

TEST_F(CollectiveTransportTest, EverySubscriberReceivesEveryVersionBitExact) {
  auto a = Subscribe();
  auto b = Subscribe();
  ASSERT_TRUE(a && b);
  for (int64_t v = 0; v < 4; ++v) {
    Publish(v);
    WaitFor(*a, v, "a");
    WaitFor(*b, v, "b");
  }
  EXPECT_FALSE(a->TakeNewer(3)->has_value());
  const PublisherStats p = publisher_->stats();
  EXPECT_EQ(p.versions_published, 4);
  EXPECT_GE(p.groups_formed, 1);
  EXPECT_EQ(p.version_bytes, static_cast<int64_t>(weights_.buffer.bytes()));
  const SubscriberStats s = a->stats();
  EXPECT_EQ(s.last_version, 3);
  EXPECT_EQ(s.checksum_failures, 0);
  EXPECT_EQ(publisher_->newest_version(), 3);
}

TEST_F(CollectiveTransportTest, ALateJoinerGetsTheNewestVersion) {
  auto early = Subscribe();
  ASSERT_NE(early, nullptr);
  for (int64_t v = 0; v < 3; ++v) Publish(v);
  WaitFor(*early, 2, "early");
  auto late = Subscribe();
  ASSERT_NE(late, nullptr);
  WaitFor(*late, 2, "late");  // without a new Publish: the new epoch re-sends the newest
  EXPECT_EQ(late->stats().versions_received, 1);
  // Both stay served after the group was re-formed for the newcomer.
  Publish(3);
  WaitFor(*early, 3, "early");
  WaitFor(*late, 3, "late");
  EXPECT_GE(publisher_->stats().groups_formed, 2);
  EXPECT_EQ(publisher_->stats().subscribers, 2);
}

TEST_F(CollectiveTransportTest, AVersionThatFailsItsChecksumIsNeverExposedAndComesAgain) {
  auto subscriber = Subscribe();
  ASSERT_NE(subscriber, nullptr);
  Publish(0);
  WaitFor(*subscriber, 0, "subscriber");
  publisher_->CorruptNextChecksumForTesting();
  Publish(1);
  // The subscriber drops version 1 and leaves the group; the next group gets it again.
  WaitFor(*subscriber, 1, "subscriber");
  const SubscriberStats s = subscriber->stats();
  EXPECT_EQ(s.checksum_failures, 1);
  EXPECT_EQ(s.versions_received, 2);
  EXPECT_NE(s.last_error.find("failed its checksum"), std::string::npos) << s.last_error;
  EXPECT_GE(publisher_->stats().groups_formed, 2);
}

TEST_F(CollectiveTransportTest, AModelOrDataPathMismatchFailsConnectNamingIt) {
  ModelConfig other = config_;
  other.intermediate_size += 8;
  EXPECT_TRUE(
      IsError(CollectiveWeightSubscriber::Connect(address(), other, SubscriberOptions()).status(),
              absl::StatusCode::kFailedPrecondition,
              {address(), "intermediate_size is ", "in the published model but"}));
  // A subscriber on a GPU cannot join a publisher that broadcasts from the CPU (Gloo): the
  // handshake says so before any CUDA is touched.
  CollectiveSubscriberOptions gpu = SubscriberOptions();
  gpu.device = Device::Cuda(0);
  const absl::Status status = CollectiveWeightSubscriber::Connect(address(), config_, gpu).status();
  if (collective::NcclCompiled()) {
    EXPECT_TRUE(IsError(status, absl::StatusCode::kFailedPrecondition,
                        {"sends weights with gloo (cpu)", "receive them with nccl (cuda)"}));
  } else {
    EXPECT_TRUE(IsError(status, absl::StatusCode::kUnimplemented, {"no NCCL"}));
  }
}

TEST_F(CollectiveTransportTest, NoPublisherIsAnErrorNamingTheAddress) {
  const std::string gone = address();
  publisher_.reset();
  CollectiveSubscriberOptions o = SubscriberOptions();
  o.timeout = absl::Milliseconds(300);
  const absl::Status status = CollectiveWeightSubscriber::Connect(gone, config_, o).status();
  EXPECT_TRUE(IsError(status, absl::StatusCode::kDeadlineExceeded, {gone})) << status;
}

TEST_F(CollectiveTransportTest, ASubscriberFollowsARestartedPublisherThatResumesAboveIt) {
  auto subscriber = Subscribe();
  ASSERT_NE(subscriber, nullptr);
  Publish(0);
  Publish(7);
  WaitFor(*subscriber, 7, "before the restart");
  const int port = publisher_->port();
  publisher_.reset();
  CollectivePublisherOptions o = PublisherOptions();
  o.address = absl::StrCat("127.0.0.1:", port);
  auto restarted = CollectiveWeightPublisher::Start(config_, o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  publisher_ = *std::move(restarted);
  // The new publisher knows nothing but what the subscriber reports: version 7.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (publisher_->newest_version() < 7 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(publisher_->newest_version(), 7);
  const int64_t next = FirstVersionToPublish(/*learner_version=*/1, publisher_->newest_version());
  EXPECT_EQ(next, 8);
  Publish(next);
  WaitFor(*subscriber, 8, "after the restart");
  EXPECT_GE(subscriber->stats().reconnects, 1);
}

// With a version file the restarted publisher knows where to resume at once, before any
// subscriber has announced itself (weight_broadcast/version_file.h).
TEST_F(CollectiveTransportTest, ARestartedPublisherKnowsItsNewestVersionFromItsVersionFile) {
  const std::string file = absl::StrCat(::testing::TempDir(), "/prl_collective_version_", getpid());
  std::remove(file.c_str());
  const int port = publisher_->port();
  publisher_.reset();
  CollectivePublisherOptions o = PublisherOptions();
  o.address = absl::StrCat("127.0.0.1:", port);
  o.version_file = file;
  publisher_ = *CollectiveWeightPublisher::Start(config_, o);
  auto subscriber = Subscribe();
  ASSERT_NE(subscriber, nullptr);
  Publish(4);
  WaitFor(*subscriber, 4, "before the restart");
  subscriber.reset();  // nobody will report version 4 to the next publisher
  publisher_.reset();
  publisher_ = *CollectiveWeightPublisher::Start(config_, o);
  EXPECT_EQ(publisher_->newest_version(), 4);
  EXPECT_TRUE(IsError(publisher_->Publish(4, weights_), absl::StatusCode::kInvalidArgument,
                      {"versions must increase"}));
  EXPECT_EQ(FirstVersionToPublish(/*learner_version=*/0, publisher_->newest_version()), 5);
  std::remove(file.c_str());
}

TEST_F(CollectiveTransportTest, AVersionNotNewerThanTheSubscribersIsIgnored) {
  auto subscriber = Subscribe();
  ASSERT_NE(subscriber, nullptr);
  Publish(5);
  WaitFor(*subscriber, 5, "subscriber");
  // A second publisher on the same port numbering from below (a learner that ignored
  // newest_version()): its versions are dropped and counted, never exposed.
  const int port = publisher_->port();
  publisher_.reset();
  CollectivePublisherOptions o = PublisherOptions();
  o.address = absl::StrCat("127.0.0.1:", port);
  publisher_ = *CollectiveWeightPublisher::Start(config_, o);
  Publish(2);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (subscriber->stats().versions_ignored == 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(subscriber->stats().versions_ignored, 1);
  EXPECT_FALSE(subscriber->TakeNewer(5)->has_value());
  Publish(6);
  WaitFor(*subscriber, 6, "subscriber");
}

TEST(CollectiveTransportOptionsTest, BadOptionsAreRejectedNamingThem) {
  CollectivePublisherOptions o = PublisherOptions();
  o.keepalive_interval = o.timeout;
  EXPECT_TRUE(IsError(CollectiveWeightPublisher::Start(ModelOfMiB(1), o).status(),
                      absl::StatusCode::kInvalidArgument, {"keepalive_interval <= timeout / 2"}));
  CollectiveSubscriberOptions s = SubscriberOptions();
  s.heartbeat_interval = absl::ZeroDuration();
  EXPECT_TRUE(IsError(CollectiveWeightSubscriber::Connect("127.0.0.1:1", ModelOfMiB(1), s).status(),
                      absl::StatusCode::kInvalidArgument, {"heartbeat_interval > 0"}));
}

}  // namespace
}  // namespace prl::testing
