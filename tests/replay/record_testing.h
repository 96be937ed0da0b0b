// Shared helpers of the rollout-record tests (record_test.cc, record_decode_test.cc): a record
// with every field set, groups of them, and their encodings.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "replay/record_decoder.h"
#include "replay/record_encoder.h"
#include "replay/rollout_group.h"
#include "replay/rollout_record.h"
#include "tests/status_testing.h"

namespace prl::record_testing {

using ::prl::testing::IsError;
inline constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
inline constexpr size_t kHeaderBytes = 128;  // the record header of layout 2

// A record with every field set; `completion` tokens of versions 7, 8, 9, 7, ...
inline RolloutRecord MakeRecord(uint32_t sample_index = 0, uint32_t group_size = 1,
                                size_t completion = 5) {
  RolloutRecord r;
  r.run_id = "run-42";
  r.prompt_set_id = "gsm8k-train";
  r.actor_id = absl::StrCat("actor-", sample_index);
  r.prompt_index = 1234;
  r.group_id = 3;
  r.sample_index = sample_index;
  r.group_size = group_size;
  r.prompt_tokens = {1, 15043, 29892, 3186};
  for (size_t i = 0; i < completion; ++i) {
    r.completion_tokens.push_back(static_cast<int32_t>(100 + i + sample_index));
    r.behaviour_logprobs.push_back(-0.25f * static_cast<float>(i % 7));
    r.token_versions.push_back(7 + static_cast<int64_t>(i % 3));
  }
  r.reward = 0.5 + sample_index;
  r.reward_components = {{"correctness", 1.0}, {"format", -0.5}};
  r.finish_reason = RolloutFinishReason::kStop;
  r.sampling = {.temperature = 0.7f,
                .top_p = 0.95f,
                .top_k = 50,
                .max_tokens = 64,
                .seed = 99,
                .stop_token_ids = {2, 32000}};
  r.created_unix_nanos = 1'700'000'000'000'000'000;
  r.finished_unix_nanos = r.created_unix_nanos + 1'500'000'000;
  return r;
}

inline std::vector<RolloutRecord> MakeGroup(uint32_t n) {
  std::vector<RolloutRecord> group;
  for (uint32_t i = 0; i < n; ++i) group.push_back(MakeRecord(i, n, 3 + i));
  return group;
}

inline std::vector<uint8_t> Encode(const RolloutRecord& r) {
  std::vector<uint8_t> bytes(EncodedRecordSize(r));
  EncodeRecordTo(r, bytes.data());
  return bytes;
}

inline std::vector<uint8_t> EncodeGroup(const std::vector<RolloutRecord>& records) {
  const absl::StatusOr<GroupInfo> info = DescribeGroup(records);
  EXPECT_TRUE(info.ok()) << info.status();
  std::vector<uint8_t> bytes(info->payload_bytes);
  EncodeGroupTo(records, bytes.data());
  return bytes;
}

template <typename T>
inline void Poke(std::vector<uint8_t>& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(value));
}

inline void ExpectRoundTrip(const RolloutRecord& r) {
  ASSERT_TRUE(ValidateRecord(r).ok()) << ValidateRecord(r);
  const std::vector<uint8_t> bytes = Encode(r);
  const absl::StatusOr<RolloutRecord> decoded = DecodeRecord(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(*decoded == r);
}

}  // namespace prl::record_testing
