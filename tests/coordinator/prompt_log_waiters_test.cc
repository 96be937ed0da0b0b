// PromptLog's asynchronous waiters (OnDurable): called once their record is durable, sharing
// fsyncs, each exactly once, with the log's error after a failed write, and by the destructor
// at the latest.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/prompt_log.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

using ::prl::testing::IsError;

class PromptLogWaitersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("prl_prompt_log_waiters_test_", getpid(), "_", n_++);
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "prompts.log").string();
    auto opened = PromptLog::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    log_ = std::move(opened->log);
  }
  void TearDown() override {
    log_.reset();
    std::filesystem::remove_all(dir_);
  }

  static prl::v1::LogRecord Cancelled(int i, size_t pad = 0) {
    prl::v1::LogRecord r;
    r.set_cancelled(absl::StrCat("ps-", i, std::string(pad, 'x')));
    return r;
  }
  int64_t FileBytes() const { return static_cast<int64_t>(std::filesystem::file_size(path_)); }

  std::filesystem::path dir_;
  std::string path_;
  std::unique_ptr<PromptLog> log_;
  static inline int n_ = 0;
};

TEST_F(PromptLogWaitersTest, AWaiterIsCalledOnceItsRecordAndEveryEarlierOneIsOnDisk) {
  const int64_t fsyncs = log_->stats().fsyncs;
  uint64_t last = 0;
  for (int i = 0; i < 10; ++i) last = *log_->Write(Cancelled(i));
  const int64_t written = log_->bytes();
  // A std::promise, not an absl::Notification: Debian's Abseil is not built for ThreadSanitizer,
  // which would not see its synchronisation (scripts/sanitize.sh tsan).
  std::promise<std::pair<absl::Status, int64_t>> called;
  std::future<std::pair<absl::Status, int64_t>> answer = called.get_future();
  log_->OnDurable(last, [&](absl::Status s) { called.set_value({s, FileBytes()}); });
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const auto [status, bytes_when_called] = answer.get();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(bytes_when_called, written) << "every record up to the waiter's was written";
  EXPECT_EQ(log_->stats().fsyncs, fsyncs + 1) << "the ten records shared one fsync";
}

TEST_F(PromptLogWaitersTest, AWaiterForARecordAlreadyDurableIsCalledBeforeOnDurableReturns) {
  const uint64_t ticket = *log_->Write(Cancelled(1));
  ASSERT_TRUE(log_->WaitDurable(ticket).ok());
  bool called = false;
  log_->OnDurable(ticket, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    called = true;
  });
  EXPECT_TRUE(called);
}

TEST_F(PromptLogWaitersTest, ConcurrentWaitersAreEachCalledOnceAndShareFsyncs) {
  constexpr int kThreads = 8, kPerThread = 200;
  std::atomic<int> calls{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<uint64_t> ticket = log_->Write(Cancelled(t * 1000 + i));
        ASSERT_TRUE(ticket.ok()) << ticket.status();
        log_->OnDurable(*ticket, [&](absl::Status s) {
          if (!s.ok()) failures.fetch_add(1);
          calls.fetch_add(1);
        });
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (calls.load() < kThreads * kPerThread && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(calls.load(), kThreads * kPerThread);
  EXPECT_EQ(failures.load(), 0);
  const PromptLogStats stats = log_->stats();
  EXPECT_LT(stats.fsyncs, stats.records) << "waiters that queued together shared an fsync";
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), kThreads * kPerThread) << "no waiter is called twice";
}

// Compactions replace the file under the flusher: every waiter is still called once with OK,
// and the records written after the last compaction are in the file it left.
TEST_F(PromptLogWaitersTest, WaitersAcrossCompactionsAreEachCalledOnceAndLoseNothing) {
  constexpr int kThreads = 4, kCompactions = 20;
  std::atomic<int> written{0}, calls{0}, failures{0};
  std::atomic<bool> compacting{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; compacting.load(); ++i) {
        absl::StatusOr<uint64_t> ticket = log_->Write(Cancelled(t * 1'000'000 + i));
        ASSERT_TRUE(ticket.ok()) << ticket.status();
        written.fetch_add(1);
        log_->OnDurable(*ticket, [&](absl::Status s) {
          if (!s.ok()) failures.fetch_add(1);
          calls.fetch_add(1);
        });
      }
    });
  }
  for (int k = 0; k < kCompactions; ++k) {
    EXPECT_TRUE(log_->Compact({Cancelled(-1)}).ok());
    absl::SleepFor(absl::Milliseconds(1));
  }
  compacting.store(false);
  for (std::thread& t : threads) t.join();
  const uint64_t last = *log_->Write(Cancelled(99999));
  ASSERT_TRUE(log_->WaitDurable(last).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (calls.load() < written.load() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(calls.load(), written.load());
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(log_->stats().compactions, kCompactions);
  log_.reset();
  auto reopened = PromptLog::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_FALSE(reopened->records.empty());
  EXPECT_EQ(reopened->records.front().cancelled(), "ps--1") << "the last snapshot";
  EXPECT_EQ(reopened->records.back().cancelled(), "ps-99999");
}

TEST_F(PromptLogWaitersTest, TheDestructorCallsEveryWaiterWithItsRecordDurable) {
  int called_ok = 0;
  for (int i = 0; i < 50; ++i) {
    const uint64_t ticket = *log_->Write(Cancelled(i));
    log_->OnDurable(ticket, [&](absl::Status s) { called_ok += s.ok() ? 1 : 0; });
  }
  log_.reset();
  EXPECT_EQ(called_ok, 50);
  auto reopened = PromptLog::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(reopened->records.size(), 50u);
}

// A write the file system refuses (here: past the process's file size limit, EFBIG) fails the
// waiters of every record not yet durable, synchronous and asynchronous alike, with an error
// that says what to do; the log then refuses every later record.
TEST_F(PromptLogWaitersTest, AFailedWriteFailsEveryWaiterAndEveryLaterRecord) {
  ASSERT_TRUE(log_->Append(Cancelled(0)).ok());
  rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(FileBytes() + 64);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);

  const uint64_t first = *log_->Write(Cancelled(1, 1000));
  const uint64_t second = *log_->Write(Cancelled(2));
  std::promise<absl::Status> called;  // not absl::Notification: see the first test
  std::future<absl::Status> answer = called.get_future();
  log_->OnDurable(second, [&](absl::Status s) { called.set_value(s); });
  const bool was_called = answer.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  const absl::Status async_status = was_called ? answer.get() : absl::UnknownError("not called");
  const absl::Status sync_status = log_->WaitDurable(first);
  const absl::Status later = log_->Write(Cancelled(3)).status();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);

  ASSERT_TRUE(was_called);
  for (const absl::Status& s : {async_status, sync_status, later}) {
    EXPECT_TRUE(IsError(s, absl::StatusCode::kInternal,
                        {"cannot write the prompt log", path_, "restart the coordinator"}))
        << s;
  }
  bool called_at_once = false;
  log_->OnDurable(second, [&](absl::Status s) { called_at_once = !s.ok(); });
  EXPECT_TRUE(called_at_once) << "a waiter on a failed log gets the error before returning";
}

}  // namespace
}  // namespace prl::coordinator
