#include "core/process_identity.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace prl {

namespace {

constexpr uint64_t kPidBits = 22;
constexpr uint64_t kStartBits = 42;

// (state, start time in ticks) of /proc/<pid>/stat; false when the process does not exist.
bool ReadStat(int32_t pid, char* state, uint64_t* start_ticks) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  std::getline(in, line);
  // Field 2 (comm) is parenthesised and may contain spaces: parse after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  rest >> *state;  // field 3
  for (int i = 4; i <= 22; ++i) {
    if (!(rest >> field)) return false;
  }
  *start_ticks = std::stoull(field);
  return true;
}

ProcessToken MakeToken(int32_t pid, uint64_t start_ticks) {
  return (static_cast<uint64_t>(pid) & ((uint64_t{1} << kPidBits) - 1)) |
         ((start_ticks & ((uint64_t{1} << kStartBits) - 1)) << kPidBits);
}

}  // namespace

ProcessToken SelfProcessToken() {
  // Cached per pid: a forked child recomputes its own.
  static std::atomic<uint64_t> cached{0};
  const int32_t pid = static_cast<int32_t>(getpid());
  const uint64_t seen = cached.load(std::memory_order_acquire);
  if (seen != 0 && TokenPid(seen) == pid) return seen;
  char state = 0;
  uint64_t start = 0;
  ReadStat(pid, &state, &start);
  const ProcessToken token = MakeToken(pid, start);
  cached.store(token, std::memory_order_release);
  return token;
}

bool ProcessAlive(ProcessToken token) {
  if (token == 0) return false;
  const int32_t pid = TokenPid(token);
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = 0;
  uint64_t start = 0;
  if (!ReadStat(pid, &state, &start)) return false;
  if (state == 'Z' || state == 'X') return false;
  return MakeToken(pid, start) == token;
}

}  // namespace prl
