#include "learner/local_launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace prl::learner {

namespace {

// Threads per rank: options.threads_per_rank, else the launcher's budget (OMP_NUM_THREADS when
// set, e.g. by prl run, which shares the cores between roles; else every core) split evenly.
int ThreadsPerRank(const LaunchOptions& options) {
  if (options.threads_per_rank > 0) return options.threads_per_rank;
  const char* budget = std::getenv("OMP_NUM_THREADS");
  const int cores = budget != nullptr && std::atoi(budget) > 0
                        ? std::atoi(budget)
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / options.world_size);
}

// In the forked child: becomes rank `rank` (never returns).
[[noreturn]] void ExecRank(const std::vector<std::string>& argv, const LaunchOptions& options,
                           int rank, const std::string& store_dir, int threads, pid_t parent) {
  // A rank dies with its launcher (kill -9 of the launcher must not leave ranks behind
  // holding the group's segments and ports).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(options.world_size).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv(kStoreDirEnv, store_dir.c_str(), 1);
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  std::fprintf(stderr, "prl: cannot start rank %d: %s\n", rank, std::strerror(errno));
  _exit(127);
}

// Waits for every rank; the failures as one line ("" when all exited 0). Once one has failed,
// the others get `grace_after_failure` to notice (through their collectives' time-out) and
// report; then they are killed, so that a rank that hangs (stopped, deadlocked) cannot hang
// the launcher.
std::string WaitForRanks(const std::vector<pid_t>& children, const LaunchOptions& options) {
  std::string failures;
  std::vector<bool> done(children.size(), false);
  size_t remaining = children.size();
  absl::Time kill_at = absl::InfiniteFuture();
  while (remaining > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (absl::Now() >= kill_at) {
        for (size_t r = 0; r < children.size(); ++r) {
          if (!done[r]) kill(children[r], SIGKILL);
        }
        kill_at = absl::InfiniteFuture();
      }
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    const size_t rank = std::find(children.begin(), children.end(), pid) - children.begin();
    if (rank >= children.size()) continue;  // not one of ours
    done[rank] = true;
    --remaining;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    absl::StrAppend(&failures, failures.empty() ? "" : "; ", "rank ", rank,
                    WIFSIGNALED(status) ? absl::StrCat(" was killed by signal ", WTERMSIG(status))
                                        : absl::StrCat(" exited with ", WEXITSTATUS(status)));
    if (kill_at == absl::InfiniteFuture()) kill_at = absl::Now() + options.grace_after_failure;
  }
  return failures;
}

}  // namespace

absl::Status RunLocalRanks(const std::vector<std::string>& argv, const LaunchOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: expected >= 1, found ", options.world_size));
  }
  char dir_template[] = "/tmp/prl-rendezvous-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a rendezvous directory in /tmp: ", std::strerror(errno)));
  }
  const std::string store_dir = dir_template;
  const int threads = ThreadsPerRank(options);
  std::vector<pid_t> children;
  const pid_t parent = getpid();
  for (int rank = 0; rank < options.world_size; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t c : children) kill(c, SIGKILL);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    }
    if (pid == 0) ExecRank(argv, options, rank, store_dir, threads, parent);
    children.push_back(pid);
  }
  const std::string failures = WaitForRanks(children, options);
  std::error_code ignored;
  std::filesystem::remove_all(store_dir, ignored);
  if (!failures.empty()) {
    return absl::AbortedError(
        absl::StrCat("learner ranks failed: ", failures, " (their own errors are printed above)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<collective::RendezvousConfig> RendezvousForThisRank() {
  if (getenv("RANK") == nullptr) return absl::NotFoundError("RANK is not set: not a learner rank");
  if (const char* dir = getenv(kStoreDirEnv); dir != nullptr) {
    // Started by RunLocalRanks: RANK and WORLD_SIZE are ours, the rendezvous is a FileStore.
    collective::RendezvousConfig config;
    config.rank = std::atoi(getenv("RANK"));
    const char* world = getenv("WORLD_SIZE");
    config.world_size = world == nullptr ? 0 : std::atoi(world);
    config.file_store_dir = dir;
    PRL_RETURN_IF_ERROR(collective::ValidateRendezvous(config));
    return config;
  }
  return collective::RendezvousFromEnv();
}

}  // namespace prl::learner
