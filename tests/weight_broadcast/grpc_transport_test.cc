// The gRPC weight transport on loopback: versions arrive complete and checksummed, a late
// subscriber starts from the newest, a slow one skips versions instead of falling behind, a
// subscriber survives a server restart, a corrupted chunk is never exposed, a model mismatch
// names the field, a stalled stream is cut, and TakeNewer never waits for a stream in progress.
#include "weight_broadcast/grpc_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "model/presets.h"
#include "rpc/grpc_util.h"
#include "tests/status_testing.h"
#include "tests/weight_broadcast/test_weights.h"
#include "weight_broadcast/version_file.h"
#include "weight_broadcast/versioning.h"

namespace prl::testing {
namespace {

class GrpcTransportTest : public ::testing::Test {
 protected:
  // gRPC 1.51 sometimes takes 10 s in the grpc_shutdown that the last gRPC object of a process
  // runs when a server is destroyed right after a client in the same process cancelled its
  // stream. Holding the library open for the whole binary keeps every test to its own time.
  static void SetUpTestSuite() { grpc_init(); }

  void SetUp() override { StartPublisher("127.0.0.1:0"); }

  void StartPublisher(const std::string& address, const std::string& version_file = "") {
    GrpcPublisherOptions options;
    options.address = address;
    options.chunk_bytes = 1 << 20;  // several chunks per version
    options.version_file = version_file;
    auto started = GrpcWeightPublisher::Start(config_, options);
    ASSERT_TRUE(started.ok()) << started.status();
    publisher_ = *std::move(started);
  }

  std::unique_ptr<GrpcWeightSubscriber> Subscribe(const ModelConfig& config) {
    GrpcSubscriberOptions options;
    options.initial_backoff = absl::Milliseconds(20);
    options.max_backoff = absl::Milliseconds(500);
    return *GrpcWeightSubscriber::Connect(target(), config, options);
  }

  std::string target() const { return absl::StrCat("127.0.0.1:", publisher_->port()); }

  void Publish(int64_t version) {
    FillPattern(weights_, version);
    ASSERT_TRUE(publisher_->Publish(version, weights_).ok());
  }

  // Waits until the subscriber holds `version` (or fails the test); returns it.
  VersionedWeights WaitFor(WeightSubscriber& subscriber, int64_t version) {
    auto got = subscriber.WaitNewer(-1, absl::Seconds(30));
    while (got.ok() && got->version < version) {
      got = subscriber.WaitNewer(got->version, absl::Seconds(30));
    }
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {};
    EXPECT_EQ(got->version, version);
    return *got;
  }

  ModelConfig config_ = ModelOfMiB(4);
  ParameterSet weights_ = *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/false);
  std::unique_ptr<GrpcWeightPublisher> publisher_;
};

TEST_F(GrpcTransportTest, VersionsArriveCompleteAndChecksummed) {
  auto subscriber = Subscribe(config_);
  for (int64_t v = 0; v < 4; ++v) {
    Publish(v);
    auto got = subscriber->WaitNewer(v - 1, absl::Seconds(30));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->version, v);
    EXPECT_EQ(CheckPattern(*got->weights, v), "");
  }
  EXPECT_FALSE(subscriber->TakeNewer(3)->has_value());
  const SubscriberStats s = subscriber->stats();
  EXPECT_EQ(s.versions_received, 4);
  EXPECT_EQ(s.versions_skipped, 0);
  EXPECT_EQ(s.checksum_failures, 0);
  EXPECT_EQ(s.bytes_received, 4 * static_cast<int64_t>(weights_.buffer.bytes()));
  // The server counts a version as sent after its last Write returned, which may be after the
  // subscriber has it.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (publisher_->stats().versions_sent < 4 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const PublisherStats p = publisher_->stats();
  EXPECT_EQ(p.versions_published, 4);
  EXPECT_EQ(p.versions_sent, 4);
  EXPECT_EQ(p.versions_skipped, 0);
  EXPECT_EQ(p.subscribers, 1);
}

TEST_F(GrpcTransportTest, LateSubscriberGetsTheNewest) {
  for (int64_t v = 0; v < 5; ++v) Publish(v);
  auto subscriber = Subscribe(config_);
  auto got = subscriber->WaitNewer(-1, absl::Seconds(30));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 4);
  EXPECT_EQ(CheckPattern(*got->weights, 4), "");
  EXPECT_EQ(subscriber->stats().versions_received, 1);
}

// A raw stream that reads slowly: the server finishes each version, then jumps to the newest.
TEST_F(GrpcTransportTest, SlowSubscriberSkipsVersionsInsteadOfFallingBehind) {
  auto stub = v1::WeightService::NewStub(grpc::CreateCustomChannel(
      target(), grpc::InsecureChannelCredentials(), rpc::ChannelArgs(64 << 20)));
  grpc::ClientContext context;
  v1::SubscribeRequest request;
  request.set_have_version(-1);
  request.set_model_fingerprint(ModelFingerprint(config_));
  auto reader = stub->Subscribe(&context, request);
  Publish(0);
  std::atomic<bool> publishing{true};
  std::thread learner([&] {
    for (int64_t v = 1; v <= 40; ++v) {
      Publish(v);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    publishing = false;
  });
  std::vector<int64_t> completed;
  v1::WeightChunk chunk;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((completed.empty() || completed.back() < 40) &&
         std::chrono::steady_clock::now() < give_up && reader->Read(&chunk)) {
    if (chunk.offset() + chunk.data().size() == chunk.total_bytes()) {
      completed.push_back(chunk.version());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));  // ~4x slower than publishing
  }
  learner.join();
  context.TryCancel();
  reader->Finish();
  ASSERT_FALSE(completed.empty());
  EXPECT_EQ(completed.back(), 40) << "the stream fell behind";
  EXPECT_TRUE(std::is_sorted(completed.begin(), completed.end()));
  EXPECT_LT(completed.size(), 20u) << "versions were queued, not skipped";
  EXPECT_GT(publisher_->stats().versions_skipped, 0);
}

TEST_F(GrpcTransportTest, SubscriberReconnectsAfterServerRestart) {
  auto subscriber = Subscribe(config_);
  Publish(1);
  EXPECT_EQ(CheckPattern(*WaitFor(*subscriber, 1).weights, 1), "");
  const std::string address = target();
  publisher_.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the subscriber sees it go
  StartPublisher(address);
  Publish(2);
  EXPECT_EQ(CheckPattern(*WaitFor(*subscriber, 2).weights, 2), "");
  EXPECT_GE(subscriber->stats().reconnects, 1);
}

// Weight versions continue across a publisher restart (weight_broadcast/version_file.h): the
// restarted publisher knows the newest version before any subscriber reconnects, refuses to
// number below it, and the subscriber that held it takes the next one.
TEST_F(GrpcTransportTest, ARestartedPublisherResumesAboveItsVersionFileAndIsFollowed) {
  const std::string file = absl::StrCat(::testing::TempDir(), "/prl_grpc_version_", getpid());
  std::remove(file.c_str());
  const std::string address = target();
  publisher_.reset();
  StartPublisher(address, file);
  auto subscriber = Subscribe(config_);
  Publish(5);
  Publish(7);
  EXPECT_EQ(CheckPattern(*WaitFor(*subscriber, 7).weights, 7), "");
  publisher_.reset();
  StartPublisher(address, file);
  EXPECT_EQ(publisher_->newest_version(), 7) << "known at start, from the version file";
  EXPECT_TRUE(IsError(publisher_->Publish(3, weights_), absl::StatusCode::kInvalidArgument,
                      {"versions must increase", "found 3"}));
  const int64_t next = FirstVersionToPublish(/*learner_version=*/2, publisher_->newest_version());
  EXPECT_EQ(next, 8);
  Publish(next);
  EXPECT_EQ(CheckPattern(*WaitFor(*subscriber, 8).weights, 8), "");
  std::remove(file.c_str());
}

// Without a version file a restarted publisher may number below what a subscriber holds (a
// learner that ignored newest_version()): the subscriber never takes those versions, and
// follows again once the numbers pass its own.
TEST_F(GrpcTransportTest, ASubscriberIgnoresARestartedPublishersLowerVersions) {
  auto subscriber = Subscribe(config_);
  Publish(6);
  WaitFor(*subscriber, 6);
  const std::string address = target();
  publisher_.reset();
  StartPublisher(address);
  Publish(2);
  auto lower = subscriber->WaitNewer(6, absl::Milliseconds(500));
  EXPECT_EQ(lower.status().code(), absl::StatusCode::kDeadlineExceeded) << lower.status();
  EXPECT_EQ(subscriber->stats().last_version, 6);
  Publish(9);
  EXPECT_EQ(CheckPattern(*WaitFor(*subscriber, 9).weights, 9), "");
}

TEST_F(GrpcTransportTest, CorruptedChunkIsRejected) {
  publisher_->CorruptNextChunkForTesting();
  Publish(1);
  auto subscriber = Subscribe(config_);
  // The first copy fails its checksum and is never exposed; the re-fetched one is intact.
  const VersionedWeights got = WaitFor(*subscriber, 1);
  ASSERT_NE(got.weights, nullptr);
  EXPECT_EQ(CheckPattern(*got.weights, 1), "");
  const SubscriberStats s = subscriber->stats();
  EXPECT_EQ(s.checksum_failures, 1);
  EXPECT_EQ(s.versions_received, 1);
  EXPECT_NE(s.last_error.find("failed its checksum"), std::string::npos) << s.last_error;
}

TEST_F(GrpcTransportTest, ModelMismatchIsAPermanentErrorNamingTheField) {
  ModelConfig other = config_;
  other.num_key_value_heads = 4;
  auto subscriber = Subscribe(other);
  Publish(1);
  auto got = subscriber->WaitNewer(-1, absl::Seconds(30));
  EXPECT_TRUE(IsError(got.status(), absl::StatusCode::kFailedPrecondition,
                      {target(), "num_key_value_heads is 2 in the published model but 4"}));
  EXPECT_TRUE(IsError(subscriber->TakeNewer(-1).status(), absl::StatusCode::kFailedPrecondition,
                      {"num_key_value_heads"}));
}

TEST_F(GrpcTransportTest, UnreachableServerIsRetriedAndReported) {
  const std::string address = target();
  publisher_.reset();
  GrpcSubscriberOptions options;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  auto subscriber = *GrpcWeightSubscriber::Connect(address, config_, options);
  auto got = subscriber->WaitNewer(-1, absl::Milliseconds(500));
  EXPECT_TRUE(IsError(got.status(), absl::StatusCode::kDeadlineExceeded,
                      {"no weight version newer than -1", "last error"}));
  StartPublisher(address);
  Publish(3);
  EXPECT_EQ(WaitFor(*subscriber, 3).version, 3);
}
TEST_F(GrpcTransportTest, AStalledSubscriberIsCutInsteadOfPinningSnapshots) {
  config_ = ModelOfMiB(64);
  weights_ = *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/false);
  GrpcPublisherOptions options;
  options.address = "127.0.0.1:0";
  options.chunk_bytes = 1 << 20;
  options.stall_timeout = absl::Seconds(3);  // far above two 64 MiB publishes on a busy machine
  publisher_ = *GrpcWeightPublisher::Start(config_, options);
  // A subscriber that reads one chunk of version 0 and then nothing: flow control stops the
  // server's writes long before the 64 MiB version is through.
  auto stub = v1::WeightService::NewStub(grpc::CreateCustomChannel(
      target(), grpc::InsecureChannelCredentials(), rpc::ChannelArgs(64 << 20)));
  grpc::ClientContext context;
  v1::SubscribeRequest request;
  request.set_have_version(-1);
  request.set_model_fingerprint(ModelFingerprint(config_));
  auto reader = stub->Subscribe(&context, request);
  Publish(0);
  v1::WeightChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  Publish(1);
  Publish(2);  // the stream's version is now two behind, but not yet for stall_timeout
  EXPECT_EQ(publisher_->stats().stalled_streams_cut, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(3200));
  Publish(3);
  EXPECT_EQ(publisher_->stats().stalled_streams_cut, 1);
  // The server ended the stream: the client sees it end (after the chunks already in flight).
  while (reader->Read(&chunk)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  // A healthy subscriber is unaffected.
  auto subscriber = Subscribe(config_);
  WaitFor(*subscriber, 3);
}

TEST_F(GrpcTransportTest, TakeNewerNeverBlocksDuringATransfer) {
  config_ = ModelOfMiB(64);
  weights_ = *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/false);
  StartPublisher("127.0.0.1:0");
  auto subscriber = Subscribe(config_);
  ExpectTakeNewerNeverBlocks(*subscriber, [&] {
    for (int64_t v = 1; v <= 6; ++v) {
      EXPECT_TRUE(publisher_->Publish(v, weights_).ok());
      EXPECT_TRUE(subscriber->WaitNewer(v - 1, absl::Seconds(60)).ok());
    }
  });
}

// Not a pass/fail check: prints the loopback numbers for a 40m-parameter model (160 MB) in
// steady state (the first versions also fault in fresh snapshot and receive buffers).
TEST_F(GrpcTransportTest, ReportsThroughputFor40mModel) {
  config_ = *PresetConfig("40m");
  weights_ = *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/false);
  GrpcPublisherOptions options;
  options.address = "127.0.0.1:0";
  publisher_ = *GrpcWeightPublisher::Start(config_, options);  // default 4 MiB chunks
  auto subscriber = Subscribe(config_);
  const double gb = static_cast<double>(weights_.buffer.bytes()) / 1e9;
  PublisherStats p0;
  SubscriberStats s0;
  constexpr int64_t kWarmup = 2, kVersions = 8;
  for (int64_t v = 0; v < kVersions; ++v) {
    if (v == kWarmup) {
      p0 = publisher_->stats();
      s0 = subscriber->stats();
    }
    Publish(v);
    auto got = subscriber->WaitNewer(v - 1, absl::Seconds(60));
    ASSERT_TRUE(got.ok()) << got.status();
  }
  const double publish_s = publisher_->stats().total_publish_seconds - p0.total_publish_seconds;
  const double transfer_s = subscriber->stats().total_transfer_seconds - s0.total_transfer_seconds;
  const double n = kVersions - kWarmup;
  std::printf(
      "gRPC loopback, %.0f MB model: publish (copy + XXH3) %.1f ms, transfer %.1f ms "
      "(%.2f GB/s)\n",
      gb * 1e3, 1e3 * publish_s / n, 1e3 * transfer_s / n, gb * n / transfer_s);
}

}  // namespace
}  // namespace prl::testing
