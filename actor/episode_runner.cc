#include "actor/episode_runner.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "actor/turn_renderer.h"
#include "core/status_macros.h"

namespace prl::actor {

namespace v1 = prl::v1;

struct EpisodeRunner::Episode {
  std::string id;                 // "<lease id>/<sample>"
  int32_t turn = 0;               // turns the environment answered
  int64_t completion_tokens = 0;  // the model's and the environment's so far
  EpisodeOutcome outcome;
};

struct EpisodeRunner::Group {
  v1::LeasedPrompt lease;
  std::shared_ptr<env::Environment> env;
  int64_t max_sequence_tokens = 0;
  uint64_t request_id = 0;
  std::vector<Episode> episodes;
  int32_t started = 0;
  std::optional<std::vector<int32_t>> observation;  // the first observation, rendered
  std::vector<std::string> stop_strings;
  absl::Status failure;
  int64_t prompt_tokens = 0;  // the prompt and the first observation
  bool aborted = false;
};

EpisodeRunner::EpisodeRunner(std::shared_ptr<const tokenizer::TextCodec> codec, int threads,
                             std::function<void()> wake, metrics::ActorMetrics* metrics)
    : codec_(std::move(codec)), wake_(std::move(wake)), metrics_(metrics) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

EpisodeRunner::~EpisodeRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

template <typename Call>
auto EpisodeRunner::Timed(Call&& call) -> decltype(call()) {
  const absl::Time start = absl::Now();
  auto result = call();
  if (metrics_ != nullptr) {
    metrics_->environment_latency_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return result;
}

void EpisodeRunner::Run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_jobs_;
    }
    job();
    std::lock_guard<std::mutex> lock(mu_);
    --running_jobs_;
  }
}

void EpisodeRunner::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  work_.notify_one();
}

void EpisodeRunner::Push(Action action) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    actions_.push_back(std::move(action));
  }
  if (wake_) wake_();
}

void EpisodeRunner::StartGroup(const v1::LeasedPrompt& lease, int64_t max_sequence_tokens) {
  auto group = std::make_shared<Group>();
  group->lease = lease;
  group->max_sequence_tokens = max_sequence_tokens;
  for (int32_t j = 0; j < lease.samples(); ++j) {
    group->episodes.push_back({absl::StrCat(lease.lease_id(), "/", j), 0, 0, {}});
  }
  absl::StatusOr<std::shared_ptr<env::Environment>> env = environments_.For(lease.environment());
  if (!env.ok() || codec_ == nullptr) {
    Action abort = Action::Of(Action::Kind::kAbort, lease.lease_id());
    abort.failure = !env.ok() ? env.status()
                              : absl::FailedPreconditionError(
                                    "agentic episodes need the model's text (a tokenizer)");
    return Push(std::move(abort));
  }
  group->env = *env;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups_[lease.lease_id()] = group;
  }
  for (int32_t j = 0; j < lease.samples(); ++j) {
    Post([this, id = lease.lease_id(), j] { StartEpisode(id, j); });
  }
}

void EpisodeRunner::StartEpisode(const std::string& lease_id, int32_t sample) {
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(lease_id);
    if (it == groups_.end()) return;
    g = it->second;
  }
  const v1::LeasedPrompt& lease = g->lease;
  const std::vector<int32_t> prompt(lease.prompt_tokens().begin(), lease.prompt_tokens().end());
  v1::StartEpisodeRequest request;
  request.set_episode_id(g->episodes[sample].id);
  request.set_environment(lease.environment().name());
  absl::StatusOr<std::string> text = codec_->DecodeCompletion(prompt);
  request.set_prompt_text(text.ok() ? *text : "");
  request.set_reference(lease.reference());
  *request.mutable_parameters() = lease.environment().parameters();
  request.set_sample_index(sample);
  request.set_max_turns(lease.environment().max_turns());
  absl::StatusOr<v1::StartEpisodeResponse> started =
      Timed([&] { return g->env->StartEpisode(request); });
  absl::StatusOr<std::vector<int32_t>> observation =
      started.ok() ? RenderReply(*codec_, started->observation(), -1) : started.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (!observation.ok() && g->failure.ok()) g->failure = observation.status();
  if (observation.ok()) {
    if (!g->observation.has_value()) {
      g->observation = *observation;
      g->stop_strings.assign(started->stop_strings().begin(), started->stop_strings().end());
    } else if (*g->observation != *observation && g->failure.ok()) {
      g->failure = absl::FailedPreconditionError(
          "the environment gave the samples of one group different first observations; prl "
          "runs a group from one prompt (give every sample the same rules)");
    }
  }
  if (++g->started < static_cast<int32_t>(g->episodes.size())) return;
  Action action = Action::Of(Action::Kind::kAddGroup, lease_id);
  if (!g->failure.ok()) {
    action.kind = Action::Kind::kAbort;
    action.failure = g->failure;
    g->aborted = true;
  } else {
    action.tokens = prompt;
    action.tokens.insert(action.tokens.end(), g->observation->begin(), g->observation->end());
    g->prompt_tokens = static_cast<int64_t>(action.tokens.size());
    action.params.multi_turn = true;
    action.params.max_tokens = lease.environment().max_tokens_per_turn();
    if (!g->stop_strings.empty()) {
      // The turn's text ends with a stop string: its last tokens are enough to tell.
      action.params.end_turn = [codec = codec_, stops = g->stop_strings](
                                   absl::Span<const int32_t> turn) {
        const size_t tail = std::min<size_t>(turn.size(), 32);
        absl::StatusOr<std::string> text =
            codec->DecodeCompletion(turn.subspan(turn.size() - tail));
        if (!text.ok()) return false;
        return std::any_of(stops.begin(), stops.end(),
                           [&](const std::string& s) { return absl::EndsWith(*text, s); });
      };
    }
  }
  actions_.push_back(std::move(action));
  if (wake_) wake_();
}

void EpisodeRunner::Bind(const std::string& lease_id, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(lease_id);
  if (it == groups_.end()) return;
  it->second->request_id = request_id;
  by_request_[request_id] = lease_id;
}

void EpisodeRunner::OnTurn(const TurnOutput& turn) {
  std::string lease_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_request_.find(turn.request_id);
    if (it == by_request_.end()) return;
    lease_id = it->second;
  }
  Post([this, lease_id, turn] { Step(lease_id, turn); });
}

void EpisodeRunner::Step(const std::string& lease_id, TurnOutput turn) {
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(lease_id);
    if (it == groups_.end() || it->second->aborted) return;
    g = it->second;
  }
  Episode& ep = g->episodes[turn.sample_index];  // this sample's turns run one at a time
  const v1::EnvironmentSpec& spec = g->lease.environment();
  const auto abort = [&](const absl::Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (g->aborted) return;
      g->aborted = true;
      Action a = Action::Of(Action::Kind::kAbort, lease_id, g->request_id);
      a.failure = absl::Status(why.code(), absl::StrCat("episode ", ep.id, ": ", why.message()));
      actions_.push_back(std::move(a));
    }
    if (wake_) wake_();
  };
  const auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      actions_.push_back(
          Action::Of(Action::Kind::kFinish, lease_id, g->request_id, turn.sample_index));
    }
    if (wake_) wake_();
  };
  const auto truncate = [&](const std::string& reason) {
    v1::EndEpisodeRequest end;
    end.set_episode_id(ep.id);
    end.set_truncated(true);
    end.set_reason(reason);
    absl::StatusOr<v1::EndEpisodeResponse> scored = Timed([&] { return g->env->EndEpisode(end); });
    if (!scored.ok()) return abort(scored.status());
    ep.outcome.reward = scored->episode_reward();
    ep.outcome.truncated = true;
    ep.outcome.reason = reason;
    finish();
  };
  // The turn, as the environment sees it.
  const auto& stops = g->lease.sampling().stop_token_ids();
  const bool stop_token = !turn.tokens.empty() &&
                          std::find(stops.begin(), stops.end(), turn.tokens.back()) != stops.end();
  v1::StepRequest request;
  request.set_episode_id(ep.id);
  request.set_turn_index(ep.turn);
  absl::StatusOr<std::string> text = codec_->DecodeCompletion(turn.tokens);
  if (!text.ok()) return abort(text.status());
  request.set_text(*text);
  request.mutable_token_ids()->Assign(turn.tokens.begin(), turn.tokens.end());
  request.set_turn_end(turn.reason == FinishReason::kLength ? v1::TURN_END_MAX_TOKENS
                       : stop_token                          ? v1::TURN_END_END_OF_TURN
                                                             : v1::TURN_END_STOP_STRING);
  absl::StatusOr<v1::StepResponse> answer = Timed([&] { return g->env->Step(request); });
  if (!answer.ok()) return abort(answer.status());
  ++ep.turn;
  ep.completion_tokens += static_cast<int64_t>(turn.tokens.size());
  ep.outcome.turn_ends.push_back(static_cast<uint32_t>(ep.completion_tokens));
  ep.outcome.turn_rewards.push_back(answer->has_turn_reward() ? answer->turn_reward() : 0.0);
  if (answer->done()) {
    ep.outcome.reward = answer->episode_reward();
    ep.outcome.reason = answer->done_reason();
    return finish();
  }
  if (ep.turn >= spec.max_turns()) return truncate(absl::StrCat("max_turns ", spec.max_turns()));
  absl::StatusOr<std::vector<int32_t>> reply =
      RenderReply(*codec_, answer->messages(), turn.tokens.empty() ? -1 : turn.tokens.back());
  if (!reply.ok()) return abort(reply.status());
  const int64_t after = ep.completion_tokens + static_cast<int64_t>(reply->size());
  int64_t room = g->max_sequence_tokens - g->prompt_tokens - after;  // for the next turn
  if (spec.max_episode_tokens() > 0) {
    room = std::min<int64_t>(room, spec.max_episode_tokens() - after);
    if (room < 1) return truncate(absl::StrCat("max_episode_tokens ", spec.max_episode_tokens()));
  }
  if (room < 1) return truncate(absl::StrCat("context ", g->max_sequence_tokens));
  ep.completion_tokens = after;
  Action next = Action::Of(Action::Kind::kContinue, lease_id, g->request_id, turn.sample_index);
  next.tokens = *std::move(reply);
  next.max_tokens = static_cast<int32_t>(std::min<int64_t>(room, spec.max_tokens_per_turn()));
  Push(std::move(next));
}

absl::StatusOr<uint64_t> EpisodeRunner::Apply(Engine& engine, Action& a, SamplingParams base) {
  switch (a.kind) {
    case Action::Kind::kAddGroup:
      base.multi_turn = true;
      base.max_tokens = a.params.max_tokens;
      base.end_turn = std::move(a.params.end_turn);
      return engine.AddRequest(std::move(a.tokens), base);
    case Action::Kind::kContinue:
      PRL_RETURN_IF_ERROR(engine.Continue(a.request_id, a.sample, a.tokens, a.max_tokens));
      return 0;
    case Action::Kind::kFinish:
      PRL_RETURN_IF_ERROR(engine.FinishSample(a.request_id, a.sample));
      return 0;
    case Action::Kind::kAbort:
      return a.failure;
  }
  return absl::InternalError("EpisodeRunner::Apply: unknown action");
}

std::vector<EpisodeRunner::Action> EpisodeRunner::TakeActions() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Action> out;
  out.swap(actions_);
  return out;
}

std::vector<EpisodeOutcome> EpisodeRunner::TakeOutcome(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<EpisodeOutcome> out;
  auto it = by_request_.find(request_id);
  if (it == by_request_.end()) return out;
  auto g = groups_.find(it->second);
  if (g != groups_.end()) {
    for (Episode& e : g->second->episodes) out.push_back(std::move(e.outcome));
    groups_.erase(g);
  }
  by_request_.erase(it);
  return out;
}

void EpisodeRunner::Forget(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(lease_id);
  if (it == groups_.end()) return;
  it->second->aborted = true;
  by_request_.erase(it->second->request_id);
  groups_.erase(it);
}

bool EpisodeRunner::Busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_jobs_ > 0 || !jobs_.empty() || !actions_.empty();
}

}  // namespace prl::actor
