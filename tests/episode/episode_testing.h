// Shared fixtures for the episode floor's tests: a tiny model over the built-in character
// vocabulary, a scripted environment served over gRPC on loopback (it records every call), and
// a loop that drives an EpisodeEngine until a condition holds.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "env/environment.h"
#include "env/environment_server.h"
#include "episode/episode_engine.h"
#include "model/parameters.h"
#include "task/char_text_codec.h"
#include "task/char_tokenizer.h"

namespace prl::episode::testing {

// A tiny random model over `vocab` tokens (the built-in character vocabulary by default).
inline std::shared_ptr<const ParameterSet> TinyCharWeights(
    int64_t context = 128, int64_t vocab = task::CharTokenizer().vocab_size()) {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen2, /*attention_bias=*/true, &c);
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = vocab;
  c.max_position_embeddings = context;
  c.tie_word_embeddings = true;
  auto set = std::make_shared<ParameterSet>(*ParameterSet::Allocate(c, Device::Cpu(), false));
  InitializeParameters(*set, 5, 0.3f);
  return set;
}

// An environment whose answers follow a script; thread-safe; records every call.
class ScriptedEnvironment final : public env::Environment {
 public:
  struct Script {
    std::string observation;         // the first observation's user message ("" none)
    int done_after_turns = 2;        // the turn that many turns in is answered done, reward 1
    absl::Status step_error;         // every Step fails with this
    bool hang_steps = false;         // Step waits for Release()
    int unavailable_from_turn = -1;  // Steps of this turn and later answer UNAVAILABLE
    double end_reward = 0.25;
    std::string tools_json;  // StartEpisodeResponse.tools_json
  };
  struct Ended {
    std::string episode_id;
    bool truncated = false, aborted = false;
    std::string reason;
  };

  explicit ScriptedEnvironment(Script script) : script_(std::move(script)) {}

  absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(
      const v1::StartEpisodeRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    started_.push_back(request);
    changed_.notify_all();
    v1::StartEpisodeResponse r;
    r.set_tools_json(script_.tools_json);
    if (!script_.observation.empty()) {
      v1::EnvMessage* m = r.add_observation();
      m->set_role("user");
      m->set_content(script_.observation);
    }
    return r;
  }
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request) override {
    std::unique_lock<std::mutex> lock(mu_);
    steps_.push_back(request);
    changed_.notify_all();
    if (script_.hang_steps) changed_.wait(lock, [&] { return released_; });
    if (!script_.step_error.ok()) return script_.step_error;
    if (script_.unavailable_from_turn >= 0 &&
        request.turn_index() >= script_.unavailable_from_turn) {
      return absl::UnavailableError("scripted: going down");
    }
    v1::StepResponse r;
    if (request.turn_index() + 1 >= script_.done_after_turns) {
      r.set_done(true);
      r.set_episode_reward(1.0);
      r.set_done_reason("scripted");
      return r;
    }
    v1::EnvMessage* m = r.add_messages();
    m->set_role("user");
    m->set_content("+");
    return r;
  }
  absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(const v1::EndEpisodeRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_.push_back(
        {request.episode_id(), request.truncated(), request.aborted(), request.reason()});
    changed_.notify_all();
    v1::EndEpisodeResponse r;
    r.set_episode_reward(script_.end_reward);
    return r;
  }

  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }
  // Waits until `ready` holds of the recorded calls.
  void WaitUntil(const std::function<bool(const ScriptedEnvironment&)>& ready) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return ready(*this); });
  }
  std::vector<v1::StartEpisodeRequest> started() const {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  std::vector<v1::StepRequest> steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  std::vector<Ended> ended() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }
  // (With the lock held, for WaitUntil's predicates.)
  size_t steps_locked() const { return steps_.size(); }
  size_t ended_locked() const { return ended_.size(); }
  size_t started_locked() const { return started_.size(); }

 private:
  const Script script_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool released_ = false;
  std::vector<v1::StartEpisodeRequest> started_;
  std::vector<v1::StepRequest> steps_;
  std::vector<Ended> ended_;
};

// A scripted environment served as "scripted" on loopback (port 0: a free one).
struct ServedEnvironment {
  std::shared_ptr<ScriptedEnvironment> env;
  std::unique_ptr<env::EnvironmentServer> server;
  std::string address;

  static ServedEnvironment Start(ScriptedEnvironment::Script script, int port = 0) {
    ServedEnvironment s;
    s.env = std::make_shared<ScriptedEnvironment>(std::move(script));
    env::EnvironmentServerOptions o;
    o.address = absl::StrCat("127.0.0.1:", port);
    auto server = env::EnvironmentServer::Start({{"scripted", s.env}}, o);
    EXPECT_TRUE(server.ok()) << server.status();
    s.server = std::move(*server);
    s.address = absl::StrCat("127.0.0.1:", s.server->port());
    return s;
  }
};

inline v1::EnvironmentSpec RemoteSpec(const std::string& address, double timeout_s = 2) {
  v1::EnvironmentSpec spec;
  spec.set_name("scripted");
  spec.set_address(address);
  spec.set_max_turns(8);
  spec.set_max_tokens_per_turn(4);
  spec.set_timeout_s(timeout_s);
  return spec;
}

// A group of `n` samples of the prompt "(1-100)=" with episodes against `spec`.
inline GroupRequest EpisodeGroup(const std::string& id, const v1::EnvironmentSpec& spec,
                                 int32_t n = 2) {
  GroupRequest g;
  g.id = id;
  g.prompt = *task::CharTokenizer().Encode("(1-100)=");
  g.params.n = n;
  g.params.temperature = 1.0f;
  g.params.max_tokens = spec.max_tokens_per_turn();
  g.params.seed = 7;
  g.params.stop_token_ids = {task::CharTokenizer::kEos};
  g.environment = spec;
  g.reference = "42";
  return g;
}

// An EpisodeEngine over the tiny model, driven by Run until a condition holds; finished and
// failed groups are collected.
class EpisodeLoop {
 public:
  // The tiny model over `codec`'s vocabulary (default: the character codec's).
  explicit EpisodeLoop(EpisodeEngineOptions options = {}, int64_t context = 128,
                       int64_t kv_cache_bytes = int64_t{4} << 20,
                       std::shared_ptr<const tokenizer::TextCodec> codec = nullptr) {
    if (codec == nullptr) codec = std::make_shared<task::CharTextCodec>();
    EngineOptions o;
    o.kv_cache_bytes = kv_cache_bytes;
    auto engine = Engine::Create(TinyCharWeights(context, codec->vocab_size()), 0, o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    episodes_ = std::make_unique<EpisodeEngine>(std::move(*engine), std::move(codec), options,
                                                [this] { Wake(); });
  }

  EpisodeEngine& episodes() { return *episodes_; }
  std::vector<FinishedGroup>& finished() { return finished_; }
  std::vector<FailedGroup>& failed() { return failed_; }

  // Steps until `done` holds (checked after every step); false when the engine ran out of
  // groups first.
  bool Run(const std::function<bool()>& done) {
    for (;;) {
      if (done()) return true;
      const bool runnable = episodes_->Runnable();
      EXPECT_TRUE(episodes_->Step().ok());
      for (FinishedGroup& g : episodes_->TakeFinished()) finished_.push_back(std::move(g));
      for (FailedGroup& g : episodes_->TakeFailed()) failed_.push_back(std::move(g));
      if (done()) return true;
      if (episodes_->empty()) return false;
      if (!runnable) {  // waiting for an environment: its answer wakes us (outages are polled)
        std::unique_lock<std::mutex> lock(mu_);
        woken_.wait_for(lock, std::chrono::milliseconds(20), [&] { return wake_; });
        wake_ = false;
      }
    }
  }
  bool RunToEnd() {
    return Run([&] { return episodes_->empty(); });
  }
  // Forgets wakes so far; WaitForWake then waits for the next (an answer in the inbox).
  void ClearWake() {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = false;
  }
  void WaitForWake() {
    std::unique_lock<std::mutex> lock(mu_);
    woken_.wait(lock, [&] { return wake_; });
    wake_ = false;
  }

 private:
  void Wake() {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
    woken_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable woken_;
  bool wake_ = false;
  std::unique_ptr<EpisodeEngine> episodes_;
  std::vector<FinishedGroup> finished_;
  std::vector<FailedGroup> failed_;
};

}  // namespace prl::episode::testing
