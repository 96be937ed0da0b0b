// Test support for the weight transports' multi-process tests: starting
// weight_transport_worker (transport_worker.cc), waiting for it, and waiting for conditions with
// generous deadlines instead of sleeping.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace prl::testing {

// The worker: where the build put it, or beside this test binary (a bundle copied elsewhere,
// as scripts/gpu_package.sh makes).
inline std::string WorkerPath() {
  if (std::filesystem::exists(PRL_WEIGHT_TRANSPORT_WORKER)) return PRL_WEIGHT_TRANSPORT_WORKER;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "weight_transport_worker")
      .string();
}

inline pid_t SpawnWorker(std::vector<std::string> args) {
  args.insert(args.begin(), WorkerPath());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Waits up to `timeout` for `pid` to exit; its exit code, or -1 (then it was killed).
inline int WaitExit(pid_t pid, std::chrono::seconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Polls `done` until it holds or `timeout` passed; its last answer.
inline bool WaitUntil(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace prl::testing
