// The collective transport's protocol without a network: what goes into the store and at the
// head of a broadcast survives encoding and damage is an error, the payload checksum is XXH3,
// and the publisher's member table decides who is in the next epoch and when.
#include "weight_broadcast/collective_protocol.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/xxhash_inline.h"
#include "model/presets.h"
#include "tests/status_testing.h"

namespace prl::weight_broadcast_internal {
namespace {

using ::prl::testing::IsError;
using KeyValues = std::vector<std::pair<std::string, std::string>>;

TEST(CollectiveProtocolTest, StoreRecordsRoundTrip) {
  Hello hello;
  hello.instance = 0x00ab00000000cd01ull;
  hello.keepalive = absl::Milliseconds(2500);
  hello.handshake =
      LocalHandshake("nccl", *PresetConfig("tiny"), CollectiveDataPath(Device::Cpu()));
  auto h = DecodeHello(EncodeHello(hello), "store");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->instance, hello.instance);
  EXPECT_EQ(h->keepalive, hello.keepalive);
  EXPECT_EQ(h->handshake.data_path, "gloo (cpu)");
  EXPECT_TRUE(CheckHandshake(h->handshake, hello.handshake, "here").ok());

  Announcement a{RandomId(), 17, 4, 99, "10.1.2.3"};
  auto b = DecodeAnnouncement(EncodeAnnouncement(a));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->instance, a.instance);
  EXPECT_EQ(b->beat, 17);
  EXPECT_EQ(b->epoch, 4);
  EXPECT_EQ(b->version, 99);
  EXPECT_EQ(b->host, "10.1.2.3");

  EpochRecord e{7, 3, {"aa", "bb"}};
  auto f = DecodeEpoch(EncodeEpoch(e));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->instance, 7u);
  EXPECT_EQ(f->epoch, 3);
  EXPECT_EQ(f->members, e.members);
  EXPECT_EQ(RankOf(*f, "aa"), 1);
  EXPECT_EQ(RankOf(*f, "bb"), 2);
  EXPECT_EQ(RankOf(*f, "cc"), 0);
  EXPECT_TRUE(DecodeEpoch(EncodeEpoch({7, 4, {}}))->members.empty());
  EXPECT_EQ(EpochGroupName(3), "prl/weights/epoch/3");
  EXPECT_EQ(CollectiveDataPath(Device::Cuda(1)), "nccl (cuda)");
}

TEST(CollectiveProtocolTest, DamagedRecordsAreDataLossNamingWhatIsMissing) {
  EXPECT_TRUE(IsError(DecodeAnnouncement("instance=zz beat=1").status(),
                      absl::StatusCode::kDataLoss, {"member announcement", "beat="}));
  EXPECT_TRUE(IsError(DecodeEpoch("epoch=1").status(), absl::StatusCode::kDataLoss,
                      {"epoch record", "instance="}));
  EXPECT_TRUE(IsError(DecodeHello("instance=1\nnot a handshake", "store at x").status(),
                      absl::StatusCode::kDataLoss, {"store at x", "keepalive_ms="}));
}

TEST(CollectiveProtocolTest, HeadersRoundTripAndForeignOnesAreRejected) {
  WireHeader h;
  h.kind = HeaderKind::kData;
  h.epoch = 5;
  h.version = 42;
  h.bytes = 1 << 20;
  h.checksum = 0xfeedfacecafebeefull;
  auto bytes = EncodeHeader(h);
  auto back = DecodeHeader(bytes, 5);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, HeaderKind::kData);
  EXPECT_EQ(back->version, 42);
  EXPECT_EQ(back->bytes, uint64_t{1} << 20);
  EXPECT_EQ(back->checksum, h.checksum);
  EXPECT_TRUE(IsError(DecodeHeader(bytes, 6).status(), absl::StatusCode::kDataLoss,
                      {"header of epoch 5 arrived in epoch 6"}));
  bytes[0] ^= 1;
  EXPECT_TRUE(
      IsError(DecodeHeader(bytes, 5).status(), absl::StatusCode::kDataLoss, {"not a header"}));
}

TEST(CollectiveProtocolTest, PayloadChecksumIsXxh3) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(*PayloadChecksum(data.data(), Device::Cpu(), data.size()),
            XXH3_64bits(data.data(), data.size()));
}

class MemberTableTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kInstance = 42;
  // Member `id` announcing (beat, finished epoch, version) to instance `instance`.
  static std::pair<std::string, std::string> Says(const std::string& id, int64_t beat,
                                                  int64_t epoch, int64_t version = -1,
                                                  uint64_t instance = kInstance) {
    return {std::string(kMemberPrefix) + id,
            EncodeAnnouncement({instance, beat, epoch, version, "127.0.0.1"})};
  }
  MemberTable table_{kInstance, absl::Seconds(3)};
  absl::Time t0_ = absl::FromUnixSeconds(1000);
};

TEST_F(MemberTableTest, NewcomersAreAvailableAndOthersInstancesAreNot) {
  table_.Refresh({Says("a", 1, 0, 5), Says("b", 1, 0, -1, /*instance=*/7), {"junk", "x"}}, t0_);
  EXPECT_EQ(table_.Available(), std::vector<std::string>{"a"});
  EXPECT_EQ(table_.NewestReportedVersion(), 5);
  EXPECT_EQ(table_.HostOf("a"), "127.0.0.1");
  EXPECT_TRUE(table_.ReadyToForm(t0_, absl::Seconds(5))) << "no epoch ended yet";
  EXPECT_TRUE(table_.HasNewcomer({}));
  EXPECT_FALSE(table_.HasNewcomer({"a"}));
}

TEST_F(MemberTableTest, AMemberIsAvailableAgainOnlyOnceItFinishedItsEpoch) {
  table_.Refresh({Says("a", 1, 0), Says("b", 1, 0)}, t0_);
  table_.Assign({"a", "b"}, 1);
  EXPECT_TRUE(table_.Available().empty()) << "both are busy with epoch 1";
  EXPECT_FALSE(table_.AnyExpired({"a", "b"}));
  EXPECT_FALSE(table_.AnyLeft({"a", "b"}));
  table_.Ended({"a", "b"}, t0_ + absl::Seconds(1));
  // `a` reports it finished epoch 1; `b` has not yet: the next epoch waits for it ...
  table_.Refresh({Says("a", 2, 1), Says("b", 2, 0)}, t0_ + absl::Seconds(1));
  EXPECT_EQ(table_.Available(), std::vector<std::string>{"a"});
  EXPECT_FALSE(table_.ReadyToForm(t0_ + absl::Seconds(2), absl::Seconds(5)));
  // ... until it does,
  table_.Refresh({Says("a", 3, 1), Says("b", 3, 1)}, t0_ + absl::Seconds(2));
  EXPECT_TRUE(table_.ReadyToForm(t0_ + absl::Seconds(2), absl::Seconds(5)));
  EXPECT_EQ(table_.Available(), (std::vector<std::string>{"a", "b"}));
  // ... or the grace ran out.
  table_.Assign({"a", "b"}, 2);
  table_.Ended({"a", "b"}, t0_ + absl::Seconds(3));
  table_.Refresh({Says("a", 4, 2), Says("b", 4, 1)}, t0_ + absl::Seconds(3));
  EXPECT_FALSE(table_.ReadyToForm(t0_ + absl::Seconds(4), absl::Seconds(5)));
  EXPECT_TRUE(table_.ReadyToForm(t0_ + absl::Seconds(8), absl::Seconds(5)));
  EXPECT_EQ(table_.Available(), std::vector<std::string>{"a"});
}

TEST_F(MemberTableTest, AMemberThatStopsBeatingExpiresAndNoLongerHoldsTheNextEpoch) {
  table_.Refresh({Says("a", 1, 0, 3), Says("dead", 1, 0, 9)}, t0_);
  table_.Assign({"a", "dead"}, 1);
  table_.Ended({"a", "dead"}, t0_);
  // `a` keeps beating; `dead` does not.
  EXPECT_TRUE(
      table_.Refresh({Says("a", 2, 1), Says("dead", 1, 0)}, t0_ + absl::Seconds(2)).empty());
  EXPECT_FALSE(table_.ReadyToForm(t0_ + absl::Seconds(2), absl::Seconds(60)));
  const auto expired =
      table_.Refresh({Says("a", 3, 1, 3), Says("dead", 1, 0, 9)}, t0_ + absl::Seconds(4));
  EXPECT_EQ(expired, std::vector<std::string>{"dead"});
  EXPECT_TRUE(table_.AnyExpired({"a", "dead"}));
  EXPECT_FALSE(table_.AnyLeft({"a", "dead"}));
  EXPECT_TRUE(table_.ReadyToForm(t0_ + absl::Seconds(4), absl::Seconds(60)));
  EXPECT_EQ(table_.Available(), std::vector<std::string>{"a"});
  EXPECT_EQ(table_.NewestReportedVersion(), 3) << "an expired member's version does not count";
  // Its key deleted, it is gone; announcing again makes it a newcomer.
  table_.Refresh({Says("a", 4, 1)}, t0_ + absl::Seconds(5));
  EXPECT_TRUE(table_.AnyLeft({"dead"}));
  EXPECT_FALSE(table_.AnyExpired({"dead"}));
  table_.Refresh({Says("a", 5, 1), Says("dead", 1, 0)}, t0_ + absl::Seconds(6));
  EXPECT_TRUE(table_.HasNewcomer({"a"}));
}

}  // namespace
}  // namespace prl::weight_broadcast_internal
