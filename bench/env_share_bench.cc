#include "bench/env_share_bench.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "actor/actor.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_server.h"
#include "core/status_macros.h"
#include "env/environment_server.h"
#include "env/guess_number.h"
#include "model/presets.h"
#include "task/char_text_codec.h"
#include "task/char_tokenizer.h"

namespace prl::bench {

namespace {

namespace v1 = prl::v1;

// Accepts every episode and never answers a turn (until Release, at teardown).
class HungEnvironment final : public env::Environment {
 public:
  absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(const v1::StartEpisodeRequest&) override {
    return v1::StartEpisodeResponse();
  }
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest&) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++steps_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_; });
    return absl::UnavailableError("hung environment released");
  }
  absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(const v1::EndEpisodeRequest&) override {
    return v1::EndEpisodeResponse();
  }
  // Waits until `n` turns are stuck here.
  void WaitForSteps(int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return steps_ >= n; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int64_t steps_ = 0;
  bool released_ = false;
};

// The "tiny" preset over the built-in character vocabulary, random weights.
absl::StatusOr<std::shared_ptr<const ParameterSet>> TinyModel() {
  PRL_ASSIGN_OR_RETURN(ModelConfig c, PresetConfig("tiny"));
  c.vocab_size = task::CharTokenizer().vocab_size();
  PRL_ASSIGN_OR_RETURN(ParameterSet set, ParameterSet::Allocate(c, Device::Cpu(), false));
  InitializeParameters(set, 3, 0.3f);
  return std::make_shared<const ParameterSet>(std::move(set));
}

v1::SubmitPromptSetRequest GameSet(const EnvShareBenchOptions& o, const std::string& name,
                                   const std::string& address, int prompts) {
  v1::SubmitPromptSetRequest r;
  r.set_name(name);
  for (int i = 0; i < prompts; ++i) {
    v1::Prompt* p = r.add_prompts();
    p->set_text("(1-50)=");
    p->set_reference(absl::StrCat(1 + (37 * i) % 50));
  }
  r.set_samples_per_prompt(o.samples_per_prompt);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_top_p(1.0f);
  r.mutable_sampling()->set_max_tokens(4);
  v1::EnvironmentSpec* e = r.mutable_environment();
  e->set_name(name);
  e->set_address(address);
  e->set_max_turns(o.max_turns);
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{{"low", "1"},
                                                                             {"high", "50"},
                                                                             {"higher_text", "+"},
                                                                             {"lower_text", "-"},
                                                                             {"rules_text", "#"}}) {
    (*e->mutable_parameters())[k] = v;
  }
  return r;
}

// The healthy set's prompts completed per second, alone or beside the hung set.
absl::StatusOr<double> Measure(const EnvShareBenchOptions& o, bool beside) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("prl_env_share_bench_", getpid(), beside ? "_beside" : "_alone");
  std::filesystem::remove_all(dir);
  // Two servers, as two environments would be (the hung one's blocked calls hold its own
  // server's threads).
  auto hung = std::make_shared<HungEnvironment>();
  PRL_ASSIGN_OR_RETURN(
      auto healthy_server,
      env::EnvironmentServer::Start({{"healthy", std::make_shared<env::GuessNumberEnvironment>()}},
                                    {.address = "127.0.0.1:0"}));
  PRL_ASSIGN_OR_RETURN(auto hung_server,
                       env::EnvironmentServer::Start({{"hung", hung}}, {.address = "127.0.0.1:0"}));
  const std::string healthy_address = absl::StrCat("127.0.0.1:", healthy_server->port());
  const std::string hung_address = absl::StrCat("127.0.0.1:", hung_server->port());
  coordinator::CoordinatorConfig cc;
  cc.log_path = (dir / "prompts.log").string();
  cc.vocab_size = task::CharTokenizer().vocab_size();
  cc.max_position_embeddings = 256;
  cc.lease_ms = 60'000;
  cc.heartbeat_ms = 100;
  cc.text = std::make_shared<task::CharTextCodec>();
  cc.env_addresses = {healthy_address, hung_address};
  PRL_ASSIGN_OR_RETURN(auto coordinator, coordinator::Coordinator::Open(cc));
  PRL_ASSIGN_OR_RETURN(auto server,
                       coordinator::CoordinatorServer::Start(coordinator.get(), "127.0.0.1:0"));
  actor::ActorOptions ao;
  ao.coordinator = absl::StrCat("127.0.0.1:", server->port());
  ao.name = "bench-actor";
  ao.engine.kv_cache_bytes = int64_t{16} << 20;
  ao.max_prompts_in_flight = o.max_prompts_in_flight;
  ao.text = std::make_shared<task::CharTextCodec>();
  std::atomic<int64_t> groups{0};
  PRL_ASSIGN_OR_RETURN(std::shared_ptr<const ParameterSet> model, TinyModel());
  PRL_ASSIGN_OR_RETURN(auto a, actor::Actor::Create(
                                   model, 0,
                                   [&](absl::Span<const RolloutRecord>) {
                                     ++groups;  // scored; dropped instead of written
                                     return absl::OkStatus();
                                   },
                                   nullptr, ao));
  std::atomic<bool> stop{false};
  absl::Status ran;
  std::thread actor_thread([&] { ran = a->Run(&stop); });
  absl::Status measured = absl::OkStatus();
  double rate = 0;
  if (beside) {  // the hung set holds every slot first
    measured =
        coordinator->Submit(GameSet(o, "hung", hung_address, 4 * o.max_prompts_in_flight)).status();
    if (measured.ok()) hung->WaitForSteps(int64_t{o.max_prompts_in_flight} * o.samples_per_prompt);
  }
  if (measured.ok()) {
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::SubmitPromptSetResponse> healthy =
        coordinator->Submit(GameSet(o, "healthy", healthy_address, o.prompts));
    measured = healthy.status();
    while (measured.ok()) {
      const v1::PromptSetStatus s = *coordinator->Get(healthy->prompt_set_id());
      if (s.prompts_done() + s.prompts_failed() == o.prompts) {
        rate = s.prompts_done() / absl::ToDoubleSeconds(absl::Now() - start);
        if (s.prompts_failed() > 0) {
          measured =
              absl::InternalError(absl::StrCat(s.prompts_failed(), " healthy prompts failed"));
        }
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  stop = true;
  hung->Release();
  actor_thread.join();
  a.reset();
  server.reset();
  coordinator.reset();
  healthy_server.reset();
  hung_server.reset();
  std::filesystem::remove_all(dir);
  PRL_RETURN_IF_ERROR(measured);
  PRL_RETURN_IF_ERROR(ran);
  if (o.progress) {
    std::fprintf(stderr, "env-share: healthy %s: %.2f prompts/s\n",
                 beside ? "beside hung" : "alone", rate);
  }
  return rate;
}

}  // namespace

absl::StatusOr<Report> RunEnvShareBench(const EnvShareBenchOptions& o) {
  if (o.prompts < 1 || o.samples_per_prompt < 1 || o.max_prompts_in_flight < 2 || o.max_turns < 1) {
    return absl::InvalidArgumentError(
        "bench env-share: expected prompts, samples, max_turns >= 1 and max_prompts_in_flight >= "
        "2");
  }
  PRL_ASSIGN_OR_RETURN(const double alone, Measure(o, false));
  PRL_ASSIGN_OR_RETURN(const double beside, Measure(o, true));
  Report report;
  report.bench = "env-share";
  report.machine = MachineInfo();
  report.setup = {{"healthy prompts", absl::StrCat(o.prompts)},
                  {"samples per prompt", absl::StrCat(o.samples_per_prompt)},
                  {"actor prompt slots", absl::StrCat(o.max_prompts_in_flight)},
                  {"max turns", absl::StrCat(o.max_turns)},
                  {"environment", "built-in guess_number over gRPC; the hung one never answers"}};
  report.results.push_back(
      {"healthy set beside a hung set", beside, "prompts/s", "healthy set alone", alone});
  return report;
}

}  // namespace prl::bench
