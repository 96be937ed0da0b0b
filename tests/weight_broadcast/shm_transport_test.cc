// The shared-memory weight transport within one process: versions arrive intact and newest
// first, segments of another model / size / layout are refused with errors naming the problem,
// a restarted publisher adopts its segment, and TakeNewer never waits for a copy in progress.
#include "weight_broadcast/shm_transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>
#include <thread>
#include <vector>

#include "model/presets.h"
#include "tests/status_testing.h"
#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/shm_layout.h"

namespace prl::testing {
namespace {

namespace bip = boost::interprocess;

class ShmTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { RemoveShmWeightSegment(name_).IgnoreError(); }
  void TearDown() override { RemoveShmWeightSegment(name_).IgnoreError(); }

  ParameterSet Weights(const ModelConfig& config, int64_t version) {
    ParameterSet set = *ParameterSet::Allocate(config, Device::Cpu(), /*zeroed=*/false);
    FillPattern(set, version);
    return set;
  }

  std::string name_ = absl::StrCat("prl-test-wshm-", getpid());
  ModelConfig config_ = ModelOfMiB(1);
};

TEST_F(ShmTransportTest, VersionsArriveIntactAndNewestWins) {
  auto publisher = ShmWeightPublisher::Create(name_, config_);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  auto subscriber = ShmWeightSubscriber::Open(name_, config_);
  ASSERT_TRUE(subscriber.ok()) << subscriber.status();
  EXPECT_FALSE((*subscriber)->TakeNewer(-1)->has_value());

  ASSERT_TRUE((*publisher)->Publish(0, Weights(config_, 0)).ok());
  auto v0 = (*subscriber)->WaitNewer(-1, absl::Seconds(30));
  ASSERT_TRUE(v0.ok()) << v0.status();
  EXPECT_EQ(v0->version, 0);
  EXPECT_EQ(CheckPattern(*v0->weights, 0), "");

  // Three versions while nobody looks: the subscriber ends on the newest.
  for (int64_t v = 1; v <= 3; ++v) ASSERT_TRUE((*publisher)->Publish(v, Weights(config_, v)).ok());
  auto latest = (*subscriber)->WaitNewer(0, absl::Seconds(30));
  while (latest.ok() && latest->version < 3) {
    latest = (*subscriber)->WaitNewer(latest->version, absl::Seconds(30));
  }
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(CheckPattern(*latest->weights, 3), "");
  EXPECT_FALSE((*subscriber)->TakeNewer(3)->has_value());
  // The version handed out earlier was never overwritten.
  EXPECT_EQ(CheckPattern(*v0->weights, 0), "");

  const SubscriberStats s = (*subscriber)->stats();
  EXPECT_EQ(s.last_version, 3);
  EXPECT_EQ(s.versions_received + s.versions_skipped, 4);
  EXPECT_EQ(s.bytes_received, s.versions_received * latest->weights->buffer.bytes());
  EXPECT_EQ((*publisher)->stats().versions_published, 4);
  EXPECT_EQ((*publisher)->stats().last_version, 3);
}

// A Qwen3 version arrives whole, its per-layer q/k norms and o_proj bias included (the
// transports move the ParameterSet's buffer, which holds every tensor of the layout).
TEST_F(ShmTransportTest, Qwen3VersionsArriveWithTheirQkNormsAndOBias) {
  ModelConfig config = *PresetConfig("tiny-qwen3");
  SetArchitecture(Architecture::kQwen3, /*attention_bias=*/true, &config);
  auto publisher = ShmWeightPublisher::Create(name_, config);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  auto subscriber = ShmWeightSubscriber::Open(name_, config);
  ASSERT_TRUE(subscriber.ok()) << subscriber.status();
  ASSERT_TRUE((*publisher)->Publish(5, Weights(config, 5)).ok());
  auto got = (*subscriber)->WaitNewer(-1, absl::Seconds(30));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(CheckPattern(*got->weights, 5), "");
  const ParameterSet expected = Weights(config, 5);
  for (const char* name :
       {"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
        "model.layers.1.self_attn.o_proj.bias"}) {
    const ParamEntry* e = got->weights->layout.Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_TRUE(
        std::equal(got->weights->data() + e->offset, got->weights->data() + e->offset + e->numel,
                   expected.data() + e->offset,
                   [](float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }))
        << name;
  }
}

TEST_F(ShmTransportTest, VersionsMustIncrease) {
  auto publisher = *ShmWeightPublisher::Create(name_, config_);
  ASSERT_TRUE(publisher->Publish(5, Weights(config_, 5)).ok());
  EXPECT_TRUE(IsError(publisher->Publish(5, Weights(config_, 5)),
                      absl::StatusCode::kInvalidArgument, {"versions must increase", "5"}));
  EXPECT_TRUE(IsError(publisher->Publish(-1, Weights(config_, 0)),
                      absl::StatusCode::kInvalidArgument, {"version", "-1"}));
}

TEST_F(ShmTransportTest, ModelMismatchNamesTheField) {
  auto publisher = *ShmWeightPublisher::Create(name_, config_);
  ModelConfig layers = config_;
  layers.num_hidden_layers = 3;
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, layers).status(),
                      absl::StatusCode::kFailedPrecondition,
                      {name_, "num_hidden_layers is 2 in the published model but 3"}));
  ModelConfig theta = config_;
  theta.rope_theta = 1e6;
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, theta).status(),
                      absl::StatusCode::kFailedPrecondition, {"rope_theta is 10000", "1000000"}));
  // Publishing another model's weights is refused too.
  EXPECT_TRUE(IsError(publisher->Publish(1, Weights(layers, 1)),
                      absl::StatusCode::kFailedPrecondition, {"num_hidden_layers"}));
}

TEST_F(ShmTransportTest, ForeignSegmentIsAClearError) {
  {
    bip::shared_memory_object shm(bip::create_only, name_.c_str(), bip::read_write);
    shm.truncate(1 << 20);  // zeros: no magic
  }
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, config_).status(),
                      absl::StatusCode::kDataLoss, {"not a prl weight segment", "magic"}));
  EXPECT_TRUE(IsError(ShmWeightPublisher::Create(name_, config_).status(),
                      absl::StatusCode::kDataLoss, {"not a prl weight segment"}));
  {
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_write);
    shm.truncate(100);  // smaller than a header
  }
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, config_).status(),
                      absl::StatusCode::kUnavailable, {"smaller than its header"}));
}

TEST_F(ShmTransportTest, WrongSizeOrLayoutVersionIsAClearError) {
  auto publisher = *ShmWeightPublisher::Create(name_, config_);
  const int64_t size = InspectShmWeightSegment(name_)->segment_bytes;
  {
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_write);
    shm.truncate(size + 4096);
  }
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, config_).status(),
                      absl::StatusCode::kDataLoss,
                      {absl::StrCat(size + 4096, " bytes but its header says ", size)}));
  {
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_write);
    shm.truncate(size);
    bip::mapped_region region(shm, bip::read_write, 0, 4096);
    auto* header = static_cast<weight_broadcast_internal::ShmHeader*>(region.get_address());
    header->fixed.layout_version = 7;
  }
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, config_).status(),
                      absl::StatusCode::kFailedPrecondition,
                      {"layout version 7", "this prl reads 1"}));
  {
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_write);
    bip::mapped_region region(shm, bip::read_write, 0, 4096);
    auto* header = static_cast<weight_broadcast_internal::ShmHeader*>(region.get_address());
    header->fixed.layout_version = weight_broadcast_internal::kShmLayoutVersion;
    header->fixed.weight_bytes += 4;  // not covered by the checksum any more
  }
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, config_).status(),
                      absl::StatusCode::kDataLoss, {"corrupted header"}));
}

TEST_F(ShmTransportTest, OneLivePublisherPerSegmentAndARestartAdopts) {
  auto first = *ShmWeightPublisher::Create(name_, config_);
  EXPECT_TRUE(IsError(ShmWeightPublisher::Create(name_, config_).status(),
                      absl::StatusCode::kAlreadyExists, {"live publisher", "pid"}));
  ASSERT_TRUE(first->Publish(5, Weights(config_, 5)).ok());
  auto subscriber = *ShmWeightSubscriber::Open(name_, config_);
  first.reset();  // detaches; the version stays

  auto second = ShmWeightPublisher::Create(name_, config_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->stats().last_version, 5);
  auto v5 = subscriber->WaitNewer(-1, absl::Seconds(30));
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ(v5->version, 5);
  ASSERT_TRUE((*second)->Publish(6, Weights(config_, 6)).ok());
  auto v6 = subscriber->WaitNewer(5, absl::Seconds(30));
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(CheckPattern(*v6->weights, 6), "");

  ModelConfig other = config_;
  other.vocab_size += 64;
  second->reset();
  EXPECT_TRUE(IsError(ShmWeightPublisher::Create(name_, other).status(),
                      absl::StatusCode::kFailedPrecondition, {"vocab_size"}));
}

// Versions continue across a publisher restart: the segment holds the newest, which the new
// publisher reports and may not number below; a subscriber that stayed takes its next one.
TEST_F(ShmTransportTest, ARestartedPublisherResumesAboveTheHeldVersionAndIsFollowed) {
  auto first = *ShmWeightPublisher::Create(name_, config_);
  auto subscriber = *ShmWeightSubscriber::Open(name_, config_);
  ASSERT_TRUE(first->Publish(9, Weights(config_, 9)).ok());
  ASSERT_EQ(subscriber->WaitNewer(-1, absl::Seconds(30))->version, 9);
  first.reset();
  auto second = *ShmWeightPublisher::Create(name_, config_);
  EXPECT_EQ(second->newest_version(), 9);
  EXPECT_TRUE(IsError(second->Publish(4, Weights(config_, 4)), absl::StatusCode::kInvalidArgument,
                      {"versions must increase", "found 4"}));
  const int64_t next = FirstVersionToPublish(/*learner_version=*/4, second->newest_version());
  ASSERT_TRUE(second->Publish(next, Weights(config_, next)).ok());
  auto got = subscriber->WaitNewer(9, absl::Seconds(30));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 10);
  EXPECT_EQ(CheckPattern(*got->weights, 10), "");
}

TEST_F(ShmTransportTest, RemoveDeletesTheSegment) {
  { auto publisher = *ShmWeightPublisher::Create(name_, config_); }
  ASSERT_TRUE(InspectShmWeightSegment(name_).ok());
  EXPECT_TRUE(RemoveShmWeightSegment(name_).ok());
  EXPECT_EQ(InspectShmWeightSegment(name_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(RemoveShmWeightSegment(name_).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsError(ShmWeightSubscriber::Open(name_, config_).status(),
                      absl::StatusCode::kNotFound, {name_}));
  EXPECT_TRUE(IsError(RemoveShmWeightSegment("bad/name"), absl::StatusCode::kInvalidArgument,
                      {"[A-Za-z0-9._-]"}));
}

// The property generation depends on: a copy in progress never delays TakeNewer.
TEST_F(ShmTransportTest, TakeNewerNeverBlocksDuringATransfer) {
  const ModelConfig big = ModelOfMiB(128);
  auto publisher = *ShmWeightPublisher::Create(name_, big);
  auto subscriber = *ShmWeightSubscriber::Open(name_, big);
  ParameterSet weights = Weights(big, 0);
  ExpectTakeNewerNeverBlocks(*subscriber, [&] {
    for (int64_t v = 1; v <= 12; ++v) {
      EXPECT_TRUE(publisher->Publish(v, weights).ok());
      EXPECT_TRUE(subscriber->WaitNewer(v - 1, absl::Seconds(60)).ok());
    }
  });
}

// Not a pass/fail check: prints the numbers for a 40m-parameter model (160 MB), in steady
// state (the first two versions also fault in the subscriber's two fresh ParameterSets).
TEST_F(ShmTransportTest, ReportsThroughputFor40mModel) {
  const ModelConfig config = *PresetConfig("40m");
  auto publisher = *ShmWeightPublisher::Create(name_, config);
  auto subscriber = *ShmWeightSubscriber::Open(name_, config);
  ParameterSet weights = Weights(config, 0);
  const double gb = static_cast<double>(weights.buffer.bytes()) / 1e9;
  PublisherStats p0;
  SubscriberStats s0;
  constexpr int64_t kWarmup = 2, kVersions = 10;
  for (int64_t v = 0; v < kVersions; ++v) {
    if (v == kWarmup) {
      p0 = publisher->stats();
      s0 = subscriber->stats();
    }
    ASSERT_TRUE(publisher->Publish(v, weights).ok());
    auto next = subscriber->WaitNewer(v - 1, absl::Seconds(60));
    ASSERT_TRUE(next.ok()) << next.status();
  }
  const double publish_s = publisher->stats().total_publish_seconds - p0.total_publish_seconds;
  const double receive_s = subscriber->stats().total_transfer_seconds - s0.total_transfer_seconds;
  const double n = kVersions - kWarmup;
  std::printf(
      "shm, %.0f MB model: publish %.1f ms (%.2f GB/s), receive %.1f ms (%.2f GB/s); "
      "first receive into fresh memory %.1f ms\n",
      gb * 1e3, 1e3 * publish_s / n, gb * n / publish_s, 1e3 * receive_s / n, gb * n / receive_s,
      1e3 * s0.total_transfer_seconds / kWarmup);
}

}  // namespace
}  // namespace prl::testing
