#include "runner/role_specs.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/net_address.h"
#include "core/status_macros.h"
#include "runner/gpu_plan.h"

namespace prl::runner {

std::vector<std::pair<std::string, std::string>> ThreadEnv(int threads) {
  std::vector<std::pair<std::string, std::string>> env;
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    env.push_back({"OMP_NUM_THREADS", absl::StrCat(std::max(1, threads))});
  }
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) env.push_back({"OMP_WAIT_POLICY", "PASSIVE"});
  return env;
}

int Cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > max_bytes ? "..." + text.substr(text.size() - max_bytes) : text;
}

namespace {

// host:0 becomes host:<a free port>.
absl::Status ResolvePort(std::string* address) {
  if (!absl::EndsWith(*address, ":0")) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const int port, PickFreePort());
  *address = absl::StrCat(address->substr(0, address->size() - 1), port);
  return absl::OkStatus();
}

// The metrics address of process `index` (coordinator 0, learner 1, actors 2..).
absl::StatusOr<std::string> MetricsAddress(const config::RunConfig& c, int index) {
  if (c.metrics.base_port > 0) return absl::StrCat("127.0.0.1:", c.metrics.base_port + index);
  PRL_ASSIGN_OR_RETURN(const int port, PickFreePort());
  return absl::StrCat("127.0.0.1:", port);
}

absl::Status WriteConfig(const config::RunConfig& c, const std::string& path) {
  std::ofstream f(path);
  f << config::RunConfigToJson(c) << "\n";
  if (!f) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

// Each process's /metrics flag and the line prl run prints for it.
absl::Status AddMetrics(const config::RunConfig& c, int index, ChildSpec* spec, RoleSpecs* out) {
  if (!c.metrics.enabled) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const std::string address, MetricsAddress(c, index));
  spec->argv.insert(spec->argv.end(), {"--metrics-listen", address});
  out->lines.push_back(absl::StrCat("metrics: ", spec->name, " http://", address, "/metrics"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RoleSpecs> PrepareRoles(const config::RunConfig& config,
                                       const std::string& start_model,
                                       const std::string& prl_path) {
  RoleSpecs out;
  config::RunConfig& c = out.role_config;
  c = config;
  c.model.path = start_model;
  c.learner.report_file = c.run_dir() + "/learner_steps.jsonl";
  // The run's own environment servers and agents (its tenants') are ones its coordinator
  // allows.
  const auto allow = [](std::vector<std::string>& allowed, const std::string& address) {
    if (!address.empty() && std::find(allowed.begin(), allowed.end(), address) == allowed.end()) {
      allowed.push_back(address);
    }
  };
  allow(c.coordinator.env_addresses, c.env.address);
  allow(c.coordinator.agent_addresses, c.agent.address);
  for (const config::TenantSection& t : c.tenants) {
    allow(c.coordinator.env_addresses, t.env.address);
    allow(c.coordinator.agent_addresses, t.agent.address);
  }
  // Listeners the config leaves at their defaults get free ports: two runs on one machine never
  // share (or fight over) a port. A listen address the config names is used as it is.
  const config::RunConfig defaults;
  if (c.coordinator.listen == defaults.coordinator.listen && c.coordinator.address.empty()) {
    c.coordinator.listen = "127.0.0.1:0";
  }
  if (c.broadcast.listen == defaults.broadcast.listen && c.broadcast.address.empty()) {
    c.broadcast.listen = "127.0.0.1:0";
  }
  PRL_RETURN_IF_ERROR(ResolvePort(&c.coordinator.listen));
  PRL_RETURN_IF_ERROR(ResolvePort(&c.broadcast.listen));
  out.role_config_path = c.run_dir() + "/config.json";
  PRL_RETURN_IF_ERROR(WriteConfig(c, out.role_config_path));
  PRL_ASSIGN_OR_RETURN(const GpuPlan gpus, PlanGpus(c, VisibleGpus()));
  if (!gpus.description.empty()) out.lines.push_back(gpus.description);

  const std::string logs = c.run_dir() + "/logs/";
  // Actors and learner ranks run at once: they split the cores.
  const int role_threads = Cores() / (c.actors.count + c.learner.world_size);
  out.coordinator = {"coordinator",
                     {prl_path, "coordinator", "--config", out.role_config_path},
                     logs + "coordinator.log",
                     ThreadEnv(1)};
  PRL_RETURN_IF_ERROR(AddMetrics(c, 0, &out.coordinator, &out));
  // The learner's launcher splits its OMP_NUM_THREADS between its ranks.
  out.learner = {"learner",
                 {prl_path, "learner", "serve", "--config", out.role_config_path},
                 logs + "learner.log",
                 ThreadEnv(role_threads * c.learner.world_size)};
  out.learner.env.push_back({"CUDA_VISIBLE_DEVICES", gpus.learner});
  PRL_RETURN_IF_ERROR(AddMetrics(c, 1, &out.learner, &out));
  for (int i = 0; i < c.actors.count; ++i) {
    const std::string name = absl::StrCat("actor-", i);
    ChildSpec& a = out.actors.emplace_back(
        ChildSpec{name,
                  {prl_path, "actor", "--config", out.role_config_path, "--name", name},
                  logs + name + ".log",
                  ThreadEnv(role_threads)});
    a.env.push_back({"CUDA_VISIBLE_DEVICES", gpus.actors[i]});
    PRL_RETURN_IF_ERROR(AddMetrics(c, 2 + i, &a, &out));
  }
  return out;
}

}  // namespace prl::runner
