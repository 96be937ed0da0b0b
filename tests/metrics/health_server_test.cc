// The endpoint as a fleet manager sees it (metrics/metrics_server.h): /healthz and /readyz for
// the kubelet's probes, and the bounds that keep a slow or hostile client from taking the
// endpoint away: a slowloris is cut off at the per-connection deadline without delaying a
// concurrent scrape, connections beyond the bound are refused without harm, and shutdown
// closes every connection at once.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "metrics/metrics_server.h"
#include "metrics/prl_metrics.h"
#include "tests/metrics/http_test_client.h"

namespace prl::metrics {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<MetricsServer> Serve(const MetricsServerOptions& options) {
  auto registry = std::make_shared<prometheus::Registry>();
  ProcessMetrics process(*registry, Role::kActor);
  auto server = MetricsServer::Start(options, registry);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(server).value() : nullptr;
}

// The status line of GET|HEAD <path>, e.g. "HTTP/1.1 503 Service Unavailable", and the body.
std::pair<std::string, std::string> Request(int port, const std::string& method,
                                            const std::string& path) {
  absl::StatusOr<std::string> r =
      HttpExchange(port, absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: x\r\n\r\n"));
  if (!r.ok()) return {std::string(r.status().message()), ""};
  const size_t body = r->find("\r\n\r\n");
  return {r->substr(0, r->find("\r\n")), body == std::string::npos ? "" : r->substr(body + 4)};
}

// True once the server has closed `fd` (recv sees EOF or a reset), waiting up to 10 s.
bool ClosedByServer(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST(HealthEndpoints, ReadyzIs503UntilTheRoleIsReadyThen200) {
  auto server = Serve({.address = "127.0.0.1:0"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  EXPECT_EQ(Request(port, "GET", "/healthz").first, "HTTP/1.1 200 OK");
  auto [line, body] = Request(port, "GET", "/readyz");
  EXPECT_EQ(line, "HTTP/1.1 503 Service Unavailable");
  EXPECT_EQ(body, "not ready: starting\n");

  server->SetReadiness(
      [] { return absl::UnavailableError("not registered with the coordinator"); });
  std::tie(line, body) = Request(port, "GET", "/readyz");
  EXPECT_EQ(line, "HTTP/1.1 503 Service Unavailable");
  EXPECT_EQ(body, "not ready: not registered with the coordinator\n");

  std::atomic<bool> registered{false};
  server->SetReadiness([&registered] {
    return registered ? absl::OkStatus() : absl::UnavailableError("not registered");
  });
  EXPECT_EQ(Request(port, "GET", "/readyz").first, "HTTP/1.1 503 Service Unavailable");
  registered = true;
  EXPECT_EQ(Request(port, "GET", "/readyz").first, "HTTP/1.1 200 OK");
  EXPECT_EQ(Request(port, "HEAD", "/readyz"),
            std::make_pair(std::string("HTTP/1.1 200 OK"), std::string()));
  EXPECT_EQ(Request(port, "GET", "/healthz").second, "ok\n");

  server->SetReadiness(nullptr);  // the role stops: no longer ready, still alive
  EXPECT_EQ(Request(port, "GET", "/readyz").first, "HTTP/1.1 503 Service Unavailable");
  EXPECT_EQ(Request(port, "GET", "/healthz").first, "HTTP/1.1 200 OK");
  EXPECT_TRUE(absl::StartsWith(Request(port, "GET", "/nope").first, "HTTP/1.1 404"));
}

TEST(HealthEndpoints, SlowlorisIsCutOffAtTheDeadlineAndDoesNotDelayAScrape) {
  constexpr int kTimeoutMs = 600;
  auto server = Serve({.address = "127.0.0.1:0", .request_timeout_ms = kTimeoutMs});
  ASSERT_NE(server, nullptr);
  const int slow = ConnectLoopback(server->port());
  ASSERT_GE(slow, 0);
  const Clock::time_point connected = Clock::now();
  // The slowloris dribbles a request that never ends, one header byte every 50 ms.
  std::atomic<bool> stop{false};
  std::thread dribble([&] {
    const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (size_t i = 0; !stop; ++i) {
      const char c = i < head.size() ? head[i] : 'a';
      if (send(slow, &c, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  // Meanwhile scrapes are answered at once.
  for (int i = 0; i < 5; ++i) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::string> scrape = HttpGet(server->port(), "/metrics");
    ASSERT_TRUE(scrape.ok()) << scrape.status();
    EXPECT_TRUE(absl::StrContains(*scrape, "prl_build_info{")) << *scrape;
    EXPECT_LT(SecondsSince(start), 0.25) << "a scrape waited behind the slowloris";
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  EXPECT_TRUE(ClosedByServer(slow));
  const double cut_after = SecondsSince(connected);
  stop = true;
  dribble.join();
  close(slow);
  EXPECT_GE(cut_after, kTimeoutMs / 1000.0 * 0.9);
  EXPECT_LT(cut_after, kTimeoutMs / 1000.0 + 1.0) << "the slowloris was not cut at its deadline";
}

TEST(HealthEndpoints, ConnectionsBeyondTheBoundAreRefusedAndServingResumes) {
  auto server = Serve({.address = "127.0.0.1:0", .request_timeout_ms = 5000, .max_connections = 4});
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(ConnectLoopback(server->port()));
  for (int fd : idle) ASSERT_GE(fd, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all four accepted
  // The fifth is told so at once, not left waiting.
  const Clock::time_point start = Clock::now();
  auto [line, body] = Request(server->port(), "GET", "/metrics");
  EXPECT_EQ(line, "HTTP/1.1 503 Service Unavailable");
  EXPECT_EQ(body, "too many connections\n");
  EXPECT_LT(SecondsSince(start), 1.0);
  // A burst far beyond the bound does no harm.
  std::vector<int> burst;
  for (int i = 0; i < 200; ++i) burst.push_back(ConnectLoopback(server->port()));
  for (int fd : burst) {
    if (fd >= 0) close(fd);
  }
  // The held connections keep their slots; once they go, scrapes are served again.
  for (int fd : idle) close(fd);
  absl::StatusOr<std::string> scrape = absl::UnavailableError("not tried");
  for (int i = 0; i < 50 && !scrape.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    scrape = HttpGet(server->port(), "/metrics");
  }
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_TRUE(absl::StrContains(*scrape, "prl_build_info{"));
}

TEST(HealthEndpoints, ShutdownClosesOpenConnectionsAndFreesThePort) {
  auto server = Serve({.address = "127.0.0.1:0", .request_timeout_ms = 60'000});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const int idle = ConnectLoopback(port);
  ASSERT_GE(idle, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const Clock::time_point start = Clock::now();
  server.reset();
  EXPECT_LT(SecondsSince(start), 1.0) << "shutdown waited for a client";
  EXPECT_TRUE(ClosedByServer(idle));
  close(idle);
  // The same port serves again (no connection of the old server lingers on it).
  auto again = Serve({.address = absl::StrCat("127.0.0.1:", port)});
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(HttpGet(port, "/healthz").ok());
}

// The IPv4 address ("7F000001" for 127.0.0.1) of the socket listening on `port`, from
// /proc/net/tcp; empty when none listens.
std::string ListeningAddress(int port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // header
  while (std::getline(table, line)) {
    unsigned address = 0, local_port = 0, state = 0;
    if (std::sscanf(line.c_str(), " %*d: %8X:%4X %*8X:%*4X %2X", &address, &local_port, &state) ==
            3 &&
        static_cast<int>(local_port) == port && state == 0x0A) {
      char text[16];
      std::snprintf(text, sizeof(text), "%08X", ntohl(address));
      return text;
    }
  }
  return "";
}

// A port alone means loopback, as for every prl listener: a bare "9400" must not expose
// /metrics on every interface.
TEST(HealthEndpoints, APortAloneBindsLoopbackOnly) {
  auto server = Serve({.address = "0"});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(ListeningAddress(server->port()), "7F000001");
  auto everywhere = Serve({.address = "0.0.0.0:0"});
  ASSERT_NE(everywhere, nullptr);
  EXPECT_EQ(ListeningAddress(everywhere->port()), "00000000");
}

TEST(HealthEndpoints, BadBoundsAreInvalidArgument) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (const MetricsServerOptions& options : {MetricsServerOptions{.request_timeout_ms = 0},
                                              MetricsServerOptions{.max_connections = 0}}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(options, registry);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  }
}

}  // namespace
}  // namespace prl::metrics
