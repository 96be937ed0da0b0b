#include "bench/report.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/device.h"
#include "nlohmann/json.hpp"

namespace prl::bench {

std::string Report::ToJson() const {
  nlohmann::ordered_json j;
  j["bench"] = bench;
  nlohmann::ordered_json machine_json = nlohmann::ordered_json::object();
  for (const auto& [k, v] : machine) machine_json[k] = v;
  j["machine"] = machine_json;
  nlohmann::ordered_json setup_json = nlohmann::ordered_json::object();
  for (const auto& [k, v] : setup) setup_json[k] = v;
  j["setup"] = setup_json;
  j["results"] = nlohmann::ordered_json::array();
  for (const Result& r : results) {
    j["results"].push_back({{"name", r.name},
                            {"value", r.value},
                            {"unit", r.unit},
                            {"baseline_name", r.baseline_name},
                            {"baseline_value", r.baseline_value},
                            {"ratio", r.ratio()}});
  }
  return j.dump();
}

std::string Report::ToTable() const {
  std::string out = absl::StrCat("prl bench ", bench, "\n");
  for (const auto& [k, v] : machine) absl::StrAppend(&out, "  ", k, ": ", v, "\n");
  for (const auto& [k, v] : setup) absl::StrAppend(&out, "  ", k, ": ", v, "\n");
  absl::StrAppend(&out, absl::StrFormat("\n%-28s %14s %-10s %-28s %14s %7s\n", "result", "value",
                                        "unit", "baseline", "baseline", "ratio"));
  for (const Result& r : results) {
    absl::StrAppend(
        &out, absl::StrFormat("%-28s %14.2f %-10s %-28s %14.2f %7.3f\n", r.name, r.value, r.unit,
                              r.baseline_name, r.baseline_value, r.ratio()));
  }
  return out;
}

int64_t ProcessPssBytes(int pid) {
  std::ifstream rollup(pid == 0 ? std::string("/proc/self/smaps_rollup")
                                : absl::StrCat("/proc/", pid, "/smaps_rollup"));
  std::string key;
  int64_t kb = 0;
  while (rollup >> key) {
    if (key == "Pss:" && rollup >> kb) return kb * 1024;
  }
  return 0;
}

std::vector<std::pair<std::string, std::string>> MachineInfo() {
  std::vector<std::pair<std::string, std::string>> info;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  info.emplace_back("host", host);
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      info.emplace_back("cpu", std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
      break;
    }
  }
  info.emplace_back("cores", absl::StrCat(std::thread::hardware_concurrency()));
  info.emplace_back("threads", absl::StrCat(omp_get_max_threads()));
  info.emplace_back("blas", std::string(absl::StripAsciiWhitespace(openblas_get_config())));
  info.emplace_back("backend", DescribeBackends());
  return info;
}

}  // namespace prl::bench
