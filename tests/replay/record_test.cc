// The rollout record (replay/rollout_record.h): round trips of every field through the encoder
// and decoder, the documented layout byte for byte, group keys and versions, ValidateRecord's
// errors and DescribeGroup's. Decoding untrusted bytes: record_decode_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/xxhash_inline.h"
#include "prl/v1/replay.pb.h"
#include "replay/record_decoder.h"
#include "replay/record_encoder.h"
#include "replay/record_proto.h"
#include "replay/rollout_group.h"
#include "replay/rollout_record.h"
#include "tests/status_testing.h"
#include "tests/replay/record_testing.h"

namespace prl {
namespace {

using record_testing::Encode;
using record_testing::EncodeGroup;
using record_testing::ExpectRoundTrip;
using record_testing::kHeaderBytes;
using record_testing::kInvalid;
using record_testing::MakeGroup;
using record_testing::MakeRecord;
using record_testing::Poke;
using ::prl::testing::IsError;

// ---- Round trips ---------------------------------------------------------------------------

TEST(RolloutRecordTest, RecordWithEveryFieldSetRoundTrips) { ExpectRoundTrip(MakeRecord()); }

TEST(RolloutRecordTest, EmptyCompletionRoundTripsAndHasNoMinVersion) {
  RolloutRecord r = MakeRecord(0, 1, 0);
  r.finish_reason = RolloutFinishReason::kAbort;
  r.reward_components.clear();
  r.sampling.stop_token_ids.clear();
  EXPECT_EQ(r.min_version(), std::numeric_limits<int64_t>::max());
  ExpectRoundTrip(r);
  ExpectRoundTrip(RolloutRecord{});  // all defaults, empty ids
}

TEST(RolloutRecordTest, UnicodeIdsAndComponentNamesRoundTrip) {
  RolloutRecord r = MakeRecord();
  r.run_id = "прогон-🚀-試験";
  r.prompt_set_id = std::string(85, '\0') + "é";  // NUL is valid UTF-8
  r.actor_id = std::string(63, 'x') + std::string(48, '\0') + "🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀";
  ASSERT_EQ(r.actor_id.size(), 175u);
  r.reward_components = {{"🎯 correctness", 1.0}, {std::string(255, 'n'), 2.0}};
  ExpectRoundTrip(r);
  r.actor_id = std::string(kMaxRecordIdBytes, 'a');  // exactly at the limit
  ExpectRoundTrip(r);
}

TEST(RolloutRecordTest, RewardComponentsKeepTheirOrderAndExactValues) {
  RolloutRecord r = MakeRecord();
  r.reward_components = {{"z", -0.0}, {"a", 1e-300}, {"m", -1.7976931348623157e308}};
  r.reward = std::nextafter(1.0, 2.0);
  ExpectRoundTrip(r);
  const absl::StatusOr<RolloutRecord> decoded = DecodeRecord(Encode(r));
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(std::signbit(decoded->reward_components[0].second));
}

TEST(RolloutRecordTest, HugeRecordOfTenMillionTokensRoundTrips) {
  constexpr size_t kTokens = 10'000'000;
  RolloutRecord r = MakeRecord(0, 1, 0);
  r.prompt_tokens.assign(4096, 7);
  r.completion_tokens.resize(kTokens);
  r.behaviour_logprobs.resize(kTokens);
  r.token_versions.resize(kTokens);
  for (size_t i = 0; i < kTokens; ++i) {
    r.completion_tokens[i] = static_cast<int32_t>(i % 151'000);
    r.behaviour_logprobs[i] = -static_cast<float>(i % 1000) / 100.0f;
    r.token_versions[i] = static_cast<int64_t>(i / 1'000'000);
  }
  // Header, prompt, 4 + 4 + 8 bytes per token, 2 stop ids, 2 component values, 43 string bytes
  // (no episode or route sections).
  EXPECT_EQ(EncodedRecordSize(r), kHeaderBytes + 4 * 4096 + 16 * kTokens + 8 + 16 + 48);
  ExpectRoundTrip(r);
  EXPECT_EQ(r.min_version(), 0);
}

// The checksummed encoder copies big sections with non-temporal stores and hashes the source;
// its bytes and hash must be those of the plain encoder, for sections on both sides of the
// streaming threshold (256 KB) and destinations at every 8-byte offset within a cache line.
TEST(RolloutRecordTest, ChecksummedEncodingEqualsPlainEncodingAndItsXxh3) {
  for (size_t completion :
       {size_t{0}, size_t{5}, size_t{16'383}, size_t{65'537}, size_t{300'001}}) {
    const std::vector<RolloutRecord> group = {MakeRecord(0, 2, completion),
                                              MakeRecord(1, 2, completion / 3)};
    const std::vector<uint8_t> plain = EncodeGroup(group);
    for (size_t offset = 0; offset < 64; offset += 8) {
      std::vector<uint8_t> out(plain.size() + 64, 0xAB);
      const absl::StatusOr<EncodedGroup> encoded =
          EncodeGroupToWithChecksum(group, out.data() + offset);
      ASSERT_TRUE(encoded.ok()) << encoded.status();
      ASSERT_TRUE(std::equal(plain.begin(), plain.end(), out.begin() + offset))
          << completion << " tokens at offset " << offset;
      EXPECT_EQ(out[offset + plain.size()], 0xAB) << "wrote past the group";
      EXPECT_EQ(encoded->checksum, XXH3_64bits(plain.data(), plain.size()));
      EXPECT_EQ(encoded->min_version, completion == 0 ? std::numeric_limits<int64_t>::max() : 7);
    }
  }
}

// A bad value far into a streamed section is still found, by its index in the record.
TEST(RolloutRecordTest, ChecksummedEncodingNamesABadValueDeepInALargeSection) {
  std::vector<RolloutRecord> group = {MakeRecord(0, 1, 200'000)};
  group[0].behaviour_logprobs[123'457] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> out(EncodedRecordSize(group[0]) + 4096);
  EXPECT_TRUE(IsError(EncodeGroupToWithChecksum(group, out.data()).status(), kInvalid,
                      {"behaviour_logprobs[123457]"}));
}

TEST(RolloutRecordTest, EncodedRecordSizeIsExactForEveryPaddingRemainder) {
  for (size_t prompt = 0; prompt < 3; ++prompt) {
    for (size_t completion = 0; completion < 3; ++completion) {
      for (size_t stops = 0; stops < 3; ++stops) {
        for (size_t components = 0; components < 3; ++components) {
          for (size_t id_bytes = 0; id_bytes < 9; id_bytes += 3) {
            SCOPED_TRACE(
                absl::StrCat(prompt, " ", completion, " ", stops, " ", components, " ", id_bytes));
            RolloutRecord r = MakeRecord(0, 1, completion);
            r.prompt_tokens.assign(prompt, 5);
            r.sampling.stop_token_ids.assign(stops, 2);
            r.reward_components.resize(components);
            for (size_t i = 0; i < components; ++i) r.reward_components[i].first.assign(i + 1, 'c');
            r.run_id.assign(id_bytes, 'r');
            const size_t size = EncodedRecordSize(r);
            EXPECT_EQ(size % 8, 0u);
            // A sentinel past the end shows that exactly `size` bytes are written.
            std::vector<uint8_t> bytes(size + 16, 0xAB);
            EncodeRecordTo(r, bytes.data());
            for (size_t i = size; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0xAB) << i;
            bytes.resize(size);
            const absl::StatusOr<RolloutRecord> decoded = DecodeRecord(bytes);
            ASSERT_TRUE(decoded.ok()) << decoded.status();
            EXPECT_TRUE(*decoded == r);
          }
        }
      }
    }
  }
}

TEST(RolloutRecordTest, EncodingIsTheDocumentedLayout) {
  const RolloutRecord r = MakeRecord(0, 1, 1);
  const std::vector<uint8_t> bytes = Encode(r);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "PRLR");
  auto at = [&](size_t offset, auto value) {
    std::memcpy(&value, bytes.data() + offset, sizeof(value));
    return value;
  };
  EXPECT_EQ(at(4, uint16_t{}), kRecordLayoutVersion);
  EXPECT_EQ(at(6, uint8_t{}), 2);  // stop
  EXPECT_EQ(at(8, uint64_t{}), bytes.size());
  EXPECT_EQ(at(16, uint64_t{}), r.prompt_index);
  EXPECT_EQ(at(40, double{}), r.reward);
  EXPECT_EQ(at(68, float{}), r.sampling.top_p);
  EXPECT_EQ(at(88, uint32_t{}), 4u);   // prompt tokens
  EXPECT_EQ(at(128, int32_t{}), 1);    // prompt_tokens[0], right after the header
  EXPECT_EQ(at(144, int32_t{}), 100);  // completion_tokens[0]
  EXPECT_EQ(at(152, float{}), 0.0f);   // behaviour_logprobs[0]
  EXPECT_EQ(at(160, int64_t{}), 7);    // token_versions[0]
  EXPECT_EQ(at(168, int32_t{}), 2);    // stop_token_ids[0]
  EXPECT_EQ(at(176, double{}), 1.0);   // reward_components[0].value
  EXPECT_EQ(at(192, uint8_t{}), 11);   // strlen("correctness"): no episode or route sections
  EXPECT_EQ(std::string(bytes.begin() + 194, bytes.begin() + 200), "run-42");
}

// A two-turn episode: model tokens, the environment's reply, model tokens; with MoE routes of
// 2 layers, top 2. Its sections follow the reward component values, in the documented order.
RolloutRecord MakeEpisode() {
  RolloutRecord r = MakeRecord(0, 1, 0);
  r.completion_tokens = {100, 101, 500, 501, 502, 102};
  r.behaviour_logprobs = {-0.5f, -0.25f, 0.0f, 0.0f, 0.0f, -1.0f};
  r.token_versions = {7, 7, 7, 7, 7, 8};
  r.token_sources = {0, 0, 1, 1, 1, 0};
  r.turn_ends = {2, 6};
  r.turn_rewards = {0.25, 1.0};
  r.route_layers = 2;
  r.route_top_k = 2;
  for (int i = 0; i < 6 * 2 * 2; ++i) r.routes.push_back(static_cast<uint8_t>(i % 128));
  return r;
}

TEST(RolloutRecordTest, AnEpisodesSourcesTurnsAndRoutesRoundTripInTheDocumentedLayout) {
  const RolloutRecord r = MakeEpisode();
  ASSERT_TRUE(ValidateRecord(r).ok()) << ValidateRecord(r);
  ExpectRoundTrip(r);
  EXPECT_EQ(r.model_tokens(), 3);
  EXPECT_EQ(r.min_version(), 7);
  const std::vector<uint8_t> bytes = Encode(r);
  auto at = [&](size_t offset, auto value) {
    std::memcpy(&value, bytes.data() + offset, sizeof(value));
    return value;
  };
  EXPECT_EQ(at(107, uint8_t{}), 2);     // route_top_k
  EXPECT_EQ(at(108, uint16_t{}), 2);    // route_layers
  EXPECT_EQ(at(112, uint32_t{}), 2u);   // turns
  EXPECT_EQ(at(116, uint32_t{}), 6u);   // token sources
  // 128 + prompt 16 + completion 24 + log-probs 24 + versions 48 + stop 8 + values 16 = 264.
  EXPECT_EQ(at(264 + 2, uint8_t{}), 1);  // token_sources[2]: the environment
  EXPECT_EQ(at(272, uint32_t{}), 2u);    // turn_ends[0]
  EXPECT_EQ(at(280, double{}), 0.25);    // turn_rewards[0]
  EXPECT_EQ(at(296 + 5, uint8_t{}), 5);  // routes[5]
  v1::RolloutRecord proto;
  ToProto(r, &proto);
  const absl::StatusOr<RolloutRecord> back = FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == r);
}

TEST(RolloutRecordTest, EpisodeAndRouteFieldsThatDisagreeAreRefusedNamingTheField) {
  auto refused = [](void (*edit)(RolloutRecord&), std::initializer_list<absl::string_view> parts) {
    RolloutRecord r = MakeEpisode();
    edit(r);
    return IsError(ValidateRecord(r), kInvalid, parts);
  };
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.token_sources.pop_back(); },
                      {"token_sources: expected none or one per completion token (6), found 5"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.token_sources[0] = 1; },
                      {"token_sources[0]", "the model"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.token_sources[1] = 2; },
                      {"token_sources[1]: expected 0 (model) or 1 (environment), found 2"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.behaviour_logprobs[3] = -0.5f; },
                      {"behaviour_logprobs[3]: expected 0 for an environment token"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.token_versions[4] = 6; },
                      {"token_versions[4]", "the version of the token before it (7)"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.turn_ends = {3, 3}; },
                      {"turn_ends[1]: expected above 3 and at most 6"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.turn_ends = {2, 7}; }, {"turn_ends[1]"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.turn_rewards.pop_back(); },
                      {"turn_rewards: expected one per turn (2), found 1"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.turn_rewards[0] = NAN; }, {"turn_rewards[0]"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.routes.pop_back(); },
                      {"routes: expected 24 expert ids (6 tokens x 2 layers x top 2), found 23"}));
  EXPECT_TRUE(refused([](RolloutRecord& r) { r.route_top_k = 0; }, {"route_top_k"}));
}

// ---- Keys and versions ---------------------------------------------------------------------

TEST(RolloutRecordTest, GroupKeyDependsOnExactlyTheGroupIds) {
  const RolloutRecord a = MakeRecord(0, 2, 3);
  const RolloutRecord b = MakeRecord(1, 2, 9);  // other sample, actor, tokens, reward
  EXPECT_EQ(a.GroupKey(), b.GroupKey());
  const std::vector<std::function<void(RolloutRecord&)>> changes = {
      [](RolloutRecord& r) { r.run_id += "x"; }, [](RolloutRecord& r) { r.prompt_set_id += "x"; },
      [](RolloutRecord& r) { r.prompt_index += 1; }, [](RolloutRecord& r) { r.group_id += 1; },
      [](RolloutRecord& r) {  // same concatenation, other split
        r.run_id = "run-42g";
        r.prompt_set_id = "sm8k-train";
      }};
  for (size_t i = 0; i < changes.size(); ++i) {
    RolloutRecord c = a;
    changes[i](c);
    EXPECT_NE(c.GroupKey(), a.GroupKey()) << "change " << i;
  }
}

TEST(RolloutRecordTest, GroupKeyIsTheSameInEveryBuild) {
  // XXH3-64 of the documented key bytes; a change here breaks keys shared across processes.
  EXPECT_EQ(MakeRecord().GroupKey(), 0x3b91e14c2fec4ea9u);
}

TEST(RolloutRecordTest, MinVersionIsTheOldestTokenVersion) {
  RolloutRecord r = MakeRecord();
  r.token_versions = {12, 11, 13, 11, 12};
  EXPECT_EQ(r.min_version(), 11);
}

// ---- ValidateRecord ------------------------------------------------------------------------

TEST(ValidateRecordTest, EveryBrokenInvariantIsAnErrorNamingItsField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string message;  // names the field, expected and found values
    std::function<void(RolloutRecord&)> breaks;
  };
  const std::vector<Case> cases = {
      {"run_id: expected at most 255 bytes, found 256", [](auto& r) { r.run_id.assign(256, 'x'); }},
      {"run_id: expected valid UTF-8, found byte 0xff at offset 1",
       [](auto& r) { r.run_id = "a\xff"; }},
      {"run_id: expected valid UTF-8", [](auto& r) { r.run_id = "\xc0\x80"; }},      // overlong
      {"run_id: expected valid UTF-8", [](auto& r) { r.run_id = "\xed\xa0\x80"; }},  // surrogate
      {"run_id: expected valid UTF-8", [](auto& r) { r.run_id = "\xf4\x90\x80\x80"; }},
      {"run_id: expected valid UTF-8", [](auto& r) { r.run_id = "ok\xe2\x82"; }},  // cut short
      {"prompt_set_id: expected at most 255", [](auto& r) { r.prompt_set_id.assign(300, 'p'); }},
      {"actor_id: expected valid UTF-8", [](auto& r) { r.actor_id.assign(1, '\x80'); }},
      {"group_size: expected >= 1, found 0", [](auto& r) { r.group_size = 0; }},
      {"sample_index: expected < group_size (1), found 1", [](auto& r) { r.sample_index = 1; }},
      {"segments: expected >= 1, found 0", [](auto& r) { r.segments = 0; }},
      {"segment: expected < segments (2), found 2", [](auto& r) {
         r.segments = 2;
         r.segment = 2;
       }},
      {"prompt_tokens[2]: expected a token id >= 0, found -1",
       [](auto& r) { r.prompt_tokens[2] = -1; }},
      {"completion_tokens[4]: expected a token id >= 0",
       [](auto& r) { r.completion_tokens[4] = -9; }},
      {"behaviour_logprobs: expected one per completion token (5), found 4",
       [](auto& r) { r.behaviour_logprobs.pop_back(); }},
      {"behaviour_logprobs[1]: expected a finite log-probability, found nan",
       [&](auto& r) { r.behaviour_logprobs[1] = nan; }},
      {"behaviour_logprobs[3]: expected a finite",
       [&](auto& r) { r.behaviour_logprobs[3] = -inf; }},
      {"token_versions: expected one per completion token (5), found 6",
       [](auto& r) { r.token_versions.push_back(1); }},
      {"token_versions[0]: expected a weight version >= 0, found -1",
       [](auto& r) { r.token_versions[0] = -1; }},
      {"reward: expected a finite number, found nan", [&](auto& r) { r.reward = nan; }},
      {"reward: expected a finite number, found inf", [&](auto& r) { r.reward = inf; }},
      {"reward_components[1].name: expected a non-empty name",
       [](auto& r) { r.reward_components[1].first.clear(); }},
      {"reward_components[0].name: expected at most 255 bytes",
       [](auto& r) { r.reward_components[0].first.assign(256, 'n'); }},
      {"reward_components[1].name: expected valid UTF-8",
       [](auto& r) { r.reward_components[1].first.assign(1, '\xfe'); }},
      {"reward_components[2].name: expected distinct names, found \"format\" again (also "
       "reward_components[1])",
       [](auto& r) { r.reward_components.emplace_back("format", 0.0); }},
      {"reward_components[0].value: expected a finite number",
       [&](auto& r) { r.reward_components[0].second = nan; }},
      {"finish_reason: expected 1 (length), 2 (stop) or 3 (abort), found 0",
       [](auto& r) { r.finish_reason = static_cast<RolloutFinishReason>(0); }},
      {"finish_reason: expected",
       [](auto& r) { r.finish_reason = static_cast<RolloutFinishReason>(4); }},
      {"sampling.temperature: expected >= 0 and finite, found -1",
       [](auto& r) { r.sampling.temperature = -1.0f; }},
      {"sampling.temperature: expected >= 0 and finite, found nan",
       [&](auto& r) { r.sampling.temperature = nan; }},
      {"sampling.temperature: expected >= 0 and finite, found inf",
       [&](auto& r) { r.sampling.temperature = inf; }},
      {"sampling.top_p: expected in (0, 1], found 0", [](auto& r) { r.sampling.top_p = 0.0f; }},
      {"sampling.top_p: expected in (0, 1], found 1.5", [](auto& r) { r.sampling.top_p = 1.5f; }},
      {"sampling.top_k: expected >= 0 (0 disables), found -1",
       [](auto& r) { r.sampling.top_k = -1; }},
      {"sampling.max_tokens: expected >= 0, found -2", [](auto& r) { r.sampling.max_tokens = -2; }},
      {"sampling.stop_token_ids[1]: expected a token id >= 0",
       [](auto& r) { r.sampling.stop_token_ids[1] = -3; }},
      {"created_unix_nanos: expected >= 0, found -1",
       [](auto& r) { r.created_unix_nanos = -1, r.finished_unix_nanos = 0; }},
      {"finished_unix_nanos: expected >= created_unix_nanos (1700000000000000000), found 5",
       [](auto& r) { r.finished_unix_nanos = 5; }},
  };
  ASSERT_TRUE(ValidateRecord(MakeRecord()).ok());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    RolloutRecord r = MakeRecord();
    c.breaks(r);
    EXPECT_TRUE(IsError(ValidateRecord(r), kInvalid, {c.message}));
  }
}

// ---- Groups --------------------------------------------------------------------------------

TEST(DescribeGroupTest, DescribesACompleteGroupGivenInAnyOrder) {
  std::vector<RolloutRecord> group = MakeGroup(3);
  std::swap(group[0], group[2]);
  group[1].token_versions[0] = 4;
  const absl::StatusOr<GroupInfo> info = DescribeGroup(group);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->key, group[0].GroupKey());
  EXPECT_EQ(info->size, 3u);
  EXPECT_EQ(info->min_version, 4);
  std::vector<uint8_t> bytes(info->payload_bytes + 8, 0xAB);
  EncodeGroupTo(group, bytes.data());
  for (size_t i = info->payload_bytes; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0xAB);
  bytes.resize(info->payload_bytes);
  const absl::StatusOr<std::vector<RolloutRecord>> decoded = DecodeGroup(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(*decoded == group);  // the order given is kept
}

TEST(DescribeGroupTest, GroupWithoutCompletionTokensHasNoMinVersion) {
  std::vector<RolloutRecord> group = {MakeRecord(0, 1, 0)};
  const absl::StatusOr<GroupInfo> info = DescribeGroup(group);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->min_version, std::numeric_limits<int64_t>::max());
}

TEST(DescribeGroupTest, EmptyGroupIsAnError) {
  EXPECT_TRUE(IsError(DescribeGroup({}).status(), kInvalid, {"at least one record"}));
}

TEST(DescribeGroupTest, MixedGroupsAreAnErrorNamingTheFieldThatDiffers) {
  const std::vector<std::pair<std::string, std::function<void(RolloutRecord&)>>> changes = {
      {"run_id: expected \"run-42\" (as record 0), found \"run-43\"",
       [](auto& r) { r.run_id = "run-43"; }},
      {"prompt_set_id: expected \"gsm8k-train\"", [](auto& r) { r.prompt_set_id = "math"; }},
      {"prompt_index: expected 1234 (as record 0), found 1235",
       [](auto& r) { r.prompt_index = 1235; }},
      {"group_id: expected 3 (as record 0), found 4", [](auto& r) { r.group_id = 4; }}};
  for (const auto& [message, change] : changes) {
    std::vector<RolloutRecord> group = MakeGroup(3);
    change(group[2]);
    EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid, {"group record 2: ", message}));
  }
}

TEST(DescribeGroupTest, DuplicateSampleIndexIsAnErrorNamingBothRecords) {
  std::vector<RolloutRecord> group = MakeGroup(3);
  group[2].sample_index = 0;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group record 2: sample_index: expected each (sample_index, segment) "
                       "once, found 0 segment 0 again (also record 0)"}));
}

TEST(DescribeGroupTest, MissingSampleIndexIsAnError) {
  // Three records claiming a group of three, indices 0, 1, 3: index 2 is missing.
  std::vector<RolloutRecord> group = MakeGroup(3);
  group[2].sample_index = 3;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group record 2: sample_index: expected < group_size (3), found 3"}));
  // Three of a group of four: the fourth is missing.
  group = MakeGroup(3);
  for (RolloutRecord& r : group) r.group_size = 4;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group_size: expected at most the number of records (3), found 4"}));
}

TEST(DescribeGroupTest, GroupSizeMismatchIsAnErrorNamingTheRecord) {
  std::vector<RolloutRecord> group = MakeGroup(2);
  group[1].group_size = 3;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group record 1: group_size: expected 2 (as record 0), found 3"}));
}

// Two episodes, the second an agent's of two records (docs/agents.md): {0}, {1 seg 0, 1 seg 1}.
std::vector<RolloutRecord> MakeSplitGroup() {
  std::vector<RolloutRecord> group = MakeGroup(2);
  for (RolloutRecord& r : group) r.group_size = 2;
  RolloutRecord second = group[1];
  second.token_versions[0] = 9;
  group[1].segments = second.segments = 2;
  second.segment = 1;
  group.push_back(second);
  return group;
}

TEST(DescribeGroupTest, AnEpisodeOfSeveralSegmentsIsOneMemberOfItsGroupAndRoundTrips) {
  std::vector<RolloutRecord> group = MakeSplitGroup();
  std::swap(group[0], group[2]);  // any order
  const absl::StatusOr<GroupInfo> info = DescribeGroup(group);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 3u);
  std::vector<uint8_t> bytes(info->payload_bytes);
  EncodeGroupTo(group, bytes.data());
  const absl::StatusOr<std::vector<RolloutRecord>> decoded = DecodeGroup(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(*decoded == group);
  EXPECT_EQ((*decoded)[0].segment, 1u);
  EXPECT_EQ((*decoded)[0].segments, 2u);
}

TEST(DescribeGroupTest, AMissingOrRepeatedSegmentOrEpisodeIsAnErrorNamingIt) {
  std::vector<RolloutRecord> group = MakeSplitGroup();
  group.pop_back();  // episode 1's second segment
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group: expected 3 records (each episode's segments), found 2"}));
  group = MakeSplitGroup();
  group[2].segment = 0;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group record 2: sample_index: expected each (sample_index, segment) once, "
                       "found 1 segment 0 again (also record 1)"}));
  group = MakeSplitGroup();
  group[2].segments = 3;
  group[2].segment = 2;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group record 2: segments: expected 2 (as episode 1's other records), "
                       "found 3"}));
  // Three records of a group of three episodes, episode 0 in two segments: episode 2 is missing.
  group = MakeSplitGroup();
  for (RolloutRecord& r : group) r.group_size = 3;
  group[1].sample_index = 0;
  group[2].sample_index = 0;
  group[0].segments = 1;
  group[0].sample_index = 1;
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group: expected every episode 0..2 (group_size 3), found none of episode 2"}));
}

TEST(DescribeGroupTest, InvalidRecordIsAnErrorNamingItsPositionAndField) {
  std::vector<RolloutRecord> group = MakeGroup(2);
  group[1].token_versions.pop_back();
  EXPECT_TRUE(IsError(DescribeGroup(group).status(), kInvalid,
                      {"group record 1: token_versions: expected one per completion token"}));
}

}  // namespace
}  // namespace prl
