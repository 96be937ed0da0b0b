// Decoding untrusted record bytes (replay/record_decoder.h) and the protobuf form of records
// (replay/record_proto.h): truncations, corruptions, bad counts and layouts are errors naming
// what is wrong; what decodes is a valid record; the committed fuzz seeds are the encoder's.
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

// ---- Decoding untrusted bytes --------------------------------------------------------------

TEST(DecodeRecordTest, TruncatedRecordAtEveryLengthIsAnError) {
  const std::vector<uint8_t> bytes = Encode(MakeRecord());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const absl::Span<const uint8_t> prefix(bytes.data(), n);
    EXPECT_TRUE(IsError(DecodeRecord(prefix).status(), kInvalid, {"rollout record: truncated"}))
        << n;
  }
  EXPECT_TRUE(DecodeRecord(bytes).ok());
}

TEST(DecodeRecordTest, TrailingBytesAreAnError) {
  std::vector<uint8_t> bytes = Encode(MakeRecord());
  const size_t size = bytes.size();
  bytes.resize(size + 8, 0);
  EXPECT_TRUE(IsError(
      DecodeRecord(bytes).status(), kInvalid,
      {"trailing bytes", absl::StrCat("expected exactly ", size, " bytes, found ", size + 8)}));
}

TEST(DecodeRecordTest, UnknownLayoutVersionIsAnErrorNamingTheVersion) {
  std::vector<uint8_t> bytes = Encode(MakeRecord());
  Poke<uint16_t>(bytes, 4, 2);  // a record of layout 2, whose episodes had no segments
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid,
                      {"rollout record: layout_version: expected 3, found 2"}));
  std::vector<uint8_t> group = EncodeGroup(MakeGroup(2));
  Poke<uint16_t>(group, 4, 7);
  EXPECT_TRUE(IsError(DecodeGroup(group).status(), kInvalid,
                      {"rollout group: layout_version: expected 3, found 7"}));
}

TEST(DecodeRecordTest, WrongMagicIsAnError) {
  std::vector<uint8_t> bytes = Encode(MakeRecord());
  bytes[0] = 'X';
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid,
                      {"magic: expected \"PRLR\", found \"XRLR\""}));
  // A record is not a group, nor the other way round.
  EXPECT_TRUE(IsError(DecodeGroup(Encode(MakeRecord())).status(), kInvalid,
                      {"magic: expected \"PRLG\", found \"PRLR\""}));
}

TEST(DecodeRecordTest, TotalBytesThatDisagreesWithTheCountsIsAnError) {
  std::vector<uint8_t> bytes = Encode(MakeRecord());
  Poke<uint64_t>(bytes, 8, bytes.size() + 8);
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid,
                      {"total_bytes: expected ", absl::StrCat("found ", bytes.size() + 8)}));
}

TEST(DecodeRecordTest, HugeCountsInASmallInputAreAnErrorWithoutAllocating) {
  for (size_t count_offset : {88, 92, 96, 100, 112}) {
    std::vector<uint8_t> bytes = Encode(MakeRecord());
    Poke<uint32_t>(bytes, count_offset, 0xFFFFFFFFu);
    EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"truncated"})) << count_offset;
  }
  std::vector<uint8_t> bytes = Encode(MakeRecord());  // routes: 5 tokens x 65535 layers x 255
  Poke<uint8_t>(bytes, 107, 255);
  Poke<uint16_t>(bytes, 108, 65535);
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"truncated"}));
  Poke<uint32_t>(bytes, 92, 0x10000u);  // 65536 tokens: 2^40 route ids, refused before sizing
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"route_layers"}));
}

TEST(DecodeRecordTest, NonZeroPaddingOrReservedBytesAreAnError) {
  std::vector<uint8_t> bytes = Encode(MakeRecord(0, 1, 1));  // one token: 4 bytes of padding
  bytes[148] = 1;                                            // after completion_tokens[0] at 144
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"padding between sections"}));
  for (size_t reserved : {7, 110, 111}) {
    bytes = Encode(MakeRecord());
    bytes[reserved] = 1;
    EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"reserved header bytes"}))
        << reserved;
  }
  bytes = Encode(MakeRecord());
  Poke<uint32_t>(bytes, 120, 1);  // segment 1 of an episode of segments 1
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"segment: expected < segments (1)"}));
  Poke<uint32_t>(bytes, 124, 0);
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"segments: expected >= 1"}));
  bytes = Encode(MakeRecord());
  Poke<uint32_t>(bytes, 116, 3);  // token sources: neither none nor one per completion token
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid, {"num_token_sources"}));
}

TEST(DecodeRecordTest, DecodedRecordsAreValidated) {
  std::vector<uint8_t> bytes = Encode(MakeRecord());
  Poke<double>(bytes, 40, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid,
                      {"rollout record: reward: expected a finite number"}));
  bytes = Encode(MakeRecord());
  bytes[6] = 0;
  EXPECT_TRUE(IsError(DecodeRecord(bytes).status(), kInvalid,
                      {"rollout record: finish_reason: expected 1 (length)"}));
}

TEST(DecodeGroupTest, TruncatedGroupAtEveryLengthIsAnError) {
  const std::vector<uint8_t> bytes = EncodeGroup(MakeGroup(2));
  for (size_t n = 0; n < bytes.size(); ++n) {
    const absl::StatusOr<std::vector<RolloutRecord>> decoded =
        DecodeGroup(absl::Span<const uint8_t>(bytes.data(), n));
    EXPECT_TRUE(IsError(decoded.status(), kInvalid, {"rollout group: "})) << n;
  }
}

TEST(DecodeGroupTest, OffsetsOutOfOrderOrOutOfRangeAreAnErrorNamingTheOffset) {
  const std::vector<uint8_t> good = EncodeGroup(MakeGroup(3));
  std::vector<uint8_t> bytes = good;
  Poke<uint64_t>(bytes, 24, ~uint64_t{0});  // offsets[1]
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid, {"offsets[1]: expected in ["}));
  bytes = good;
  Poke<uint64_t>(bytes, 24, 8);
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid, {"offsets[1]: expected in ["}));
  bytes = good;
  Poke<uint64_t>(bytes, 16, 0);
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid, {"offsets[0]: expected 48"}));
  bytes = good;
  Poke<uint64_t>(bytes, 40, good.size() - 8);
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid, {"offsets[3]: expected"}));
  bytes = good;
  Poke<uint32_t>(bytes, 8, 0xFFFFFFFFu);
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid, {"truncated", "offset table"}));
  bytes = good;
  Poke<uint32_t>(bytes, 8, 0);
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid, {"num_records: expected at least 1"}));
}

TEST(DecodeGroupTest, AGroupThatIsNotCompleteIsAnErrorNamingTheRecord) {
  std::vector<uint8_t> bytes = EncodeGroup(MakeGroup(3));
  uint64_t record2 = 0;
  std::memcpy(&record2, bytes.data() + 32, 8);
  Poke<uint32_t>(bytes, record2 + 32, 1);  // record 2 claims sample index 1
  EXPECT_TRUE(IsError(DecodeGroup(bytes).status(), kInvalid,
                      {"rollout group record 2: sample_index: expected each (sample_index, segment) once"}));
  bytes[record2 + 6] = 9;  // a record that fails on its own names its position and offset
  EXPECT_TRUE(IsError(
      DecodeGroup(bytes).status(), kInvalid,
      {absl::StrCat("rollout group: record 2 at byte ", record2, ": finish_reason: expected")}));
}

TEST(DecodeGroupTest, ASegmentCountBeyondTheGroupIsAnErrorNotAnAllocation) {
  std::vector<RolloutRecord> records = MakeGroup(2);
  records[0].segments = 0xFFFFFFFFu;  // a flipped high byte: 2^32 segments for one episode
  EXPECT_TRUE(IsError(DescribeGroup(records).status(), kInvalid,
                      {"group record 0: segments: expected at most the number of records (2)",
                       "found 4294967295"}));
}

TEST(DecodeGroupTest, EverySingleByteCorruptionIsAnErrorOrAValidCanonicalGroup) {
  const std::vector<uint8_t> good = EncodeGroup(MakeGroup(2));
  int accepted = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {0x01, 0x10, 0x80, 0xFF}) {
      std::vector<uint8_t> bytes = good;
      bytes[i] ^= flip;
      const absl::StatusOr<std::vector<RolloutRecord>> decoded = DecodeGroup(bytes);
      if (!decoded.ok()) {
        ASSERT_FALSE(decoded.status().message().empty());
        continue;
      }
      // Accepted corruptions (a token id, a reward bit) are valid groups with one encoding.
      ++accepted;
      ASSERT_TRUE(DescribeGroup(*decoded).ok()) << i;
      ASSERT_EQ(EncodeGroup(*decoded), bytes) << i;
    }
  }
  EXPECT_GT(accepted, 0);
}

// ---- Protobuf ------------------------------------------------------------------------------

TEST(RecordProtoTest, EveryFieldSurvivesTheWireFormat) {
  for (const RolloutRecord& r : {MakeRecord(1, 4, 6), MakeRecord(0, 1, 0), RolloutRecord{}}) {
    v1::RolloutRecord proto;
    ToProto(r, &proto);
    std::string wire;
    ASSERT_TRUE(proto.SerializeToString(&wire));
    v1::RolloutRecord parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    const absl::StatusOr<RolloutRecord> back = FromProto(parsed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == r);
  }
}

TEST(RecordProtoTest, ToProtoOverwritesWhatWasThere) {
  v1::RolloutRecord proto;
  ToProto(MakeRecord(0, 1, 9), &proto);
  ToProto(MakeRecord(0, 1, 2), &proto);
  EXPECT_EQ(proto.completion_tokens_size(), 2);
  EXPECT_EQ(proto.reward_components_size(), 2);
}

TEST(RecordProtoTest, UnspecifiedFinishReasonIsAnErrorNamingTheField) {
  v1::RolloutRecord proto;
  ToProto(MakeRecord(), &proto);
  proto.set_finish_reason(v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_TRUE(
      IsError(FromProto(proto).status(), kInvalid,
              {"finish_reason: expected FINISH_REASON_LENGTH", "found FINISH_REASON_UNSPECIFIED"}));
  proto.set_finish_reason(static_cast<v1::FinishReason>(9));  // from a newer sender
  EXPECT_TRUE(IsError(FromProto(proto).status(), kInvalid, {"finish_reason:", "found 9"}));
}

TEST(RecordProtoTest, MissingSamplingIsAnError) {
  v1::RolloutRecord proto;
  ToProto(MakeRecord(), &proto);
  proto.clear_sampling();
  EXPECT_TRUE(IsError(FromProto(proto).status(), kInvalid, {"sampling: expected"}));
}

TEST(RecordProtoTest, FromProtoValidatesTheRecord) {
  v1::RolloutRecord proto;
  ToProto(MakeRecord(), &proto);
  proto.mutable_behaviour_logprobs()->RemoveLast();
  EXPECT_TRUE(IsError(FromProto(proto).status(), kInvalid,
                      {"behaviour_logprobs: expected one per completion token (5), found 4"}));
  ToProto(MakeRecord(), &proto);
  proto.mutable_sampling()->set_top_p(0.0f);  // a sender relying on proto3 defaults
  EXPECT_TRUE(IsError(FromProto(proto).status(), kInvalid, {"sampling.top_p"}));
}

// ---- The committed fuzz seeds ----------------------------------------------------------------

// The seeds in fuzz/corpus/record_decode/ double as golden copies of layout 1: if this test
// fails, the layout changed. Bump kRecordLayoutVersion, or if the change is intended and v1 was
// never deployed, rewrite them with PRL_WRITE_RECORD_SEEDS=1 ./replay_record_test.
TEST(RecordSeedsTest, CommittedFuzzSeedsAreTheCurrentEncoding) {
  RolloutRecord unicode = MakeRecord(0, 1, 2);
  unicode.run_id = "прогон-🚀";
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds = {
      {"group_of_one", EncodeGroup({MakeRecord(0, 1, 2)})},
      {"group_of_three", EncodeGroup(MakeGroup(3))},
      {"group_empty_completion", EncodeGroup({MakeRecord(0, 1, 0)})},
      {"record_unicode", Encode(unicode)},
  };
  const std::filesystem::path dir = PRL_RECORD_SEED_DIR;
  const bool write = std::getenv("PRL_WRITE_RECORD_SEEDS") != nullptr;
  for (const auto& [name, bytes] : seeds) {
    SCOPED_TRACE(name);
    if (write) {
      std::filesystem::create_directories(dir);
      std::ofstream(dir / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    std::ifstream in(dir / name, std::ios::binary);
    ASSERT_TRUE(in.good()) << (dir / name);
    const std::vector<uint8_t> committed((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
    EXPECT_EQ(committed, bytes);
  }
}

}  // namespace
}  // namespace prl
