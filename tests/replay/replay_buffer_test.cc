// Single-process behaviour of the replay buffer: round trips, groups, staleness, backpressure,
// leases, and the documented errors (none of which hangs).
#include "replay/replay_buffer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/replay/stress_content.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

std::string UniqueName(const std::string& what) {
  return "prl-test-" + what + "-" + std::to_string(getpid());
}

class ReplayBufferTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReplayBuffer> Make(ReplayConfig config = {}) {
    ReplayBuffer::Remove(name_, true).IgnoreError();
    if (config.capacity_bytes == (int64_t{1} << 30)) config.capacity_bytes = 4 << 20;
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> b = ReplayBuffer::Create(name_, config);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(b).value();
  }
  void TearDown() override { ReplayBuffer::Remove(name_, true).IgnoreError(); }

  std::string name_ = UniqueName(::testing::UnitTest::GetInstance()->current_test_info()->name());
};

// Take's groups as a plain vector (ranging over the StatusOr directly trips a GCC 12 false
// -Wmaybe-uninitialized).
std::vector<LeasedGroup> TakeNow(ReplayBuffer& b, const TakeOptions& take) {
  absl::StatusOr<std::vector<LeasedGroup>> got = b.Take(take);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? std::move(got).value() : std::vector<LeasedGroup>{};
}

// StressGroup(7, seq), optionally with every token version set to `version`.
std::vector<RolloutRecord> Group(int64_t seq, int64_t version = -1) {
  std::vector<RolloutRecord> g = StressGroup(7, seq);
  if (version >= 0) {
    for (RolloutRecord& r : g) std::fill(r.token_versions.begin(), r.token_versions.end(), version);
  }
  return g;
}

TEST_F(ReplayBufferTest, GroupsRoundTripOldestFirstThroughAnotherHandle) {
  auto writer = Make();
  auto reader = *ReplayBuffer::Open(name_);
  for (int64_t s = 0; s < 5; ++s) ASSERT_TRUE(writer->WriteGroup(Group(s), absl::Seconds(1)).ok());
  TakeOptions take;
  take.max_groups = 3;
  std::vector<LeasedGroup> first = TakeNow(*reader, take);
  ASSERT_EQ(first.size(), 3u);
  take.max_groups = 10;
  const std::vector<LeasedGroup> rest = TakeNow(*reader, take);
  ASSERT_EQ(rest.size(), 2u);
  for (const LeasedGroup& g : rest) first.push_back(g);
  for (int64_t s = 0; s < 5; ++s) {
    auto records = *first[s].Decode();
    int writer_id;
    int64_t seq;
    ASSERT_TRUE(CheckStressGroup(records, &writer_id, &seq));
    EXPECT_EQ(seq, s) << "oldest first";
    EXPECT_EQ(first[s].num_records, records.size());
    ASSERT_TRUE(reader->Ack(first[s]).ok());
  }
  const ReplayStats st = writer->Stats();
  EXPECT_EQ(st.groups_in, 5);
  EXPECT_EQ(st.groups_out, 5);
  EXPECT_EQ(st.records_out, st.records_in);
  EXPECT_EQ(st.used_bytes, 0);
}

TEST_F(ReplayBufferTest, EmptyTakeWaitsForItsTimeoutThenReturnsNothing) {
  auto b = Make();
  TakeOptions take;
  take.timeout = absl::Milliseconds(50);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(TakeNow(*b, take).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(45));
}

TEST_F(ReplayBufferTest, AWaitingReaderWakesWhenAGroupArrives) {
  auto b = Make();
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(b->WriteGroup(Group(1), absl::Seconds(1)).ok());
  });
  TakeOptions take;
  take.timeout = absl::Seconds(10);
  const auto start = std::chrono::steady_clock::now();
  auto got = TakeNow(*b, take);
  writer.join();
  EXPECT_EQ(got.size(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(ReplayBufferTest, StaleGroupsAreDroppedAndCountedNeverDelivered) {
  auto b = Make();
  ASSERT_TRUE(b->WriteGroup(Group(1, /*version=*/2), absl::Seconds(1)).ok());
  ASSERT_TRUE(b->WriteGroup(Group(2, /*version=*/7), absl::Seconds(1)).ok());
  TakeOptions take;
  take.max_groups = 10;
  take.learner_version = 8;
  take.max_lag = 3;  // version 2 has lag 6 > 3: dropped; version 7 has lag 1
  auto got = TakeNow(*b, take);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].min_version, 7);
  EXPECT_EQ(b->Stats().dropped_stale, 1);
}

TEST_F(ReplayBufferTest, AFullBufferMakesWritersWaitThenFailWithResourceExhausted) {
  ReplayConfig config;
  config.capacity_bytes = 1 << 16;
  auto b = Make(config);
  int written = 0;
  // (The small groups of writer 7 fit; the first 60 sequence numbers have no large one.)
  absl::Status s;
  while ((s = b->WriteGroup(Group(written), absl::Milliseconds(50))).ok()) ++written;
  EXPECT_GT(written, 0);
  EXPECT_TRUE(IsError(s, absl::StatusCode::kResourceExhausted, {"is full", "waited"})) << s;
  EXPECT_GE(b->Stats().write_timeouts, 1);
  // A reader making room unblocks a waiting writer.
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    TakeOptions take;
    take.max_groups = 100;
    for (const LeasedGroup& g : TakeNow(*b, take)) ASSERT_TRUE(b->Ack(g).ok());
  });
  EXPECT_TRUE(b->WriteGroup(Group(1000), absl::Seconds(10)).ok());
  reader.join();
}

TEST_F(ReplayBufferTest, DropOldestPolicyMakesRoomAndCountsTheDrops) {
  ReplayConfig config;
  config.capacity_bytes = 8 << 20;  // the largest stress groups are a few MB
  config.backpressure = BackpressurePolicy::kDropOldest;
  auto b = Make(config);
  constexpr int kGroups = 4000;
  for (int s = 0; s < kGroups; ++s) {
    ASSERT_TRUE(b->WriteGroup(Group(s), absl::ZeroDuration()).ok()) << "never waits";
  }
  const ReplayStats st = b->Stats();
  EXPECT_GT(st.dropped_full, 0);
  EXPECT_EQ(st.groups_in - st.dropped_full, st.groups_ready);
  TakeOptions take;
  auto newest = TakeNow(*b, take);
  ASSERT_EQ(newest.size(), 1u);
  int w;
  int64_t seq;
  ASSERT_TRUE(CheckStressGroup(*newest[0].Decode(), &w, &seq));
  EXPECT_EQ(seq, kGroups - st.groups_ready) << "the oldest groups went first";

  // Issue 28: a dropped group's prompt was "done" at the coordinator and never trained. The
  // drops' prompts wait in the segment, oldest first, until a reader handed them back; beyond
  // the ring's capacity the oldest are overwritten, and counted.
  const int64_t recorded = std::min<int64_t>(st.dropped_full, 1024);
  EXPECT_EQ(st.dropped_prompts_waiting, recorded);
  EXPECT_EQ(st.dropped_prompts_overwritten, st.dropped_full - recorded);
  uint64_t through = 0;
  const std::vector<DroppedPrompt> dropped = b->DroppedPrompts(10, &through);
  ASSERT_EQ(dropped.size(), 10u);
  const int64_t first = st.dropped_full - recorded;  // the oldest still recorded
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(dropped[i].prompt_set_id, "w7");
    EXPECT_EQ(dropped[i].prompt_index, static_cast<uint64_t>(first + i));
  }
  auto other = *ReplayBuffer::Open(name_);  // what one handle forgets, every handle does
  other->ForgetDroppedPrompts(through);
  EXPECT_EQ(b->Stats().dropped_prompts_waiting, recorded - 10);
  const std::vector<DroppedPrompt> next = b->DroppedPrompts(1, &through);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].prompt_index, static_cast<uint64_t>(first + 10));
}

TEST_F(ReplayBufferTest, AGroupLargerThanTheBufferIsRejectedAtOnce) {
  ReplayConfig config;
  config.capacity_bytes = 1 << 16;
  auto b = Make(config);
  std::vector<RolloutRecord> huge = Group(1);
  huge[0].completion_tokens.assign(100000, 1);
  huge[0].behaviour_logprobs.assign(100000, -1.0f);
  huge[0].token_versions.assign(100000, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(IsError(b->WriteGroup(huge, absl::Seconds(30)), absl::StatusCode::kInvalidArgument,
                      {"more than replay buffer", "holds (65536 bytes)"}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST_F(ReplayBufferTest, ExpiredLeasesAreRedeliveredAndTheirLateAckFails) {
  ReplayConfig config;
  config.lease_ms = 30;
  auto b = Make(config);
  ASSERT_TRUE(b->WriteGroup(Group(1), absl::Seconds(1)).ok());
  TakeOptions take;
  auto first = TakeNow(*b, take);
  ASSERT_EQ(first.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  take.timeout = absl::Seconds(1);
  auto again = TakeNow(*b, take);
  ASSERT_EQ(again.size(), 1u) << "the expired lease's group is delivered again";
  EXPECT_EQ(again[0].group_key, first[0].group_key);
  EXPECT_TRUE(IsError(b->Ack(first[0]), absl::StatusCode::kFailedPrecondition, {"lost"}));
  EXPECT_TRUE(b->Ack(again[0]).ok());
  EXPECT_EQ(b->Stats().redelivered, 1);
}

TEST_F(ReplayBufferTest, ADeadReadersGroupsComeBackFirstInTheirOriginalOrder) {
  auto b = Make();
  for (int s = 0; s < 6; ++s) ASSERT_TRUE(b->WriteGroup(Group(s), absl::Seconds(1)).ok());
  // A reader process takes the four oldest and dies without acknowledging them.
  const pid_t child = fork();
  if (child == 0) {
    TakeOptions take;
    take.max_groups = 4;
    auto taken = b->Take(take);
    _exit(taken.ok() && taken->size() == 4 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  TakeOptions take;
  take.max_groups = 6;
  take.reclaim_first = true;  // at once, not at the next periodic pass
  const std::vector<LeasedGroup> again = TakeNow(*b, take);
  ASSERT_EQ(again.size(), 6u);
  for (int s = 0; s < 6; ++s) {
    EXPECT_EQ(again[s].group_key, Group(s)[0].GroupKey()) << "position " << s;
  }
  EXPECT_EQ(b->Stats().redelivered, 4);
}

TEST_F(ReplayBufferTest, ReleasedGroupsGoBackToTheFrontOfTheQueue) {
  auto b = Make();
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(b->WriteGroup(Group(s), absl::Seconds(1)).ok());
  TakeOptions take;
  auto g0 = TakeNow(*b, take);
  ASSERT_TRUE(b->Release(g0[0]).ok());
  auto again = TakeNow(*b, take);
  EXPECT_EQ(again[0].group_key, g0[0].group_key);
  EXPECT_FALSE(b->Release(g0[0]).ok()) << "a released lease cannot be released twice";
}

TEST_F(ReplayBufferTest, FramesWrapAroundTheRingManyTimes) {
  ReplayConfig config;
  config.capacity_bytes = 4 << 20;  // holds the largest stress group (a few MB)
  auto b = Make(config);
  TakeOptions take;
  take.max_groups = 8;
  int64_t next_read = 0;
  for (int64_t s = 0; s < 2000; ++s) {
    ASSERT_TRUE(b->WriteGroup(Group(s), absl::Seconds(5)).ok()) << s;
    if (s % 3 == 2) {
      for (const LeasedGroup& g : TakeNow(*b, take)) {
        int w;
        int64_t seq;
        ASSERT_TRUE(CheckStressGroup(*g.Decode(), &w, &seq));
        ASSERT_EQ(seq, next_read++);
        ASSERT_TRUE(b->Ack(g).ok());
      }
    }
  }
  EXPECT_GT(b->Stats().bytes_in, 3 * config.capacity_bytes) << "the ring wrapped several times";
}

TEST_F(ReplayBufferTest, ExistingSegmentsAreErrorsUnlessStaleAndReclaimed) {
  auto b = Make();
  EXPECT_TRUE(IsError(ReplayBuffer::Create(name_, {}).status(), absl::StatusCode::kAlreadyExists,
                      {"already exists", "is running", "prl replay reset"}));
  EXPECT_TRUE(IsError(ReplayBuffer::Remove(name_, /*force=*/false),
                      absl::StatusCode::kFailedPrecondition, {"is alive"}));
  b.reset();
  ReplayBuffer::Remove(name_, true).IgnoreError();
  // A segment whose creator died: a child process creates it and exits.
  const pid_t child = fork();
  if (child == 0) {
    ReplayConfig config;
    config.capacity_bytes = 1 << 16;
    _exit(ReplayBuffer::Create(name_, config).ok() ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const SegmentInfo info = *ReplayBuffer::Inspect(name_);
  EXPECT_FALSE(info.creator_alive);
  EXPECT_EQ(info.creator_pid, child);
  EXPECT_TRUE(IsError(ReplayBuffer::Create(name_, {}).status(), absl::StatusCode::kAlreadyExists,
                      {"stale"}));
  ReplayConfig config;
  config.capacity_bytes = 1 << 16;
  EXPECT_TRUE(ReplayBuffer::Create(name_, config, /*reclaim_stale=*/true).ok());
}

// An opener racing the creator finds no segment, or the whole one: never one half made (empty,
// or without its header), which it would have to call damaged.
TEST_F(ReplayBufferTest, AnOpenerRacingTheCreatorNeverFindsTheSegmentHalfMade) {
  ReplayConfig config;
  config.capacity_bytes = 32 << 20;  // big enough that sizing it takes a while
  for (int round = 0; round < 20; ++round) {
    ReplayBuffer::Remove(name_, true).IgnoreError();
    std::atomic<bool> go{false};
    absl::Status seen = absl::OkStatus();
    std::thread opener([&] {
      while (!go.load()) std::this_thread::yield();
      for (;;) {
        absl::StatusOr<std::unique_ptr<ReplayBuffer>> b = ReplayBuffer::Open(name_);
        if (b.ok()) return;
        if (!absl::IsNotFound(b.status())) {
          seen = b.status();
          return;
        }
      }
    });
    go = true;
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> made = ReplayBuffer::Create(name_, config);
    opener.join();
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE(seen.ok()) << "round " << round << ": " << seen;
  }
}

// A creator that died while making its segment leaves a draft no one can open; the next
// Create removes it.
TEST_F(ReplayBufferTest, ADeadCreatorsDraftIsRemovedByTheNextCreate) {
  ReplayBuffer::Remove(name_, true).IgnoreError();
  const pid_t child = fork();
  if (child == 0) {
    const std::string draft = name_ + ".creating." + std::to_string(getpid());
    const int fd = shm_open(("/" + draft).c_str(), O_CREAT | O_RDWR, 0600);
    _exit(fd >= 0 ? 0 : 1);  // dies before sizing or publishing it
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const std::string draft = "/dev/shm/" + name_ + ".creating." + std::to_string(child);
  ASSERT_EQ(access(draft.c_str(), F_OK), 0);
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kNotFound, {}));
  ReplayConfig config;
  config.capacity_bytes = 1 << 16;
  ASSERT_TRUE(ReplayBuffer::Create(name_, config).ok());
  EXPECT_NE(access(draft.c_str(), F_OK), 0) << draft;
}

// Flips bytes of the segment file directly, as a stray writer would.
void Corrupt(const std::string& name, size_t offset, uint64_t value) {
  const int fd = open(("/dev/shm/" + name).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, &value, sizeof(value), static_cast<off_t>(offset)), 8);
  close(fd);
}

TEST_F(ReplayBufferTest, CorruptedHeadersAndOtherVersionsAreClearErrors) {
  Make().reset();
  Corrupt(name_, 8, 99);  // layout_version (and the checksum no longer matches)
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kFailedPrecondition,
                      {"layout version 99", "prl replay reset"}));
  Make().reset();
  Corrupt(name_, 16, 12345);  // segment_bytes: a checksum mismatch
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"corrupted header"}));
  Make().reset();
  Corrupt(name_, 0, 0x1234);  // magic
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kDataLoss,
                      {"not a prl replay segment"}));
  Make().reset();
  ASSERT_EQ(truncate(("/dev/shm/" + name_).c_str(), 1 << 20), 0);  // wrong size
  EXPECT_TRUE(IsError(ReplayBuffer::Open(name_).status(), absl::StatusCode::kFailedPrecondition,
                      {"bytes but its header says"}));
  EXPECT_TRUE(IsError(ReplayBuffer::Open("prl-test-absent").status(), absl::StatusCode::kNotFound,
                      {"prl-test-absent"}));
  EXPECT_TRUE(IsError(ReplayBuffer::Open("bad/name").status(),
                      absl::StatusCode::kInvalidArgument, {"[A-Za-z0-9._-]"}));
}

TEST_F(ReplayBufferTest, InvalidConfigsAndRequestsNameTheField) {
  ReplayConfig config;
  config.capacity_bytes = 100;
  EXPECT_TRUE(IsError(ReplayBuffer::Create(name_, config).status(),
                      absl::StatusCode::kInvalidArgument, {"capacity_bytes must be >= 65536"}));
  auto b = Make();
  TakeOptions take;
  take.max_groups = 0;
  EXPECT_TRUE(IsError(b->Take(take).status(), absl::StatusCode::kInvalidArgument, {"max_groups"}));
  std::vector<RolloutRecord> partial = Group(1);
  partial[0].group_size = 9;
  EXPECT_FALSE(b->WriteGroup(partial, absl::Seconds(1)).ok()) << "incomplete groups are refused";
}

}  // namespace
}  // namespace prl::testing
