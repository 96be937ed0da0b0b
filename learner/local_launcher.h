// LocalLauncher: runs W ranks of a learner group as separate processes on this machine (what
// torchrun --standalone does): each child is `argv` re-executed with RANK, WORLD_SIZE, LOCAL_RANK
// and a FileStore directory for the rendezvous in its environment, and OMP_NUM_THREADS set so that
// the ranks share the cores instead of oversubscribing them. A rank dies with its launcher.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collective/rendezvous.h"
#include "core/device.h"

namespace prl::learner {

// Environment variable that carries the FileStore directory to the children.
inline constexpr char kStoreDirEnv[] = "PRL_RENDEZVOUS_DIR";

struct LaunchOptions {
  int world_size = 1;
  int threads_per_rank = 0;  // 0: max(1, budget / world_size), budget = OMP_NUM_THREADS or cores
  // After the first rank fails, how long the others may take to notice and report before
  // they are killed (set it above the collectives' time-out).
  absl::Duration grace_after_failure = absl::Seconds(60);
};

// Starts the ranks (argv[0] is replaced by this executable), waits for all of them and
// returns OK if every one exited 0; otherwise an error naming each failed rank and how it
// ended. A rank that fails does not kill the others at once: they notice through their
// collectives (a closed connection, or the time-out) and report it themselves; whoever is
// still running grace_after_failure later is killed.
absl::Status RunLocalRanks(const std::vector<std::string>& argv, const LaunchOptions& options);

// In a rank started by RunLocalRanks (or by an external launcher setting RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT): the rendezvous to use. NotFound when this process is not a rank.
absl::StatusOr<collective::RendezvousConfig> RendezvousForThisRank();

}  // namespace prl::learner
