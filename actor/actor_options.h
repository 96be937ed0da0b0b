// The actor's settings (ActorOptions) and where its groups go (GroupWriter): shared by the
// actor's parts (actor/actor.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "inference_engine/engine.h"
#include "metrics/prl_metrics.h"
#include "openai/openai_server.h"
#include "replay/replay_buffer.h"
#include "replay/rollout_record.h"
#include "tokenizer/text_codec.h"

namespace prl::actor {

// Where finished groups go: the local shared-memory buffer (LocalReplayWriter) or the remote
// gRPC ingest (RemoteReplayWriter). Blocks while the buffer is full (backpressure), up to a
// time-out.
using GroupWriter = std::function<absl::Status(absl::Span<const RolloutRecord> group)>;
GroupWriter LocalReplayWriter(ReplayBuffer* buffer, absl::Duration timeout);
// max_message_bytes: the largest group message (replay.max_message_mb, as the ingest's);
// adapter_id: the adapter whose replay the groups enter (a run of adapters), or empty.
absl::StatusOr<GroupWriter> RemoteReplayWriter(const std::string& address, absl::Duration timeout,
                                              int64_t max_message_bytes,
                                              const std::string& adapter_id = "");

class AdapterChannels;  // actor/adapter_channels.h

struct ActorOptions {
  std::string coordinator = "localhost:50051";
  std::string name = "actor";
  std::string run_id = "run";
  EngineOptions engine;
  // A LoRA learner's run (learner.lora_*): the adapter of the initial version, on the engine
  // from the start; each later version arrives as an adapter (Engine::SwapAdapter). Null: none.
  std::shared_ptr<const LoraSet> initial_adapter;
  // A run of adapters (docs/tenants.md): each adapter's versions and groups, by the adapter its
  // lease names (actor/adapter_channels.h). Null: a run of one model (a lease naming an adapter
  // is given back).
  std::shared_ptr<AdapterChannels> adapters;
  int32_t max_prompts_in_flight = 8;  // leased and generating at once
  // The model's text (tokenizer/text_codec.h): completions decoded for the text rewards and for
  // clients watching samples (GroupResult.texts). Null: the ids are written as decimal numbers
  // separated by spaces (so that exact_match can compare with a reference written the same way)
  // and no texts are reported.
  std::shared_ptr<const tokenizer::TextCodec> text;
  // Prometheus metrics to update (null: none); they must outlive the actor.
  metrics::ActorMetrics* metrics = nullptr;
  metrics::WeightSyncMetrics* weight_metrics = nullptr;
  metrics::ProcessMetrics* process_metrics = nullptr;
  // How long a lease may wait for the weight version it requires (sync mode; a re-run of a
  // group handed back as stale); then the actor fails.
  absl::Duration weight_wait_timeout = absl::Seconds(600);
  // Agentic episodes (episode/episode_engine.h): environment calls in flight to one
  // environment at once, and how long one found down may stay down while its groups wait.
  int32_t env_calls_per_address = 16;
  absl::Duration env_outage_budget = absl::Minutes(5);
  // Agents (docs/agents.md): the OpenAI-compatible endpoint the actor serves them (unset: none;
  // groups with an agent then fail), the model name it answers as, the base URL agents are told
  // ("": the endpoint's own), and agents' episodes running at once per agent address.
  std::optional<openai::OpenAiServerOptions> openai;
  std::string openai_model = "prl";
  std::string openai_base_url;
  int32_t agent_episodes_per_address = 256;
};

}  // namespace prl::actor
