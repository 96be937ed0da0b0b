#include "roles/actor_role.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "actor/actor.h"
#include "checkpoint/hf_model_dir.h"
#include "core/status_macros.h"
#include "roles/adapter_segments.h"
#include "roles/device_settings.h"
#include "roles/learner_rank.h"
#include "roles/model_text.h"
#include "roles/role_metrics.h"
#include "roles/role_security.h"
#include "roles/weight_transports.h"

namespace prl::roles {

namespace {

std::string DefaultName() {
  char host[256] = "actor";
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

// Where finished groups go: the remote ingest when replay.address is set, else the run's
// segment on this node (the learner creates it; an actor started first waits for it).
struct ReplaySink {
  std::unique_ptr<ReplayBuffer> buffer;  // the local segment, if any
  actor::GroupWriter writer;
  std::string description;
};

absl::StatusOr<ReplaySink> OpenReplaySink(const config::RunConfig& c,
                                          const std::atomic<bool>& stop) {
  ReplaySink sink;
  const absl::Duration timeout = absl::Seconds(c.actors.replay_timeout_s);
  if (!c.replay.address.empty()) {
    PRL_ASSIGN_OR_RETURN(sink.writer, actor::RemoteReplayWriter(c.replay.address, timeout,
                                                                   c.replay.max_message_mb << 20));
    sink.description = absl::StrCat("remote ingest ", c.replay.address);
    return sink;
  }
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> opened = ReplayBuffer::Open(c.replay_segment());
  for (int i = 0; i < 600 && absl::IsNotFound(opened.status()) && !stop; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    opened = ReplayBuffer::Open(c.replay_segment());
  }
  PRL_RETURN_IF_ERROR(opened.status());
  sink.buffer = std::move(*opened);
  sink.writer = actor::LocalReplayWriter(sink.buffer.get(), timeout);
  sink.description = absl::StrCat("segment ", c.replay_segment());
  return sink;
}

// The name the endpoint answers as: the model directory's last part.
std::string ServedModelName(const std::string& model_path) {
  std::string path = model_path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return name.empty() ? "prl" : name;
}

absl::StatusOr<actor::ActorOptions> ActorOptionsFrom(const config::RunConfig& c,
                                                     const ActorRoleOptions& role) {
  actor::ActorOptions o;
  o.coordinator = c.coordinator_address();
  o.name = role.name.empty() ? DefaultName() : role.name;
  o.run_id = c.run.name;
  o.max_prompts_in_flight = c.actors.max_prompts_in_flight;
  o.env_calls_per_address = c.actors.env_calls_per_address;
  o.env_outage_budget = absl::Seconds(c.actors.env_outage_s);
  o.agent_episodes_per_address = c.actors.agent_episodes_per_address;
  openai::OpenAiServerOptions endpoint;
  endpoint.address = c.actors.openai_listen;
  endpoint.tls_cert_file = c.security.tls_cert_file;
  endpoint.tls_key_file = c.security.tls_key_file;
  endpoint.tls_ca_file = c.security.tls_ca_file;
  endpoint.require_client_cert = c.security.require_client_cert;
  endpoint.max_connections = c.actors.openai_max_connections;
  endpoint.insecure = c.security.insecure;
  o.openai = endpoint;
  o.openai_model = ServedModelName(c.model.path);
  if (!c.actors.openai_address.empty()) {
    o.openai_base_url = absl::StrCat(c.security.tls_cert_file.empty() ? "http" : "https", "://",
                                     c.actors.openai_address, "/v1");
  }
  PRL_ASSIGN_OR_RETURN(o.engine, ActorEngineOptions(c.actors));
  return o;
}

void PrintStart(const actor::ActorOptions& o, const config::RunConfig& c, const ReplaySink& sink,
                const RoleMetrics& endpoint) {
  std::printf(
      "actor %s: generating for %s%s on %s (%s), KV cache %lld MiB in blocks of %d, %d "
      "sequences, %d prompts in flight; groups to %s; weights over %s; text: %s\n",
      o.name.c_str(), o.coordinator.c_str(), endpoint.Describe().c_str(),
      o.engine.device.ToString().c_str(),
      std::string(EnumName(kComputeDTypeNames, o.engine.dtype)).c_str(),
      static_cast<long long>(o.engine.kv_cache_bytes >> 20), o.engine.block_size,
      o.engine.max_num_seqs, o.max_prompts_in_flight, sink.description.c_str(),
      std::string(EnumName(config::kWeightTransportNames, c.broadcast.transport)).c_str(),
      o.text != nullptr ? o.text->Describe().c_str() : "token ids (no tokenizer)");
  std::fflush(stdout);
}

}  // namespace

absl::Status RunActorRole(const config::RunConfig& c, const ActorRoleOptions& role,
                          const std::atomic<bool>& stop) {
  PRL_RETURN_IF_ERROR(ConfigureRoleSecurity(c, rpc::Role::kActor, {}));
  if (c.model.path.empty()) {
    return absl::InvalidArgumentError(
        "model.path is empty: the actor needs the starting "
        "weights; set model.path or pass --model");
  }
  PRL_ASSIGN_OR_RETURN(actor::ActorOptions options, ActorOptionsFrom(c, role));
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<RoleMetrics> endpoint, StartRoleMetrics(c.metrics));
  PRL_ASSIGN_OR_RETURN(ParameterSet loaded, LoadModel(c.model.path, options.engine.device));
  const ModelConfig model = loaded.config;
  absl::StatusOr<std::shared_ptr<const tokenizer::TextCodec>> text =
      OpenModelText(c, c.model.path, model.vocab_size);
  if (text.ok()) {
    options.text = std::move(*text);
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  auto initial = std::make_shared<const ParameterSet>(std::move(loaded));
  ReplaySink sink;
  std::unique_ptr<WeightSubscriber> weights;
  if (c.coordinator.adapters) {
    // A run of adapters (docs/tenants.md): the base never changes; each adapter's versions and
    // groups have channels of their own (segments on the learner's node, or its gRPC weight
    // server and the remote ingest), opened when a lease first names it.
    options.adapters = std::make_shared<actor::AdapterChannels>(AdapterChannelOpener(c, model));
    sink.writer = [](absl::Span<const RolloutRecord>) {
      return absl::FailedPreconditionError(
          "a run of adapters writes each group to its adapter's replay");
    };
    sink.description =
        c.replay.address.empty()
            ? absl::StrCat("each adapter's segment ", c.replay_segment(), "-<adapter>")
            : absl::StrCat("remote ingest ", c.replay.address, ", each adapter's replay");
  } else {
    PRL_ASSIGN_OR_RETURN(sink, OpenReplaySink(c, stop));
    PRL_ASSIGN_OR_RETURN(const WeightSpec spec, RunWeightSpec(c, model));
    if (spec.adapter.has_value()) {  // a LoRA learner's run: the versions are its adapter's
      PRL_ASSIGN_OR_RETURN(std::optional<LoraSet> start, StartingAdapter(c.learner, model));
      options.initial_adapter = std::make_shared<const LoraSet>(*std::move(start));
    }
    PRL_ASSIGN_OR_RETURN(weights, OpenWeightSubscriber(c, spec, options.engine.device));
  }
  metrics::ProcessMetrics process_metrics(*endpoint->registry, metrics::Role::kActor);
  metrics::ActorMetrics actor_metrics(*endpoint->registry);
  metrics::WeightSyncMetrics weight_metrics(*endpoint->registry);
  options.metrics = &actor_metrics;
  options.weight_metrics = &weight_metrics;
  options.process_metrics = &process_metrics;
  PRL_ASSIGN_OR_RETURN(
      auto a, actor::Actor::Create(initial, 0, std::move(sink.writer), weights.get(), options));
  PrintStart(options, c, sink, *endpoint);
  std::printf("actor %s: OpenAI-compatible endpoint for agents at %s (model \"%s\")\n",
              options.name.c_str(), a->agents_base_url().c_str(), options.openai_model.c_str());
  std::fflush(stdout);
  endpoint->SetReadiness([&a] {  // it holds weights (its engine's) from here on
    return a->stats().registrations > 0
               ? absl::OkStatus()
               : absl::UnavailableError("not registered with the coordinator yet");
  });
  const absl::Status run = a->Run(&stop);
  endpoint->SetReadiness(nullptr);
  const actor::ActorStats s = a->stats();
  std::printf("actor %s: %lld groups, %lld tokens, %lld reward failures, weight version %lld\n",
              options.name.c_str(), static_cast<long long>(s.groups_written),
              static_cast<long long>(s.tokens_generated), static_cast<long long>(s.reward_failures),
              static_cast<long long>(s.weight_version));
  return run;
}

}  // namespace prl::roles
