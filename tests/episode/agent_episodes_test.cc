// Agents' episodes (episode/episode_engine.h, docs/agents.md) against agents served over gRPC on
// loopback that call the engine's OpenAI-compatible endpoint over HTTP: calls that extend the
// trajectory make one record with the KV cache kept and exactly the tokens the endpoint
// answered; a rewritten history makes one more record; limits and a second call in flight
// answer the call, not the episode; a hung, crashed or lying agent fails its own group (keys
// revoked) while another agent's go on; a weight swap mid-call keeps the call.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "episode/episode_engine.h"
#include "task/char_tokenizer.h"
#include "tests/episode/agent_testing.h"
#include "tests/episode/episode_testing.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode {
namespace {

using testing::AgentAt;
using testing::EndpointClient;
using testing::EpisodeLoop;
using testing::Json;
using testing::ServedAgent;

std::vector<int32_t> Chars(const std::string& text) { return *task::CharTokenizer().Encode(text); }

// A group of `n` agent episodes of the text prompt "(1+2)=".
GroupRequest AgentGroup(const std::string& id, const v1::AgentSpec& spec, int32_t n = 2) {
  GroupRequest g;
  g.id = id;
  g.prompt = Chars("(1+2)=");
  g.params.n = n;
  g.params.temperature = 1.0f;
  g.params.max_tokens = spec.max_tokens_per_call();
  g.params.seed = 7;
  g.params.stop_token_ids = {task::CharTokenizer::kEos};
  g.agent = spec;
  g.submitted.set_text("(1+2)=");
  g.reference = "3";
  return g;
}

Json Completion(const std::string& prompt, int max_tokens = 6) {
  return {{"model", "m"}, {"prompt", prompt}, {"max_tokens", max_tokens}};
}

std::vector<int32_t> Ids(const Json& answer) {
  return answer["prl"]["token_ids"].get<std::vector<int32_t>>();
}

class AgentEpisodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(loop_.episodes().ServeAgents({}, "tiny").ok());
  }
  EpisodeLoop loop_;
};

// Three calls, each prompt the last prompt, its answer and a new character: one record per
// episode holding the answers as the endpoint gave them (ids, log-probs) and the new characters
// as context between them; the next call computes only what is new.
TEST_F(AgentEpisodesTest, CallsThatExtendTheTrajectoryMakeOneRecordWithTheCacheKept) {
  std::mutex mu;
  std::map<int, std::vector<Json>> answers;  // by sample
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    EndpointClient client(r);
    std::string prompt = r.prompt().text();
    for (const char* next : {"+", "*", ""}) {
      auto [status, answer] = client.Post("/completions", Completion(prompt));
      if (status != 200) return grpc::Status(grpc::StatusCode::INTERNAL, answer.dump());
      {
        std::lock_guard<std::mutex> lock(mu);
        answers[r.sample_index()].push_back(answer);
      }
      prompt += answer["choices"][0]["text"].get<std::string>() + next;
      if (*next == '\0') break;
    }
    out->set_reward(r.sample_index() == 0 ? 1.0 : 0.0);
    for (double c : {0.1, 0.2, 0.3}) out->add_call_rewards(c);
    out->set_done_reason("answered");
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("g", AgentAt(served.address))).ok());
  ASSERT_TRUE(loop_.RunToEnd());
  // Read under the agent's lock: the reply that ordered its writes came over a socket.
  const std::lock_guard<std::mutex> agent_wrote(mu);
  ASSERT_TRUE(loop_.failed().empty()) << loop_.failed()[0].why;
  ASSERT_EQ(loop_.finished().size(), 1u);
  const FinishedGroup& g = loop_.finished()[0];
  ASSERT_EQ(g.episodes.size(), 2u);
  for (int j = 0; j < 2; ++j) {
    const EpisodeOutcome& o = g.episodes[j];
    EXPECT_EQ(o.reward, j == 0 ? 1.0 : 0.0);
    EXPECT_EQ(o.reason, "answered");
    ASSERT_EQ(o.segments.size(), 1u) << "sample " << j;
    const EpisodeSegment& s = o.segments[0];
    EXPECT_EQ(s.prompt, *task::CharTextCodec().EncodePrompt("(1+2)="));
    // The completion: answer 1, "+", answer 2, "*", answer 3, with their sources.
    std::vector<int32_t> tokens;
    std::vector<uint8_t> sources;
    std::vector<float> logprobs;
    std::vector<uint32_t> ends;
    const std::vector<Json>& calls = answers[j];
    ASSERT_EQ(calls.size(), 3u);
    for (size_t c = 0; c < calls.size(); ++c) {
      if (c > 0) {
        tokens.push_back(Chars(c == 1 ? "+" : "*")[0]);
        sources.push_back(1);
        logprobs.push_back(0.0f);
      }
      const std::vector<int32_t> ids = Ids(calls[c]);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      sources.insert(sources.end(), ids.size(), 0);
      for (float lp : calls[c]["prl"]["logprobs"]) logprobs.push_back(lp);
      ends.push_back(static_cast<uint32_t>(tokens.size()));
      EXPECT_EQ(calls[c]["usage"]["prompt_tokens"], s.prompt.size() + tokens.size() - ids.size());
    }
    EXPECT_EQ(s.output.tokens, tokens);
    EXPECT_EQ(s.output.sources, sources);
    EXPECT_EQ(s.output.logprobs, logprobs);
    EXPECT_EQ(s.turn_ends, ends);
    EXPECT_EQ(s.turn_rewards, (std::vector<double>{0.1, 0.2, 0.3}));
    EXPECT_EQ(s.output.sample_index, j);
  }
  const EngineStats st = loop_.episodes().engine().Stats();
  EXPECT_EQ(st.turns_continued, 4) << "two continued calls per episode";
  EXPECT_EQ(st.turn_kept_tokens, st.turn_context_tokens) << "nothing computed again";
  // Each episode had its own key, the endpoint's URL and the limits; none works any more.
  const std::vector<v1::RunEpisodeRequest> requests = served.agent->requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_NE(requests[0].api_key(), requests[1].api_key());
  EXPECT_TRUE(absl::StartsWith(requests[0].api_key(), "prl-ep-"));
  EXPECT_EQ(requests[0].api_key().size(), 7u + 64u);
  EXPECT_EQ(requests[0].base_url(), loop_.episodes().agents_base_url());
  EXPECT_EQ(requests[0].limits().max_calls(), 8);
  EXPECT_EQ(loop_.episodes().live_agent_keys(), 0);
  EXPECT_EQ(EndpointClient(requests[0]).Post("/completions", Completion("1")).first, 401);
}

// The second call does not begin with the first's prompt and answer: a record of its own.
TEST_F(AgentEpisodesTest, AnAgentThatRewritesItsHistoryMakesOneMoreRecord) {
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    EndpointClient client(r);
    auto first = client.Post("/completions", Completion("(1+2)="));
    auto second = client.Post("/completions", Completion("(3+4)="));
    if (first.first != 200 || second.first != 200) return grpc::Status(grpc::StatusCode::INTERNAL, "");
    out->set_reward(1);
    out->add_call_rewards(0.5);
    out->add_call_rewards(0.75);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("g", AgentAt(served.address), 1)).ok());
  ASSERT_TRUE(loop_.RunToEnd());
  ASSERT_TRUE(loop_.failed().empty()) << loop_.failed()[0].why;
  const EpisodeOutcome& o = loop_.finished()[0].episodes[0];
  ASSERT_EQ(o.segments.size(), 2u);
  EXPECT_EQ(o.segments[0].prompt, *task::CharTextCodec().EncodePrompt("(1+2)="));
  EXPECT_EQ(o.segments[1].prompt, *task::CharTextCodec().EncodePrompt("(3+4)="));
  EXPECT_EQ(o.segments[0].turn_rewards, std::vector<double>{0.5});
  EXPECT_EQ(o.segments[1].turn_rewards, std::vector<double>{0.75});
  for (const EpisodeSegment& s : o.segments) {
    EXPECT_EQ(s.turn_ends, std::vector<uint32_t>{static_cast<uint32_t>(s.output.tokens.size())});
  }
}

// Past max_calls a call is refused (429) and the episode goes on; a key is for its episode only.
TEST_F(AgentEpisodesTest, LimitsRefuseTheCallNotTheEpisode) {
  std::atomic<int> third{0}, stranger{0};
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    EndpointClient client(r);
    client.Post("/completions", Completion("1"));
    client.Post("/completions", Completion("2"));
    third = client.Post("/completions", Completion("3")).first;
    stranger = client.Post("/completions", Completion("4"), "prl-ep-guessed").first;
    out->set_reward(1);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("g", AgentAt(served.address, /*max_calls=*/2), 1)).ok());
  ASSERT_TRUE(loop_.RunToEnd());
  ASSERT_TRUE(loop_.failed().empty()) << loop_.failed()[0].why;
  EXPECT_EQ(third, 429);
  EXPECT_EQ(stranger, 401);
  EXPECT_EQ(loop_.finished()[0].episodes[0].segments.size(), 2u);
}

// A second call while the first generates is refused (409): an episode's calls run one at a
// time. (The loop does not step between the first call's start and the second's arrival.)
TEST_F(AgentEpisodesTest, ACallWhileAnotherGeneratesIsRefused) {
  std::atomic<bool> send_second{false};
  std::atomic<int> second{0}, first{0};
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    EndpointClient client(r);
    std::thread t([&] { first = client.Post("/completions", Completion("(1+2)=")).first; });
    while (!send_second) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    second = client.Post("/completions", Completion("(1+2)=")).first;
    t.join();
    out->set_reward(1);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("g", AgentAt(served.address), 1)).ok());
  ASSERT_TRUE(loop_.Run([&] { return loop_.episodes().engine().Stats().num_waiting +
                                         loop_.episodes().engine().Stats().num_running > 0; }));
  loop_.ClearWake();
  send_second = true;
  loop_.WaitForWake();  // the second call is in the inbox; the first has not stepped since
  ASSERT_TRUE(loop_.RunToEnd());
  EXPECT_EQ(second, 409);
  EXPECT_EQ(first, 200);
  ASSERT_EQ(loop_.finished().size(), 1u);
}

// Agents that fail: each fails its own group, visibly, naming the agent and what went wrong,
// its keys revoked.
TEST_F(AgentEpisodesTest, AHungCrashedOrLyingAgentFailsItsGroup) {
  ServedAgent hung = ServedAgent::Start([&](const v1::RunEpisodeRequest& r,
                                            grpc::ServerContext* context, v1::RunEpisodeResponse*) {
    EndpointClient(r).Post("/completions", Completion("1"));
    hung.agent->WaitForRelease(context);
    return grpc::Status::OK;
  });
  ServedAgent liar = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                            v1::RunEpisodeResponse* out) {
    EndpointClient(r).Post("/completions", Completion("1"));
    out->set_reward(std::nan(""));
    return grpc::Status::OK;
  });
  ServedAgent idle = ServedAgent::Start(
      [&](const v1::RunEpisodeRequest&, grpc::ServerContext*, v1::RunEpisodeResponse* out) {
        out->set_reward(1);
        return grpc::Status::OK;
      });
  ServedAgent crashing = ServedAgent::Start(
      [&](const v1::RunEpisodeRequest&, grpc::ServerContext*, v1::RunEpisodeResponse*) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent's process died");
      });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("hung", AgentAt(hung.address, 8, 0.5), 1)).ok());
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("liar", AgentAt(liar.address), 1)).ok());
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("idle", AgentAt(idle.address), 1)).ok());
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("crash", AgentAt(crashing.address), 1)).ok());
  ASSERT_TRUE(loop_.RunToEnd());
  hung.agent->Release();
  EXPECT_TRUE(loop_.finished().empty());
  std::map<std::string, absl::Status> why;
  for (const FailedGroup& f : loop_.failed()) why[f.id] = f.why;
  ASSERT_EQ(why.size(), 4u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(why["hung"])) << why["hung"];
  EXPECT_TRUE(absl::StrContains(why["hung"].message(), "agent.timeout_s")) << why["hung"];
  EXPECT_TRUE(absl::IsInvalidArgument(why["liar"])) << why["liar"];
  EXPECT_TRUE(absl::StrContains(why["liar"].message(), "RunEpisodeResponse.reward")) << why["liar"];
  EXPECT_TRUE(absl::StrContains(why["idle"].message(), "without calling the endpoint"))
      << why["idle"];
  EXPECT_TRUE(absl::IsUnavailable(why["crash"])) << why["crash"];
  EXPECT_TRUE(absl::StrContains(why["crash"].message(), crashing.address)) << why["crash"];
  EXPECT_EQ(loop_.episodes().live_agent_keys(), 0);
  EXPECT_EQ(loop_.episodes().engine().Stats().unfinished_requests, 0) << "nothing left running";
}

// A hung agent holds only its own episodes; given up (the lease reclaimed), its RunEpisode is
// cancelled and its key revoked.
TEST_F(AgentEpisodesTest, AHungAgentHoldsOnlyItsOwnEpisodes) {
  std::atomic<bool> cancelled{false};
  ServedAgent hung = ServedAgent::Start([&](const v1::RunEpisodeRequest&,
                                            grpc::ServerContext* context, v1::RunEpisodeResponse*) {
    cancelled = !hung.agent->WaitForRelease(context);
    return grpc::Status::OK;
  });
  ServedAgent healthy = ServedAgent::Start([&](const v1::RunEpisodeRequest& r,
                                               grpc::ServerContext*, v1::RunEpisodeResponse* out) {
    EndpointClient(r).Post("/completions", Completion("1"));
    out->set_reward(1);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("hung", AgentAt(hung.address), 4)).ok());
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("healthy", AgentAt(healthy.address), 4)).ok());
  ASSERT_TRUE(loop_.Run([&] { return !loop_.finished().empty(); }));
  EXPECT_EQ(loop_.finished()[0].id, "healthy");
  EXPECT_EQ(loop_.episodes().live_agent_keys(), 4) << "the hung group's";
  ASSERT_TRUE(loop_.episodes().Abort("hung", "reclaimed"));
  EXPECT_EQ(loop_.episodes().live_agent_keys(), 0);
  hung.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_TRUE(cancelled);
}

// One RunEpisode at a time per agent address: a group's episodes still queued there when the
// group ends are dropped, never sent (each would hold the address's thread up to timeout_s).
// A probe group queued behind them shows the queue has moved past them.
TEST(AgentEpisodesCancelTest, QueuedRunEpisodesOfAnEndedGroupAreNeverSent) {
  EpisodeEngineOptions options;
  options.agent_episodes_per_address = 1;
  EpisodeLoop loop(options);
  ASSERT_TRUE(loop.episodes().ServeAgents({}, "tiny").ok());
  std::atomic<int> sent{0};
  ServedAgent agent =
      ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext* context,
                             v1::RunEpisodeResponse* out) {
        if (sent++ == 0) {  // the ended group's first episode: until it is cancelled
          agent.agent->WaitForRelease(context);
          return grpc::Status::OK;
        }
        EndpointClient(r).Post("/completions", Completion("1"));
        out->set_reward(1);
        return grpc::Status::OK;
      });
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("ended", AgentAt(agent.address), 3)).ok());
  ASSERT_TRUE(loop.Run([&] { return sent.load() == 1; }));
  ASSERT_TRUE(loop.episodes().Abort("ended", "reclaimed"));
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("probe", AgentAt(agent.address), 1)).ok());
  ASSERT_TRUE(loop.Run([&] { return !loop.finished().empty() || !loop.failed().empty(); }));
  ASSERT_EQ(loop.finished().size(), 1u);
  EXPECT_EQ(loop.finished()[0].id, "probe");
  EXPECT_EQ(sent.load(), 2) << "the ended group's two queued RunEpisodes were sent";
  agent.agent->Release();
}

// Stopping while four agents' calls are in flight (what SIGTERM does to an actor: the episode
// engine goes) aborts the groups, closes the endpoint's connections and leaves the calls'
// callbacks to fire into nothing; no thread touches the server after it went. Three rounds,
// plain and streamed; under scripts/sanitize.sh asan any use after free is a finding.
TEST(AgentEpisodesStopTest, StoppingWhileFourCallsAreInFlightTouchesNothingFreed) {
  for (int round = 0; round < 3; ++round) {
    auto loop = std::make_unique<EpisodeLoop>();
    ASSERT_TRUE(loop->episodes().ServeAgents({}, "tiny").ok());
    std::atomic<int> calling{0};
    ServedAgent agent = ServedAgent::Start(
        [&](const v1::RunEpisodeRequest& r, grpc::ServerContext*, v1::RunEpisodeResponse* out) {
          ++calling;
          Json body = Completion("1", 64);
          body["stream"] = round == 1;
          try {
            EndpointClient(r).Post("/completions", body);
          } catch (const std::exception&) {  // the endpoint went mid-call: expected here
          }
          out->set_reward(1);
          return grpc::Status::OK;
        });
    v1::AgentSpec spec = AgentAt(agent.address);
    spec.set_max_tokens_per_call(64);  // long enough to be generating when the engine goes
    ASSERT_TRUE(loop->episodes().Add(AgentGroup("g", spec, 4)).ok());
    loop->Run([&] {
      return calling.load() == 4 && loop->episodes().engine().Stats().unfinished_requests > 0;
    });
    loop.reset();
    agent.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
}

// New weights arrive while a call generates: the call goes on and is answered; its tokens carry
// the version that sampled each.
TEST_F(AgentEpisodesTest, AWeightSwapMidCallKeepsTheCall) {
  std::atomic<int> status{0};
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    status = EndpointClient(r).Post("/completions", Completion("(1+2)=", 40)).first;
    out->set_reward(1);
    return grpc::Status::OK;
  });
  v1::AgentSpec spec = AgentAt(served.address);
  spec.set_max_tokens_per_call(40);
  GroupRequest group = AgentGroup("g", spec, 1);
  group.params.stop_token_ids.clear();  // only the budget ends the answer
  ASSERT_TRUE(loop_.episodes().Add(std::move(group)).ok());
  ASSERT_TRUE(loop_.Run([&] { return loop_.episodes().engine().Stats().generated_tokens >= 3; }));
  ASSERT_TRUE(loop_.episodes().engine().SwapWeights(testing::TinyCharWeights(), 1).ok());
  ASSERT_TRUE(loop_.RunToEnd());
  ASSERT_TRUE(loop_.failed().empty()) << loop_.failed()[0].why;
  EXPECT_EQ(status, 200);
  const SampleOutput& s = loop_.finished()[0].episodes[0].segments[0].output;
  ASSERT_EQ(s.tokens.size(), 40u);
  EXPECT_EQ(s.versions.front(), 0);
  EXPECT_EQ(s.versions.back(), 1);
}

// A streamed call: server-sent events whose text deltas add up to the answer, then [DONE]; with
// logprobs, each sampled token's alternatives.
TEST_F(AgentEpisodesTest, AStreamedCallSendsTheAnswerAsItGrows) {
  std::mutex mu;
  std::string stream, whole;
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    EndpointClient client(r);
    Json body = Completion("(1+2)=");
    body["stream"] = true;
    auto streamed = client.Post("/completions", body);
    Json plain = Completion("(1+2)=");
    plain["logprobs"] = 2;
    auto answered = client.Post("/completions", plain);
    std::lock_guard<std::mutex> lock(mu);
    stream = streamed.second.get<std::string>();
    whole = answered.second.dump();
    out->set_reward(1);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop_.episodes().Add(AgentGroup("g", AgentAt(served.address), 1)).ok());
  ASSERT_TRUE(loop_.RunToEnd());
  // Read under the agent's lock: the reply that ordered its writes came over a socket.
  const std::lock_guard<std::mutex> agent_wrote(mu);
  ASSERT_TRUE(loop_.failed().empty()) << loop_.failed()[0].why;
  std::string text, final_text;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
    const Json chunk = Json::parse(line);
    text += chunk["choices"][0].value("text", "");
  }
  EXPECT_TRUE(absl::EndsWith(stream, "data: [DONE]\n\n"));
  const EpisodeSegment& first = loop_.finished()[0].episodes[0].segments[0];
  EXPECT_EQ(text, *task::CharTextCodec().DecodeCompletion(absl::MakeConstSpan(
                      first.output.tokens.data(), first.turn_ends[0])));
  const Json answer = Json::parse(whole);
  const Json& lp = answer["choices"][0]["logprobs"];
  ASSERT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
  for (const Json& alternatives : lp["top_logprobs"]) EXPECT_LE(alternatives.size(), 2u);
}

// A forced tool choice (tool_choice naming a function) opens the answer with the format's call
// opening: in the record it is context after the prompt, never part of it (source 1, log-prob
// 0, its call's end after the model's tokens), as docs/agents.md says; the answer lists it
// first among the tokens the call added. Qwen3's real template and tokenizer (hermes calls).
TEST(AgentEpisodesChatTest, AForcedToolChoicesOpeningIsContextAfterThePromptNotPartOfIt) {
  if (const std::string reason = tokenizer::testing::SkipReason(); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  auto loaded = tokenizer::HfTextCodec::Load(tokenizer::testing::PackageModelDir("qwen3"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const tokenizer::TextCodec> codec = *std::move(loaded);
  EpisodeLoop loop({}, /*context=*/1024, /*kv_cache_bytes=*/int64_t{64} << 20, codec);
  ASSERT_TRUE(loop.episodes().ServeAgents({}, "tiny").ok());
  std::mutex mu;
  Json answer;
  ServedAgent served = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                              v1::RunEpisodeResponse* out) {
    const Json tool = {{"type", "function"},
                       {"function", {{"name", "calc"},
                                     {"description", "Evaluates an arithmetic expression."},
                                     {"parameters", {{"type", "object"},
                                                     {"properties", {{"expr", {{"type", "string"}}}}},
                                                     {"required", {"expr"}}}}}}};
    const Json body = {{"model", "m"},
                       {"max_tokens", 5},
                       {"messages", Json::array({{{"role", "user"}, {"content", "6*7?"}}})},
                       {"tools", Json::array({tool})},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "calc"}}}}}};
    auto [status, a] = EndpointClient(r).Post("/chat/completions", body);
    {
      std::lock_guard<std::mutex> lock(mu);
      answer = a;
    }
    if (status != 200) return grpc::Status(grpc::StatusCode::INTERNAL, a.dump());
    out->set_reward(1);
    return grpc::Status::OK;
  });
  GroupRequest g = AgentGroup("g", AgentAt(served.address), 1);
  g.prompt = *codec->EncodePrompt("6*7?");
  g.params.stop_token_ids = codec->stop_ids();
  g.submitted.set_text("6*7?");
  ASSERT_TRUE(loop.episodes().Add(std::move(g)).ok());
  ASSERT_TRUE(loop.RunToEnd());
  // Read under the agent's lock: the reply that ordered its writes came over a socket.
  const std::lock_guard<std::mutex> agent_wrote(mu);
  ASSERT_TRUE(loop.failed().empty()) << loop.failed()[0].why;
  const EpisodeSegment& s = loop.finished()[0].episodes[0].segments[0];
  const std::vector<int32_t> opening =
      *codec->EncodeContinuation("<tool_call>\n{\"name\": \"calc\", \"arguments\": ");
  ASSERT_FALSE(opening.empty());
  // The prompt is the chat as rendered; the opening is not at its end.
  EXPECT_EQ(answer["usage"]["prompt_tokens"], s.prompt.size()) << answer.dump();
  ASSERT_GE(s.prompt.size(), opening.size());
  EXPECT_NE(std::vector<int32_t>(s.prompt.end() - opening.size(), s.prompt.end()), opening);
  // The completion: the opening (context), then what the model sampled.
  ASSERT_GT(s.output.tokens.size(), opening.size());
  EXPECT_EQ(std::vector<int32_t>(s.output.tokens.begin(), s.output.tokens.begin() + opening.size()),
            opening);
  EXPECT_EQ(s.output.tokens, Ids(answer)) << answer.dump();
  std::vector<uint8_t> sources(s.output.tokens.size(), 0);
  std::fill(sources.begin(), sources.begin() + opening.size(), 1);
  EXPECT_EQ(s.output.sources, sources);
  EXPECT_EQ(answer["prl"]["token_sources"].get<std::vector<int>>(),
            std::vector<int>(sources.begin(), sources.end()));
  for (size_t i = 0; i < opening.size(); ++i) EXPECT_EQ(s.output.logprobs[i], 0.0f) << i;
  EXPECT_EQ(s.turn_ends, std::vector<uint32_t>{static_cast<uint32_t>(s.output.tokens.size())});
}

}  // namespace
}  // namespace prl::episode
