// The one output format of every `prl bench ...` (docs/architecture.md, "Benchmarks"): a readable
// table, or with --json one object {"bench", "machine", "results": [{"name", "value", "unit",
// "baseline_name", "baseline_value", "ratio"}]}, where each baseline was measured in the same
// run so that figures from a noisy, shared machine can still be compared.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace prl::bench {

struct Result {
  std::string name;
  double value = 0.0;
  std::string unit;
  std::string baseline_name;
  double baseline_value = 0.0;
  double ratio() const { return baseline_value != 0.0 ? value / baseline_value : 0.0; }
};

struct Report {
  std::string bench;
  std::vector<std::pair<std::string, std::string>> machine;  // facts about where it ran
  std::vector<std::pair<std::string, std::string>> setup;    // what was measured (shapes...)
  std::vector<Result> results;

  std::string ToJson() const;
  std::string ToTable() const;
};

// Host name, CPU model, cores, OpenMP threads, BLAS build, kernel backend.
std::vector<std::pair<std::string, std::string>> MachineInfo();

// A process's proportional set size in bytes (/proc/PID/smaps_rollup's Pss, 0 when it cannot be
// read): each page shared by several processes (a shared-memory segment, a mapped file) split
// between them, so that a sum over processes counts it once. `pid` 0: this process.
int64_t ProcessPssBytes(int pid = 0);

}  // namespace prl::bench
