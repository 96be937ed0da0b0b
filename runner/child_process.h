// ChildProcess: one supervised process of `prl run` (the coordinator, a learner launcher, an
// actor): fork + exec with stdout and stderr appended to a log file, killed by the kernel if
// prl run itself dies (PR_SET_PDEATHSIG), so that no role outlives its supervisor.
//
// Thread-safety: a ChildProcess is used from one thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prl::runner {

struct ChildSpec {
  std::string name;               // "actor-0": for messages
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::string log_path;           // stdout and stderr, appended
  // Set in the child's environment (on top of the parent's).
  std::vector<std::pair<std::string, std::string>> env;
};

class ChildProcess {
 public:
  static absl::StatusOr<ChildProcess> Start(const ChildSpec& spec);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();  // kills (SIGKILL) and reaps a child still running

  // The wait status once the child has exited (reaped on the first call that sees it).
  std::optional<int> Poll();
  bool running() { return !Poll().has_value(); }
  void Signal(int signal_number);
  // Waits for the child to exit by itself; returns the wait status.
  int Wait();
  // SIGTERM, then SIGKILL after `grace`; returns the wait status.
  int Stop(absl::Duration grace);

  const ChildSpec& spec() const { return spec_; }
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(ChildSpec spec, pid_t pid) : spec_(std::move(spec)), pid_(pid) {}

  ChildSpec spec_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// "exited with code 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, read and released): for the
// addresses prl run hands its children.
absl::StatusOr<int> PickFreePort();

}  // namespace prl::runner
