#include "metrics/metrics_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace prl::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

// The server's state, all of it touched on the Asio thread only, except `readiness` (under
// `readiness_mu`). Members are destroyed in reverse order: the io_context (and with it every
// pending handler and the sessions they own) before `active`, which sessions decrement.
struct MetricsServer::Impl {
  std::shared_ptr<prometheus::Registry> registry;
  std::chrono::milliseconds timeout;
  int max_connections = 0;
  int port = 0;
  int active = 0;    // open sessions
  int refusing = 0;  // connections over the bound being told so

  std::mutex readiness_mu;
  ReadinessCheck readiness;  // null: not ready

  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};  // accept failed (e.g. no file descriptors): try again later
  std::thread thread;

  void Accept();
  void Refuse(tcp::socket socket);
  http::response<http::string_body> Answer(const http::request<http::empty_body>& request);
};

namespace {

absl::Status BadAddress(const std::string& address, const std::string& reason) {
  return absl::InvalidArgumentError(
      absl::StrCat("cannot serve /metrics on '", address, "': ", reason,
                   ". Expected host:port or port, IPv4 or a host name (port 0 = any free port)"));
}

// A listening IPv4 socket on `address` ("host:port", or "port" on loopback), and the port it
// bound.
absl::StatusOr<std::pair<int, int>> Listen(const std::string& address) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "metrics address is empty: expected host:port or port (port 0 = any free port)");
  }
  std::string host = "127.0.0.1", port_text = address;
  const size_t colon = address.rfind(':');
  if (colon != std::string::npos) {
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return BadAddress(address, "invalid port spec");
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int err = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); err != 0) {
    return BadAddress(address, absl::StrCat("cannot resolve '", host, "': ", gai_strerror(err)));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot serve /metrics on '", address, "': ", std::strerror(err),
        ". If the port is in use (another prl process or exporter on this node), choose another "
        "metrics port, or port 0 for any free one"));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::make_pair(fd, static_cast<int>(ntohs(addr.sin_port)));
}

// One connection: read one request within the deadline, answer it, close. Owned by the
// handlers pending on it; destroyed (closing the socket) when the last one has run.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MetricsServer::Impl& server)
      : stream_(std::move(socket)), server_(server) {
    ++server_.active;
  }
  ~Session() { --server_.active; }

  void Start() {
    stream_.expires_after(server_.timeout);  // covers the read and the write together
    parser_.header_limit(16 * 1024);
    parser_.body_limit(0);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Respond();
                     });
  }

 private:
  void Respond() {
    response_ = server_.Answer(parser_.get());
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  MetricsServer::Impl& server_;
  beast::flat_buffer buffer_{8192};
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> response_;
};

// A connection over the bound: answered 503 at once, whatever it asks, then drained until the
// client closes (closing with its request unread would reset the connection before the client
// reads the answer), all within one second.
class Refusal : public std::enable_shared_from_this<Refusal> {
 public:
  Refusal(tcp::socket socket, MetricsServer::Impl& server)
      : stream_(std::move(socket)), server_(server) {
    ++server_.refusing;
  }
  ~Refusal() { --server_.refusing; }

  void Start() {
    static constexpr char kBusy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n"
        "Retry-After: 1\r\nConnection: close\r\n\r\ntoo many connections\n";
    stream_.expires_after(std::chrono::seconds(1));
    asio::async_write(stream_, asio::buffer(kBusy, sizeof(kBusy) - 1),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return;
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                        self->Drain();
                      });
  }

 private:
  void Drain() {
    stream_.async_read_some(asio::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (!ec) self->Drain();
                            });
  }

  beast::tcp_stream stream_;
  MetricsServer::Impl& server_;
  char drain_[512];
};

http::response<http::string_body> TextResponse(http::status status, unsigned version,
                                               std::string body, bool head) {
  http::response<http::string_body> response(status, version);
  response.set(http::field::content_type, "text/plain; charset=utf-8");
  response.keep_alive(false);
  response.body() = std::move(body);
  response.prepare_payload();  // Content-Length of the body, also for HEAD
  if (head) response.body().clear();
  return response;
}

}  // namespace

void MetricsServer::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // shutting down
    if (ec) {  // EMFILE and friends: back off instead of spinning
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this](beast::error_code wait) {
        if (!wait) Accept();
      });
      return;
    }
    if (active >= max_connections) {
      Refuse(std::move(socket));
    } else {
      std::make_shared<Session>(std::move(socket), *this)->Start();
    }
    Accept();
  });
}

void MetricsServer::Impl::Refuse(tcp::socket socket) {
  if (refusing >= max_connections) {  // a flood: not even a note
    beast::error_code ignored;
    socket.close(ignored);
    return;
  }
  std::make_shared<Refusal>(std::move(socket), *this)->Start();
}

http::response<http::string_body> MetricsServer::Impl::Answer(
    const http::request<http::empty_body>& request) {
  const unsigned version = request.version();
  const bool head = request.method() == http::verb::head;
  if (request.method() != http::verb::get && !head) {
    auto response =
        TextResponse(http::status::method_not_allowed, version, "only GET and HEAD\n", false);
    response.set(http::field::allow, "GET, HEAD");
    return response;
  }
  const std::string target(request.target());
  const std::string path = target.substr(0, target.find('?'));
  if (path == "/metrics") {
    auto response = TextResponse(http::status::ok, version,
                                 prometheus::TextSerializer().Serialize(registry->Collect()), head);
    response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    return response;
  }
  if (path == "/healthz") return TextResponse(http::status::ok, version, "ok\n", head);
  if (path == "/readyz") {
    absl::Status ready = absl::UnavailableError("starting");
    {
      std::lock_guard<std::mutex> lock(readiness_mu);
      if (readiness) ready = readiness();
    }
    if (ready.ok()) return TextResponse(http::status::ok, version, "ready\n", head);
    return TextResponse(http::status::service_unavailable, version,
                        absl::StrCat("not ready: ", ready.message(), "\n"), head);
  }
  return TextResponse(http::status::not_found, version,
                      "not found: the paths are /metrics, /healthz and /readyz\n", head);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("MetricsServer::Start: registry is null");
  }
  if (options.request_timeout_ms < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics request_timeout_ms and max_connections must be at least 1, got ",
                     options.request_timeout_ms, " and ", options.max_connections));
  }
  absl::StatusOr<std::pair<int, int>> listening = Listen(options.address);
  if (!listening.ok()) return listening.status();
  auto impl = std::make_unique<Impl>();
  impl->registry = std::move(registry);
  impl->timeout = std::chrono::milliseconds(options.request_timeout_ms);
  impl->max_connections = options.max_connections;
  impl->port = listening->second;
  beast::error_code ec;
  impl->acceptor.assign(tcp::v4(), listening->first, ec);
  if (ec) {
    ::close(listening->first);
    return absl::InternalError(absl::StrCat("cannot serve /metrics: ", ec.message()));
  }
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->ioc.run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() {
  impl_->ioc.stop();  // pending handlers never run; destroying the context closes everything
  if (impl_->thread.joinable()) impl_->thread.join();
}

int MetricsServer::port() const { return impl_->port; }

prometheus::Registry& MetricsServer::registry() const { return *impl_->registry; }

void MetricsServer::SetReadiness(ReadinessCheck check) {
  std::lock_guard<std::mutex> lock(impl_->readiness_mu);
  impl_->readiness = std::move(check);
}

}  // namespace prl::metrics
