// PromptFeeder: `prl run`'s client of the coordinator. It keeps the task's train prompts
// (runner/task_source.h) pending ahead of the learner — enough that the actors never wait for
// prompts within the staleness budget — submitting a chunk at a time, each with an idempotency
// key so that a retried submit is not duplicated. A tenant's feeder (prl run with tenants)
// submits to its adapter and counts only its adapter's sets.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "runner/task_source.h"

namespace prl::runner {

// The submission of `prl run`'s train chunk number `chunk`: `count` of the task's train prompts
// with the run's sampling and scoring, for `adapter` (nullopt: the run's one model), named and
// keyed (idempotency) by the run, the tenant and the chunk.
absl::StatusOr<prl::v1::SubmitPromptSetRequest> TrainChunk(
    const config::RunConfig& config, const TaskSource& task,
    const std::optional<prl::v1::AdapterSpec>& adapter, int64_t chunk, int64_t count);

class PromptFeeder {
 public:
  // `task` must outlive the feeder.
  // `adapter`: the tenant's adapter (its settings, as SubmitPromptSetRequest.adapter), or
  // nullopt for the run's one model.
  PromptFeeder(const config::RunConfig& config, const TaskSource& task,
               std::shared_ptr<grpc::Channel> coordinator,
               std::optional<prl::v1::AdapterSpec> adapter = std::nullopt);

  // Submits a chunk when fewer than (max_lag + 2) steps' worth of prompts are pending. A
  // coordinator that is down (restarting) is tried again next time; a refused submission is
  // an error.
  absl::Status Feed();
  // Prompts leased to actors at the last Feed.
  int64_t in_flight() const { return in_flight_; }

 private:
  const config::RunConfig& config_;
  const TaskSource& task_;
  const std::optional<prl::v1::AdapterSpec> adapter_;
  std::unique_ptr<prl::v1::PromptService::Stub> prompts_;
  int64_t chunks_ = 0, in_flight_ = 0;
};

}  // namespace prl::runner
