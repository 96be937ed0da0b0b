// openai/openai_server.h over real HTTP (a Beast client on loopback) with a scripted backend:
// the per-episode key is required everywhere; answers follow OpenAI's schema with prl's
// extension fields; a stream is server-sent events (the role, the text as it grew, the tool
// calls and finish reason, usage, [DONE]); malformed requests and the backend's refusals get
// their status and name the field; a connection serves one request after another.
#include "openai/openai_server.h"

#include <gtest/gtest.h>

#include <mutex>

#include "absl/strings/str_split.h"
#include "tests/openai/http_client.h"

namespace prl::openai {
namespace {

namespace http = boost::beast::http;
using Json = nlohmann::ordered_json;

class ScriptedBackend final : public CompletionBackend {
 public:
  std::string model() const override { return "tiny-model"; }
  bool KnowsKey(const std::string& key) const override { return key == "episode-key"; }
  void Generate(const std::string& key, ChatCall call, Progress progress, Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back({key, call});
    }
    if (!call.messages.empty() && call.messages.back()["content"] == "too much") {
      return done(absl::ResourceExhaustedError("the episode's calls: at most 8"));
    }
    if (progress) {
      progress("Hel");
      progress("Hello");
    }
    Completion c;
    c.content = "Hello";
    v1::ToolCall call_1;
    call_1.set_id("call_0123456789abcdef");
    call_1.set_name("calc");
    call_1.set_arguments_json(R"({"x":"6*7"})");
    c.tool_calls = {call_1};
    c.finish_reason = "tool_calls";
    c.prompt_tokens = 10;
    c.token_ids = {5, 6, 7};
    c.logprobs = {-0.5f, 0.0f, -1.5f};
    c.versions = {3, 3, 4};
    c.sources = {0, 1, 0};
    done(c);
  }
  std::vector<std::pair<std::string, ChatCall>> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::string, ChatCall>> calls_;
};

using testing::Call;
using testing::Exchange;
using testing::Request;
using Answer = testing::HttpAnswer;

class OpenAiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = OpenAiServer::Start({}, &backend_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    port_ = server_->port();
  }
  ScriptedBackend backend_;
  std::unique_ptr<OpenAiServer> server_;
  int port_ = 0;
};

const char kChat[] = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})";

TEST_F(OpenAiServerTest, EveryPathWantsTheEpisodesKey) {
  EXPECT_EQ(server_->base_url(), "http://127.0.0.1:" + std::to_string(port_) + "/v1");
  for (const auto& [verb, path] :
       std::vector<std::pair<http::verb, std::string>>{{http::verb::get, "/v1/models"},
                                                       {http::verb::post, "/v1/chat/completions"},
                                                       {http::verb::post, "/v1/completions"}}) {
    const Answer none = Call(port_, verb, path, "", kChat);
    EXPECT_EQ(none.status, 401) << path;
    EXPECT_EQ(Json::parse(none.body)["error"]["type"], "authentication_error");
    EXPECT_EQ(Call(port_, verb, path, "an-actor-token", kChat).status, 401) << path;
  }
  EXPECT_TRUE(backend_.calls().empty());
  const Answer models = Call(port_, http::verb::get, "/v1/models", "episode-key");
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(Json::parse(models.body)["data"][0]["id"], "tiny-model");
  EXPECT_EQ(Call(port_, http::verb::get, "/v2/anything", "episode-key").status, 404);
  EXPECT_EQ(Call(port_, http::verb::get, "/v1/chat/completions", "episode-key").status, 405);
}

TEST_F(OpenAiServerTest, AChatCompletionFollowsOpenAisSchemaWithTheSampledTokens) {
  const Answer a = Call(port_, http::verb::post, "/v1/chat/completions", "episode-key", kChat);
  ASSERT_EQ(a.status, 200) << a.body;
  const Json j = Json::parse(a.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny-model");
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Hello");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"], "call_0123456789abcdef");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"x":"6*7"})");
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["prl"]["token_ids"], Json({5, 6, 7}));
  EXPECT_EQ(j["prl"]["logprobs"], Json({-0.5, 0.0, -1.5}));
  EXPECT_EQ(j["prl"]["weight_versions"], Json({3, 3, 4}));
  EXPECT_EQ(j["prl"]["token_sources"], Json({0, 1, 0}));
  ASSERT_EQ(backend_.calls().size(), 1u);
  EXPECT_EQ(backend_.calls()[0].first, "episode-key");
}

TEST_F(OpenAiServerTest, AStreamIsServerSentEventsEndingInDone) {
  const Answer a = Call(port_, http::verb::post, "/v1/chat/completions", "episode-key",
                        R"({"messages": [{"role": "user", "content": "hi"}], "stream": true,
               "stream_options": {"include_usage": true}})");
  ASSERT_EQ(a.status, 200) << a.body;
  std::vector<Json> events;
  bool done = false;
  for (absl::string_view line : absl::StrSplit(a.body, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::StartsWith(line, "data: ")) << line;
    const absl::string_view data = line.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    ASSERT_FALSE(done) << "an event after [DONE]";
    events.push_back(Json::parse(std::string(data)));
  }
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 5u) << a.body;
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(events[3]["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(events[3]["prl"]["token_ids"], Json({5, 6, 7}));
  EXPECT_EQ(events[4]["usage"]["total_tokens"], 13);
  for (const Json& e : events) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], events[0]["id"]) << "one id for the whole stream";
  }
}

TEST_F(OpenAiServerTest, RefusalsGetTheirStatusAndNameTheField) {
  const Answer bad = Call(port_, http::verb::post, "/v1/chat/completions", "episode-key",
                          R"({"messages": [{"role": "user", "content": "hi"}], "top_p": 5})");
  EXPECT_EQ(bad.status, 400);
  const Json error = Json::parse(bad.body)["error"];
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(error["param"], "top_p");
  EXPECT_EQ(error["message"], "top_p: expected a number in (0, 1], found 5");
  EXPECT_EQ(
      Call(port_, http::verb::post, "/v1/chat/completions", "episode-key", "{not json").status,
      400);
  const Answer limit = Call(port_, http::verb::post, "/v1/chat/completions", "episode-key",
                            R"({"messages": [{"role": "user", "content": "too much"}]})");
  EXPECT_EQ(limit.status, 429);
  EXPECT_EQ(Json::parse(limit.body)["error"]["message"], "the episode's calls: at most 8");
}

TEST_F(OpenAiServerTest, AConnectionServesOneRequestAfterAnother) {
  const std::vector<Answer> answers =
      Exchange(port_, {Request(http::verb::post, "/v1/chat/completions", "episode-key", kChat),
                       Request(http::verb::get, "/v1/models", "episode-key"),
                       Request(http::verb::post, "/v1/completions", "episode-key",
                               R"({"prompt": "12+34=", "stream": true})")});
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].status, 200);
  EXPECT_EQ(answers[1].status, 200);
  EXPECT_EQ(answers[2].status, 200);
  EXPECT_NE(answers[2].body.find("\"object\":\"text_completion\""), std::string::npos)
      << answers[2].body;
  EXPECT_TRUE(absl::EndsWith(answers[2].body, "data: [DONE]\n\n"));
}

TEST(OpenAiServerStartTest, ANetworkAddressNeedsTlsOrAnExplicitChoice) {
  ScriptedBackend backend;
  OpenAiServerOptions o;
  o.address = "0.0.0.0:0";
  const absl::Status refused = OpenAiServer::Start(o, &backend).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("security.tls_cert_file"), std::string::npos) << refused;
  o.insecure = true;
  EXPECT_TRUE(OpenAiServer::Start(o, &backend).ok());
}

}  // namespace
}  // namespace prl::openai
