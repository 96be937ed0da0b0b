// The learner role (`prl learner serve`): learner.world_size ranks (local processes, or one
// per pod under an external launcher: roles/learner_rank.h) that train on groups from the
// run's replay segment, publish each version over the run's weight transport, checkpoint, and
// report every step (roles/learner_step_sink.h). Rank 0 owns the node's replay segment (it
// joins the segment a previous learner of the run left, so nothing generated is lost) and the
// publisher. A restarted learner resumes from its latest checkpoint.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "learner/learner_service.h"

namespace prl::roles {

// The LearnerService settings of a run.
learner::LearnerServiceOptions LearnerServiceOptionsFrom(const config::RunConfig& config);

// `argv` is this process's command line: local ranks re-execute it.
absl::Status RunLearnerRole(const config::RunConfig& config, const std::vector<std::string>& argv,
                            const std::atomic<bool>& stop);

}  // namespace prl::roles
