// `prl env`: environments for agentic episodes (docs/environments.md).
//   prl env serve    serves prl's built-in environments as an EnvironmentService
//   prl env episode  plays one episode against any EnvironmentService, turn texts given on the
//                    command line, and prints every answer as a JSON line: to try an
//                    environment by hand or check one written in another language.
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "core/status_macros.h"
#include "env/builtin_environments.h"
#include "env/environment_server.h"
#include "env/remote_environment.h"
#include "google/protobuf/util/json_util.h"
#include "roles/role_security.h"
#include "roles/stop_signal.h"

namespace prl::cli {

namespace {

namespace v1 = prl::v1;

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) out = "{}";
  return out;
}

void RegisterEnvServe(CLI::App* env, CommandRegistry& registry) {
  CLI::App* cmd =
      env->add_subcommand("serve",
                          "Serve prl's built-in environments (calculator, guess_number) as a gRPC "
                          "EnvironmentService");
  auto flags = std::make_shared<ConfigFlags>(cmd);
  auto listen = std::make_shared<std::string>("127.0.0.1:7000");
  cmd->add_option("--listen", *listen, "host:port (loopback by default; port 0 picks one)");
  auto token_file = std::make_shared<std::string>();
  cmd->add_option("--token-file", *token_file,
                  "Callers must present this bearer token (security.service_token_file)");
  registry.Add(cmd, [flags, listen, token_file] {
    return flags->Run([&](config::RunConfig c) -> absl::Status {
      if (!token_file->empty()) c.security.service_token_file = *token_file;
      PRL_RETURN_IF_ERROR(roles::ConfigureRoleSecurity(c, std::nullopt, {rpc::Role::kService}));
      env::EnvironmentServerOptions options;
      options.address = *listen;
      PRL_ASSIGN_OR_RETURN_IN(auto server,
                              env::EnvironmentServer::Start(env::AllBuiltinEnvironments(), options),
                              "--listen");
      std::printf("environments %s on port %d (EnvironmentService)\n",
                  env::DescribeBuiltinEnvironments().c_str(), server->port());
      std::fflush(stdout);
      const std::atomic<bool>& stop = roles::StopOnSignals();
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      server->Shutdown();
      return absl::OkStatus();
    });
  });
}

struct EpisodeFlags {
  std::string address, environment, reference;
  std::vector<std::string> params, turns;
  int max_turns = 8;
  double timeout_s = 10;
};

absl::Status PlayEpisode(const EpisodeFlags& f) {
  env::RemoteEnvironmentOptions o;
  o.address = f.address;
  o.retry.timeout = absl::Seconds(f.timeout_s);
  PRL_ASSIGN_OR_RETURN(auto env, env::RemoteEnvironment::Connect(o));
  v1::StartEpisodeRequest start;
  start.set_episode_id(absl::StrCat("prl-env-episode-", std::random_device{}()));
  start.set_environment(f.environment);
  start.set_reference(f.reference);
  start.set_max_turns(f.max_turns);
  for (const std::string& p : f.params) {
    const std::vector<std::string> kv = absl::StrSplit(p, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--param: expected key=value, found '", p, "'"));
    }
    (*start.mutable_parameters())[kv[0]] = kv[1];
  }
  PRL_ASSIGN_OR_RETURN(const v1::StartEpisodeResponse started, env->StartEpisode(start));
  std::printf("{\"start\": %s}\n", Json(started).c_str());
  bool done = false;
  for (size_t i = 0; i < f.turns.size() && !done; ++i) {
    v1::StepRequest step;
    step.set_episode_id(start.episode_id());
    step.set_turn_index(static_cast<int32_t>(i));
    step.set_text(f.turns[i]);
    step.set_turn_end(v1::TURN_END_END_OF_TURN);
    for (const std::string& s : started.stop_strings()) {
      if (absl::EndsWith(f.turns[i], s)) step.set_turn_end(v1::TURN_END_STOP_STRING);
    }
    PRL_ASSIGN_OR_RETURN(const v1::StepResponse answer, env->Step(step));
    std::printf("{\"turn\": %zu, \"answer\": %s}\n", i, Json(answer).c_str());
    done = answer.done();
  }
  if (!done) {
    v1::EndEpisodeRequest end;
    end.set_episode_id(start.episode_id());
    end.set_truncated(true);
    end.set_reason("prl env episode: out of turns");
    PRL_ASSIGN_OR_RETURN(const v1::EndEpisodeResponse ended, env->EndEpisode(end));
    std::printf("{\"end\": %s}\n", Json(ended).c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

void RegisterEnvEpisode(CLI::App* env, CommandRegistry& registry) {
  CLI::App* cmd = env->add_subcommand(
      "episode", "Play one episode against an EnvironmentService; print each answer as JSON");
  auto f = std::make_shared<EpisodeFlags>();
  cmd->add_option("--address", f->address, "host:port of the EnvironmentService")->required();
  cmd->add_option("--environment", f->environment, "Its name (a server may host several)");
  cmd->add_option("--reference", f->reference, "The prompt's reference answer");
  cmd->add_option("--param", f->params, "An environment parameter, key=value (repeatable)");
  cmd->add_option("--turn", f->turns, "A model turn's text, in order (repeatable)");
  cmd->add_option("--max-turns", f->max_turns, "StartEpisodeRequest.max_turns");
  cmd->add_option("--timeout-s", f->timeout_s, "Each call's budget, retries included");
  registry.Add(cmd, [f] { return PlayEpisode(*f); });
}

}  // namespace

void RegisterEnvCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* env = app.add_subcommand("env", "Environments for agentic episodes");
  env->require_subcommand(1);
  RegisterEnvServe(env, registry);
  RegisterEnvEpisode(env, registry);
}

}  // namespace prl::cli
