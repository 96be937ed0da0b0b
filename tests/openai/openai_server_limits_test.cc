// openai/openai_server.h under callers that do not behave, over real sockets: the key is
// checked before the body is read; idle and unauthenticated connections cannot hold a caller
// with a key out (shed, longest-waiting first; per-peer bound); a head that does not arrive is
// dropped at its deadline; a handler's exception is a 500 naming the request and the server
// goes on; a backend callback that comes after the server stopped does nothing. Every wait is
// for an event (an answer, a close, the backend holding a call), never for the clock.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "absl/strings/str_cat.h"
#include "openai/openai_server.h"
#include "tests/openai/http_client.h"
#include "tests/security/endpoint_clients.h"

namespace prl::openai {
namespace {

namespace http = boost::beast::http;
using security::testing::Head;
using security::testing::RawAnswer;
using security::testing::SendRaw;

const char kKey[] = "episode-key";
const char kChat[] = R"({"messages": [{"role": "user", "content": "hi"}]})";

// Answers at once, throws for the content "throw", or holds the call until Release.
class TestBackend final : public CompletionBackend {
 public:
  std::string model() const override { return "tiny-model"; }
  bool KnowsKey(const std::string& key) const override { return key == kKey; }
  void Generate(const std::string&, ChatCall call, Progress progress, Done done) override {
    const std::string content = call.messages.back()["content"];
    if (content == "throw") throw std::runtime_error("a backend bug");
    if (content == "hold") {
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back({std::move(progress), std::move(done)});
      changed_.notify_all();
      return;
    }
    Completion c;
    c.content = "ok";
    c.finish_reason = "stop";
    done(c);
  }
  // Waits until `n` calls are held.
  void WaitHeld(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return held_.size() >= n; });
  }
  std::vector<std::pair<Progress, Done>> TakeHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(held_);
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::pair<Progress, Done>> held_;
};

std::string ChatBody(const std::string& content, bool stream = false) {
  return absl::StrCat(R"({"messages": [{"role": "user", "content": ")", content, R"("}])",
                      stream ? R"(, "stream": true)" : "", "}");
}

// A connection that sends nothing: open until the server closes it.
class IdleConnection {
 public:
  explicit IdleConnection(int port) : socket_(ioc_) {
    socket_.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)});
  }
  // Blocks until the server closes the connection; what it sent before.
  std::string WaitClosed() {
    std::string got;
    char buffer[1024];
    boost::system::error_code ec;
    for (;;) {
      const size_t n = socket_.read_some(boost::asio::buffer(buffer), ec);
      if (ec) return got;
      got.append(buffer, n);
    }
  }
  void Send(const std::string& bytes) { boost::asio::write(socket_, boost::asio::buffer(bytes)); }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket socket_;
};

std::unique_ptr<OpenAiServer> Serve(TestBackend* backend, OpenAiServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<OpenAiServer>> server = OpenAiServer::Start(options, backend);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(OpenAiServerLimitsTest, AHandlersExceptionIsA500NamingTheRequestAndTheServerGoesOn) {
  TestBackend backend;
  std::unique_ptr<OpenAiServer> server = Serve(&backend);
  ASSERT_NE(server, nullptr);
  const auto post = [&](const std::string& body) {
    return testing::Call(server->port(), http::verb::post, "/v1/chat/completions", kKey, body);
  };
  const testing::HttpAnswer failed = post(ChatBody("throw"));
  EXPECT_EQ(failed.status, 500) << failed.body;
  EXPECT_NE(failed.body.find("internal error (request 1)"), std::string::npos) << failed.body;
  const testing::HttpAnswer next = post(ChatBody("hi"));
  EXPECT_EQ(next.status, 200) << next.body;
}

// A caller without a key is answered from the head alone: the 8 MiB it declared (under the
// 16 MiB cap) is never read, and the answer comes though not one byte of it was sent.
TEST(OpenAiServerLimitsTest, AMissingOrWrongKeyIs401BeforeAnyOfTheBodyIsRead) {
  TestBackend backend;
  std::unique_ptr<OpenAiServer> server = Serve(&backend);
  ASSERT_NE(server, nullptr);
  const std::string length = absl::StrCat("Content-Length: ", 8 << 20, "\r\n");
  for (const std::string key : {"", "not-the-key"}) {
    const RawAnswer answer =
        SendRaw(server->port(), Head("POST /v1/chat/completions", key, length));
    EXPECT_EQ(answer.status(), 401) << key << ": " << answer.bytes;
    EXPECT_TRUE(answer.closed) << key;
  }
  // The same head with the key waits for its body: sent, it is answered.
  const RawAnswer served =
      SendRaw(server->port(), Head("POST /v1/chat/completions", kKey,
                                   absl::StrCat("Content-Length: ", strlen(kChat), "\r\n")) +
                                  kChat);
  EXPECT_EQ(served.status(), 200) << served.bytes;
}

// Four idle connections fill a cap of four: a caller with its key still gets in (the
// longest-waiting idle one is shed), and is answered.
TEST(OpenAiServerLimitsTest, IdleConnectionsAtTheCapAreShedForACallerWithAKey) {
  TestBackend backend;
  OpenAiServerOptions options;
  options.max_connections = 4;
  std::unique_ptr<OpenAiServer> server = Serve(&backend, options);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<IdleConnection>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<IdleConnection>(server->port()));
  const testing::HttpAnswer served =
      testing::Call(server->port(), http::verb::post, "/v1/chat/completions", kKey, ChatBody("hi"));
  EXPECT_EQ(served.status, 200) << served.body;
  EXPECT_EQ(idle[0]->WaitClosed(), "") << "the longest-waiting idle connection is shed unanswered";
}

// One peer's connections that never sent a key are bounded: its oldest is shed past the bound.
TEST(OpenAiServerLimitsTest, APeersUnauthenticatedConnectionsAreBounded) {
  TestBackend backend;
  OpenAiServerOptions options;
  options.max_unauthenticated_per_peer = 2;
  std::unique_ptr<OpenAiServer> server = Serve(&backend, options);
  ASSERT_NE(server, nullptr);
  IdleConnection first(server->port()), second(server->port()), third(server->port());
  EXPECT_EQ(first.WaitClosed(), "");
  // An authenticated connection does not count: the peer still calls.
  const testing::HttpAnswer served =
      testing::Call(server->port(), http::verb::post, "/v1/chat/completions", kKey, ChatBody("hi"));
  EXPECT_EQ(served.status, 200) << served.body;
}

// When every connection is generating, none is shed: the new one gets 503.
TEST(OpenAiServerLimitsTest, AtTheCapWithEveryConnectionGeneratingANewOneGets503) {
  TestBackend backend;
  OpenAiServerOptions options;
  options.max_connections = 2;
  std::unique_ptr<OpenAiServer> server = Serve(&backend, options);
  ASSERT_NE(server, nullptr);
  std::vector<std::thread> callers;
  std::vector<int> statuses(2);
  for (int i = 0; i < 2; ++i) {
    callers.emplace_back([&, i] {
      statuses[i] = testing::Call(server->port(), http::verb::post, "/v1/chat/completions", kKey,
                                  ChatBody("hold"))
                        .status;
    });
  }
  backend.WaitHeld(2);
  const RawAnswer refused = SendRaw(server->port(), Head("GET /v1/models", kKey));
  EXPECT_EQ(refused.status(), 503) << refused.bytes;
  for (auto& [progress, done] : backend.TakeHeld()) {
    Completion c;
    c.content = "late";
    c.finish_reason = "stop";
    done(c);
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
}

TEST(OpenAiServerLimitsTest, AHeadThatDoesNotArriveByItsDeadlineLosesTheConnection) {
  TestBackend backend;
  OpenAiServerOptions options;
  options.header_timeout_ms = 100;
  std::unique_ptr<OpenAiServer> server = Serve(&backend, options);
  ASSERT_NE(server, nullptr);
  IdleConnection silent(server->port());
  EXPECT_EQ(silent.WaitClosed(), "");
  IdleConnection partial(server->port());
  partial.Send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");  // and never the rest
  EXPECT_EQ(partial.WaitClosed(), "");
}

// The backend keeps a streamed call's callbacks past the server's end (an engine thread that
// finishes late): calling and destroying them then touches nothing of the server.
TEST(OpenAiServerLimitsTest, CallbacksAfterTheServerStoppedDoNothing) {
  TestBackend backend;
  std::unique_ptr<OpenAiServer> server = Serve(&backend);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::thread caller([&] {
    IdleConnection c(port);
    const std::string body = ChatBody("hold", /*stream=*/true);
    c.Send(Head("POST /v1/chat/completions", kKey,
                absl::StrCat("Content-Length: ", body.size(), "\r\n")) +
           body);
    c.WaitClosed();  // the server's end closes it
  });
  backend.WaitHeld(1);
  server.reset();
  caller.join();
  for (auto& [progress, done] : backend.TakeHeld()) {
    progress("partial");
    Completion c;
    c.content = "partial";
    done(c);
  }
}

// With security.require_client_cert the endpoint, like the gRPC servers, serves only a client
// whose certificate tls_ca_file verifies; and it refuses to start without that CA.
TEST(OpenAiServerLimitsTest, RequireClientCertIsHonoured) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("prl_endpoint_mtls_", getpid());
  std::filesystem::create_directories(dir);
  ASSERT_NO_FATAL_FAILURE(security::testing::MakeCertificate(dir));  // the server's
  const std::string client = absl::StrCat(
      "cd ", dir.string(),
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
      "client.key -out client.crt -days 2 -subj /CN=prl-agent 2>/dev/null");
  ASSERT_EQ(std::system(client.c_str()), 0) << client;
  TestBackend backend;
  OpenAiServerOptions options;
  options.tls_cert_file = (dir / "endpoint.crt").string();
  options.tls_key_file = (dir / "endpoint.key").string();
  options.require_client_cert = true;
  EXPECT_TRUE(absl::IsFailedPrecondition(OpenAiServer::Start(options, &backend).status()))
      << "require_client_cert without tls_ca_file";
  options.tls_ca_file = (dir / "client.crt").string();
  std::unique_ptr<OpenAiServer> server = Serve(&backend, options);
  ASSERT_NE(server, nullptr);
  const auto models = testing::Request(http::verb::get, "/v1/models", kKey);
  const std::string ca = (dir / "endpoint.crt").string();
  const testing::HttpAnswer anonymous = security::testing::HttpsCall(server->port(), ca, models);
  EXPECT_EQ(anonymous.status, 0) << "served without a client certificate: " << anonymous.body;
  const testing::HttpAnswer mutual = security::testing::HttpsCall(
      server->port(), ca, models, (dir / "client.crt").string(), (dir / "client.key").string());
  EXPECT_EQ(mutual.status, 200) << mutual.body;
  server.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace prl::openai
