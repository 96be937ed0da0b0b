// A run of adapters' channels on one node (docs/tenants.md): each adapter's versions and its
// groups travel through shared-memory segments of its own, named by the run and the adapter's
// id, which the learner makes when it first hears of the adapter and removes when the adapter
// is deleted; an actor opens them when a lease first names the adapter (AdapterChannelOpener).
// A run of adapters needs broadcast.transport shm and a replay on the learner's node for now
// (ValidateRunConfig says so).
#pragma once

#include <set>
#include <string>

#include "actor/adapter_channels.h"
#include "config/run_config.h"
#include "model/config.h"
#include "model/lora.h"
#include "prl/v1/prompt.pb.h"

namespace prl::roles {

// "<the run's weight segment>-<adapter id>" and "<the run's replay segment>-<adapter id>".
std::string AdapterWeightSegment(const config::RunConfig& config, const std::string& adapter_id);
std::string AdapterReplaySegment(const config::RunConfig& config, const std::string& adapter_id);

// Every adapter segment of the run on this node ("<segment>-ad-<12 hex>") but those of the
// adapters in `keep`, removed: at prl run's exit, all; when the learner (re)starts, those of
// adapters deleted while it was down.
void RemoveAdapterSegments(const config::RunConfig& config, const std::set<std::string>& keep = {});

// Where the learner appends an adapter's step reports (learner::StepReport JSON lines) when
// learner.report_file is set: "<report_file without .jsonl>.<adapter name>.jsonl".
std::string AdapterReportFile(const config::RunConfig& config, const std::string& adapter_name);

// PEFT's settings of an adapter the coordinator made (its spec, defaults filled in).
LoraConfig LoraConfigOf(const prl::v1::AdapterSpec& spec);

// An actor's opener of an adapter's segments: its weight subscriber (WeightSpec of the model
// and the adapter) and a writer of its replay segment (blocking up to
// actors.replay_timeout_s while it is full). NotFound while the learner has not made either.
actor::AdapterChannels::Opener AdapterChannelOpener(const config::RunConfig& config,
                                                    const ModelConfig& model);

}  // namespace prl::roles
