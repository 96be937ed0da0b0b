#include "runner/gpu_plan.h"

#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/device.h"

namespace prl::runner {

namespace {

using config::RunConfig;

// Actors' KV-cache share on each GPU they share with the learner.
absl::Status CheckSharedBudget(const RunConfig& c, const GpuPlan& plan) {
  std::map<std::string, int> actors_on;
  for (const std::string& gpu : plan.actors) ++actors_on[gpu];
  for (const auto& [gpu, count] : actors_on) {
    const double share = count * c.actors.gpu_memory_fraction;
    if (share > kMaxSharedActorFraction) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actors.gpu_memory_fraction = ", c.actors.gpu_memory_fraction, ": ", count,
          " actors share GPU ", gpu, " with the learner, and their KV caches would take ", share,
          " of its memory (at most ", kMaxSharedActorFraction,
          " may go to actors so that the learner fits); lower actors.gpu_memory_fraction to ",
          kMaxSharedActorFraction / count, " or below, or actors.count"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GpuPlan> PlanGpus(const RunConfig& c, const std::vector<std::string>& visible) {
  GpuPlan plan;
  const bool learner_gpu = c.learner.device == DeviceType::kCuda;
  const bool actors_gpu = c.actors.device == DeviceType::kCuda;
  plan.actors.assign(c.actors.count, "");
  const int n = static_cast<int>(visible.size());
  const int learner_gpus = learner_gpu ? c.learner.world_size : 0;
  if ((learner_gpu || actors_gpu) && n == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(learner_gpu ? "learner.device" : "actors.device",
                     " = cuda: no GPU is visible to prl run (CUDA_VISIBLE_DEVICES, driver)"));
  }
  if (learner_gpus > n) {
    return absl::FailedPreconditionError(
        absl::StrCat("learner.world_size = ", learner_gpus, " with learner.device = cuda needs ",
                     learner_gpus, " GPUs (one per rank) but ", n, " are visible"));
  }
  std::vector<std::string> learner_ids(visible.begin(), visible.begin() + learner_gpus);
  plan.learner = absl::StrJoin(learner_ids, ",");
  if (!actors_gpu) return plan;
  std::vector<std::string> pool(visible.begin() + learner_gpus, visible.end());
  plan.shared = pool.empty();
  if (plan.shared) pool = learner_ids;
  for (int i = 0; i < c.actors.count; ++i) plan.actors[i] = pool[i % pool.size()];
  if (plan.shared) {
    if (absl::Status s = CheckSharedBudget(c, plan); !s.ok()) return s;
  }
  plan.description = absl::StrCat(
      "gpus: learner on [", plan.learner, "], actors on [", absl::StrJoin(plan.actors, ","), "]",
      plan.shared ? absl::StrCat(" (shared with the learner; KV caches ",
                                 c.actors.gpu_memory_fraction, " of a GPU each)")
                  : "");
  return plan;
}

std::vector<std::string> VisibleGpus() {
  std::vector<std::string> ids;
  const int count = CudaDeviceCount();
  if (const char* env = std::getenv("CUDA_VISIBLE_DEVICES"); env != nullptr) {
    for (absl::string_view id : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
      if (static_cast<int>(ids.size()) < count) ids.emplace_back(id);
    }
    return ids;
  }
  for (int i = 0; i < count; ++i) ids.push_back(absl::StrCat(i));
  return ids;
}

}  // namespace prl::runner
