#include "coordinator/prompt_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace prl::coordinator {
namespace {

class PromptLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("prl_prompt_log_test_", getpid(), "_", n_++, ".log"))
                .string();
    std::filesystem::remove(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  static prl::v1::LogRecord Cancelled(int i) {
    prl::v1::LogRecord r;
    r.set_cancelled(absl::StrCat("ps-", i));
    return r;
  }
  void AppendAll(int n) {
    auto opened = PromptLog::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    for (int i = 0; i < n; ++i) ASSERT_TRUE(opened->log->Append(Cancelled(i)).ok());
  }
  int64_t Size() const { return static_cast<int64_t>(std::filesystem::file_size(path_)); }

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
  opened = PromptLog::Open(path_);
  EXPECT_EQ(opened->records.size(), 6u);
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

TEST_F(PromptLogTest, CorruptionBeforeTheLastRecordIsDataLossNamingTheOffset) {
  AppendAll(3);
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8 + 12 + 1);  // inside the first record's payload
    f.put('X');
  }
  auto opened = PromptLog::Open(path_);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(opened.status().message().find("record at byte 8"), std::string::npos)
      << opened.status();
}

TEST_F(PromptLogTest, AFileThatIsNotALogIsRefused) {
  std::ofstream(path_) << "hello world";
  EXPECT_EQ(PromptLog::Open(path_).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace prl::coordinator
