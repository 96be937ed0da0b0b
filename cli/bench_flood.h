// TenantFlood: the flooding client of `prl bench e2e --tenants N --flood F` (docs/benchmarks.md,
// "A tenant's flood"). Beside a tenants run, as a user's own client would, it submits to one
// tenant's adapter F - 1 more prompt sets of learner.steps * learner.groups_per_step train
// prompts each, so that this tenant asks for F times the prompts of any other; what the
// benchmark then measures is what that costs the others.
//
// It waits for the run: it reaches the coordinator at the address of the run's effective config
// (<run dir>/config.json, where prl run writes the free port it chose), and the sets go in once
// the coordinator lists a set of the tenant's adapter (the run's own feeder made the adapter;
// its warm-start is over). Submissions carry idempotency
// keys, so a submission retried after a coordinator restart is not doubled.
//
// Owns: its channel and stub to the run's coordinator. Not thread-safe: one thread polls it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "prl/v1/prompt.grpc.pb.h"

namespace prl::cli {

class TenantFlood {
 public:
  // `run`: the tenants run's config (its coordinator address and security); `tenant`: the name
  // of the adapter that floods; `factor` >= 2.
  TenantFlood(const config::RunConfig& run, std::string tenant, int factor);

  // Submits the flood once the tenant's adapter is there; nothing before, nothing after. A
  // coordinator not up yet is tried again at the next call; a refused submission is an error.
  absl::Status Poll();
  bool submitted() const { return submitted_ == factor_ - 1; }
  int64_t prompts_submitted() const { return prompts_submitted_; }

 private:
  absl::Status SubmitAll();

  const config::RunConfig& run_;
  const std::string tenant_;
  const int factor_;
  std::unique_ptr<prl::v1::PromptService::Stub> prompts_;  // null: connect at the next Poll
  int submitted_ = 0;
  int64_t prompts_submitted_ = 0;
};

}  // namespace prl::cli
