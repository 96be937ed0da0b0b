// A run of adapters' channels (docs/tenants.md): each adapter's groups enter a replay segment
// of its own on the learner's node, and its versions leave through a segment of its own there
// (broadcast.transport shm) or a channel of the learner's weight server named by the adapter's
// id (grpc: weight_broadcast/grpc_adapter_server.h). The learner makes them when it first hears
// of the adapter and removes them when the adapter is deleted; an actor opens them when a lease
// first names the adapter (AdapterChannelOpener): on the learner's node directly, on another
// node through the weight server and the replay role's remote ingest (replay.address), which
// checks with the coordinator that each group's lease is of that adapter.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "actor/adapter_channels.h"
#include "config/run_config.h"
#include "model/config.h"
#include "model/lora.h"
#include "prl/v1/prompt.pb.h"

namespace prl::roles {

// Whether `id` has an adapter id's form ("ad-" and 12 lowercase hex digits), as the coordinator
// makes them: checked before an id from outside names a file.
bool IsAdapterId(std::string_view id);

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

// An actor's opener of an adapter's channel: its weight subscriber (WeightSpec of the model and
// the adapter; over gRPC with broadcast.transport grpc) and a writer of its replay (the remote
// ingest with replay.address, else its segment; blocking up to actors.replay_timeout_s while
// it is full). On one node, NotFound while the learner has not made the segments; over gRPC the
// channel opens at once and its first version arrives once the learner has made the adapter.
actor::AdapterChannels::Opener AdapterChannelOpener(const config::RunConfig& config,
                                                    const ModelConfig& model);

}  // namespace prl::roles
