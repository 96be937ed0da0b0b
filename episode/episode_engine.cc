#include "episode/episode_engine.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "env/episode_protocol.h"
#include "episode/episode_engine_internal.h"
#include "episode/episode_protocol.h"
#include "episode/stop_strings.h"

namespace prl::episode {

namespace v1 = prl::v1;

namespace {

constexpr int32_t kMaxOutageRestarts = 8;

absl::Status InEpisode(const std::string& episode_id, const absl::Status& why) {
  return absl::Status(why.code(), absl::StrCat("episode ", episode_id, ": ", why.message()));
}

}  // namespace

EpisodeEngine::EpisodeEngine(std::unique_ptr<Engine> engine,
                             std::shared_ptr<const tokenizer::TextCodec> codec,
                             EpisodeEngineOptions options, std::function<void()> wake)
    : engine_(std::move(engine)),
      codec_(std::move(codec)),
      options_(options),
      inbox_(std::make_unique<Inbox>(std::move(wake))),
      pool_(options.calls_per_environment) {}

EpisodeEngine::~EpisodeEngine() {
  std::vector<std::string> ids;
  for (const auto& [id, g] : groups_) ids.push_back(id);
  for (const std::string& id : ids) Abort(id, "the actor is stopping");
  // The notifications get a moment; then every call in flight is cancelled.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  for (const std::shared_ptr<Endpoint>& e : pool_.endpoints()) {
    while (e->calls_pending() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  }
  pool_.Shutdown();
  // The endpoint goes last of all that hold its calls: the render threads stop, the answers
  // they and the environments left are dropped unapplied, and only then the server (its
  // callbacks hold weak references, so a late one would do nothing either way).
  renders_.Shutdown();
  inbox_->Take();
  server_.reset();
}

// ---- Groups in and out ----------------------------------------------------------------------

absl::Status EpisodeEngine::Add(GroupRequest request) {
  if (groups_.count(request.id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("group ", request.id, " is already running"));
  }
  auto g = std::make_unique<Group>();
  g->request = std::move(request);
  Group& group = *g;
  if (group.request.agent.has_value()) {  // an agent's episodes
    groups_[group.request.id] = std::move(g);
    AddAgents(group);
    return absl::OkStatus();
  }
  if (!group.request.environment.has_value()) {  // one turn
    PRL_ASSIGN_OR_RETURN(group.request_id,
                         engine_->AddRequest(group.request.prompt, group.request.params,
                                             group.request.adapter));
    by_request_[group.request_id] = {group.request.id, -1};
    groups_[group.request.id] = std::move(g);
    return absl::OkStatus();
  }
  const std::string id = group.request.id;
  absl::Status ready = codec_ == nullptr ? absl::FailedPreconditionError(
                                               "agentic episodes need the model's text (a "
                                               "tokenizer)")
                                         : absl::OkStatus();
  if (ready.ok()) {
    absl::StatusOr<std::shared_ptr<Endpoint>> endpoint = pool_.For(*group.request.environment);
    ready = endpoint.status();
    if (endpoint.ok()) {
      group.endpoint = *endpoint;
      absl::StatusOr<std::shared_ptr<env::Environment>> client =
          group.endpoint->ClientFor(*group.request.environment);
      ready = client.status();
      if (client.ok()) group.client = *client;
    }
  }
  if (ready.ok()) {
    absl::StatusOr<ChatContext> chat = ChatContextOf(group.request.submitted);
    ready = chat.status();
    if (chat.ok()) group.chat = *std::move(chat);
  }
  if (ready.ok()) {
    absl::StatusOr<ToolCallFormat> format = ToolCallFormatOf(
        group.request.environment->tool_call_format(), *codec_, "environment.tool_call_format");
    ready = format.status();
    if (format.ok()) group.tool_format = *format;
  }
  groups_[id] = std::move(g);
  if (!ready.ok()) {
    failed_.push_back({id, ready});
    groups_.erase(id);
    return absl::OkStatus();
  }
  if (group.endpoint->down_since().has_value()) {  // it waits for the environment
    group.phase = Group::Phase::kWaiting;
    return absl::OkStatus();
  }
  StartEpisodes(group);
  return absl::OkStatus();
}

void EpisodeEngine::StartEpisodes(Group& g) {
  g.phase = Group::Phase::kStarting;
  g.epoch = g.endpoint->epoch();
  g.answered = 0;
  g.first_prompt.reset();
  g.stop_strings.clear();
  g.samples.assign(g.request.params.n, Sample{});
  for (int32_t j = 0; j < g.request.params.n; ++j) {
    g.samples[j].episode_id = g.attempt == 0 ? absl::StrCat(g.request.id, "/", j)
                                             : absl::StrCat(g.request.id, "/", j, "~", g.attempt);
    CallStart(g, j);
  }
}

bool EpisodeEngine::Abort(const std::string& id, const std::string& reason) {
  auto it = groups_.find(id);
  if (it == groups_.end()) return false;
  Group& g = *it->second;
  AbortInEngine(g);
  if (g.endpoint != nullptr && g.phase != Group::Phase::kWaiting) NotifyAborted(g, reason);
  if (g.agent != nullptr) EndAgents(g, absl::CancelledError(absl::StrCat("aborted: ", reason)));
  groups_.erase(it);
  return true;
}

void EpisodeEngine::AbortInEngine(Group& g) {
  // Their outputs are dropped: the requests leave by_request_ here.
  for (AgentEpisode& e : g.agents) {
    std::vector<uint64_t> ids;
    for (const auto& [id, ends] : e.closing) ids.push_back(id);
    if (e.request_id != 0) ids.push_back(e.request_id);
    for (uint64_t id : ids) {
      engine_->Abort(id);
      by_request_.erase(id);
    }
    e.closing.clear();
    e.request_id = 0;
  }
  if (g.request_id == 0) return;
  engine_->Abort(g.request_id);
  by_request_.erase(g.request_id);
  g.request_id = 0;
}

void EpisodeEngine::Fail(Group& g, const absl::Status& why) {
  if (g.agent != nullptr) {  // an agent's failure is the attempt's: no outages to wait out
    AbortInEngine(g);
    EndAgents(g, why);
    if (options_.metrics != nullptr) options_.metrics->AgentErrors(why.code()).Increment();
    failed_.push_back({g.request.id, why});
    groups_.erase(g.request.id);  // g is gone
    return;
  }
  const bool lost_in_outage =
      (absl::IsNotFound(why) || absl::IsFailedPrecondition(why)) && g.endpoint->epoch() != g.epoch;
  const std::optional<absl::Time> down = g.endpoint->down_since();
  // (An environment that answers UNAVAILABLE itself while it is reachable would otherwise send
  // its groups round for ever: a group starts again after at most kMaxOutageRestarts outages.)
  if (g.endpoint->remote() && (absl::IsUnavailable(why) || lost_in_outage) &&
      g.attempt < kMaxOutageRestarts &&
      (!down.has_value() || absl::Now() - *down <= options_.outage_budget)) {
    // An outage: the group waits for the environment and starts again, no attempt spent.
    std::fprintf(stderr, "episodes: group %s waits for %s (%s)\n", g.request.id.c_str(),
                 g.endpoint->name().c_str(), std::string(why.message()).c_str());
    AbortInEngine(g);
    g.phase = Group::Phase::kWaiting;
    ++g.attempt;  // answers of this attempt still on their way are dropped
    return;
  }
  AbortInEngine(g);
  NotifyAborted(g, std::string(why.message()));
  if (options_.metrics != nullptr) options_.metrics->EnvironmentErrors(why.code()).Increment();
  failed_.push_back({g.request.id, why});
  groups_.erase(g.request.id);  // g is gone
}

void EpisodeEngine::PollOutages(absl::Time now) {
  for (const std::shared_ptr<Endpoint>& e : pool_.endpoints()) e->ProbeIfDue(now);
  std::vector<Group*> waiting;
  for (auto& [id, g] : groups_) {
    if (g->phase == Group::Phase::kWaiting) waiting.push_back(g.get());
  }
  for (Group* g : waiting) {
    const std::optional<absl::Time> down = g->endpoint->down_since();
    if (!down.has_value()) {
      StartEpisodes(*g);  // the environment is back: new episode ids
    } else if (now - *down > options_.outage_budget) {
      const absl::Status why = absl::UnavailableError(absl::StrCat(
          g->endpoint->name(), " has been down for ", absl::FormatDuration(now - *down),
          ", longer than the outage budget (actors.env_outage_s = ",
          absl::FormatDuration(options_.outage_budget), ")"));
      if (options_.metrics != nullptr) options_.metrics->EnvironmentErrors(why.code()).Increment();
      failed_.push_back({g->request.id, why});
      groups_.erase(g->request.id);
    }
  }
}

// ---- The loop -------------------------------------------------------------------------------

absl::Status EpisodeEngine::Step() {
  for (Answer& a : inbox_->Take()) Apply(a);
  PollOutages(absl::Now());
  const EngineStats s = engine_->Stats();
  if (s.num_running > 0 || s.num_waiting > 0) {
    PRL_RETURN_IF_ERROR(engine_->Step());
    for (TurnOutput& turn : engine_->TakeTurns()) {
      auto owner = by_request_.find(turn.request_id);
      if (owner == by_request_.end()) continue;
      Group& g = *groups_.at(owner->second.group);
      if (owner->second.sample >= 0) {
        AnswerTurn(g, owner->second.sample, std::move(turn));
      } else {
        CallStep(g, std::move(turn));
      }
    }
  }
  CollectFinished();
  return absl::OkStatus();
}

void EpisodeEngine::CollectFinished() {
  for (RequestOutput& output : engine_->TakeFinished()) {
    auto id = by_request_.find(output.request_id);
    if (id == by_request_.end()) continue;  // aborted
    const RequestOwner owner = id->second;
    by_request_.erase(id);
    auto it = groups_.find(owner.group);
    if (owner.sample >= 0) {  // an agent episode's trajectory
      OnSegment(*it->second, owner.sample, std::move(output));
      continue;
    }
    Group& g = *it->second;
    FinishedGroup done{g.request.id, std::move(output), {}};
    if (g.endpoint != nullptr) {
      for (Sample& s : g.samples) done.episodes.push_back(std::move(s.outcome));
    }
    finished_.push_back(std::move(done));
    groups_.erase(it);
  }
}

std::vector<FinishedGroup> EpisodeEngine::TakeFinished() {
  std::vector<FinishedGroup> out;
  out.swap(finished_);
  return out;
}

std::vector<FailedGroup> EpisodeEngine::TakeFailed() {
  std::vector<FailedGroup> out;
  out.swap(failed_);
  return out;
}

bool EpisodeEngine::Runnable() const {
  const EngineStats s = engine_->Stats();
  return s.num_running > 0 || s.num_waiting > 0 || !inbox_->empty() || !finished_.empty() ||
         !failed_.empty();
}

EpisodeCounts EpisodeEngine::counts() const {
  EpisodeCounts c;
  for (const auto& [id, g] : groups_) {
    switch (g->phase) {
      case Group::Phase::kInEngine:
        ++c.in_engine;
        c.samples_in_engine += g->request.params.n;
        break;
      case Group::Phase::kWaiting:
        ++c.waiting;
        break;
      default:
        ++c.starting;
    }
  }
  return c;
}

// ---- Answers --------------------------------------------------------------------------------

void EpisodeEngine::Apply(Answer& a) {
  auto it = groups_.find(a.group_id);
  if (it == groups_.end() || it->second->attempt != a.attempt) {  // gone, or restarted
    if (a.kind == Answer::Kind::kCall && a.call->Claim()) {
      a.call->done(absl::UnauthenticatedError("the key's episode has ended"));
    }
    return;
  }
  Group& g = *it->second;
  switch (a.kind) {  // an agent's: each handles its errors
    case Answer::Kind::kCall:
      return OnCall(g, a);
    case Answer::Kind::kRendered:
      return OnRendered(g, a);
    case Answer::Kind::kAnswered:
      return OnAnswered(g, a);
    case Answer::Kind::kReturned:
      return OnReturned(g, a);
    default:
      break;
  }
  if (g.phase == Group::Phase::kWaiting) return;
  if (!a.status.ok()) return Fail(g, InEpisode(g.samples[a.sample].episode_id, a.status));
  switch (a.kind) {
    case Answer::Kind::kStart:
      return OnStarted(g, a);
    case Answer::Kind::kStep:
      return OnStepped(g, a);
    case Answer::Kind::kEnd:
      return OnEnded(g, a);
    default:
      return;
  }
}

void EpisodeEngine::OnStarted(Group& g, Answer& a) {
  if (!g.first_prompt.has_value()) {
    g.first_prompt = std::move(a.tokens);
    g.stop_strings = std::move(a.stop_strings);
    if (a.chat.has_value()) g.chat = *std::move(a.chat);
  } else if (*g.first_prompt != a.tokens) {
    return Fail(g, InEpisode(g.samples[a.sample].episode_id,
                             absl::FailedPreconditionError(
                                 "the environment gave the samples of one group different first "
                                 "observations; prl runs a group from one prompt (give every "
                                 "sample the same rules)")));
  }
  if (++g.answered == g.request.params.n) Launch(g);
}

void EpisodeEngine::Launch(Group& g) {
  const v1::EnvironmentSpec& spec = *g.request.environment;
  const int64_t prompt_tokens = static_cast<int64_t>(g.first_prompt->size());
  const TurnBudget first = NextTurnBudget(prompt_tokens, 0, engine_->max_sequence_tokens(), spec);
  if (!first.truncate.empty()) {  // not one token of room: nothing could ever be trained
    return Fail(g, absl::FailedPreconditionError(
                       absl::StrCat("the prompt and the first observation (", prompt_tokens,
                                    " tokens) leave no room for a model turn (", first.truncate,
                                    "): shorten the observation or raise the model's context")));
  }
  SamplingParams params = g.request.params;
  params.multi_turn = true;
  params.max_tokens = first.max_tokens;
  if (!g.stop_strings.empty()) {
    params.end_turn = [stops = std::make_shared<StopStrings>(codec_, g.stop_strings)](
                          absl::Span<const int32_t> turn) { return stops->CompletedBy(turn); };
  }
  absl::StatusOr<uint64_t> id = engine_->AddRequest(*g.first_prompt, params, g.request.adapter);
  if (!id.ok()) {
    return Fail(g, absl::Status(id.status().code(),
                                absl::StrCat("the engine refused the episodes' first prompt (",
                                             prompt_tokens, " tokens): ", id.status().message())));
  }
  g.phase = Group::Phase::kInEngine;
  g.request_id = *id;
  by_request_[*id] = {g.request.id, -1};
}

void EpisodeEngine::OnStepped(Group& g, Answer& a) {
  Sample& s = g.samples[a.sample];
  const v1::EnvironmentSpec& spec = *g.request.environment;
  if (absl::Status valid = env::ValidateStepResponse(a.step); !valid.ok()) {  // built-ins too
    return Fail(g, InEpisode(s.episode_id, valid));
  }
  ++s.turns;
  s.completion_tokens += a.turn_tokens;
  s.outcome.turn_ends.push_back(static_cast<uint32_t>(s.completion_tokens));
  s.outcome.turn_rewards.push_back(a.step.has_turn_reward() ? a.step.turn_reward() : 0.0);
  absl::Status applied = absl::OkStatus();
  if (a.step.done()) {
    s.ended = true;
    s.outcome.reward = a.step.episode_reward();
    s.outcome.reason = a.step.done_reason();
    applied = engine_->FinishSample(g.request_id, a.sample);
  } else if (s.turns >= spec.max_turns()) {
    return CallEnd(g, a.sample, absl::StrCat("max_turns ", spec.max_turns()));
  } else {
    const int64_t reply = static_cast<int64_t>(a.tokens.size());
    const int64_t sequence = static_cast<int64_t>(g.first_prompt->size()) + s.completion_tokens;
    const TurnBudget next = NextTurnBudget(sequence + reply, s.completion_tokens + reply,
                                           engine_->max_sequence_tokens(), spec);
    if (!next.truncate.empty()) return CallEnd(g, a.sample, next.truncate);
    s.completion_tokens += reply;
    applied = engine_->Continue(g.request_id, a.sample, a.tokens, next.max_tokens);
  }
  if (!applied.ok()) Fail(g, InEpisode(s.episode_id, applied));
}

void EpisodeEngine::OnEnded(Group& g, Answer& a) {
  Sample& s = g.samples[a.sample];
  s.outcome.reward = a.reward;
  s.outcome.truncated = true;
  s.outcome.reason = a.reason;
  s.ended = true;
  if (absl::Status done = engine_->FinishSample(g.request_id, a.sample); !done.ok()) {
    Fail(g, InEpisode(s.episode_id, done));
  }
}

}  // namespace prl::episode
