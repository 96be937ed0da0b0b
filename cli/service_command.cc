// `prl coordinator` (the prompt-set service), and its command-line clients `prl submit` and
// `prl status`.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/hf_model_dir.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "core/status_macros.h"
#include "metrics/metrics_server.h"
#include "metrics/prl_metrics.h"
#include "nlohmann/json.hpp"
#include "prl/v1/prompt.grpc.pb.h"
#include "reward/verifiers.h"
#include "rpc/grpc_util.h"
#include "task/char_tokenizer.h"

namespace prl::cli {

namespace {

namespace v1 = prl::v1;

std::atomic<bool> stop_requested{false};

struct CoordinatorFlags {
  std::string log = "runs/coordinator/prompts.log", model, address = "0.0.0.0:50051";
  std::string metrics_address = "0.0.0.0:0";
  std::string config_file;
  coordinator::CoordinatorConfig config;
  bool char_tokenizer = false;
  CLI::App* command = nullptr;
};

absl::Status ApplyConfig(CoordinatorFlags& f) {
  if (f.config_file.empty()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const config::RunConfig c, config::LoadRunConfig(f.config_file));
  CLI::App* cmd = f.command;
  FromConfig(cmd, "--model", &f.model, c.model.path);
  FromConfig(cmd, "--log", &f.log, c.prompt_log());
  FromConfig(cmd, "--address", &f.address, c.coordinator.address);
  FromConfig(cmd, "--lease-ms", &f.config.lease_ms, c.coordinator.lease_ms);
  FromConfig(cmd, "--heartbeat-ms", &f.config.heartbeat_ms, c.coordinator.heartbeat_ms);
  FromConfig(cmd, "--max-pending-prompts", &f.config.max_pending_prompts,
             c.coordinator.max_pending_prompts);
  FromConfig(cmd, "--max-lag", &f.config.max_lag, c.learner.max_lag);
  FromConfig(cmd, "--groups-per-step", &f.config.groups_per_step, c.learner.groups_per_step);
  FromConfig(cmd, "--char-tokenizer", &f.char_tokenizer, c.task.name == "arithmetic");
  FromConfig(cmd, "--sync", &f.config.sync, c.run.mode == "sync");
  if (f.model.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.config_file,
                     ": model.path is empty; give --model (prl run creates the "
                     "model and passes it)"));
  }
  return absl::OkStatus();
}

absl::Status RunCoordinator(CoordinatorFlags f) {
  PRL_RETURN_IF_ERROR(ApplyConfig(f));
  if (f.model.empty()) {
    return absl::InvalidArgumentError(
        "coordinator: --model is required (or --config with "
        "model.path)");
  }
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(f.model));
  f.config.log_path = f.log;
  f.config.vocab_size = model.vocab_size;
  f.config.max_position_embeddings = model.max_position_embeddings;
  if (f.char_tokenizer) {
    auto tokenizer = std::make_shared<task::CharTokenizer>();
    if (tokenizer->vocab_size() > model.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--char-tokenizer: the built-in tokenizer has ", tokenizer->vocab_size(),
                       " tokens but the model's vocab_size is ", model.vocab_size));
    }
    f.config.tokenize = [tokenizer](absl::string_view text) { return tokenizer->Encode(text); };
  }
  f.config.validate_reward = [](const v1::RewardSpec& spec) {
    reward::RewardSpec parsed;
    parsed.name = spec.name();
    for (const auto& [k, v] : spec.params()) parsed.params[k] = v;
    return reward::MakeRewardFunction(parsed).status();  // validates; the actor builds its own
  };
  PRL_ASSIGN_OR_RETURN(auto coordinator, coordinator::Coordinator::Open(f.config));
  const coordinator::CoordinatorStats stats = coordinator->Stats();
  PRL_ASSIGN_OR_RETURN(auto server,
                       coordinator::CoordinatorServer::Start(coordinator.get(), f.address));
  auto registry = std::make_shared<prometheus::Registry>();
  metrics::ProcessMetrics process(*registry, metrics::Role::kCoordinator);
  metrics::CoordinatorMetrics m(*registry);
  metrics::MetricsServerOptions metrics_options;
  metrics_options.address = f.metrics_address;
  PRL_ASSIGN_OR_RETURN(auto metrics_server,
                       metrics::MetricsServer::Start(metrics_options, registry));
  std::printf(
      "coordinator on port %d (metrics on port %d): %lld prompt sets in %s (%lld "
      "prompts pending)%s\n",
      server->port(), metrics_server->port(), static_cast<long long>(stats.prompt_sets),
      f.log.c_str(), static_cast<long long>(stats.prompts_pending),
      stats.torn_log_bytes > 0
          ? absl::StrCat(", cut a torn tail of ", stats.torn_log_bytes, " bytes").c_str()
          : "");
  std::fflush(stdout);
  std::signal(SIGINT, [](int) { stop_requested = true; });
  std::signal(SIGTERM, [](int) { stop_requested = true; });
  for (int tick = 0; !stop_requested; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (tick % 10 != 0) continue;
    const coordinator::CoordinatorStats s = coordinator->Stats();
    int64_t active = 0;
    for (const v1::PromptSetStatus& set : coordinator->List()) {
      active += set.state() == v1::PROMPT_SET_STATE_RUNNING ? 1 : 0;
    }
    m.prompt_sets_active.Set(static_cast<double>(active));
    m.prompts_pending.Set(static_cast<double>(s.prompts_pending));
    m.prompts_in_flight.Set(static_cast<double>(s.prompts_in_flight));
    metrics::AdvanceCounterTo(m.prompts_done, static_cast<double>(s.prompts_done));
    metrics::AdvanceCounterTo(m.leases_expired, static_cast<double>(s.leases_expired));
    process.weight_version.Set(static_cast<double>(s.learner_version));
  }
  server->Shutdown();
  return absl::OkStatus();
}

std::unique_ptr<v1::PromptService::Stub> Connect(const std::string& server) {
  return v1::PromptService::NewStub(grpc::CreateCustomChannel(
      server, grpc::InsecureChannelCredentials(), rpc::ChannelArgs(int64_t{256} << 20)));
}

std::string StateName(v1::PromptSetState s) {
  switch (s) {
    case v1::PROMPT_SET_STATE_RUNNING:
      return "running";
    case v1::PROMPT_SET_STATE_DONE:
      return "done";
    case v1::PROMPT_SET_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

std::string StatusLine(const v1::PromptSetStatus& s) {
  return absl::StrFormat(
      "%s %-9s %lld/%lld done, %lld in flight, %lld pending, mean reward %.4f  %s",
      s.prompt_set_id(), StateName(s.state()), static_cast<long long>(s.prompts_done()),
      static_cast<long long>(s.prompts_total()), static_cast<long long>(s.prompts_in_flight()),
      static_cast<long long>(s.prompts_pending()), s.mean_reward(), s.name());
}

nlohmann::ordered_json StatusJson(const v1::PromptSetStatus& s) {
  nlohmann::ordered_json j;
  j["prompt_set_id"] = s.prompt_set_id();
  j["name"] = s.name();
  j["state"] = StateName(s.state());
  j["prompts_total"] = s.prompts_total();
  j["prompts_done"] = s.prompts_done();
  j["prompts_in_flight"] = s.prompts_in_flight();
  j["prompts_pending"] = s.prompts_pending();
  j["mean_reward"] = s.mean_reward();
  j["samples_per_prompt"] = s.samples_per_prompt();
  return j;
}

struct SubmitFlags {
  std::string server = "localhost:50051", file, name, idempotency_key, reward = "exact_match";
  std::vector<std::string> reward_params;
  int samples = 4, top_k = 0, max_tokens = 256;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  std::vector<int> stop_token_ids;
  bool watch = false, json = false;
};

// Prompt lines: {"text": "..."} or {"tokens": [...]}, optionally "reference": "...".
absl::StatusOr<v1::SubmitPromptSetRequest> ReadSubmission(const SubmitFlags& f) {
  v1::SubmitPromptSetRequest r;
  r.set_name(f.name.empty() ? f.file : f.name);
  r.set_samples_per_prompt(f.samples);
  r.set_idempotency_key(f.idempotency_key);
  v1::RolloutSampling* s = r.mutable_sampling();
  s->set_temperature(static_cast<float>(f.temperature));
  s->set_top_p(static_cast<float>(f.top_p));
  s->set_top_k(f.top_k);
  s->set_max_tokens(f.max_tokens);
  s->set_seed(f.seed);
  for (int id : f.stop_token_ids) s->add_stop_token_ids(id);
  r.mutable_reward()->set_name(f.reward);
  for (const std::string& kv : f.reward_params) {
    std::vector<std::string> parts = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (parts.size() != 2 || parts[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--reward-param: expected KEY=VALUE, found '", kv, "'"));
    }
    (*r.mutable_reward()->mutable_params())[parts[0]] = parts[1];
  }
  std::ifstream in(f.file);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open prompts file ", f.file));
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(f.file, " line ", line);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON: ", e.what()));
    }
    v1::Prompt* p = r.add_prompts();
    if (j.contains("text") && j["text"].is_string()) {
      p->set_text(j["text"].get<std::string>());
    } else if (j.contains("tokens") && j["tokens"].is_array()) {
      for (const auto& t : j["tokens"]) {
        if (!t.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": \"tokens\" must be integers"));
        }
        p->mutable_tokens()->add_ids(t.get<int32_t>());
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected {\"text\": ...} or {\"tokens\": [...]}"));
    }
    if (j.contains("reference")) {
      if (!j["reference"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": \"reference\" must be a string"));
      }
      p->set_reference(j["reference"].get<std::string>());
    }
  }
  return r;
}

absl::Status Watch(v1::PromptService::Stub& stub, const std::string& id, bool json) {
  grpc::ClientContext ctx;
  v1::WatchPromptSetRequest request;
  request.set_prompt_set_id(id);
  auto reader = stub.WatchPromptSet(&ctx, request);
  v1::PromptSetEvent event;
  while (reader->Read(&event)) {
    if (!event.has_status()) continue;
    std::printf("%s\n", json ? StatusJson(event.status()).dump().c_str()
                             : StatusLine(event.status()).c_str());
    std::fflush(stdout);
  }
  return rpc::FromGrpcStatus(reader->Finish());
}

absl::Status RunSubmit(const SubmitFlags& f) {
  PRL_ASSIGN_OR_RETURN(const v1::SubmitPromptSetRequest request, ReadSubmission(f));
  auto stub = Connect(f.server);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::SubmitPromptSetResponse response;
  PRL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->SubmitPromptSet(&ctx, request, &response)));
  if (f.json) {
    nlohmann::ordered_json j;
    j["prompt_set_id"] = response.prompt_set_id();
    j["duplicate"] = response.duplicate();
    j["prompts"] = request.prompts_size();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("submitted %s: %d prompts x %d samples%s\n", response.prompt_set_id().c_str(),
                request.prompts_size(), request.samples_per_prompt(),
                response.duplicate() ? " (already submitted with this idempotency key)" : "");
  }
  std::fflush(stdout);
  return f.watch ? Watch(*stub, response.prompt_set_id(), f.json) : absl::OkStatus();
}

absl::Status RunStatus(const std::string& server, const std::string& id, bool json) {
  auto stub = Connect(server);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::vector<v1::PromptSetStatus> sets;
  if (id.empty()) {
    v1::ListPromptSetsResponse list;
    PRL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->ListPromptSets(&ctx, {}, &list)));
    sets.assign(list.prompt_sets().begin(), list.prompt_sets().end());
  } else {
    v1::GetPromptSetRequest request;
    request.set_prompt_set_id(id);
    PRL_RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub->GetPromptSet(&ctx, request, &sets.emplace_back())));
  }
  if (json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& s : sets) j.push_back(StatusJson(s));
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (sets.empty()) std::printf("no prompt sets\n");
    for (const auto& s : sets) std::printf("%s\n", StatusLine(s).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterServiceCommands(CLI::App& app, CommandRegistry& registry) {
  auto c = std::make_shared<CoordinatorFlags>();
  CLI::App* coord = app.add_subcommand(
      "coordinator", "The prompt-set service: durable prompt sets, leases to actors, progress");
  coord->add_option("--model", c->model,
                    "Model directory (its vocabulary and context bound "
                    "the prompts; required unless --config gives model.path)");
  coord->add_option("--config", c->config_file,
                    "The run's config file (flags given here override it)");
  coord->add_flag("--sync", c->config.sync,
                  "Sync mode: lease one step's prompts at a time, with the newest weights");
  coord->add_option("--log", c->log, "The durable prompt log")->capture_default_str();
  coord->add_option("--address", c->address, "Listening address (port 0: any free port)")
      ->capture_default_str();
  coord
      ->add_option("--metrics-address", c->metrics_address,
                   "Prometheus /metrics address (port 0: any free port)")
      ->capture_default_str();
  coord->add_option("--lease-ms", c->config.lease_ms, "Re-queue a lease not renewed in this")
      ->capture_default_str();
  coord->add_option("--heartbeat-ms", c->config.heartbeat_ms, "Actors' heartbeat period")
      ->capture_default_str();
  coord
      ->add_option("--max-pending-prompts", c->config.max_pending_prompts,
                   "Prompts pending or in flight before submits get RESOURCE_EXHAUSTED")
      ->capture_default_str();
  coord
      ->add_option("--max-samples-per-prompt", c->config.max_samples_per_prompt,
                   "Largest group a submission may ask for")
      ->capture_default_str();
  coord->add_option("--max-lag", c->config.max_lag, "Learner versions a sample may lag")
      ->capture_default_str();
  coord
      ->add_option("--groups-per-step", c->config.groups_per_step,
                   "Groups per learner step, for the max_lag budget (0: no budget)")
      ->capture_default_str();
  coord->add_flag("--char-tokenizer", c->char_tokenizer,
                  "Accept text prompts, tokenised with the built-in task's character tokenizer");
  c->command = coord;
  registry.Add(coord, [c] { return RunCoordinator(*c); });

  auto s = std::make_shared<SubmitFlags>();
  CLI::App* submit = app.add_subcommand("submit", "Submit a prompt set to a coordinator");
  submit
      ->add_option("file", s->file,
                   "JSONL: {\"text\": ...} or {\"tokens\": [...]}, "
                   "optional \"reference\"")
      ->required();
  submit->add_option("--server", s->server, "Coordinator address")->capture_default_str();
  submit->add_option("--samples", s->samples, "Samples per prompt (the group size)")
      ->capture_default_str();
  submit->add_option("--temperature", s->temperature, "Sampling temperature")
      ->capture_default_str();
  submit->add_option("--top-p", s->top_p, "Nucleus mass")->capture_default_str();
  submit->add_option("--top-k", s->top_k, "Top-k (0: off)")->capture_default_str();
  submit->add_option("--max-tokens", s->max_tokens, "Completion tokens at most")
      ->capture_default_str();
  submit->add_option("--seed", s->seed, "Sampling seed")->capture_default_str();
  submit->add_option("--stop-token", s->stop_token_ids, "Stop token id (repeatable)");
  submit->add_option("--reward", s->reward, "exact_match | numeric | regex | arithmetic | remote")
      ->capture_default_str();
  submit->add_option("--reward-param", s->reward_params, "KEY=VALUE for the reward (repeatable)");
  submit->add_option("--name", s->name, "A name for humans (default: the file name)");
  submit->add_option("--idempotency-key", s->idempotency_key,
                     "Retrying with the same key does not submit twice");
  submit->add_flag("--watch", s->watch, "Stream progress until the set is done");
  submit->add_flag("--json", s->json, "JSON output");
  registry.Add(submit, [s] { return RunSubmit(*s); });

  auto st_server = std::make_shared<std::string>("localhost:50051");
  auto st_id = std::make_shared<std::string>();
  auto st_json = std::make_shared<bool>(false);
  CLI::App* status =
      app.add_subcommand("status", "Prompt sets of a coordinator and their progress");
  status->add_option("id", *st_id, "One prompt set (default: all)");
  status->add_option("--server", *st_server, "Coordinator address")->capture_default_str();
  status->add_flag("--json", *st_json, "JSON output");
  registry.Add(status,
               [st_server, st_id, st_json] { return RunStatus(*st_server, *st_id, *st_json); });
}

}  // namespace prl::cli
