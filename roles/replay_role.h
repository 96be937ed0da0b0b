// The replay ingest role (`prl replay serve`): serves prl.v1.ReplayService.Push on
// replay.listen into a replay segment on this node (the run's, unless another is named), so
// that actors on other nodes (replay.address) can write groups, until the stop flag is set. It
// admits only groups of this run that belong to an open lease (the coordinator answers
// ActorControl.CheckGroup). It waits for the learner to create the run's segment (a segment
// named explicitly must exist), and serves /metrics, /healthz and /readyz (ready once it
// serves) on metrics.listen. In a run of adapters (coordinator.adapters) there is no run's
// segment: each push names its adapter (PushRequest.adapter_id), whose segment the learner
// beside it made (roles/adapter_segments.h), and the coordinator checks that the group's lease
// is of a set of that adapter.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "config/run_config.h"
#include "model/config.h"
#include "replay/replay_buffer.h"
#include "replay/rollout_record.h"

namespace prl::roles {

// The replay segment's settings of a run: replay.capacity_mb, lease_ms, drop_oldest; the label
// names the run.
ReplayConfig ReplayConfigFrom(const config::RunConfig& config);
// An adapter's segment's settings (a run of adapters): the same,
// AdapterReplayCapacityBytes(config, model) big.
ReplayConfig AdapterReplayConfigFrom(const config::RunConfig& config, const ModelConfig& model);

// An adapter's replay segment's size (bytes): replay.adapter_capacity_mb when set; 0 (the
// default): what its lag budget can hold at once ((learner.max_lag + 1) *
// learner.groups_per_step groups, sync: groups_per_step), twice over (room for the ring's wrap
// and evaluation groups), each group task.samples_per_prompt records of the longest sequence
// the model allows (max_position_embeddings, its MoE routes included), clamped to 4..32 MiB
// (32 MiB without a lag budget). Every page is allocated up front, so N adapters take N times
// this: an adapter of the tiny model takes the 4 MiB floor, one of a long-context model the
// 32 MiB ceiling, where a group that does not fit makes its writer wait (a group larger than
// the segment is refused, naming both sizes).
int64_t AdapterReplayCapacityBytes(const config::RunConfig& config, const ModelConfig& model);

// Which pushed groups enter the buffer: those of this run (config.run.name) whose group id is
// that of an open lease of their prompt at the coordinator (ActorControl.CheckGroup at
// config's coordinator address, under this process's security as it is when called: the
// learner's token), entering the replay of their lease's adapter (`adapter_id`; empty: the
// run's). A refusal is the coordinator's status (FAILED_PRECONDITION; PERMISSION_DENIED for
// another adapter's replay) or PERMISSION_DENIED for another run's group.
std::function<absl::Status(absl::Span<const RolloutRecord>, const std::string& adapter_id)>
AdmitLeasedGroups(const config::RunConfig& config);

// `segment` empty: the run's segment (config.replay_segment()).
absl::Status RunReplayRole(const config::RunConfig& config, const std::string& segment,
                           const std::atomic<bool>& stop);

}  // namespace prl::roles
