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
#include "core/child_process.h"
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

// Rank `rank` of the launch: this program again (/proc/self/exe) with the rank's environment,
// its output inherited and in the launcher's process group (killing the group kills the
// ranks), killed by the kernel if the launcher dies (a kill -9 of the launcher must not leave
// ranks behind holding the group's segments and ports).
ChildSpec RankSpec(const std::vector<std::string>& argv, const LaunchOptions& options, int rank,
                   const std::string& store_dir, int threads) {
  ChildSpec spec;
  spec.name = absl::StrCat("rank ", rank);
  spec.argv = argv;
  spec.argv[0] = "/proc/self/exe";
  spec.own_process_group = false;
  spec.env = {{"RANK", std::to_string(rank)},
              {"WORLD_SIZE", std::to_string(options.world_size)},
              {"LOCAL_RANK", std::to_string(rank)},
              {kStoreDirEnv, store_dir},
              {"OMP_NUM_THREADS", std::to_string(threads)}};
  return spec;
}

// Waits for every rank; the failures as one line ("" when all exited 0). Once one has failed,
// the others get `grace_after_failure` to notice (through their collectives' time-out) and
// report; then they are killed, so that a rank that hangs (stopped, deadlocked) cannot hang
// the launcher.
std::string WaitForRanks(std::vector<ChildProcess>& ranks, const LaunchOptions& options) {
  std::string failures;
  std::vector<bool> done(ranks.size(), false);
  size_t remaining = ranks.size();
  absl::Time kill_at = absl::InfiniteFuture();
  while (remaining > 0) {
    bool reaped = false;
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      const std::optional<int> status = done[rank] ? std::nullopt : ranks[rank].Poll();
      if (!status.has_value()) continue;
      done[rank] = true;
      --remaining;
      reaped = true;
      if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) continue;
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", "rank ", rank,
                      WIFSIGNALED(*status)
                          ? absl::StrCat(" was killed by signal ", WTERMSIG(*status))
                          : absl::StrCat(" exited with ", WEXITSTATUS(*status)));
      if (kill_at == absl::InfiniteFuture()) kill_at = absl::Now() + options.grace_after_failure;
    }
    if (reaped) continue;
    if (absl::Now() >= kill_at) {
      for (size_t rank = 0; rank < ranks.size(); ++rank) {
        if (!done[rank]) ranks[rank].Signal(SIGKILL);
      }
      kill_at = absl::InfiniteFuture();
    }
    absl::SleepFor(absl::Milliseconds(20));
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
  std::vector<ChildProcess> ranks;
  for (int rank = 0; rank < options.world_size; ++rank) {
    absl::StatusOr<ChildProcess> started =
        ChildProcess::Start(RankSpec(argv, options, rank, store_dir, threads));
    if (!started.ok()) return started.status();  // the ranks started so far are killed
    ranks.push_back(std::move(started).value());
  }
  const std::string failures = WaitForRanks(ranks, options);
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
