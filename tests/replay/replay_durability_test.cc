// The replay buffer's bounded, strict, durable side: threads of one process, critical sections
// that span thousands of groups (the undo log is bounded by design), lease renewal, checks of
// a segment's bookkeeping on attach, and /dev/shm's size checked before a segment is created.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/xxhash_inline.h"
#include "replay/replay_buffer.h"
#include "replay/segment_layout.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

using replay_internal::FixedHeader;
using replay_internal::Header;

// A one-record group of a few hundred bytes, identified by `seq`.
std::vector<RolloutRecord> Tiny(int64_t seq, int64_t version = 0, size_t tokens = 4) {
  RolloutRecord r;
  r.run_id = "durability";
  r.prompt_set_id = "ps";
  r.prompt_index = static_cast<uint64_t>(seq);
  r.group_id = static_cast<uint64_t>(seq);
  r.prompt_tokens = {1, 2};
  r.completion_tokens.assign(tokens, 3);
  r.behaviour_logprobs.assign(tokens, -0.5f);
  r.token_versions.assign(tokens, version);
  return {r};
}

int64_t SeqOf(const LeasedGroup& g) {
  absl::StatusOr<std::vector<RolloutRecord>> records = g.Decode();
  return records.ok() ? static_cast<int64_t>((*records)[0].prompt_index) : -1;
}

class ReplayDurabilityTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReplayBuffer> Make(ReplayConfig config) {
    ReplayBuffer::Remove(name_, true).IgnoreError();
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> b = ReplayBuffer::Create(name_, config);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(b).value() : nullptr;
  }
  void TearDown() override { ReplayBuffer::Remove(name_, true).IgnoreError(); }
  std::vector<LeasedGroup> TakeNow(ReplayBuffer& b, int32_t max_groups, int64_t version = 0,
                                   int64_t max_lag = INT64_MAX,
                                   absl::Duration timeout = absl::ZeroDuration()) {
    TakeOptions take;
    take.max_groups = max_groups;
    take.learner_version = version;
    take.max_lag = max_lag;
    take.timeout = timeout;
    absl::StatusOr<std::vector<LeasedGroup>> got = b.Take(take);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? std::move(got).value() : std::vector<LeasedGroup>{};
  }
  void Write(ReplayBuffer& b, int64_t n) {
    for (int64_t s = 0; s < n; ++s) ASSERT_TRUE(b.WriteGroup(Tiny(s), absl::Seconds(5)).ok()) << s;
  }
  // Overwrites 8 bytes of the segment at `offset`, as a stray writer would.
  void Poke(size_t offset, uint64_t value) {
    const int fd = open(("/dev/shm/" + name_).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, &value, sizeof(value), static_cast<off_t>(offset)), 8);
    close(fd);
  }
  // Changes the creator's fixed header and re-signs it, so that only the range checks stand
  // between the damage and the attaching process.
  void RewriteFixedHeader(const std::function<void(FixedHeader&)>& change) {
    const int fd = open(("/dev/shm/" + name_).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    FixedHeader f;
    ASSERT_EQ(pread(fd, &f, sizeof(f), 0), static_cast<ssize_t>(sizeof(f)));
    change(f);
    const uint64_t checksum = XXH3_64bits(&f, sizeof(f));
    ASSERT_EQ(pwrite(fd, &f, sizeof(f), 0), static_cast<ssize_t>(sizeof(f)));
    ASSERT_EQ(pwrite(fd, &checksum, 8, offsetof(Header, fixed_checksum)), 8);
    close(fd);
  }

  std::string name_ = absl::StrCat(
      "prl-test-", ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", getpid());
};

TEST_F(ReplayDurabilityTest, ThreadsOfOneProcessWriteAndReadTogetherEachGroupOnce) {
  ReplayConfig config;
  config.capacity_bytes = 1 << 20;  // small: writers wait for readers now and then
  auto b = Make(config);
  auto other = *ReplayBuffer::Open(name_);  // a second handle in the same process
  constexpr int kWriters = 4, kPerWriter = 500;
  std::atomic<int64_t> consumed{0};
  std::vector<int> seen(kWriters * kPerWriter, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      ReplayBuffer& handle = w % 2 == 0 ? *b : *other;
      for (int i = 0; i < kPerWriter; ++i) {
        ASSERT_TRUE(handle.WriteGroup(Tiny(w * kPerWriter + i), absl::Seconds(60)).ok());
      }
    });
  }
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      ReplayBuffer& handle = r % 2 == 0 ? *b : *other;
      TakeOptions take;
      take.max_groups = 4;
      take.timeout = absl::Milliseconds(20);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (consumed.load() < kWriters * kPerWriter &&
             std::chrono::steady_clock::now() < give_up) {
        absl::StatusOr<std::vector<LeasedGroup>> groups = handle.Take(take);
        ASSERT_TRUE(groups.ok()) << groups.status();
        for (const LeasedGroup& g : *groups) {
          const int64_t seq = SeqOf(g);
          ASSERT_GE(seq, 0);
          ASSERT_TRUE(handle.Ack(g).ok());
          ++seen[static_cast<size_t>(seq)];  // distinct slots per group: no data race
          consumed.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < kWriters * kPerWriter; ++s) ASSERT_EQ(seen[s], 1) << "group " << s;
  EXPECT_EQ(b->Stats().groups_out, kWriters * kPerWriter);
  EXPECT_EQ(b->Stats().redelivered, 0);
}

TEST_F(ReplayDurabilityTest, DroppingTwentyThousandStaleGroupsSpansSectionsWithoutAborting) {
  ReplayConfig config;
  config.capacity_bytes = 16 << 20;
  config.max_groups = 25'000;
  auto b = Make(config);
  Write(*b, 20'000);  // token version 0
  EXPECT_TRUE(TakeNow(*b, 1, /*version=*/100, /*max_lag=*/4).empty());
  EXPECT_EQ(b->Stats().dropped_stale, 20'000);
  EXPECT_EQ(b->Stats().groups_ready, 0);
}

TEST_F(ReplayDurabilityTest, TakingAndExpiringThousandsOfLeasesAtOnceSpansSections) {
  ReplayConfig config;
  config.capacity_bytes = 8 << 20;
  config.max_groups = 8192;
  config.max_leases = 8192;
  config.lease_ms = 50;
  auto b = Make(config);
  Write(*b, 6000);
  std::vector<LeasedGroup> first = TakeNow(*b, 6000);
  ASSERT_EQ(first.size(), 6000u) << "one Take, several critical sections";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Every lease expired: maintenance re-queues all 6000, over several sections. (An ack that
  // comes after its new lease expired too fails, and that group comes once more.)
  std::set<int64_t> acked;
  for (int round = 0; round < 1000 && acked.size() < 6000; ++round) {
    for (const LeasedGroup& g : TakeNow(*b, 6000, 0, INT64_MAX, absl::Milliseconds(100))) {
      if (b->Ack(g).ok()) acked.insert(SeqOf(g));
    }
  }
  EXPECT_EQ(acked.size(), 6000u);
  EXPECT_GE(b->Stats().redelivered, 6000);
  EXPECT_EQ(b->Stats().groups_ready + b->Stats().groups_leased, 0);
}

TEST_F(ReplayDurabilityTest, DropOldestMakesRoomForALargeGroupByDroppingThousands) {
  ReplayConfig config;
  config.capacity_bytes = 4 << 20;
  config.max_groups = 30'000;
  config.backpressure = BackpressurePolicy::kDropOldest;
  auto b = Make(config);
  int64_t written = 0;
  while (b->Stats().used_bytes < config.capacity_bytes * 9 / 10) {
    ASSERT_TRUE(b->WriteGroup(Tiny(written++), absl::Seconds(5)).ok());
  }
  const int64_t dropped = b->Stats().dropped_full;
  ASSERT_TRUE(b->WriteGroup(Tiny(99'999, 0, 200'000), absl::Seconds(5)).ok());  // ~3.2 MB
  // Each drop writes several fields: thousands of them are more than one undo log holds.
  EXPECT_GT(b->Stats().dropped_full - dropped, 4000) << "of " << written << " groups";
  std::vector<LeasedGroup> rest = TakeNow(*b, 30'000);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(SeqOf(rest.back()), 99'999);
}

TEST_F(ReplayDurabilityTest, ARenewedLeaseOutlivesItsOriginalDeadline) {
  ReplayConfig config;
  config.capacity_bytes = 1 << 20;
  config.lease_ms = 2000;
  auto b = Make(config);
  auto other = *ReplayBuffer::Open(name_);
  Write(*b, 1);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point taken = Clock::now();
  std::vector<LeasedGroup> g = TakeNow(*b, 1);
  ASSERT_EQ(g.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const Clock::time_point renewed = Clock::now();
  const absl::Status renew = b->Renew(g[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  // Past the original deadline, within the renewed one: nothing is re-delivered.
  const std::vector<LeasedGroup> stolen = TakeNow(*other, 1);
  const Clock::time_point checked = Clock::now();
  if (renewed - taken > std::chrono::milliseconds(1900) ||
      checked - renewed > std::chrono::milliseconds(1900)) {
    GTEST_SKIP() << "the machine stalled longer than the lease margins";
  }
  ASSERT_TRUE(renew.ok()) << renew;
  EXPECT_TRUE(stolen.empty());
  EXPECT_TRUE(b->Ack(g[0]).ok());
  EXPECT_EQ(b->Stats().redelivered, 0);
}

TEST_F(ReplayDurabilityTest, RenewingALostLeaseIsFailedPrecondition) {
  ReplayConfig config;
  config.capacity_bytes = 1 << 20;
  auto b = Make(config);
  Write(*b, 1);
  std::vector<LeasedGroup> g = TakeNow(*b, 1);
  ASSERT_EQ(g.size(), 1u);
  ASSERT_TRUE(b->Renew(g[0]).ok());
  ASSERT_TRUE(b->Release(g[0]).ok());
  EXPECT_TRUE(IsError(b->Renew(g[0]), absl::StatusCode::kFailedPrecondition,
                      {"lost before it was renewed", "discard"}));
}

TEST_F(ReplayDurabilityTest, DamagedBookkeepingIsAnErrorNamingTheFieldOnAttach) {
  ReplayConfig config;
  config.capacity_bytes = 1 << 20;
  Make(config).reset();
  Poke(offsetof(Header, head), 1000);  // not 128-aligned
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"is damaged", "head", "128-aligned", "prl replay reset"}));

  auto b = Make(config);
  Write(*b, 3);
  const uint64_t queue_offset = [&] {
    FixedHeader f;
    const int fd = open(("/dev/shm/" + name_).c_str(), O_RDONLY);
    EXPECT_EQ(pread(fd, &f, sizeof(f), 0), static_cast<ssize_t>(sizeof(f)));
    close(fd);
    return f.queue_offset;
  }();
  Poke(queue_offset + 8, 7 * 128);  // ready queue entry 1: no frame starts there
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"ready queue entry 1", "the position of a ready group"}));
  b.reset();

  Make(config).reset();
  RewriteFixedHeader([](FixedHeader& f) { f.queue_capacity = uint64_t{1} << 40; });
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"queue_capacity is 1099511627776"}));
  EXPECT_TRUE(IsError(ReplayBuffer::Inspect(name_).status(), absl::StatusCode::kDataLoss,
                      {"queue_capacity"}))
      << "read-only attaches check the header too";

  Make(config).reset();
  RewriteFixedHeader([](FixedHeader& f) { f.backpressure = 7; });
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"backpressure is 7"}));

  Make(config).reset();
  Poke(offsetof(Header, lock) + offsetof(LockState, undo_count), 1);
  Poke(offsetof(Header, lock) + offsetof(LockState, undo), uint64_t{1} << 50);
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"lock.undo[0].offset"}));
}

TEST_F(ReplayDurabilityTest, ASegmentLargerThanDevShmIsRefusedNamingBothSizes) {
  struct statvfs fs;
  ASSERT_EQ(statvfs("/dev/shm", &fs), 0);
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail * fs.f_frsize);
  ReplayConfig config;
  config.capacity_bytes = free_bytes + (int64_t{1} << 30);
  const absl::Status status = ReplayBuffer::Create(name_, config).status();
  EXPECT_TRUE(IsError(status, absl::StatusCode::kResourceExhausted,
                      {"needs", "/dev/shm has", "bytes free", "replay.capacity_mb"}));
  EXPECT_EQ(ReplayBuffer::Inspect(name_).status().code(), absl::StatusCode::kNotFound)
      << "nothing is left behind";
}

}  // namespace
}  // namespace prl::testing
