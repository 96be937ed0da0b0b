// ChildProcess: the one way prl starts another process: the roles of `prl run` (stdout and
// stderr appended to a log file, each in its own process group, so that a terminal's Ctrl-C
// reaches prl run only), the ranks of a local learner launch (output inherited, in the
// launcher's process group, so that killing the group kills them all), the PyTorch
// baselines of the benchmarks (stdout captured), and the writer and reader processes of
// `prl bench replay` (Fork: a function of this program run in a child, no exec). Every child is killed by the kernel if its
// parent dies (PR_SET_PDEATHSIG): nothing outlives its supervisor.
//
// Thread-safety: a ChildProcess is used from one thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prl {

struct ChildSpec {
  std::string name;               // "actor-0": for messages
  std::vector<std::string> argv;  // argv[0] is the executable's path (or name: search_path)
  std::string log_path;           // stdout and stderr, appended; empty: inherited
  // Set in the child's environment (on top of the parent's).
  std::vector<std::pair<std::string, std::string>> env;
  bool search_path = false;       // look argv[0] up in PATH
  bool capture_stdout = false;    // stdout into a pipe (ReadStdout), stderr inherited
  bool own_process_group = true;  // false: stays in the parent's process group
};

class ChildProcess {
 public:
  static absl::StatusOr<ChildProcess> Start(const ChildSpec& spec);
  // Runs `body` in a forked child (in this process group, output inherited) that exits with
  // its return value. The child must not rely on threads of the parent (only the forking
  // thread exists in it): call before starting any, or keep the body to plain system calls.
  static absl::StatusOr<ChildProcess> Fork(const std::string& name, const std::function<int()>& body);

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

  // capture_stdout: everything the child writes to stdout, read until it closes it.
  std::string ReadStdout();

  const ChildSpec& spec() const { return spec_; }
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(ChildSpec spec, pid_t pid, int stdout_fd)
      : spec_(std::move(spec)), pid_(pid), stdout_fd_(stdout_fd) {}

  ChildSpec spec_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;  // capture_stdout: the pipe's read end
  std::optional<int> status_;
};

// "exited with code 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

}  // namespace prl
