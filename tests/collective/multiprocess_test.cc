// Learner groups of real processes (collective_worker) on loopback: exact collectives for
// world sizes 1 to 4, rendezvous through rank 0's gRPC store with the ranks started in a
// random order (rank 0 last) and through a FileStore, and ranks that die (SIGKILL) or hang
// (SIGSTOP) in the middle of a collective: the survivors must fail within the time-out, not
// hang, and fail at once afterwards.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/free_port.h"

extern char** environ;

namespace prl::testing {
namespace {

using ::prl::testing::FreePort;

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class Group {
 public:
  Group(int world_size, const std::string& name) : world_size_(world_size) {
    dir_ = ::testing::TempDir() + "/prl_collective_" + name + "_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    port_ = FreePort();
    pids_.assign(world_size, 0);
  }
  ~Group() {
    for (pid_t pid : pids_) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }

  std::string Log(int rank) const { return absl::StrCat(dir_, "/rank", rank, ".log"); }
  std::string dir() const { return dir_; }
  pid_t pid(int rank) const { return pids_[rank]; }

  void Start(int rank, const std::string& scenario,
             const std::map<std::string, std::string>& extra_env = {}) {
    std::vector<std::string> args = {PRL_COLLECTIVE_WORKER, scenario};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (!absl::StartsWith(entry, "RANK=") && !absl::StartsWith(entry, "WORLD_SIZE=") &&
          !absl::StartsWith(entry, "MASTER_") && !absl::StartsWith(entry, "PRL_TEST_")) {
        env.push_back(entry);
      }
    }
    env.push_back(absl::StrCat("RANK=", rank));
    env.push_back(absl::StrCat("WORLD_SIZE=", world_size_));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back(absl::StrCat("MASTER_PORT=", port_));
    env.push_back(absl::StrCat("PRL_TEST_READY_DIR=", dir_));
    for (const auto& [key, value] : extra_env) env.push_back(absl::StrCat(key, "=", value));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = Log(rank);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    ASSERT_EQ(posix_spawn(&pids_[rank], argv[0], &actions, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
  }

  // The exit status of `rank`, or nullopt if it is still running after `timeout`.
  std::optional<int> Wait(int rank, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      int status = 0;
      if (waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
        pids_[rank] = 0;
        return status;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Waits for every rank and expects each to print OK and exit 0.
  void ExpectAllOk(std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    for (int rank = 0; rank < world_size_; ++rank) {
      const std::optional<int> status = Wait(rank, timeout);
      ASSERT_TRUE(status.has_value()) << "rank " << rank << " still running:\n"
                                      << ReadFile(Log(rank));
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << "rank " << rank << " status " << *status << ":\n"
          << ReadFile(Log(rank));
      EXPECT_TRUE(absl::StrContains(ReadFile(Log(rank)), "OK")) << ReadFile(Log(rank));
    }
  }

  void Signal(int rank, int sig) { kill(pids_[rank], sig); }

 private:
  int world_size_;
  int port_ = 0;
  std::string dir_;
  std::vector<pid_t> pids_;
};

class AllCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(AllCollectivesTest, EveryCollectiveGivesExactValues) {
  const int world_size = GetParam();
  Group group(world_size, absl::StrCat("all", world_size));
  for (int rank = 0; rank < world_size; ++rank) group.Start(rank, "all");
  group.ExpectAllOk();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllCollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("World", info.param); });

TEST(RendezvousTest, GrpcStoreRanksStartInRandomOrderRankZeroLast) {
  const int world_size = 4;
  Group group(world_size, "order");
  std::vector<int> order = {1, 2, 3};
  std::shuffle(order.begin(), order.end(), std::mt19937(std::random_device{}()));
  for (int rank : order) {
    group.Start(rank, "quick");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  // The others have been retrying the store for a while by now.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  group.Start(0, "quick");
  group.ExpectAllOk();
}

TEST(RendezvousTest, FileStoreConnectsAGroupAndCleansUpItsKeys) {
  const int world_size = 3;
  Group group(world_size, "file");
  const std::string store_dir = group.dir() + "/store";
  for (int rank : {2, 0, 1}) group.Start(rank, "quick", {{"PRL_TEST_STORE_DIR", store_dir}});
  group.ExpectAllOk();
  // Every rank deleted the keys it set once all had read them: the directory is reusable.
  EXPECT_TRUE(std::filesystem::is_empty(store_dir));
}

// Runs a 3-rank all-reduce loop with a 2 s time-out, hits rank 1 with `sig` once every rank
// is running, and checks that ranks 0 and 2 fail within 10 s with the poisoned status.
void ExpectSurvivorsFail(int sig, const std::string& name) {
  Group group(3, name);
  for (int rank = 0; rank < 3; ++rank) group.Start(rank, "loop", {{"PRL_TEST_TIMEOUT_MS", "2000"}});
  const auto ready_deadline = Clock::now() + std::chrono::seconds(60);
  for (int rank = 0; rank < 3; ++rank) {
    while (!std::filesystem::exists(absl::StrCat(group.dir(), "/ready.", rank))) {
      ASSERT_LT(Clock::now(), ready_deadline) << "rank " << rank << ":\n"
                                              << ReadFile(group.Log(rank));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // mid-collective, most likely
  const auto hit = Clock::now();
  group.Signal(1, sig);
  bool timed_out_somewhere = false;
  for (int rank : {0, 2}) {
    const std::optional<int> status = group.Wait(rank, std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value()) << "rank " << rank << " still running 10 s after the hit:\n"
                                    << ReadFile(group.Log(rank));
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - hit);
    const std::string log = ReadFile(group.Log(rank));
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << log;
    EXPECT_LT(took.count(), 10'000) << log;
    const bool deadline = absl::StrContains(log, "FIRST DEADLINE_EXCEEDED");
    EXPECT_TRUE(deadline || absl::StrContains(log, "FIRST UNAVAILABLE")) << log;
    EXPECT_TRUE(
        absl::StrContains(log, absl::StrCat("collective all_reduce on rank ", rank, " of 3")))
        << log;
    if (deadline) {
      timed_out_somewhere = true;
      EXPECT_TRUE(absl::StrContains(log, "no answer from a peer within 2 s")) << log;
    }
    // The next calls fail at once with the same status.
    EXPECT_TRUE(absl::StrContains(log, "same=1")) << log;
    int64_t second_ms = -1;
    const size_t at = log.find("SECOND ");
    ASSERT_NE(at, std::string::npos) << log;
    std::istringstream(log.substr(log.find(' ', at + 7) + 1)) >> second_ms;
    EXPECT_GE(second_ms, 0) << log;
    EXPECT_LT(second_ms, 100) << log;
  }
  // A hung rank keeps its connections open: somebody must have timed out.
  if (sig == SIGSTOP) {
    EXPECT_TRUE(timed_out_somewhere);
  }
  group.Signal(1, SIGKILL);
}

TEST(FailureTest, KilledRankMakesSurvivorsFailWithinTheTimeout) {
  ExpectSurvivorsFail(SIGKILL, "killed");
}

TEST(FailureTest, HungRankMakesSurvivorsTimeOut) { ExpectSurvivorsFail(SIGSTOP, "hung"); }

}  // namespace
}  // namespace prl::testing
