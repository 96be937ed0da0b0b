// The step's bytes (learner/step_samples.h): what rank 0 broadcasts and the journal keeps
// decode to exactly the samples encoded, and damaged bytes are an error, never a crash.
#include "learner/step_samples.h"

#include <gtest/gtest.h>

namespace prl::learner {
namespace {

std::vector<TrainSample> Samples() {
  std::vector<TrainSample> out(2);
  out[0].prompt = {1, 2, 3};
  out[0].completion = {4, 5};
  out[0].behaviour_logprobs = {-0.5f, -1.25f};
  out[0].versions = {7, 8};
  out[0].reward = 1.0;
  out[0].advantage = 0.75;
  out[0].has_advantage = true;
  // Qwen3-MoE routes: 2 tokens x 2 MoE layers x top-2.
  out[0].route_layers = 2;
  out[0].route_top_k = 2;
  out[0].routes = {0, 3, 1, 2, 7, 4, 255, 9};
  out[1].prompt = {9};
  out[1].completion = {10};
  out[1].behaviour_logprobs = {-3.0f};
  out[1].versions = {8};
  out[1].reward = 0.0;
  out[1].advantage = -0.75;
  out[1].has_advantage = true;
  return out;
}

TEST(StepSamplesTest, DecodingGivesBackExactlyTheSamplesEncodedAndTheStopSignal) {
  const std::vector<TrainSample> in = Samples();
  absl::StatusOr<std::vector<uint8_t>> bytes = EncodeStepSamples(in);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::optional<std::vector<TrainSample>>> out = DecodeStepSamples(*bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->has_value());
  ASSERT_EQ((*out)->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const TrainSample& a = in[i];
    const TrainSample& b = (**out)[i];
    EXPECT_EQ(a.prompt, b.prompt);
    EXPECT_EQ(a.completion, b.completion);
    EXPECT_EQ(a.behaviour_logprobs, b.behaviour_logprobs);
    EXPECT_EQ(a.versions, b.versions);
    EXPECT_EQ(a.route_layers, b.route_layers);
    EXPECT_EQ(a.route_top_k, b.route_top_k);
    EXPECT_EQ(a.routes, b.routes);
    EXPECT_EQ(a.reward, b.reward);
    EXPECT_EQ(a.advantage, b.advantage);
    EXPECT_TRUE(b.has_advantage);
  }
  absl::StatusOr<std::optional<std::vector<TrainSample>>> stop =
      DecodeStepSamples(EncodeStopSignal());
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_FALSE(stop->has_value());
  absl::StatusOr<std::vector<uint8_t>> empty = EncodeStepSamples({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(DecodeStepSamples(*empty)->value().empty()) << "an empty step is not a stop";
}

TEST(StepSamplesTest, SamplesWithoutVersionsOrAdvantageAreRefusedNamingTheSample) {
  std::vector<TrainSample> in = Samples();
  in[1].versions.clear();
  absl::StatusOr<std::vector<uint8_t>> bytes = EncodeStepSamples(in);
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("sample 1"), std::string::npos) << bytes.status();
  in = Samples();
  in[0].has_advantage = false;
  EXPECT_NE(EncodeStepSamples(in).status().message().find("advantage"), std::string::npos);
}

// Every truncation and every single-byte flip of a valid encoding either decodes (a flip inside
// a value) or is DataLoss: never a crash, an out-of-bounds read or a huge allocation.
TEST(StepSamplesTest, TruncatedOrCorruptedBytesAreDataLossNeverACrash) {
  const std::vector<uint8_t> bytes = *EncodeStepSamples(Samples());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const absl::Status s = DecodeStepSamples(absl::MakeConstSpan(bytes.data(), n)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "cut at " << n << ": " << s;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> bad = bytes;
    bad[i] ^= 0xff;
    const absl::Status s = DecodeStepSamples(bad).status();
    EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kDataLoss) << "byte " << i << ": " << s;
  }
}

}  // namespace
}  // namespace prl::learner
