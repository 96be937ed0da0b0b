// The pieces every weight transport shares: the one handshake check (a mismatch names what
// differs, with both values), its text form, the check of the weights handed to Publish, and
// the version rule with the resume of a restarted learner.
#include "weight_broadcast/handshake.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_replace.h"
#include "model/presets.h"
#include "tests/status_testing.h"
#include "weight_broadcast/version_file.h"
#include "weight_broadcast/versioning.h"

namespace prl::testing {
namespace {

class HandshakeTest : public ::testing::Test {
 protected:
  ModelConfig config_ = *PresetConfig("tiny");
  WeightHandshake ours_ = LocalHandshake("nccl", config_, "gloo (cpu)");
};

TEST_F(HandshakeTest, EqualSidesPass) {
  EXPECT_TRUE(CheckHandshake(ours_, LocalHandshake("nccl", config_, "gloo (cpu)"), "here").ok());
  EXPECT_EQ(ours_.weight_bytes, ParameterLayout(config_).num_elements() * 4);
  EXPECT_EQ(WeightBytes(config_), ours_.weight_bytes);
}

TEST_F(HandshakeTest, TransportMismatchNamesBoth) {
  EXPECT_TRUE(IsError(CheckHandshake(ours_, LocalHandshake("grpc", config_), "server x"),
                      absl::StatusCode::kFailedPrecondition,
                      {"server x: ", "over 'nccl'", "expects 'grpc'"}));
}

TEST_F(HandshakeTest, ModelMismatchNamesTheFieldAndBothValues) {
  ModelConfig other = config_;
  other.num_hidden_layers += 1;
  EXPECT_TRUE(IsError(CheckHandshake(ours_, LocalHandshake("nccl", other, "gloo (cpu)"), "seg"),
                      absl::StatusCode::kFailedPrecondition,
                      {"seg: model config mismatch: num_hidden_layers is ",
                       absl::StrCat(config_.num_hidden_layers, " in the published model but ",
                                    other.num_hidden_layers)}));
}

TEST_F(HandshakeTest, SizeMismatchNamesBothSizes) {
  WeightHandshake theirs = ours_;
  theirs.weight_bytes += 4;
  EXPECT_TRUE(
      IsError(CheckHandshake(theirs, ours_, "seg"), absl::StatusCode::kFailedPrecondition,
              {absl::StrCat(theirs.weight_bytes, " bytes, this model has ", ours_.weight_bytes)}));
}

TEST_F(HandshakeTest, DataPathMismatchSaysWhichDevicesDisagree) {
  EXPECT_TRUE(IsError(CheckHandshake(ours_, LocalHandshake("nccl", config_, "nccl (cuda)"), "s"),
                      absl::StatusCode::kFailedPrecondition,
                      {"sends weights with gloo (cpu)", "receive them with nccl (cuda)",
                       "all use CUDA devices, or all the CPU"}));
}

TEST_F(HandshakeTest, TextFormRoundTripsAndDamageIsDataLoss) {
  auto decoded = DecodeHandshake(EncodeHandshake(ours_), "store");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->transport, ours_.transport);
  EXPECT_EQ(decoded->model_fingerprint, ours_.model_fingerprint);
  EXPECT_EQ(decoded->weight_bytes, ours_.weight_bytes);
  EXPECT_EQ(decoded->data_path, ours_.data_path);
  EXPECT_TRUE(CheckHandshake(*decoded, ours_, "store").ok());
  EXPECT_TRUE(IsError(DecodeHandshake("garbage", "store key k").status(),
                      absl::StatusCode::kDataLoss, {"store key k", "prl-weights-v1"}));
  const std::string bad =
      absl::StrReplaceAll(EncodeHandshake(ours_), {{"weight_bytes=", "weight_bytes=x"}});
  EXPECT_TRUE(IsError(DecodeHandshake(bad, "s").status(), absl::StatusCode::kDataLoss,
                      {"weight_bytes is not a number"}));
}

TEST_F(HandshakeTest, PublishedWeightsMustBeThePublishersModel) {
  ModelConfig other = config_;
  other.vocab_size += 64;
  auto set = *ParameterSet::Allocate(other, Device::Cpu(), /*zeroed=*/true);
  EXPECT_TRUE(IsError(CheckPublishedWeights(ours_, WeightView::Of(set), "Publish"),
                      absl::StatusCode::kFailedPrecondition, {"Publish: ", "vocab_size is "}));
  auto same = *ParameterSet::Allocate(config_, Device::Cpu(), /*zeroed=*/true);
  EXPECT_TRUE(CheckPublishedWeights(ours_, WeightView::Of(same), "Publish").ok());
}

TEST(VersionSequenceTest, VersionsMustIncreaseAndStayInRange) {
  VersionSequence v;
  EXPECT_EQ(v.newest(), -1);
  EXPECT_EQ(v.last_published(), -1);
  EXPECT_TRUE(v.CheckNext(0, "p").ok());
  v.Published(0);
  EXPECT_TRUE(
      IsError(v.CheckNext(0, "p", " (hint)"), absl::StatusCode::kInvalidArgument,
              {"p: versions must increase: version 0 was published already, found 0", "(hint)"}));
  EXPECT_TRUE(v.CheckNext(7, "p").ok());
  EXPECT_TRUE(IsError(v.CheckNext(-1, "p"), absl::StatusCode::kInvalidArgument,
                      {"version must be in [0, 2^62), found -1"}));
  EXPECT_TRUE(
      IsError(v.CheckNext(kVersionLimit, "p"), absl::StatusCode::kInvalidArgument, {"[0, 2^62)"}));
}

TEST(VersionSequenceTest, HeldVersionsBindReportedOnesOnlyInform) {
  VersionSequence v;
  v.Held(41);  // a restarted publisher found version 41 in its segment
  EXPECT_EQ(v.newest(), 41);
  EXPECT_EQ(v.last_published(), -1);
  EXPECT_TRUE(IsError(v.CheckNext(41, "p"), absl::StatusCode::kInvalidArgument,
                      {"version 41 is held already, found 41"}));
  v.Reported(57);  // a subscriber has 57: advisory
  EXPECT_EQ(v.newest(), 57);
  EXPECT_TRUE(v.CheckNext(42, "p").ok());
  v.Published(42);
  EXPECT_EQ(v.last_published(), 42);
  EXPECT_EQ(v.newest(), 57);
  v.Reported(3);  // lower reports never lower it
  EXPECT_EQ(v.newest(), 57);
}

TEST(VersionSequenceTest, ARestartedLearnerResumesAboveTheNewestKnownVersion) {
  EXPECT_EQ(FirstVersionToPublish(/*learner_version=*/0, /*transport_newest=*/-1), 0);
  EXPECT_EQ(FirstVersionToPublish(10, 9), 10);   // the checkpoint is ahead: its own number
  EXPECT_EQ(FirstVersionToPublish(10, 10), 11);  // the transport holds 10 already
  EXPECT_EQ(FirstVersionToPublish(5, 57), 58);   // subscribers are ahead of the checkpoint
}

TEST(VersionSequenceTest, ConcurrentReportsKeepTheMaximum) {
  VersionSequence v;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&v, t] {
      for (int64_t i = 0; i < 1000; ++i) v.Reported(i * 4 + t);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(v.newest(), 3999);
}

TEST(VersionFileTest, KeepsTheNewestVersionAndRefusesAGarbledFileNamingIt) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/prl_version_file_", getpid());
  const std::string path = dir + "/weights/version";
  std::filesystem::remove_all(dir);
  EXPECT_EQ(*ReadPublishedVersion(path), -1) << "no file: nothing published yet";
  ASSERT_TRUE(WritePublishedVersion(path, 41).ok());
  ASSERT_TRUE(WritePublishedVersion(path, 42).ok());
  EXPECT_EQ(*ReadPublishedVersion(path), 42);
  std::ofstream(path) << "forty-three\n";
  EXPECT_TRUE(IsError(ReadPublishedVersion(path).status(), absl::StatusCode::kDataLoss,
                      {path, "expected a version in [0, 2^62)", "forty-three"}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace prl::testing
