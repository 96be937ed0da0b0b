// The coordinator's command-line clients: `prl submit` and `prl status`.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/command.h"
#include "coordinator/list_client.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"

namespace prl::cli {

namespace {

namespace v1 = prl::v1;

std::unique_ptr<v1::PromptService::Stub> Connect(const std::string& server) {
  return v1::PromptService::NewStub(
      rpc::NewChannel(server, rpc::ChannelArgs(int64_t{256} << 20)));
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

std::string FailedLine(const v1::FailedPrompt& f) {
  std::string reruns;
  if (f.stale_reruns() > 0) reruns = absl::StrFormat(" and %d stale re-runs", f.stale_reruns());
  return absl::StrFormat("  prompt %lld failed after %d attempts%s: %s",
                         static_cast<long long>(f.prompt_index()), f.attempts(), reruns,
                         f.reason());
}

std::string StatusLine(const v1::PromptSetStatus& s) {
  const std::string failed =
      s.prompts_failed() > 0
          ? absl::StrFormat(", %lld failed", static_cast<long long>(s.prompts_failed()))
          : "";
  const std::string adapter =
      s.adapter().empty() ? "" : absl::StrFormat(", adapter %s", s.adapter());
  // A weight other than 1 (a coordinator before weights reports 0: also 1).
  const std::string weight =
      s.weight() > 0 && s.weight() != 1 ? absl::StrFormat(", weight %g", s.weight()) : "";
  return absl::StrFormat(
      "%s %-9s %lld/%lld done%s, %lld in flight, %lld pending%s%s, mean reward %.4f  %s",
      s.prompt_set_id(), StateName(s.state()), static_cast<long long>(s.prompts_done()),
      static_cast<long long>(s.prompts_total()), failed,
      static_cast<long long>(s.prompts_in_flight()), static_cast<long long>(s.prompts_pending()),
      weight, adapter, s.mean_reward(), s.name());
}

// The status line, then the failed prompts (the first 100) and why pending prompts wait.
std::string StatusDetails(const v1::PromptSetStatus& s) {
  std::string out = StatusLine(s);
  for (const v1::FailedPrompt& f : s.failed_prompts()) absl::StrAppend(&out, "\n", FailedLine(f));
  if (s.failed_prompts_size() < s.prompts_failed()) {
    absl::StrAppend(&out, "\n  (", s.prompts_failed() - s.failed_prompts_size(), " more failed)");
  }
  if (!s.message().empty()) absl::StrAppend(&out, "\n  waiting: ", s.message());
  for (const v1::EvalRoundResult& r : s.eval_rounds()) {
    absl::StrAppend(&out, absl::StrFormat(
                              "\n  eval at version %lld: mean reward %.4f, pass@%d %.4f (%lld "
                              "prompts, %lld failed)",
                              static_cast<long long>(r.version()), r.mean_reward(), r.k(),
                              r.pass_at_k(), static_cast<long long>(r.prompts()),
                              static_cast<long long>(r.prompts_failed())));
  }
  if (s.eval() && s.eval_round_version() >= 0) {
    absl::StrAppend(&out, "\n  eval round running, opened at version ", s.eval_round_version());
  }
  return out;
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
  j["prompts_failed"] = s.prompts_failed();
  j["weight"] = s.weight();
  if (!s.adapter().empty()) j["adapter"] = s.adapter();
  if (s.eval()) {
    j["eval_round_version"] = s.eval_round_version();
    j["eval_rounds"] = nlohmann::ordered_json::array();
    for (const v1::EvalRoundResult& r : s.eval_rounds()) {
      j["eval_rounds"].push_back({{"version", r.version()},
                                  {"mean_reward", r.mean_reward()},
                                  {"pass_at_k", r.pass_at_k()},
                                  {"k", r.k()},
                                  {"prompts", r.prompts()},
                                  {"prompts_failed", r.prompts_failed()},
                                  {"weight_versions",
                                   {r.min_weight_version(), r.max_weight_version()}}});
    }
  }
  j["failed_prompts"] = nlohmann::ordered_json::array();
  for (const v1::FailedPrompt& f : s.failed_prompts()) {
    j["failed_prompts"].push_back(
        {{"prompt_index", f.prompt_index()},
         {"attempts", f.attempts()},
         {"stale_reruns", f.stale_reruns()},
         {"reason", f.reason()}});
  }
  j["message"] = s.message();
  return j;
}

// How a client proves itself and checks the server (rpc/security.h).
struct ClientTrust {
  std::string token_file, ca_file, cert_file, key_file;
};

void AddTrustFlags(CLI::App* cmd, ClientTrust* t) {
  cmd->add_option("--token-file", t->token_file,
                  "The client role's bearer token (security.client_token_file of the run)");
  cmd->add_option("--ca-file", t->ca_file, "The CA that verifies the coordinator (TLS)");
  cmd->add_option("--cert-file", t->cert_file, "This client's certificate (mutual TLS)");
  cmd->add_option("--key-file", t->key_file, "Its private key (mutual TLS)");
}

absl::Status ConfigureClient(const ClientTrust& t) {
  rpc::SecuritySettings s;
  s.client_token_file = t.token_file;
  s.tls_ca_file = t.ca_file;
  s.tls_cert_file = t.cert_file;
  s.tls_key_file = t.key_file;
  return rpc::ConfigureSecurity(s, rpc::Role::kClient);
}

struct SubmitFlags {
  ClientTrust trust;
  std::string server = "localhost:50051", file, name, idempotency_key, reward = "exact_match";
  std::vector<std::string> reward_params;
  // Agentic episodes (docs/environments.md): the environment and its limits.
  std::string environment, env_address;
  std::vector<std::string> env_params;
  int max_turns = 0, max_tokens_per_turn = 0, max_episode_tokens = 0;
  double env_timeout_s = 0;
  std::string tool_call_format;
  // Agents (docs/agents.md): the agent and its limits.
  std::string agent, agent_address;
  std::vector<std::string> agent_params;
  int max_calls = 0, max_tokens_per_call = 0;
  double agent_timeout_s = 0;
  int samples = 4, top_k = 0, max_tokens = 256;
  double temperature = 1.0, top_p = 1.0;
  double weight = 1.0;  // the set's share of leases beside other sets
  // Tenants (docs/tenants.md): the adapter the set trains, and a new one's settings.
  std::string adapter, adapter_targets;
  int adapter_rank = 0;
  double adapter_alpha = 0, adapter_lr = 0;
  bool adapter_rslora = false;
  int64_t eval_every = 0;    // >= 1: an evaluation set, a round every this many versions
  double pass_reward = 0.0;  // an evaluation sample passes at this reward (0: 1)
  uint64_t seed = 0;
  std::vector<int> stop_token_ids;
  bool watch = false, json = false, show_texts = false;
};

absl::StatusOr<v1::SubmitPromptSetRequest> ReadSubmission(const SubmitFlags& f) {
  v1::SubmitPromptSetRequest r;
  r.set_name(f.name.empty() ? f.file : f.name);
  r.set_samples_per_prompt(f.samples);
  r.set_idempotency_key(f.idempotency_key);
  // Checked here: 0 would travel as "unset" and be leased as 1.
  if (!(f.weight >= 0.001 && f.weight <= 1000)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--weight: expected 0.001 to 1000 (the set's share of leases), found ", f.weight));
  }
  r.set_weight(f.weight);
  if (!f.adapter.empty()) {
    v1::AdapterSpec* a = r.mutable_adapter();
    a->set_name(f.adapter);
    a->set_rank(f.adapter_rank);
    a->set_alpha(f.adapter_alpha);
    a->set_rslora(f.adapter_rslora);
    a->set_learning_rate(f.adapter_lr);
    for (absl::string_view t : absl::StrSplit(f.adapter_targets, ',', absl::SkipEmpty())) {
      a->add_target_modules(std::string(t));
    }
  } else if (f.adapter_rank != 0 || f.adapter_alpha != 0 || f.adapter_lr != 0 ||
             f.adapter_rslora || !f.adapter_targets.empty()) {
    return absl::InvalidArgumentError(
        "--adapter-rank, --adapter-alpha, --adapter-rslora, --adapter-targets and --adapter-lr "
        "set a new adapter's settings: name it with --adapter");
  }
  if (f.eval_every != 0 || f.pass_reward != 0) {
    r.mutable_eval()->set_every_versions(f.eval_every);
    r.mutable_eval()->set_pass_reward(f.pass_reward);
  }
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
  if (!f.environment.empty()) {
    r.clear_reward();  // an episode's reward is its environment's
    v1::EnvironmentSpec* e = r.mutable_environment();
    e->set_name(f.environment);
    e->set_address(f.env_address);
    e->set_max_turns(f.max_turns);
    e->set_max_tokens_per_turn(f.max_tokens_per_turn);
    e->set_max_episode_tokens(f.max_episode_tokens);
    e->set_timeout_s(f.env_timeout_s);
    e->set_tool_call_format(f.tool_call_format);
    for (const std::string& kv : f.env_params) {
      std::vector<std::string> parts = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      if (parts.size() != 2 || parts[0].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--env-param: expected KEY=VALUE, found '", kv, "'"));
      }
      (*e->mutable_parameters())[parts[0]] = parts[1];
    }
  }
  if (!f.agent_address.empty()) {
    r.clear_reward();  // an agent's episode reward is the agent's
    v1::AgentSpec* a = r.mutable_agent();
    a->set_name(f.agent);
    a->set_address(f.agent_address);
    a->set_max_calls(f.max_calls);
    a->set_max_tokens_per_call(f.max_tokens_per_call);
    a->set_max_episode_tokens(f.max_episode_tokens);
    a->set_timeout_s(f.agent_timeout_s);
    a->set_tool_call_format(f.tool_call_format);
    for (const std::string& kv : f.agent_params) {
      std::vector<std::string> parts = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      if (parts.size() != 2 || parts[0].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--agent-param: expected KEY=VALUE, found '", kv, "'"));
      }
      (*a->mutable_parameters())[parts[0]] = parts[1];
    }
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<v1::Prompt> prompts,
                       coordinator::ReadPromptFile(f.file));
  for (const v1::Prompt& p : prompts) *r.add_prompts() = p;
  return r;
}

// A finished group's samples: one line each (JSON: one object per group).
void PrintGroup(const v1::GroupResult& g, bool json) {
  if (json) {
    nlohmann::ordered_json j;
    j["prompt_index"] = g.prompt_index();
    j["rewards"] = std::vector<double>(g.rewards().begin(), g.rewards().end());
    j["texts"] = std::vector<std::string>(g.texts().begin(), g.texts().end());
    j["completion_tokens"] =
        std::vector<int32_t>(g.completion_tokens().begin(), g.completion_tokens().end());
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  for (int i = 0; i < g.rewards_size(); ++i) {
    std::printf("  prompt %lld sample %d: reward %.4g, %d tokens: %s\n",
                static_cast<long long>(g.prompt_index()), i, g.rewards(i),
                g.completion_tokens(i),
                i < g.texts_size() ? nlohmann::json(g.texts(i)).dump().c_str() : "(no text)");
  }
}

absl::Status Watch(v1::PromptService::Stub& stub, const std::string& id, bool json,
                   bool texts) {
  grpc::ClientContext ctx;
  v1::WatchPromptSetRequest request;
  request.set_prompt_set_id(id);
  request.set_include_texts(texts);
  auto reader = stub.WatchPromptSet(&ctx, request);
  v1::PromptSetEvent event;
  while (reader->Read(&event)) {
    if (event.has_group() && texts) PrintGroup(event.group(), json);
    if (event.has_failed() && !json) std::printf("%s\n", FailedLine(event.failed()).c_str());
    if (event.has_status()) {
      std::printf("%s\n", json ? StatusJson(event.status()).dump().c_str()
                               : StatusLine(event.status()).c_str());
    }
    std::fflush(stdout);
  }
  return rpc::FromGrpcStatus(reader->Finish());
}

absl::Status RunSubmit(const SubmitFlags& f) {
  PRL_RETURN_IF_ERROR(ConfigureClient(f.trust));
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
  return f.watch || f.show_texts
             ? Watch(*stub, response.prompt_set_id(), f.json, f.show_texts)
             : absl::OkStatus();
}

absl::Status RunStatus(const ClientTrust& trust, const std::string& server, const std::string& id,
                       bool json) {
  PRL_RETURN_IF_ERROR(ConfigureClient(trust));
  auto stub = Connect(server);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::vector<v1::PromptSetStatus> sets;
  if (id.empty()) {
    PRL_ASSIGN_OR_RETURN(sets, coordinator::ListAllPromptSets(*stub, absl::Seconds(30)));
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
    for (const auto& s : sets) std::printf("%s\n", StatusDetails(s).c_str());
  }
  return absl::OkStatus();
}

// `prl adapter list`: the coordinator's adapters (a tenant's own); `prl adapter delete NAME`.
absl::Status RunAdapterList(const ClientTrust& trust, const std::string& server, bool json) {
  PRL_RETURN_IF_ERROR(ConfigureClient(trust));
  auto stub = Connect(server);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListAdaptersResponse response;
  PRL_RETURN_IF_ERROR(
      rpc::FromGrpcStatus(stub->ListAdapters(&ctx, v1::ListAdaptersRequest(), &response)));
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const v1::AdapterStatus& a : response.adapters()) {
    const v1::AdapterSpec& spec = a.spec();
    const std::string targets = absl::StrJoin(spec.target_modules(), ",");
    if (json) {
      j.push_back({{"name", spec.name()},
                   {"adapter_id", a.adapter_id()},
                   {"tenant", a.tenant()},
                   {"rank", spec.rank()},
                   {"alpha", spec.alpha()},
                   {"rslora", spec.rslora()},
                   {"target_modules", targets},
                   {"learning_rate", spec.learning_rate()},
                   {"version", a.version()},
                   {"groups_consumed", a.groups_consumed()},
                   {"prompt_sets_running", a.prompt_sets_running()},
                   {"prompts_in_flight", a.prompts_in_flight()},
                   {"learner_rank", a.learner_rank()}});
      continue;
    }
    std::printf(
        "%s %s r=%d alpha=%g%s targets=%s lr=%g: version %lld, %lld groups trained, %lld "
        "sets running, %lld prompts in flight, learner rank %d%s\n",
        spec.name().c_str(), a.adapter_id().c_str(), spec.rank(), spec.alpha(),
        spec.rslora() ? " rslora" : "", targets.c_str(), spec.learning_rate(),
        static_cast<long long>(a.version()), static_cast<long long>(a.groups_consumed()),
        static_cast<long long>(a.prompt_sets_running()),
        static_cast<long long>(a.prompts_in_flight()), a.learner_rank(),
        a.tenant().empty() ? "" : absl::StrCat(" (tenant ", a.tenant(), ")").c_str());
  }
  if (json) std::printf("%s\n", j.dump().c_str());
  if (!json && response.adapters().empty()) std::printf("no adapters\n");
  return absl::OkStatus();
}

absl::Status RunAdapterDelete(const ClientTrust& trust, const std::string& server,
                              const std::string& name) {
  PRL_RETURN_IF_ERROR(ConfigureClient(trust));
  auto stub = Connect(server);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::DeleteAdapterRequest request;
  request.set_name(name);
  v1::DeleteAdapterResponse response;
  PRL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->DeleteAdapter(&ctx, request, &response)));
  std::printf("deleted adapter %s (%s): %lld running prompt sets cancelled\n", name.c_str(),
              response.adapter_id().c_str(),
              static_cast<long long>(response.prompt_sets_cancelled()));
  return absl::OkStatus();
}

void RegisterAdapterClientCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* adapter = app.get_subcommand("adapter");  // prl adapter init|merge (adapter_command.cc)
  auto server = std::make_shared<std::string>("localhost:50051");
  auto trust = std::make_shared<ClientTrust>();
  auto json = std::make_shared<bool>(false);
  CLI::App* list = adapter->add_subcommand(
      "list", "A run of adapters' adapters at a coordinator (a tenant's token: its own)");
  list->add_option("--server", *server, "Coordinator address")->capture_default_str();
  list->add_flag("--json", *json, "JSON output");
  AddTrustFlags(list, trust.get());
  registry.Add(list, [trust, server, json] { return RunAdapterList(*trust, *server, *json); });

  auto name = std::make_shared<std::string>();
  auto delete_server = std::make_shared<std::string>("localhost:50051");
  auto delete_trust = std::make_shared<ClientTrust>();
  CLI::App* del = adapter->add_subcommand(
      "delete",
      "Delete an adapter at a coordinator: its running prompt sets are cancelled and its state "
      "freed");
  del->add_option("name", *name, "The adapter's name")->required();
  del->add_option("--server", *delete_server, "Coordinator address")->capture_default_str();
  AddTrustFlags(del, delete_trust.get());
  registry.Add(del, [delete_trust, delete_server, name] {
    return RunAdapterDelete(*delete_trust, *delete_server, *name);
  });
}

}  // namespace

void RegisterClientCommands(CLI::App& app, CommandRegistry& registry) {
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
  submit->add_option("--environment", s->environment,
                     "Agentic episodes against this environment (calculator, guess_number, or "
                     "the name a server at --env-address hosts); its episode reward replaces "
                     "--reward");
  submit->add_option("--env-address", s->env_address,
                     "host:port of the EnvironmentService (empty: built in)");
  submit->add_option("--env-param", s->env_params, "KEY=VALUE for the environment (repeatable)");
  submit->add_option("--max-turns", s->max_turns, "Model turns per episode (0: 8)");
  submit->add_option("--max-tokens-per-turn", s->max_tokens_per_turn,
                     "Tokens per model turn (0: --max-tokens)");
  submit->add_option("--max-episode-tokens", s->max_episode_tokens,
                     "Completion tokens per episode, the model's and the replies' (0: no limit)");
  submit->add_option("--tool-call-format", s->tool_call_format,
                     "How the model writes tool calls: hermes, llama3_json, none (default: from "
                     "the model's chat template)");
  submit->add_option("--env-timeout-s", s->env_timeout_s,
                     "One environment call's budget, retries included (0: 30)");
  submit->add_option("--agent-address", s->agent_address,
                     "Agents: host:port of the AgentService that runs each episode against the "
                     "actors' OpenAI-compatible endpoint; its reward replaces --reward");
  submit->add_option("--agent", s->agent, "Agents: the name passed to RunEpisode");
  submit->add_option("--agent-param", s->agent_params, "KEY=VALUE for the agent (repeatable)");
  submit->add_option("--max-calls", s->max_calls, "Agents: endpoint calls per episode (0: 16)");
  submit->add_option("--max-tokens-per-call", s->max_tokens_per_call,
                     "Agents: tokens of one call's answer (0: --max-tokens)");
  submit->add_option("--agent-timeout-s", s->agent_timeout_s,
                     "Agents: an episode's wall time (0: 300)");
  submit->add_option("--name", s->name, "A name for humans (default: the file name)");
  submit->add_option("--weight", s->weight,
                     "The set's share of leases beside other sets with prompts to lease (weights "
                     "1 and 3 are leased 1:3); 0.001 to 1000")
      ->capture_default_str();
  submit->add_option("--adapter", s->adapter,
                     "A run of adapters (docs/tenants.md): the LoRA adapter the set trains, made "
                     "by the first set that names it");
  submit->add_option("--adapter-rank", s->adapter_rank, "A new adapter's rank (0: learner.lora_rank)");
  submit->add_option("--adapter-alpha", s->adapter_alpha,
                     "A new adapter's alpha (0: learner.lora_alpha)");
  submit->add_flag("--adapter-rslora", s->adapter_rslora, "A new adapter scales alpha / sqrt(r)");
  submit->add_option("--adapter-targets", s->adapter_targets,
                     "A new adapter's modules, comma-separated (empty: learner.lora_targets)");
  submit->add_option("--adapter-lr", s->adapter_lr, "A new adapter's learning rate (0: learner.lr)");
  submit->add_option("--eval-every", s->eval_every,
                     "An evaluation set, never trained on: its prompts run at once and again every "
                     "this many learner versions; each round's mean reward and pass@k (k = "
                     "--samples) are in its status (0: a training set)");
  submit->add_option("--pass-reward", s->pass_reward,
                     "Evaluation sets: a sample passes at a reward >= this (0: 1)");
  submit->add_option("--idempotency-key", s->idempotency_key,
                     "Retrying with the same key does not submit twice");
  submit->add_flag("--watch", s->watch, "Stream progress until the set is done");
  submit->add_flag("--show-texts", s->show_texts,
                   "Watch, and print each finished sample's text and reward");
  submit->add_flag("--json", s->json, "JSON output");
  AddTrustFlags(submit, &s->trust);
  registry.Add(submit, [s] { return RunSubmit(*s); });

  auto st_server = std::make_shared<std::string>("localhost:50051");
  auto st_id = std::make_shared<std::string>();
  auto st_json = std::make_shared<bool>(false);
  auto st_trust = std::make_shared<ClientTrust>();
  CLI::App* status =
      app.add_subcommand("status", "Prompt sets of a coordinator and their progress");
  status->add_option("id", *st_id, "One prompt set (default: all)");
  status->add_option("--server", *st_server, "Coordinator address")->capture_default_str();
  status->add_flag("--json", *st_json, "JSON output");
  AddTrustFlags(status, st_trust.get());
  registry.Add(status, [st_trust, st_server, st_id, st_json] {
    return RunStatus(*st_trust, *st_server, *st_id, *st_json);
  });
  RegisterAdapterClientCommands(app, registry);
}

}  // namespace prl::cli
