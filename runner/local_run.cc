#include "runner/local_run.h"

#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_model_dir.h"
#include "core/status_macros.h"
#include "model/presets.h"
#include "nlohmann/json.hpp"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/replay_buffer.h"
#include "rpc/grpc_util.h"
#include "runner/child_process.h"
#include "runner/evaluation.h"
#include "task/arithmetic_task.h"
#include "task/char_tokenizer.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::runner {

namespace {

namespace fs = std::filesystem;
namespace v1 = prl::v1;
using Json = nlohmann::ordered_json;

std::string Tail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > max_bytes ? "..." + text.substr(text.size() - max_bytes) : text;
}

task::ArithmeticConfig TaskConfig(const config::RunConfig& c) {
  task::ArithmeticConfig t;
  t.min_digits = c.task.min_digits;
  t.max_digits = c.task.max_digits;
  t.operations = c.task.operations;
  return t;
}

// One learner step as reported in learner_steps.jsonl.
struct StepLine {
  int64_t step = 0, version = 0, samples = 0, completion_tokens = 0, trained_tokens = 0;
  double unix_time = 0, reward = 0, lag_mean = 0, lag_max = 0, kl = 0, ratio = 0;
};

// The roles share this machine's cores: each gets an OpenMP thread budget so that together
// they do not oversubscribe the cores, and OpenMP threads sleep rather than spin while they
// wait (a spinning team on a shared core starves the other processes). Variables the user
// set win.
std::vector<std::pair<std::string, std::string>> ThreadEnv(int threads) {
  std::vector<std::pair<std::string, std::string>> env;
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    env.push_back({"OMP_NUM_THREADS", absl::StrCat(std::max(1, threads))});
  }
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) env.push_back({"OMP_WAIT_POLICY", "PASSIVE"});
  return env;
}

int Cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

class Run {
 public:
  explicit Run(const LocalRunOptions& o) : o_(o), c_(o.config), dir_(o.config.run_dir()) {}

  absl::StatusOr<std::string> Execute() {
    absl::StatusOr<std::string> result = ExecuteSteps();
    StopRoles();
    // Shared memory outlives processes: remove the run's segments on every exit path.
    ReplayBuffer::Remove(c_.replay_segment(), /*force=*/true).IgnoreError();
    RemoveShmWeightSegment(c_.weight_segment()).IgnoreError();
    return result;
  }

 private:
  absl::StatusOr<std::string> ExecuteSteps() {
    std::printf("prl run: %s (%s mode), run directory %s\n", c_.run.name.c_str(),
                c_.run.mode.c_str(), dir_.c_str());
    PRL_RETURN_IF_ERROR(Prepare());
    PRL_RETURN_IF_ERROR(WarmStart());
    PRL_ASSIGN_OR_RETURN(eval_before_, Evaluate(start_model_, "eval_before"));
    PRL_RETURN_IF_ERROR(StartRoles());
    PRL_RETURN_IF_ERROR(Supervise());
    StopRoles();
    PRL_RETURN_IF_ERROR(Export());
    PRL_ASSIGN_OR_RETURN(eval_after_, Evaluate(dir_ + "/model-final", "eval_after"));
    return WriteSummary();
  }

  bool Interrupted() const { return o_.interrupted != nullptr && o_.interrupted->load(); }

  absl::Status Prepare() {
    std::error_code ec;
    if (!o_.resume) {
      for (const char* name :
           {"model-init", "model-sft", "model-final", "sft.jsonl", "sft-checkpoints", "checkpoints",
            "coordinator", "logs", "learner_steps.jsonl", "summary.json", "config.json"}) {
        fs::remove_all(fs::path(dir_) / name, ec);
      }
      ReplayBuffer::Remove(c_.replay_segment(), true).IgnoreError();
      RemoveShmWeightSegment(c_.weight_segment()).IgnoreError();
    }
    fs::create_directories(fs::path(dir_) / "logs", ec);
    if (ec) return absl::InternalError(absl::StrCat("creating ", dir_, ": ", ec.message()));
    if (!c_.model.path.empty()) {
      start_model_ = c_.model.path;
      std::printf("model: %s\n", start_model_.c_str());
      return absl::OkStatus();
    }
    start_model_ = dir_ + "/model-init";
    if (o_.resume && fs::exists(start_model_ + "/config.json")) return absl::OkStatus();
    PRL_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(c_.model.preset));
    config.vocab_size = task::CharTokenizer().vocab_size();
    config.max_position_embeddings = c_.model.max_position_embeddings;
    PRL_ASSIGN_OR_RETURN(ParameterSet params, ParameterSet::Allocate(config, Device::Cpu(), false));
    InitializeParameters(params, c_.model.init_seed, 0.02f);
    PRL_RETURN_IF_ERROR(SaveModel(start_model_, params));
    std::printf("model: created %s (preset %s, %lld parameters, character vocabulary of %lld)\n",
                start_model_.c_str(), c_.model.preset.c_str(),
                static_cast<long long>(ParameterCount(config)),
                static_cast<long long>(config.vocab_size));
    return absl::OkStatus();
  }

  // The supervised warm-start: `prl learner train --loss sft` on the task's train split.
  absl::Status WarmStart() {
    if (c_.sft.steps == 0) return WriteRoleConfig();
    const std::string out = dir_ + "/model-sft";
    if (o_.resume && fs::exists(out + "/config.json")) {
      start_model_ = out;
      std::printf("warm-start: reusing %s\n", out.c_str());
      return WriteRoleConfig();
    }
    const absl::Time start = absl::Now();
    const int64_t n = std::min<int64_t>(c_.sft.steps * c_.sft.examples_per_step, 50'000);
    PRL_ASSIGN_OR_RETURN(
        const std::vector<task::ArithmeticProblem> problems,
        task::GenerateProblems(TaskConfig(c_), task::Split::kTrain, c_.run.seed * 7919 + 1, n));
    const task::CharTokenizer tokenizer;
    {
      std::ofstream f(dir_ + "/sft.jsonl");
      for (const task::ArithmeticProblem& p : problems) {
        PRL_ASSIGN_OR_RETURN(const task::TokenizedExample e, task::SftExample(tokenizer, p));
        Json line;
        line["prompt"] = e.prompt;
        line["completion"] = e.completion;
        line["behaviour_logprobs"] = std::vector<float>(e.completion.size(), 0.0f);
        line["advantage"] = 1.0;
        f << line.dump() << "\n";
      }
      if (!f) return absl::InternalError(absl::StrCat("writing ", dir_, "/sft.jsonl"));
    }
    std::printf("warm-start: %lld supervised steps of %lld examples (lr %g)\n",
                static_cast<long long>(c_.sft.steps),
                static_cast<long long>(c_.sft.examples_per_step), c_.sft.lr);
    std::fflush(stdout);
    const std::string log = dir_ + "/logs/sft.log";
    PRL_ASSIGN_OR_RETURN(ChildProcess sft,
                         ChildProcess::Start({"sft",
                                              {o_.prl_path,
                                               "learner",
                                               "train",
                                               "--model",
                                               start_model_,
                                               "--rollouts",
                                               dir_ + "/sft.jsonl",
                                               "--loss",
                                               "sft",
                                               "--steps",
                                               absl::StrCat(c_.sft.steps),
                                               "--samples-per-step",
                                               absl::StrCat(c_.sft.examples_per_step),
                                               "--lr",
                                               absl::StrCat(c_.sft.lr),
                                               "--checkpoint-dir",
                                               dir_ + "/sft-checkpoints",
                                               "--checkpoint-every",
                                               absl::StrCat(c_.sft.steps),
                                               "--keep-checkpoints",
                                               "1",
                                               "--out",
                                               out},
                                              log,
                                              ThreadEnv(Cores())}));
    while (sft.running()) {
      if (Interrupted()) return absl::CancelledError("interrupted during the warm-start");
      absl::SleepFor(absl::Milliseconds(100));
    }
    const int status = *sft.Poll();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(absl::StrCat("warm-start (prl learner train) ",
                                              DescribeWaitStatus(status), "; ", log, ":\n",
                                              Tail(log)));
    }
    sft_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("warm-start: done in %.1f s -> %s\n", sft_seconds_, out.c_str());
    start_model_ = out;
    return WriteRoleConfig();
  }

  // The file every role reads: the effective config with the model to start from.
  absl::Status WriteRoleConfig() {
    config::RunConfig roles = c_;
    roles.model.path = start_model_;
    role_config_ = dir_ + "/config.json";
    std::ofstream f(role_config_);
    f << config::RunConfigToJson(roles) << "\n";
    if (!f) return absl::InternalError(absl::StrCat("writing ", role_config_));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Evaluate(const std::string& model_dir, const char* what) {
    PRL_ASSIGN_OR_RETURN(ParameterSet weights, LoadModel(model_dir, Device::Cpu()));
    PRL_ASSIGN_OR_RETURN(
        const EvalResult r,
        EvaluateArithmetic(std::make_shared<const ParameterSet>(std::move(weights)), TaskConfig(c_),
                           c_.task.eval_prompts, c_.run.seed, c_.task.max_tokens));
    std::printf("%s: %.3f greedy accuracy on %lld held-out prompts (%.1f s)\n", what, r.accuracy,
                static_cast<long long>(r.problems), r.seconds);
    std::fflush(stdout);
    return r.accuracy;
  }

  absl::StatusOr<std::string> MetricsAddress(int index) {
    if (!c_.metrics.enabled) return std::string();
    if (c_.metrics.base_port > 0) return absl::StrCat("127.0.0.1:", c_.metrics.base_port + index);
    PRL_ASSIGN_OR_RETURN(const int port, PickFreePort());
    return absl::StrCat("127.0.0.1:", port);
  }

  absl::Status StartRoles() {
    std::string address = c_.coordinator.address;
    if (address.size() >= 2 && address.substr(address.size() - 2) == ":0") {
      PRL_ASSIGN_OR_RETURN(const int port, PickFreePort());
      address = absl::StrCat(address.substr(0, address.size() - 1), port);
    }
    coordinator_address_ = address;
    std::vector<std::string> endpoints;
    auto with_metrics = [&](std::vector<std::string> argv, int index,
                            const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
      PRL_ASSIGN_OR_RETURN(const std::string m, MetricsAddress(index));
      if (!m.empty()) {
        argv.insert(argv.end(), {"--metrics-address", m});
        endpoints.push_back(absl::StrCat(name, " http://", m, "/metrics"));
      }
      return argv;
    };
    std::string weights_address;
    if (c_.broadcast.transport == "grpc") {
      PRL_ASSIGN_OR_RETURN(const int port, PickFreePort());
      weights_address = absl::StrCat("127.0.0.1:", port);
    }
    PRL_ASSIGN_OR_RETURN(
        std::vector<std::string> coord,
        with_metrics({o_.prl_path, "coordinator", "--config", role_config_, "--address", address},
                     0, "coordinator"));
    // Actors and learner ranks run at once: they split the cores.
    const int role_threads = Cores() / (c_.actors.count + c_.learner.world_size);
    coordinator_spec_ = {"coordinator", coord, dir_ + "/logs/coordinator.log", ThreadEnv(1)};
    std::vector<std::string> learner = {
        o_.prl_path, "learner",       "serve",
        "--config",  role_config_,    "--coordinator",
        address,     "--report-file", dir_ + "/learner_steps.jsonl"};
    if (!weights_address.empty())
      learner.insert(learner.end(), {"--weights-listen", weights_address});
    PRL_ASSIGN_OR_RETURN(learner, with_metrics(learner, 1, "learner"));
    // The learner's launcher splits its OMP_NUM_THREADS between its ranks.
    learner_spec_ = {"learner", learner, dir_ + "/logs/learner.log",
                     ThreadEnv(role_threads * c_.learner.world_size)};
    for (int i = 0; i < c_.actors.count; ++i) {
      const std::string name = absl::StrCat("actor-", i);
      std::vector<std::string> actor = {o_.prl_path,     "actor", "--config", role_config_,
                                        "--coordinator", address, "--name",   name};
      if (!weights_address.empty())
        actor.insert(actor.end(), {"--weights-address", weights_address});
      PRL_ASSIGN_OR_RETURN(actor, with_metrics(actor, 2 + i, name));
      actor_specs_.push_back(
          {name, actor, dir_ + "/logs/" + name + ".log", ThreadEnv(role_threads)});
    }

    PRL_ASSIGN_OR_RETURN(ChildProcess started, ChildProcess::Start(coordinator_spec_));
    coordinator_.emplace(std::move(started));
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                         rpc::ChannelArgs(int64_t{64} << 20));
    prompts_ = v1::PromptService::NewStub(channel_);
    PRL_RETURN_IF_ERROR(WaitForServer(*channel_, *coordinator_, "the coordinator", address));
    PRL_ASSIGN_OR_RETURN(started, ChildProcess::Start(learner_spec_));
    learner_.emplace(std::move(started));
    if (!weights_address.empty()) {
      // Actors that subscribe before the learner listens back off (up to seconds) and can miss
      // a short run's versions: start them once the weights endpoint is up.
      const auto weights = grpc::CreateChannel(weights_address, grpc::InsecureChannelCredentials());
      PRL_RETURN_IF_ERROR(
          WaitForServer(*weights, *learner_, "the learner's weights endpoint", weights_address));
    }
    for (const ChildSpec& spec : actor_specs_) {
      PRL_ASSIGN_OR_RETURN(started, ChildProcess::Start(spec));
      actors_.push_back(std::move(started));
    }
    std::printf("roles: coordinator on %s, %d learner rank(s), %d actor(s); logs in %s/logs\n",
                address.c_str(), c_.learner.world_size, c_.actors.count, dir_.c_str());
    for (const std::string& e : endpoints) std::printf("metrics: %s\n", e.c_str());
    std::fflush(stdout);
    rl_start_ = absl::Now();
    return absl::OkStatus();
  }

  // Waits until `channel` connects to the server `child` runs (a minute at most).
  absl::Status WaitForServer(grpc::Channel& channel, ChildProcess& child, const std::string& what,
                             const std::string& address) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!channel.WaitForConnected(std::chrono::system_clock::now() +
                                     std::chrono::milliseconds(200))) {
      if (!child.running() || absl::Now() > deadline || Interrupted()) {
        return absl::UnavailableError(absl::StrCat(what, " did not come up on ", address, "; ",
                                                   child.spec().log_path, ":\n",
                                                   Tail(child.spec().log_path)));
      }
    }
    return absl::OkStatus();
  }

  // Restarts an exited role within its budget, or fails the run naming it.
  absl::Status Revive(ChildProcess& child, int* restarts, int budget) {
    const int status = *child.Poll();
    const ChildSpec spec = child.spec();
    if (*restarts >= budget) {
      return absl::AbortedError(absl::StrCat(spec.name, " ", DescribeWaitStatus(status),
                                             " and its restart budget (", budget, ") is spent; ",
                                             spec.log_path, ":\n", Tail(spec.log_path)));
    }
    ++*restarts;
    std::printf("supervisor: %s %s; restarting it (%d/%d)\n", spec.name.c_str(),
                DescribeWaitStatus(status).c_str(), *restarts, budget);
    std::fflush(stdout);
    PRL_ASSIGN_OR_RETURN(child, ChildProcess::Start(spec));
    return absl::OkStatus();
  }

  // Keeps pending train prompts ahead of the learner: a chunk at a time, each with an
  // idempotency key so that a retried submit is not duplicated.
  absl::Status FeedPrompts() {
    const int64_t g = c_.learner.groups_per_step;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListPromptSetsResponse list;
    if (!prompts_->ListPromptSets(&ctx, v1::ListPromptSetsRequest(), &list).ok()) {
      return absl::OkStatus();  // the coordinator is restarting: try again next tick
    }
    int64_t pending = 0;
    in_flight_ = 0;
    for (const v1::PromptSetStatus& s : list.prompt_sets()) {
      pending += s.prompts_pending();
      in_flight_ += s.prompts_in_flight();
    }
    // Enough pending that the actors never wait for prompts within the staleness budget (the
    // coordinator leases at most (max_lag + 1) steps' worth), submitted a few steps at a time.
    if (pending >= (c_.learner.max_lag + 2) * g) return absl::OkStatus();
    const int64_t chunk = 8 * g;
    PRL_ASSIGN_OR_RETURN(const std::vector<task::ArithmeticProblem> problems,
                         task::GenerateProblems(TaskConfig(c_), task::Split::kTrain,
                                                c_.run.seed * 104729 + 17 + chunks_, chunk));
    const task::CharTokenizer tokenizer;
    v1::SubmitPromptSetRequest request;
    request.set_name(absl::StrCat(c_.run.name, " train chunk ", chunks_));
    request.set_idempotency_key(absl::StrCat("prl-run/", c_.run.name, "/chunk/", chunks_));
    request.set_samples_per_prompt(c_.task.samples_per_prompt);
    v1::RolloutSampling* sampling = request.mutable_sampling();
    sampling->set_temperature(static_cast<float>(c_.task.temperature));
    sampling->set_top_p(static_cast<float>(c_.task.top_p));
    sampling->set_max_tokens(c_.task.max_tokens);
    sampling->set_seed(c_.run.seed * 31 + chunks_);
    sampling->add_stop_token_ids(tokenizer.eos_id());
    request.mutable_reward()->set_name(c_.task.reward);
    if (c_.task.reward == "arithmetic") {
      (*request.mutable_reward()->mutable_params())["credit"] = c_.task.credit;
    }
    for (const task::ArithmeticProblem& p : problems) {
      PRL_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, task::PromptTokens(tokenizer, p));
      v1::Prompt* prompt = request.add_prompts();
      prompt->mutable_tokens()->mutable_ids()->Assign(ids.begin(), ids.end());
      prompt->set_reference(p.answer);
    }
    grpc::ClientContext submit_ctx;
    submit_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitPromptSetResponse response;
    const grpc::Status s = prompts_->SubmitPromptSet(&submit_ctx, request, &response);
    if (s.ok()) {
      ++chunks_;
    } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator refused the train prompts: ", s.error_message()));
    }
    return absl::OkStatus();
  }

  void ReadSteps() {
    std::ifstream in(dir_ + "/learner_steps.jsonl");
    in.seekg(steps_offset_);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a partial last line: read it next time
      steps_offset_ += static_cast<std::streamoff>(line.size() + 1);
      Json j = Json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      StepLine s;
      s.step = j.value("step", int64_t{0});
      s.version = j.value("version", int64_t{0});
      s.samples = j.value("samples", int64_t{0});
      s.completion_tokens = j.value("completion_tokens", int64_t{0});
      s.trained_tokens = j.value("trained_tokens", int64_t{0});
      s.unix_time = j.value("unix_time", 0.0);
      s.reward = j.value("mean_reward", 0.0);
      s.lag_mean = j.value("lag_mean", 0.0);
      s.lag_max = j.value("lag_max", 0.0);
      s.kl = j.value("kl_behaviour_learner", 0.0);
      s.ratio = j.value("mean_ratio", 1.0);
      steps_.push_back(s);
      total_tokens_ += s.completion_tokens;
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - rl_start_);
      std::printf(
          "step %3lld/%lld | version %3lld | reward %.3f | lag mean %.2f max %.0f | %6.0f tok/s | "
          "%4lld samples in flight | %.0f s\n",
          static_cast<long long>(s.step), static_cast<long long>(c_.learner.steps),
          static_cast<long long>(s.version), s.reward, s.lag_mean, s.lag_max,
          elapsed > 0 ? static_cast<double>(total_tokens_) / elapsed : 0.0,
          static_cast<long long>(in_flight_ * c_.task.samples_per_prompt), elapsed);
      std::fflush(stdout);
    }
  }

  absl::Status Supervise() {
    absl::Time next_feed = absl::InfinitePast();
    while (true) {
      if (Interrupted()) return absl::CancelledError("interrupted");
      if (absl::Now() >= next_feed) {
        PRL_RETURN_IF_ERROR(FeedPrompts());
        next_feed = absl::Now() + absl::Milliseconds(100);
      }
      ReadSteps();
      if (!coordinator_->running()) {
        PRL_RETURN_IF_ERROR(Revive(*coordinator_, &coordinator_restarts_, c_.learner.max_restarts));
      }
      for (ChildProcess& a : actors_) {
        if (!a.running()) PRL_RETURN_IF_ERROR(Revive(a, &actor_restarts_, c_.actors.max_restarts));
      }
      if (!learner_->running()) {
        const int status = *learner_->Poll();
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // took learner.steps steps
        PRL_RETURN_IF_ERROR(Revive(*learner_, &learner_restarts_, c_.learner.max_restarts));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    rl_seconds_ = absl::ToDoubleSeconds(absl::Now() - rl_start_);
    ReadSteps();
    return absl::OkStatus();
  }

  void StopRoles() {
    for (ChildProcess& a : actors_) a.Stop(absl::Seconds(10));
    actors_.clear();
    if (learner_.has_value()) learner_->Stop(absl::Seconds(30));
    learner_.reset();
    if (coordinator_.has_value()) coordinator_->Stop(absl::Seconds(10));
    coordinator_.reset();
  }

  absl::Status Export() {
    const std::string log = dir_ + "/logs/export.log";
    PRL_ASSIGN_OR_RETURN(ChildProcess exp,
                         ChildProcess::Start({"export",
                                              {o_.prl_path, "export", "--checkpoint-dir",
                                               c_.checkpoint_dir(), "--out", dir_ + "/model-final"},
                                              log,
                                              {}}));
    const int status = exp.Wait();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(
          absl::StrCat("prl export ", DescribeWaitStatus(status), "; ", log, ":\n", Tail(log)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> WriteSummary() {
    int64_t samples = 0;
    double lag_sum = 0, lag_max = 0;
    Json curve = Json::array();
    for (const StepLine& s : steps_) {
      samples += s.samples;
      lag_sum += s.lag_mean * static_cast<double>(s.samples);
      lag_max = std::max(lag_max, s.lag_max);
      curve.push_back(
          {{"step", s.step},
           {"seconds", s.unix_time - absl::ToDoubleSeconds(rl_start_ - absl::UnixEpoch())},
           {"reward", s.reward},
           {"lag_mean", s.lag_mean},
           {"kl_behaviour_learner", s.kl}});
    }
    Json j;
    j["run"] = c_.run.name;
    j["mode"] = c_.run.mode;
    j["eval_before"] = eval_before_;
    j["eval_after"] = eval_after_;
    j["eval_prompts"] = c_.task.eval_prompts;
    j["steps"] = steps_.empty() ? 0 : steps_.back().step;
    j["samples"] = samples;
    j["completion_tokens"] = total_tokens_;
    j["rl_seconds"] = rl_seconds_;
    j["tokens_per_second"] = rl_seconds_ > 0 ? static_cast<double>(total_tokens_) / rl_seconds_ : 0;
    j["samples_per_second"] = rl_seconds_ > 0 ? static_cast<double>(samples) / rl_seconds_ : 0;
    j["mean_lag"] = samples > 0 ? lag_sum / static_cast<double>(samples) : 0;
    j["max_lag"] = lag_max;
    j["warm_start_seconds"] = sft_seconds_;
    j["restarts"] = {{"actor", actor_restarts_},
                     {"learner", learner_restarts_},
                     {"coordinator", coordinator_restarts_}};
    j["model_final"] = dir_ + "/model-final";
    j["config"] = role_config_;
    j["reward_curve"] = curve;
    const std::string path = dir_ + "/summary.json";
    std::ofstream f(path);
    f << j.dump(2) << "\n";
    if (!f) return absl::InternalError(absl::StrCat("writing ", path));
    std::printf(
        "done: %lld steps, %lld samples in %.0f s (%.0f tok/s), lag mean %.2f max %.0f; "
        "held-out accuracy %.3f -> %.3f\n",
        static_cast<long long>(j["steps"].get<int64_t>()), static_cast<long long>(samples),
        rl_seconds_, j["tokens_per_second"].get<double>(), j["mean_lag"].get<double>(), lag_max,
        eval_before_, eval_after_);
    return path;
  }

  const LocalRunOptions& o_;
  const config::RunConfig c_;
  const std::string dir_;
  std::string start_model_, role_config_, coordinator_address_;
  ChildSpec coordinator_spec_, learner_spec_;
  std::vector<ChildSpec> actor_specs_;
  std::optional<ChildProcess> coordinator_, learner_;
  std::vector<ChildProcess> actors_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PromptService::Stub> prompts_;
  int64_t chunks_ = 0, in_flight_ = 0, total_tokens_ = 0;
  std::streamoff steps_offset_ = 0;
  std::vector<StepLine> steps_;
  int actor_restarts_ = 0, learner_restarts_ = 0, coordinator_restarts_ = 0;
  double eval_before_ = 0, eval_after_ = 0, sft_seconds_ = 0, rl_seconds_ = 0;
  absl::Time rl_start_ = absl::Now();
};

}  // namespace

absl::StatusOr<std::string> RunLocal(const LocalRunOptions& options) {
  Run run(options);
  return run.Execute();
}

}  // namespace prl::runner
