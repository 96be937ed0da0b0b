#include "runner/demonstrations.h"

#include <cmath>
#include <functional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "env/builtin_environments.h"
#include "env/calculator.h"
#include "env/guess_number.h"
#include "episode/episode_protocol.h"
#include "episode/tool_calls.h"
#include "episode/turn_renderer.h"
#include "nlohmann/json.hpp"

namespace prl::runner {

namespace {

namespace v1 = prl::v1;

// A player's turn: its text and how it ends (the stop token after it, or a stop string that
// is the text's own end).
struct PlayerTurn {
  std::string text;
  bool end_of_turn = true;
};
// The player's next turn, given the turn index and the text of the environment's last reply.
using Player = std::function<absl::StatusOr<PlayerTurn>(int turn, const std::string& reply)>;

// One episode of `player` against `environment`, as the actor would record it, within the
// limits an episode of RL has (a turn, the episode, the model's context).
absl::StatusOr<SftExample> Play(env::Environment& environment, const v1::EnvironmentSpec& spec,
                                const v1::Prompt& prompt, std::vector<int32_t> prompt_tokens,
                                const tokenizer::TextCodec& codec, const std::string& episode_id,
                                const Player& player, bool must_win, int64_t max_sequence_tokens) {
  const int32_t stop = codec.stop_ids().front();
  episode::GroupRequest group;  // as the actor's episode engine starts it
  group.prompt = std::move(prompt_tokens);
  group.environment = spec;
  group.reference = prompt.reference();
  group.submitted = coordinator::EpisodePromptOf(prompt);
  const v1::StartEpisodeRequest start = episode::StartRequestOf(group, 0, episode_id, codec);
  PRL_ASSIGN_OR_RETURN(const v1::StartEpisodeResponse started, environment.StartEpisode(start));
  PRL_ASSIGN_OR_RETURN(episode::ChatContext chat, episode::ChatContextOf(group.submitted));
  PRL_ASSIGN_OR_RETURN(chat, episode::WithTools(std::move(chat), started.tools_json()));
  PRL_ASSIGN_OR_RETURN(const episode::ToolCallFormat format,
                       episode::ToolCallFormatOf(spec.tool_call_format(), codec,
                                                 "env.tool_call_format"));
  SftExample example;
  PRL_ASSIGN_OR_RETURN(example.prompt,
                       episode::FirstPromptOf(codec, group.prompt, group.submitted,
                                              started.observation(), chat,
                                              !started.tools_json().empty()));
  std::string reply;
  for (int turn = 0; turn < spec.max_turns(); ++turn) {
    PRL_ASSIGN_OR_RETURN(const PlayerTurn said, player(turn, reply));
    PRL_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, codec.EncodeContinuation(said.text));
    if (said.end_of_turn) tokens.push_back(stop);
    if (static_cast<int64_t>(tokens.size()) > spec.max_tokens_per_turn()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "turn ", turn, " ('", said.text.substr(0, 64), "') is ", tokens.size(),
          " tokens, above env.max_tokens_per_turn (or task.max_tokens): ",
          spec.max_tokens_per_turn(), "; raise task.max_tokens so that RL's turns fit too"));
    }
    example.completion.insert(example.completion.end(), tokens.begin(), tokens.end());
    example.sources.insert(example.sources.end(), tokens.size(), 0);
    // The turn as the engine reports it: ended by its stop token, or by a stop string.
    TurnOutput ended;
    ended.tokens = tokens;
    ended.reason = FinishReason::kStop;
    PRL_ASSIGN_OR_RETURN(const v1::StepRequest step,
                         episode::StepRequestOf(episode_id, turn, ended, codec, {stop}, format));
    PRL_ASSIGN_OR_RETURN(const v1::StepResponse answer, environment.Step(step));
    if (answer.done()) {
      if (must_win && answer.episode_reward() < 1.0) {
        return absl::FailedPreconditionError(absl::StrCat("the demonstration did not win (reward ",
                                                          answer.episode_reward(), ": ",
                                                          answer.done_reason(), ")"));
      }
      return example;
    }
    PRL_ASSIGN_OR_RETURN(const std::vector<int32_t> rendered,
                         episode::RenderReply(codec, answer.messages(), tokens.back(), chat));
    example.completion.insert(example.completion.end(), rendered.begin(), rendered.end());
    example.sources.insert(example.sources.end(), rendered.size(), 1);
    const int64_t episode = static_cast<int64_t>(example.completion.size());
    if (spec.max_episode_tokens() > 0 && episode >= spec.max_episode_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat("the episode reaches env.max_episode_tokens (",
                                                     spec.max_episode_tokens(), ") after turn ",
                                                     turn, "; raise it"));
    }
    if (static_cast<int64_t>(example.prompt.size()) + episode >= max_sequence_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("the episode reaches the model's context (", max_sequence_tokens,
                       " tokens) after turn ", turn, "; raise model.max_position_embeddings"));
    }
    reply.clear();
    for (const v1::EnvMessage& m : answer.messages()) reply += m.content();
  }
  if (!must_win) return example;  // truncated, as the actor ends it: the imperfect play
  return absl::FailedPreconditionError(
      absl::StrCat("the demonstration did not end within env.max_turns (", spec.max_turns(), ")"));
}

// Calls the tool on the prompt's expression (the text before its last '='), then answers the
// result (the reply's last integer: with output_chars the reply is a long trace ending with it);
// or answers the reference at once. With tool_name, the call is a tool call in the model's
// format (`format`), its turn ended by the stop token.
Player CalculatorPlayer(const v1::EnvironmentSpec& spec, episode::ToolCallFormat format,
                        const std::string& prompt_text, const std::string& reference,
                        bool demonstrate) {
  const std::string open = env::Parameter(spec.parameters(), "call_open", env::kDefaultCallOpen);
  const std::string close = env::Parameter(spec.parameters(), "call_close", env::kDefaultCallClose);
  const std::string tool = env::Parameter(spec.parameters(), "tool_name", "");
  const std::string expression = prompt_text.substr(0, prompt_text.rfind('='));
  const std::string call =
      tool.empty() ? open + expression + close
                   : episode::WriteToolCall(
                         format, tool,
                         absl::StrCat("{\"expression\": ", nlohmann::json(expression).dump(), "}"));
  return [=](int turn, const std::string& reply) -> absl::StatusOr<PlayerTurn> {
    if (!demonstrate) return PlayerTurn{reference, true};
    if (turn == 0) return PlayerTurn{call, !tool.empty()};
    int64_t result = 0;
    return PlayerTurn{env::LastInteger(reply, &result) ? absl::StrCat(result) : reply, true};
  };
}

// The question a prompt asks: a chat's last user message, or the prompt's text.
std::string QuestionOf(const v1::Prompt& prompt, const std::string& decoded) {
  if (prompt.has_chat()) {
    for (int i = prompt.chat().messages_size() - 1; i >= 0; --i) {
      if (prompt.chat().messages(i).role() == "user") return prompt.chat().messages(i).content();
    }
  }
  return prompt.has_text() ? prompt.text() : decoded;
}

// Guesses the middle of the range [low, high] the feedback leaves (bisection), or its first
// quarter.
Player GuessPlayer(const v1::EnvironmentSpec& spec, bool demonstrate) {
  struct State {
    int64_t low = 1, high = 100, guess = 0;
  };
  auto s = std::make_shared<State>();
  // (Validated with the config; the game itself refuses what is not an integer.)
  s->low = env::IntParameter(spec.parameters(), "low", env::kDefaultLow, "guess_number")
               .value_or(env::kDefaultLow);
  s->high = env::IntParameter(spec.parameters(), "high", env::kDefaultHigh, "guess_number")
                .value_or(env::kDefaultHigh);
  const std::string higher =
      env::Parameter(spec.parameters(), "higher_text", env::kDefaultHigherText);
  const std::string lower = env::Parameter(spec.parameters(), "lower_text", env::kDefaultLowerText);
  return [=](int turn, const std::string& reply) -> absl::StatusOr<PlayerTurn> {
    if (turn > 0) {
      if (reply == higher) {
        s->low = s->guess + 1;
      } else if (reply == lower) {
        s->high = s->guess - 1;
      } else {
        return absl::InternalError(absl::StrCat("guess_number answered '", reply,
                                                "', neither higher_text nor lower_text"));
      }
    }
    s->guess = s->low + (s->high - s->low) / (demonstrate ? 2 : 4);
    return PlayerTurn{absl::StrCat(s->guess), true};
  };
}

}  // namespace

bool HasDemonstrations(const v1::EnvironmentSpec& environment, config::TaskName task) {
  if (!environment.address().empty()) return false;
  return ((task == config::TaskName::kArithmetic || task == config::TaskName::kPrompts) &&
          environment.name() == "calculator") ||
         (task == config::TaskName::kGuessNumber && environment.name() == "guess_number");
}

absl::StatusOr<std::vector<SftExample>> Demonstrations(const v1::EnvironmentSpec& environment,
                                                       config::TaskName task,
                                                       const tokenizer::TextCodec& codec,
                                                       absl::Span<const v1::Prompt> prompts,
                                                       int64_t vocab_size, double demo_fraction,
                                                       int64_t max_sequence_tokens) {
  if (!HasDemonstrations(environment, task)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "env.name: demonstrations exist for the built-in calculator with task.name = "
        "arithmetic or prompts (arithmetic questions: prl task export) and guess_number with "
        "task.name = guess_number, found '",
        environment.name(), "'", environment.address().empty() ? "" : " at an address"));
  }
  if (codec.stop_ids().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(codec.Describe(), " has no stop token: a model turn needs one to end on"));
  }
  const bool calculator = environment.name() == "calculator";
  PRL_ASSIGN_OR_RETURN(const episode::ToolCallFormat format,
                       episode::ToolCallFormatOf(environment.tool_call_format(), codec,
                                                 "env.tool_call_format"));
  if (calculator && !env::Parameter(environment.parameters(), "tool_name", "").empty() &&
      format == episode::ToolCallFormat::kNone) {
    return absl::InvalidArgumentError(
        "env.tool_call_format: the calculator's tool (env.params.tool_name) needs a tool-call "
        "format (hermes or llama3_json), and the model's chat template names none");
  }
  PRL_ASSIGN_OR_RETURN(const std::shared_ptr<env::Environment> played,
                       env::MakeBuiltinEnvironment(environment.name(), "env.name"));
  std::vector<SftExample> examples;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = absl::StrCat("warm-start prompt ", i);
    PRL_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                         coordinator::PromptTokens(prompts[i], &codec, vocab_size, what));
    // The golden-ratio sequence: every prefix demonstrates about demo_fraction of its examples.
    double unused;
    const bool demonstrate =
        std::modf(static_cast<double>(i + 1) * 0.6180339887498949, &unused) < demo_fraction;
    PRL_ASSIGN_OR_RETURN(const std::string decoded, codec.DecodeCompletion(tokens));
    const std::string text = QuestionOf(prompts[i], decoded);
    const Player player =
        calculator
            ? CalculatorPlayer(environment, format, text, prompts[i].reference(), demonstrate)
            : GuessPlayer(environment, demonstrate);
    absl::StatusOr<SftExample> example =
        Play(*played, environment, prompts[i], std::move(tokens), codec, absl::StrCat("demo-", i),
             player, demonstrate, max_sequence_tokens);
    if (!example.ok()) {
      return absl::Status(
          example.status().code(),
          absl::StrCat(what, " ('", text.substr(0, 64), "', reference '",
                       prompts[i].reference().substr(0, 64), "'): ", example.status().message()));
    }
    examples.push_back(*std::move(example));
  }
  return examples;
}

}  // namespace prl::runner
