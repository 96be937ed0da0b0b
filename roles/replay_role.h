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
#include "replay/replay_buffer.h"
#include "replay/rollout_record.h"

namespace prl::roles {

// The replay segment's settings of a run: replay.capacity_mb, lease_ms, drop_oldest; the label
// names the run.
ReplayConfig ReplayConfigFrom(const config::RunConfig& config);
// An adapter's segment's settings (a run of adapters): the same, replay.adapter_capacity_mb big.
ReplayConfig AdapterReplayConfigFrom(const config::RunConfig& config);

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
