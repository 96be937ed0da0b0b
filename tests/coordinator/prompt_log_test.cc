#include "coordinator/prompt_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/xxhash_inline.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

using ::prl::testing::IsError;
constexpr int64_t kMagic = 8, kHeader = 24;

class PromptLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("prl_prompt_log_test_", getpid(), "_", n_++);
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "sub" / "prompts.log").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static prl::v1::LogRecord Cancelled(int i) {
    prl::v1::LogRecord r;
    r.set_cancelled(absl::StrCat("ps-", i));
    return r;
  }
  // Appends records 0..n-1, each its own commit (batch).
  void AppendAll(int n) {
    auto opened = PromptLog::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    for (int i = 0; i < n; ++i) ASSERT_TRUE(opened->log->Append(Cancelled(i)).ok());
  }
  int64_t Size() const { return static_cast<int64_t>(std::filesystem::file_size(path_)); }
  void Poke(int64_t offset, char value) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    f.put(value);
  }
  // The framed size of Cancelled(i) for i < 10 (its unix_ms stamp is 6 varint bytes).
  static int64_t RecordBytes() {
    prl::v1::LogRecord r = Cancelled(0);
    r.set_unix_ms(absl::ToUnixMillis(absl::Now()));
    return kHeader + static_cast<int64_t>(r.ByteSizeLong());
  }

  std::filesystem::path dir_;
  std::string path_;
  static inline int n_ = 0;
};

TEST_F(PromptLogTest, RecordsSurviveReopeningInOrder) {
  AppendAll(5);
  auto opened = PromptLog::Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->records.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(opened->records[i].cancelled(), absl::StrCat("ps-", i));
  EXPECT_EQ(opened->torn_bytes, 0);
  ASSERT_TRUE(opened->log->Append(Cancelled(5)).ok());
  opened->log.reset();
  EXPECT_EQ(PromptLog::Open(path_)->records.size(), 6u);
}

TEST_F(PromptLogTest, RecordsAreStampedWithTheTimeTheyWereAppended) {
  const int64_t before = absl::ToUnixMillis(absl::Now());
  AppendAll(1);
  const int64_t after = absl::ToUnixMillis(absl::Now());
  prl::v1::LogRecord kept = Cancelled(1);
  kept.set_unix_ms(12345);  // a snapshot's record keeps its own time
  ASSERT_TRUE(PromptLog::Open(path_)->log->Append(kept).ok());
  auto opened = PromptLog::Open(path_);
  ASSERT_EQ(opened->records.size(), 2u);
  EXPECT_GE(opened->records[0].unix_ms(), before);
  EXPECT_LE(opened->records[0].unix_ms(), after);
  EXPECT_EQ(opened->records[1].unix_ms(), 12345);
}

TEST_F(PromptLogTest, ATornLastRecordIsCutOffAtEveryLength) {
  AppendAll(3);
  const int64_t full = Size();
  auto opened = PromptLog::Open(path_);
  ASSERT_TRUE(opened->log->Append(Cancelled(3)).ok());
  const int64_t with_fourth = Size();
  opened->log.reset();
  for (int64_t cut = full + 1; cut < with_fourth; ++cut) {
    std::filesystem::resize_file(path_, cut);
    auto reopened = PromptLog::Open(path_);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    EXPECT_EQ(reopened->records.size(), 3u) << "cut at " << cut;
    EXPECT_EQ(reopened->torn_bytes, cut - full);
    EXPECT_EQ(Size(), full) << "the torn tail stays on disk";
    ASSERT_TRUE(reopened->log->Append(Cancelled(3)).ok());
    reopened->log.reset();
    EXPECT_EQ(PromptLog::Open(path_)->records.size(), 4u);
  }
}

TEST_F(PromptLogTest, CorruptionBeforeALaterCommitIsDataLossNamingTheOffset) {
  AppendAll(3);
  Poke(kMagic + kHeader + 1, 'X');  // inside the first record's payload
  EXPECT_TRUE(IsError(PromptLog::Open(path_).status(), absl::StatusCode::kDataLoss,
                      {"record at byte 8", "fails its checksum", "corrupted"}));
}

TEST_F(PromptLogTest, ADamagedLengthInTheMiddleIsCorruptionNotATornTail) {
  AppendAll(3);
  const int64_t second = kMagic + RecordBytes();
  Poke(second + 16 + 3, '\x7f');  // the second record's length now runs past the file's end
  const absl::Status status = PromptLog::Open(path_).status();
  EXPECT_TRUE(IsError(status, absl::StatusCode::kDataLoss,
                      {absl::StrCat("record at byte ", second), "its header fails its check"}));
  EXPECT_EQ(Size(), kMagic + 3 * RecordBytes()) << "nothing was cut";
}

TEST_F(PromptLogTest, ADamagedRecordInsideTheLastUnfinishedBatchIsCutWithTheBatch) {
  AppendAll(1);  // durable on its own
  const int64_t batch_start = Size();
  {
    auto opened = PromptLog::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    uint64_t last = 0;
    for (int i = 1; i <= 3; ++i) last = *opened->log->Write(Cancelled(i));
    ASSERT_TRUE(opened->log->WaitDurable(last).ok());  // one batch of three records
  }
  // A crash mid-batch can persist later pages but not earlier ones: the batch's first record
  // is gone while the two after it are intact. Nothing of the batch was acknowledged.
  for (int64_t i = 0; i < kHeader; ++i) Poke(batch_start + i, 0);
  auto opened = PromptLog::Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->records.size(), 1u);
  EXPECT_EQ(opened->records[0].cancelled(), "ps-0");
  EXPECT_EQ(opened->torn_bytes, 3 * RecordBytes());
  EXPECT_EQ(Size(), batch_start);
}

TEST_F(PromptLogTest, AFileThatIsNotALogIsRefused) {
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  std::ofstream(path_) << "hello world";
  EXPECT_TRUE(IsError(PromptLog::Open(path_).status(), absl::StatusCode::kDataLoss,
                      {"not a prl prompt log", "PRLLOG2"}));
}

TEST_F(PromptLogTest, ALogWhoseCreationWasCutShortOpensEmpty) {
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  std::ofstream(path_) << "PRL";
  auto opened = PromptLog::Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->records.empty());
  EXPECT_EQ(Size(), kMagic);
}

TEST_F(PromptLogTest, ASecondOpenOfTheSameLogFailsNamingTheHoldersPid) {
  auto first = PromptLog::Open(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(IsError(PromptLog::Open(path_).status(), absl::StatusCode::kFailedPrecondition,
                      {"in use by another coordinator", absl::StrCat("pid ", getpid())}));
  first->log.reset();
  EXPECT_TRUE(PromptLog::Open(path_).ok()) << "the lock ends with its holder";
}

TEST_F(PromptLogTest, ConcurrentAppendsShareFsyncsAndAllSurviveInEachWritersOrder) {
  constexpr int kThreads = 8, kPerThread = 100;
  {
    auto opened = PromptLog::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    PromptLog* log = opened->log.get();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([log, t] {
        for (int i = 0; i < kPerThread; ++i) {
          ASSERT_TRUE(log->Append(Cancelled(t * 1000 + i)).ok());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    const PromptLogStats stats = log->stats();
    EXPECT_EQ(stats.records, kThreads * kPerThread);
    EXPECT_LE(stats.fsyncs, stats.records);
    EXPECT_GE(stats.fsyncs, 1);
  }
  auto opened = PromptLog::Open(path_);
  ASSERT_EQ(opened->records.size(), static_cast<size_t>(kThreads * kPerThread));
  std::vector<int> next(kThreads, 0);
  for (const prl::v1::LogRecord& r : opened->records) {
    const int id = std::stoi(r.cancelled().substr(3));
    EXPECT_EQ(id % 1000, next[id / 1000]++) << "writer " << id / 1000 << " out of order";
  }
}

TEST_F(PromptLogTest, RecordsWrittenTogetherShareOneFsync) {
  auto opened = PromptLog::Open(path_);
  const int64_t fsyncs = opened->log->stats().fsyncs;
  uint64_t last = 0;
  for (int i = 0; i < 10; ++i) last = *opened->log->Write(Cancelled(i));
  ASSERT_TRUE(opened->log->WaitDurable(last).ok());
  EXPECT_EQ(opened->log->stats().fsyncs, fsyncs + 1);
}

TEST_F(PromptLogTest, WithoutGroupCommitEveryRecordIsDurableWhenWritten) {
  PromptLogOptions options;
  options.group_commit = false;
  auto opened = PromptLog::Open(path_, options);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(opened->log->Write(Cancelled(i)).ok());
  EXPECT_EQ(opened->log->stats().fsyncs, 10);
  EXPECT_EQ(Size(), opened->log->bytes()) << "written before Write returned";
}

TEST_F(PromptLogTest, CompactionReplacesTheLogWithTheSnapshot) {
  auto opened = PromptLog::Open(path_);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(opened->log->Append(Cancelled(i)).ok());
  const int64_t before = Size();
  ASSERT_TRUE(opened->log->Compact({Cancelled(7), Cancelled(8)}).ok());
  EXPECT_LT(Size(), before);
  EXPECT_EQ(opened->log->stats().snapshot_bytes, Size());
  EXPECT_FALSE(std::filesystem::exists(path_ + ".compact"));
  ASSERT_TRUE(opened->log->Append(Cancelled(9)).ok());  // appends go on after the snapshot
  EXPECT_EQ(opened->log->bytes(), Size());
  opened->log.reset();
  auto reopened = PromptLog::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_EQ(reopened->records.size(), 3u);
  EXPECT_EQ(reopened->records[0].cancelled(), "ps-7");
  EXPECT_EQ(reopened->records[2].cancelled(), "ps-9");
}

TEST_F(PromptLogTest, RecordsWrittenBeforeACompactionAreDurableAfterIt) {
  auto opened = PromptLog::Open(path_);
  const uint64_t ticket = *opened->log->Write(Cancelled(1));
  ASSERT_TRUE(opened->log->Compact({Cancelled(1)}).ok());
  EXPECT_TRUE(opened->log->WaitDurable(ticket).ok());
  EXPECT_EQ(opened->log->stats().fsyncs, 1) << "the pending record was flushed first";
}

TEST_F(PromptLogTest, ALogOfThePreviousLayoutIsRewrittenInTheCurrentOne) {
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  std::string bytes("PRLLOG1\n", 8);
  for (int i = 0; i < 3; ++i) {
    const std::string payload = Cancelled(i).SerializeAsString();
    const auto length = static_cast<uint32_t>(payload.size());
    const uint64_t checksum = XXH3_64bits(payload.data(), payload.size());
    bytes.append(reinterpret_cast<const char*>(&length), 4);
    bytes.append(reinterpret_cast<const char*>(&checksum), 8);
    bytes += payload;
  }
  std::ofstream(path_, std::ios::binary) << bytes;
  auto opened = PromptLog::Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->migrated);
  ASSERT_EQ(opened->records.size(), 3u);
  opened->log.reset();
  std::ifstream in(path_, std::ios::binary);
  std::string magic(8, '\0');
  in.read(magic.data(), 8);
  EXPECT_EQ(magic, std::string("PRLLOG2\n", 8));
  EXPECT_EQ(PromptLog::Open(path_)->records.size(), 3u);
}

}  // namespace
}  // namespace prl::coordinator
