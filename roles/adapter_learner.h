// The learner of a run of adapters (docs/tenants.md; coordinator.adapters): one trainer per
// adapter the coordinator knows, every trainer on the node's one frozen base (mapped once,
// learner/frozen_base.h), each with its own adapter weights, optimizer (its learning rate),
// replay segment, published versions, checkpoints (<checkpoint dir>/adapters/<adapter id>)
// and step count (learner.steps each).
//
// A fleet loop reports every trainer's progress to the coordinator (LearnerProgressRequest
// .adapters: each adapter's version and backlog, its lag budget's basis) a few times a second;
// the reply lists the live adapters, with their settings: an adapter first heard of gets a
// trainer (its segments made, its starting adapter published as its version 0, or its
// checkpoint resumed), one no longer listed (deleted) is stopped and its segments removed.
// Trainers whose step's groups are in take turns, in the order they became ready
// (learner/step_turns.h): every adapter with a step's worth of groups steps in turn, none
// twice ahead of another that waits.
//
// Each adapter's versions go out through a segment of its own (broadcast.transport shm) or a
// channel of one gRPC weight server on broadcast.listen (grpc: actors on other nodes); its
// groups come in through its replay segment on this node, written by actors beside it or by
// the replay role's remote ingest (roles/adapter_segments.h).
//
// With learner.world_size > 1 each rank trains the adapters the coordinator placed on it
// (AdapterCompletions.learner_rank: at creation, the rank with the fewest live adapters; kept
// for the adapter's life), each trainer over a world of one, the ranks of a node mapping its
// one base file. For now the ranks share the actors' node (broadcast.transport shm and a
// local replay: ValidateRunConfig), and the learner trains on the CPU (as every LoRA learner).
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "collective/rendezvous.h"
#include "config/run_config.h"

namespace prl::roles {

// Runs until `stop`; an error of the setup ends it. A trainer's error costs only its adapter:
// the trainer stops (saying why) and is made again after a pause, the others train on.
absl::Status RunAdapterLearner(const config::RunConfig& config,
                               const collective::RendezvousConfig& rendezvous,
                               const std::atomic<bool>& stop);

}  // namespace prl::roles
