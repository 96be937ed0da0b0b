// The actor's OpenAI-compatible endpoint and the agents' per-episode keys as an attacker sees them
// (docs/security.md; openai/openai_server.h, episode/agent_gateway.h): the endpoint listens on
// loopback unless TLS or the explicit opt-out allows more; with TLS it speaks nothing else; a call
// without its episode's live key is refused and samples nothing; a key reaches its own episode
// only, and only until its agent returns; the agent is never sent a role's token, and the key is
// none; the key shows in no log, metric or error answer; oversized requests are refused naming the
// cap and leave the server up. Every episode runs against an agent served over gRPC on loopback
// (tests/episode/agent_testing.h) that makes the calls an attacker or a careless agent would.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/hf_model_dir.h"
#include "config/run_config.h"
#include "core/net_address.h"
#include "metrics/metrics_server.h"
#include "metrics/prl_metrics.h"
#include "roles/actor_role.h"
#include "rpc/security.h"
#include "tests/episode/agent_testing.h"
#include "tests/episode/episode_testing.h"
#include "tests/security/endpoint_clients.h"

namespace prl {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
namespace v1 = prl::v1;
using episode::testing::AgentAt;
using episode::testing::EndpointClient;
using episode::testing::EpisodeLoop;
using episode::testing::Json;
using episode::testing::ServedAgent;
using openai::testing::HttpAnswer;
using security::testing::Head;
using security::testing::HttpsCall;
using security::testing::MakeCertificate;
using security::testing::RawAnswer;
using security::testing::SendRaw;
using Script = episode::testing::ScriptedAgent::Script;

// A group of `n` agent episodes of the text prompt `text`.
episode::GroupRequest AgentGroup(const std::string& id, const std::string& address, int32_t n = 1,
                                 const std::string& text = "(1+2)=") {
  episode::GroupRequest g;
  g.id = id;
  g.prompt = *task::CharTokenizer().Encode(text);
  g.agent = AgentAt(address, /*max_calls=*/8, /*timeout_s=*/120);  // room for a loaded machine
  g.params.n = n;
  g.params.temperature = 1.0f;
  g.params.max_tokens = g.agent->max_tokens_per_call();
  g.params.seed = 7;
  g.params.stop_token_ids = {task::CharTokenizer::kEos};
  g.submitted.set_text(text);
  return g;
}

Json Completion(const std::string& prompt) {
  return {{"model", "m"}, {"prompt", prompt}, {"max_tokens", 6}};
}

// The `error` object of an answer's body (empty when the body is not one).
Json ErrorOf(const std::string& body) {
  const Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  return parsed.is_object() && parsed.contains("error") ? parsed["error"] : Json::object();
}

// The calls an episode's records hold (its answered turns).
int64_t Calls(const episode::EpisodeOutcome& o) {
  int64_t n = 0;
  for (const episode::EpisodeSegment& s : o.segments) n += static_cast<int64_t>(s.turn_ends.size());
  return n;
}

// Runs the loop's groups to their end: every one finishes, and the engine sampled only what their
// records hold (the calls that were served).
void Finish(EpisodeLoop& loop) {
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_TRUE(loop.failed().empty()) << loop.failed()[0].why;
  int64_t sampled = 0;
  for (const episode::FinishedGroup& g : loop.finished()) {
    for (const episode::EpisodeOutcome& o : g.episodes) {
      for (const episode::EpisodeSegment& s : o.segments) {
        sampled += std::count(s.output.sources.begin(), s.output.sources.end(), 0);
      }
    }
  }
  EXPECT_EQ(loop.episodes().engine().Stats().generated_tokens, sampled);
}

// The tests run as an actor process does: its own role token configured (security.actor_token_
// file); the attacker also knows the other roles' tokens.
class AgentEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("prl_agent_endpoint_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* role : {"client", "actor", "learner"}) {
      tokens_[role] = absl::StrCat(role, "-token-", getpid());
      std::ofstream(dir_ / role) << tokens_[role] << "\n";
    }
    settings_.actor_token_file = (dir_ / "actor").string();
    ASSERT_TRUE(rpc::ConfigureSecurity(settings_, rpc::Role::kActor).ok());
  }
  void TearDown() override {
    rpc::ConfigureSecurity({}, std::nullopt).IgnoreError();
    fs::remove_all(dir_);
  }
  void Serve(EpisodeLoop& loop, const openai::OpenAiServerOptions& options = {}) {
    const absl::Status served = loop.episodes().ServeAgents(options, "tiny");
    ASSERT_TRUE(served.ok()) << served;
  }

  fs::path dir_;
  rpc::SecuritySettings settings_;
  std::map<std::string, std::string> tokens_;  // role -> its token
};

TEST(AgentEndpointListenTest, TheEndpointListensOnLoopbackByDefault) {
  const config::RunConfig defaults;
  EXPECT_TRUE(IsLoopbackEndpoint(defaults.actors.openai_listen)) << defaults.actors.openai_listen;
  const absl::StatusOr<config::RunConfig> parsed = config::ParseRunConfig("{}", "defaults");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->actors.openai_listen, defaults.actors.openai_listen);
  EpisodeLoop loop;
  openai::OpenAiServerOptions options;
  options.address = defaults.actors.openai_listen;
  ASSERT_TRUE(loop.episodes().ServeAgents(options, "tiny").ok());
  const std::string url = loop.episodes().agents_base_url();
  ASSERT_TRUE(absl::StartsWith(url, "http://127.0.0.1:")) << url;
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(url.substr(17, url.rfind("/v1") - 17), &port)) << url;
  // From another host's side: the port is closed on every other IPv4 address of this machine.
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(getifaddrs(&interfaces), 0);
  for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    sockaddr_in a = *reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a.sin_addr.s_addr) >> 24) == 127) continue;
    a.sin_port = htons(static_cast<uint16_t>(port));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_NE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0)
        << "the endpoint answers on " << inet_ntoa(a.sin_addr) << " (" << i->ifa_name << ")";
    close(fd);
  }
  freeifaddrs(interfaces);
}

// `prl actor` itself, from a run config: actors.openai_listen off loopback without TLS stops the
// actor before it serves anything, naming the field and what would allow it; TLS or
// security.insecure (the explicit opt-out every prl listener has) lets it start.
TEST(AgentEndpointListenTest, AnActorServesOffLoopbackOnlyWithTlsOrTheExplicitOptOut) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("prl_agent_listen_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_TRUE(SaveModel((dir / "model").string(), *episode::testing::TinyCharWeights()).ok());
  ASSERT_NO_FATAL_FAILURE(MakeCertificate(dir));
  config::RunConfig c;
  c.run.name = absl::StrCat("agent-listen-", getpid());
  c.model.path = (dir / "model").string();
  c.coordinator.address = c.replay.address = c.broadcast.address = "127.0.0.1:1";  // never called
  c.broadcast.transport = config::WeightTransport::kGrpc;
  c.actors.kv_cache_mb = 4;
  c.actors.openai_listen = "0.0.0.0:0";
  const std::atomic<bool> stop{true};  // an actor that starts stops at once
  const absl::Status refused = roles::RunActorRole(c, {"exposed"}, stop);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  for (const char* named :
       {"actors.openai_listen", "0.0.0.0:0", "security.tls_cert_file", "security.insecure"}) {
    EXPECT_TRUE(absl::StrContains(refused.message(), named)) << named << " in " << refused;
  }
  // Started: it got as far as registering with the coordinator (and was stopped).
  c.security.insecure = true;
  const absl::Status opted_out = roles::RunActorRole(c, {"insecure"}, stop);
  EXPECT_TRUE(absl::IsCancelled(opted_out)) << opted_out;
  c.security.insecure = false;
  c.security.tls_cert_file = (dir / "endpoint.crt").string();
  c.security.tls_key_file = (dir / "endpoint.key").string();
  const absl::Status with_tls = roles::RunActorRole(c, {"tls"}, stop);
  EXPECT_TRUE(absl::IsCancelled(with_tls)) << with_tls;
  rpc::ConfigureSecurity({}, std::nullopt).IgnoreError();
  fs::remove_all(dir);
}

// With TLS the endpoint speaks only TLS: the agent's key sent in plaintext gets no HTTP answer
// (the connection closes, at most after a TLS alert) and samples nothing; HTTPS with the key is
// served, and the URL the agent is given says https.
TEST_F(AgentEndpointTest, WithTlsTheEndpointSpeaksOnlyTls) {
  ASSERT_NO_FATAL_FAILURE(MakeCertificate(dir_));
  const std::string ca = (dir_ / "endpoint.crt").string();
  std::mutex mu;
  RawAnswer plaintext;
  HttpAnswer https, https_no_key;
  EpisodeLoop loop;
  openai::OpenAiServerOptions options;
  options.tls_cert_file = ca;
  options.tls_key_file = (dir_ / "endpoint.key").string();
  Serve(loop, options);
  ServedAgent agent = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                             v1::RunEpisodeResponse* out) {
    const int port = EndpointClient(r).port();
    const std::string body = Completion("(1+2)=").dump();
    const std::string length = absl::StrCat("Content-Length: ", body.size(), "\r\n");
    const RawAnswer plain = SendRaw(port, Head("POST /v1/completions", r.api_key(), length) + body);
    const auto request = [&](const std::string& key) {
      return openai::testing::Request(http::verb::post, "/v1/completions", key, body);
    };
    const HttpAnswer served = HttpsCall(port, ca, request(r.api_key()));
    const HttpAnswer no_key = HttpsCall(port, ca, request(""));
    std::lock_guard<std::mutex> lock(mu);
    std::tie(plaintext, https, https_no_key) = std::tie(plain, served, no_key);
    out->set_reward(1);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(absl::StartsWith(loop.episodes().agents_base_url(), "https://127.0.0.1:"))
      << loop.episodes().agents_base_url();
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("g", agent.address)).ok());
  ASSERT_NO_FATAL_FAILURE(Finish(loop));
  EXPECT_TRUE(plaintext.closed) << "a plaintext connection held open";
  EXPECT_EQ(plaintext.status(), 0) << plaintext.bytes;
  EXPECT_TRUE(plaintext.bytes.empty() || plaintext.bytes[0] == '\x15')  // nothing, or an alert
      << absl::CHexEscape(plaintext.bytes);
  EXPECT_EQ(https.status, 200) << https.body;
  EXPECT_EQ(https_no_key.status, 401) << https_no_key.body;
  ASSERT_EQ(loop.finished().size(), 1u);
  EXPECT_EQ(Calls(loop.finished()[0].episodes[0]), 1) << "only the HTTPS call was served";
}

// While an episode is live, anything but its exact key in the one place a key goes is refused
// (401, echoing no key) on every path, and samples nothing.
TEST_F(AgentEndpointTest, ACallWithoutItsEpisodesKeyIsRefusedAndSamplesNothing) {
  std::mutex mu;
  std::vector<std::pair<std::string, HttpAnswer>> refused;  // (attempt, answer)
  int honest = 0;
  EpisodeLoop loop;
  Serve(loop);
  ServedAgent agent = ServedAgent::Start(
      [&](const v1::RunEpisodeRequest& r, grpc::ServerContext*, v1::RunEpisodeResponse* out) {
        const std::string& key = r.api_key();
        unsigned char random[32];
        RAND_bytes(random, sizeof(random));
        std::string changed = key;
        changed.back() = changed.back() == '0' ? '1' : '0';
        const std::string auth = "Authorization", basic = absl::Base64Escape("agent:" + key);
        struct Attempt {
          std::string what, header, value, query;
        };
        const Attempt attempts[] = {
            {"no key", "", "", ""},
            {"a random well-formed key", auth,
             "Bearer prl-ep-" + absl::BytesToHexString({reinterpret_cast<char*>(random), 32}), ""},
            {"a malformed key", auth, "Bearer prl-ep-not-a-key", ""},
            {"the key less its last digit", auth, "Bearer " + key.substr(0, key.size() - 1), ""},
            {"the key with a digit changed", auth, "Bearer " + changed, ""},
            {"the key with a digit more", auth, "Bearer " + key + "0", ""},
            {"the key in upper case", auth, "Bearer prl-ep-" + absl::AsciiStrToUpper(key.substr(7)),
             ""},
            {"the client token", auth, "Bearer " + tokens_["client"], ""},
            {"the actor token", auth, "Bearer " + tokens_["actor"], ""},
            {"the learner token", auth, "Bearer " + tokens_["learner"], ""},
            {"an empty bearer", auth, "Bearer ", ""},
            {"the key without its scheme", auth, key, ""},
            {"the key as basic credentials", auth, "Basic " + basic, ""},
            {"the key in x-api-key", "x-api-key", key, ""},
            {"the key in the query", "", "", "?api_key=" + key}};
        std::vector<std::pair<std::string, HttpAnswer>> answers;
        for (const std::string path : {"/v1/completions", "/v1/chat/completions", "/v1/models"}) {
          const http::verb verb = path == "/v1/models" ? http::verb::get : http::verb::post;
          const std::string body = path == "/v1/completions"
                                       ? Completion("(1+2)=").dump()
                                       : R"({"messages": [{"role": "user", "content": "(1+2)="}]})";
          for (const Attempt& a : attempts) {
            auto request = openai::testing::Request(verb, path + a.query, "", body);
            if (!a.header.empty()) request.set(a.header, a.value);
            answers.emplace_back(absl::StrCat(a.what, " on ", path),
                                 openai::testing::Exchange(EndpointClient(r).port(), {request})[0]);
          }
        }
        const int ok = EndpointClient(r).Post("/completions", Completion("(1+2)=")).first;
        std::lock_guard<std::mutex> lock(mu);
        refused = std::move(answers);
        honest = ok;
        out->set_reward(1);
        return grpc::Status::OK;
      });
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("g", agent.address)).ok());
  ASSERT_NO_FATAL_FAILURE(Finish(loop));
  const std::string key = agent.agent->requests().at(0).api_key();
  ASSERT_EQ(refused.size(), 3u * 15u);
  for (const auto& [what, answer] : refused) {
    EXPECT_EQ(answer.status, 401) << what << ": " << answer.body;
    EXPECT_EQ(ErrorOf(answer.body).value("type", ""), "authentication_error") << what;
    EXPECT_FALSE(absl::StrContains(answer.body, key.substr(7))) << what << " echoes the key";
  }
  EXPECT_EQ(honest, 200) << "the episode's own key";
  ASSERT_EQ(loop.finished().size(), 1u);
  EXPECT_EQ(Calls(loop.finished()[0].episodes[0]), 1) << "a refused call was served";
}

// Two episodes of one group: each key's calls land in its own episode's record only; a key dies
// when its agent's RunEpisode returns, while the other episode goes on; after the group, none
// works.
TEST_F(AgentEndpointTest, AKeyReachesOnlyItsOwnEpisodeAndOnlyUntilItsAgentReturns) {
  std::mutex mu;
  std::string first_key;
  std::map<std::string, int> status;  // what -> HTTP status
  EpisodeLoop loop;
  Serve(loop);
  ServedAgent agent =
      ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext* context,
                             v1::RunEpisodeResponse* out) {
        EndpointClient client(r);
        out->set_reward(1);
        if (r.sample_index() == 0) {
          const int own = client.Post("/completions", Completion("11+1=")).first;
          std::lock_guard<std::mutex> lock(mu);
          first_key = r.api_key();
          status["episode 0's call"] = own;
          return grpc::Status::OK;
        }
        auto [own, answer] = client.Post("/completions", Completion("22*2="));
        if (!agent.agent->WaitForRelease(context)) return grpc::Status::CANCELLED;
        std::unique_lock<std::mutex> lock(mu);
        const std::string stolen = first_key;
        lock.unlock();
        const int ended = client.Post("/completions", Completion("11+1=1"), stolen).first;
        const int models =
            openai::testing::Call(client.port(), http::verb::get, "/v1/models", stolen).status;
        const std::string text = answer.is_object() ? answer["choices"][0].value("text", "") : "";
        const int again = client.Post("/completions", Completion("22*2=" + text + "2")).first;
        lock.lock();
        status["episode 1's call"] = own;
        status["episode 0's key after its agent returned"] = ended;
        status["episode 0's key on /v1/models after"] = models;
        status["episode 1's second call"] = again;
        return grpc::Status::OK;
      });
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("g", agent.address, 2)).ok());
  // Episode 0's agent returns; episode 1's goes on once episode 0's key was revoked.
  ASSERT_TRUE(loop.Run([&] { return loop.episodes().live_agent_keys() == 1; }));
  agent.agent->Release();
  ASSERT_NO_FATAL_FAILURE(Finish(loop));
  for (const auto& [what, code] : status) {
    EXPECT_EQ(code, absl::StrContains(what, "after") ? 401 : 200) << what;
  }
  EXPECT_EQ(status.size(), 5u);
  ASSERT_EQ(loop.finished().size(), 1u);
  const episode::FinishedGroup& g = loop.finished()[0];
  ASSERT_EQ(g.episodes.size(), 2u);
  EXPECT_EQ(Calls(g.episodes[0]), 1) << "episode 0 got a call it did not make";
  EXPECT_EQ(Calls(g.episodes[1]), 2);
  const std::vector<int32_t> own_prompt[2] = {*task::CharTextCodec().EncodePrompt("11+1="),
                                              *task::CharTextCodec().EncodePrompt("22*2=")};
  for (int j = 0; j < 2; ++j) {
    for (const episode::EpisodeSegment& s : g.episodes[j].segments) {
      EXPECT_EQ(s.prompt, own_prompt[j]) << "episode " << j << " holds another key's call";
    }
  }
  EXPECT_EQ(loop.episodes().live_agent_keys(), 0);
  for (const v1::RunEpisodeRequest& r : agent.agent->requests()) {
    EXPECT_EQ(EndpointClient(r).Post("/completions", Completion("1")).first, 401);
  }
}

// The agent is third-party code: its RunEpisode carries no role token, only the credential
// configured for its own address (none where none is), and the key it is handed is a fresh
// capability of its own, not a role's token or that credential.
TEST_F(AgentEndpointTest, RunEpisodeCarriesNoRoleTokenAndTheKeyIsNone) {
  std::mutex mu;
  std::map<std::string, std::vector<std::string>> headers;  // agent -> each call's metadata
  const auto harvesting = [&](const std::string& name) -> Script {
    return [&, name](const v1::RunEpisodeRequest& r, grpc::ServerContext* context,
                     v1::RunEpisodeResponse* out) {
      std::string seen;
      for (const auto& [k, v] : context->client_metadata()) {
        absl::StrAppend(&seen, std::string(k.data(), k.size()), "=",
                        std::string(v.data(), v.size()), ";");
      }
      EndpointClient(r).Post("/completions", Completion("(1+2)="));
      std::lock_guard<std::mutex> lock(mu);
      headers[name].push_back(seen);
      out->set_reward(1);
      return grpc::Status::OK;
    };
  };
  ServedAgent credentialed = ServedAgent::Start(harvesting("credentialed"));
  ServedAgent bare = ServedAgent::Start(harvesting("bare"));
  const std::string credential = absl::StrCat("agent-credential-", getpid());
  std::ofstream(dir_ / "agent") << credential << "\n";
  settings_.service_token_files[credentialed.address] = (dir_ / "agent").string();
  ASSERT_TRUE(rpc::ConfigureSecurity(settings_, rpc::Role::kActor).ok());
  EpisodeLoop loop;
  Serve(loop);
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("with", credentialed.address, 2)).ok());
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("without", bare.address, 1)).ok());
  ASSERT_NO_FATAL_FAILURE(Finish(loop));
  ASSERT_EQ(headers["credentialed"].size(), 2u);
  ASSERT_EQ(headers["bare"].size(), 1u);
  for (const auto& [agent, calls] : headers) {
    for (const std::string& seen : calls) {
      for (const auto& [role, token] : tokens_) {
        EXPECT_FALSE(absl::StrContains(seen, token)) << role << " token sent to " << agent;
      }
      if (agent == "credentialed") {
        EXPECT_TRUE(absl::StrContains(seen, "authorization=Bearer " + credential + ";")) << seen;
      } else {
        EXPECT_FALSE(absl::StrContains(seen, "authorization=")) << seen;
      }
    }
  }
  std::set<std::string> keys;
  for (const ServedAgent* a : {&credentialed, &bare}) {
    for (const v1::RunEpisodeRequest& r : a->agent->requests()) {
      const std::string& key = r.api_key();
      keys.insert(key);
      EXPECT_TRUE(absl::StartsWith(key, "prl-ep-") && key.size() == 7 + 64 &&
                  key.find_first_not_of("0123456789abcdef", 7) == std::string::npos)
          << key;
      for (const auto& [role, token] : tokens_) {
        EXPECT_FALSE(absl::StrContains(key, token) || absl::StrContains(token, key.substr(7)))
            << role;
      }
      EXPECT_FALSE(absl::StrContains(key, credential));
    }
  }
  EXPECT_EQ(keys.size(), 3u) << "a key per episode";
}

// A key is a secret: episodes that call, rewrite their history (which is logged), send a bad
// request, fail, and use their keys after the end leave no key (nor its digits) in what the
// process writes to stdout and stderr (its logs: prl's fprintf lines, gRPC's and absl's), on
// /metrics, in a failed group's reason (which the actor logs and reports to the coordinator), or
// in any answer. (The actor role's own lines around the engine print the endpoint's URL, never a
// key; a log pipeline outside the process is beyond this test.)
TEST_F(AgentEndpointTest, TheKeyShowsInNoLogMetricOrErrorAnswer) {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics::ActorMetrics actor_metrics(*registry);
  auto scrape_server = metrics::MetricsServer::Start({}, registry);
  ASSERT_TRUE(scrape_server.ok()) << scrape_server.status();
  std::mutex mu;
  std::vector<HttpAnswer> answers;
  const auto post = [&](const v1::RunEpisodeRequest& r, const Json& body) {
    const HttpAnswer a = openai::testing::Call(EndpointClient(r).port(), http::verb::post,
                                               "/v1/completions", r.api_key(), body.dump());
    std::lock_guard<std::mutex> lock(mu);
    answers.push_back(a);
  };
  ServedAgent talker = ServedAgent::Start(
      [&](const v1::RunEpisodeRequest& r, grpc::ServerContext*, v1::RunEpisodeResponse* out) {
        post(r, Completion("(1+2)="));
        post(r, Completion("(3+4)="));  // a rewritten history: a new trajectory, logged
        Json bad = Completion("(1+2)=");
        bad["top_p"] = 5;
        post(r, bad);
        out->set_reward(1);
        return grpc::Status::OK;
      });
  ServedAgent crasher = ServedAgent::Start(
      [&](const v1::RunEpisodeRequest& r, grpc::ServerContext*, v1::RunEpisodeResponse*) {
        post(r, Completion("(1+2)="));
        return grpc::Status(grpc::StatusCode::INTERNAL, "the agent crashed");
      });
  episode::EpisodeEngineOptions options;
  options.metrics = &actor_metrics;
  EpisodeLoop loop(options);
  Serve(loop);
  // (No ASSERT while the output is captured: it would stay captured.)
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(loop.episodes().Add(AgentGroup("talker", talker.address, 2)).ok());
  EXPECT_TRUE(loop.episodes().Add(AgentGroup("crasher", crasher.address, 1)).ok());
  EXPECT_TRUE(loop.RunToEnd());
  std::vector<std::string> keys;
  for (const ServedAgent* a : {&talker, &crasher}) {
    for (const v1::RunEpisodeRequest& r : a->agent->requests()) {
      keys.push_back(r.api_key().substr(7));  // the digits: a log might drop the prefix
      post(r, Completion("1"));
    }
  }
  const std::string logs =
      ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(keys.size(), 3u) << logs;
  ASSERT_EQ(loop.finished().size(), 1u);
  ASSERT_EQ(loop.failed().size(), 1u);
  const std::string why = loop.failed()[0].why.ToString();
  EXPECT_TRUE(absl::StrContains(why, "the agent crashed")) << why;
  const HttpAnswer scraped =
      openai::testing::Call((*scrape_server)->port(), http::verb::get, "/metrics", "");
  ASSERT_EQ(scraped.status, 200);
  // The places searched are the ones the episodes reached.
  EXPECT_TRUE(absl::StrContains(logs, "starts trajectory")) << logs;
  EXPECT_TRUE(absl::StrContains(scraped.body, "prl_agent_splits_total 2")) << scraped.body;
  std::map<int, int> statuses;
  for (const HttpAnswer& a : answers) ++statuses[a.status];
  EXPECT_EQ(statuses, (std::map<int, int>{{200, 5}, {400, 2}, {401, 3}}));
  for (const std::string& key : keys) {
    EXPECT_FALSE(absl::StrContains(logs, key)) << "a key in the logs:\n" << logs;
    EXPECT_FALSE(absl::StrContains(scraped.body, key)) << "a key on /metrics";
    EXPECT_FALSE(absl::StrContains(why, key)) << why;
    for (const HttpAnswer& a : answers) {
      EXPECT_FALSE(absl::StrContains(a.body, key)) << "a key in an answer: " << a.body;
    }
  }
}

// Requests past a cap are refused with 400 naming it — a body beyond max_body_bytes (declared, or
// as a chunk; with or without a key: none of it is buffered), more messages or tools than
// ChatLimits allow — and a header past 16 KiB gets its connection closed unanswered; after each
// the endpoint still serves the episode, and none of them sampled anything.
TEST_F(AgentEndpointTest, OversizedRequestsAreRefusedNamingTheCapAndTheEndpointStaysUp) {
  constexpr int64_t kCap = 64 << 10;
  openai::OpenAiServerOptions options;
  options.max_body_bytes = kCap;
  const openai::ChatLimits& limits = options.limits;
  Json messages = Json::array(), tools = Json::array();
  for (int i = 0; i <= limits.max_messages; ++i) {
    messages.push_back({{"role", "user"}, {"content", "1"}});
  }
  for (int i = 0; i <= limits.max_tools; ++i) {
    tools.push_back({{"type", "function"}, {"function", {{"name", absl::StrCat("f", i)}}}});
  }
  const std::string chat = "POST /v1/chat/completions";
  const auto post = [&](const Json& body) {  // KEY: the episode's key
    const std::string text = body.dump();
    return Head(chat, "KEY",
                absl::StrCat("Content-Type: application/json\r\nContent-Length: ", text.size(),
                             "\r\n")) +
           text;
  };
  const std::string too_long = absl::StrCat("Content-Length: ", kCap + 1, "\r\n");
  const std::string body_cap = absl::StrCat("the request body: expected at most ", kCap, " bytes");
  struct Oversized {
    std::string what, request, param, message;  // message "": no answer
  };
  const std::vector<Oversized> attempts = {
      {"a declared body past the cap", Head(chat, "KEY", too_long), "", body_cap},
      {"a declared body past the cap, no key", Head(chat, "", too_long), "", body_cap},
      {"a chunk past the cap",
       Head(chat, "KEY", "Transfer-Encoding: chunked\r\n") +
           absl::StrCat(absl::Hex(kCap + 1), "\r\n"),
       "", body_cap},
      {"too many messages", post({{"messages", messages}}), "messages",
       absl::StrCat("at most ", limits.max_messages)},
      {"too many tools", post({{"messages", Json::array({messages[0]})}, {"tools", tools}}),
       "tools", absl::StrCat("at most ", limits.max_tools)},
      {"a header past 16 KiB",
       Head("GET /v1/models", "KEY", "X-Padding: " + std::string(20 << 10, 'a') + "\r\n"), "", ""}};
  std::mutex mu;
  std::vector<RawAnswer> refused;
  std::vector<int> healthy;  // /v1/models after each
  int honest = 0;
  EpisodeLoop loop;
  Serve(loop, options);
  ServedAgent agent = ServedAgent::Start([&](const v1::RunEpisodeRequest& r, grpc::ServerContext*,
                                             v1::RunEpisodeResponse* out) {
    const int port = EndpointClient(r).port();
    std::vector<RawAnswer> answers;
    std::vector<int> up;
    for (const Oversized& a : attempts) {
      answers.push_back(SendRaw(port, absl::StrReplaceAll(a.request, {{"KEY", r.api_key()}})));
      up.push_back(openai::testing::Call(port, http::verb::get, "/v1/models", r.api_key()).status);
    }
    const int ok = EndpointClient(r).Post("/completions", Completion("(1+2)=")).first;
    std::lock_guard<std::mutex> lock(mu);
    std::tie(refused, healthy, honest) = std::tie(answers, up, ok);
    out->set_reward(1);
    return grpc::Status::OK;
  });
  ASSERT_TRUE(loop.episodes().Add(AgentGroup("g", agent.address)).ok());
  ASSERT_NO_FATAL_FAILURE(Finish(loop));
  ASSERT_EQ(refused.size(), attempts.size());
  for (size_t i = 0; i < attempts.size(); ++i) {
    const Oversized& a = attempts[i];
    const std::string head = refused[i].bytes.substr(0, 512);
    EXPECT_TRUE(refused[i].closed) << a.what << ": the connection was held";
    if (a.message.empty()) {
      EXPECT_EQ(refused[i].status(), 0) << a.what << ": " << head;
      continue;
    }
    ASSERT_EQ(refused[i].status(), 400) << a.what << ": " << head;
    const Json error = ErrorOf(refused[i].body());
    EXPECT_TRUE(absl::StrContains(error.value("message", ""), a.message)) << a.what << ": " << head;
    if (!a.param.empty()) {
      EXPECT_EQ(error.value("param", ""), a.param) << a.what;
    }
  }
  EXPECT_EQ(healthy, std::vector<int>(attempts.size(), 200)) << "the endpoint stopped serving";
  EXPECT_EQ(honest, 200);
  ASSERT_EQ(loop.finished().size(), 1u);
  EXPECT_EQ(Calls(loop.finished()[0].episodes[0]), 1);
}

}  // namespace
}  // namespace prl
