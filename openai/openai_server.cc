#include "openai/openai_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/net_address.h"

namespace prl::openai {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using Json = nlohmann::ordered_json;

struct OpenAiServer::Impl {
  OpenAiServerOptions options;
  CompletionBackend* backend = nullptr;
  std::string host;
  int port = 0;
  int64_t started = 0;  // unix seconds: /v1/models' "created"
  int active = 0;       // open connections (the server's thread only)
  int64_t calls = 0;    // calls answered, for their ids (the server's thread only)
  asio::io_context ioc{1};
  std::optional<ssl::context> tls;
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};
  std::thread thread;

  void Accept();
};

namespace {

http::status StatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return http::status::bad_request;
    case absl::StatusCode::kUnauthenticated:
      return http::status::unauthorized;
    case absl::StatusCode::kPermissionDenied:
      return http::status::forbidden;
    case absl::StatusCode::kNotFound:
      return http::status::not_found;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return http::status::conflict;
    case absl::StatusCode::kResourceExhausted:
      return http::status::too_many_requests;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return http::status::service_unavailable;
    default:
      return http::status::internal_server_error;
  }
}

const char* ErrorType(http::status status) {
  switch (status) {
    case http::status::bad_request:
      return "invalid_request_error";
    case http::status::unauthorized:
      return "authentication_error";
    case http::status::not_found:
    case http::status::method_not_allowed:
      return "not_found_error";
    case http::status::too_many_requests:
      return "rate_limit_error";
    case http::status::conflict:
      return "conflict_error";
    default:
      return "server_error";
  }
}

// The field an InvalidArgument message names first ("messages[2].role: expected ...").
std::string ParamOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || message.find(' ') < colon) return "";
  return message.substr(0, colon);
}

std::string BearerKey(const http::request<http::string_body>& request) {
  const auto it = request.find(http::field::authorization);
  if (it == request.end()) return "";
  const std::string value(it->value());
  return absl::StartsWith(value, "Bearer ") ? value.substr(7) : "";
}

// One connection: requests one after another (keep-alive); a streamed answer is written chunk
// by chunk as the backend's progress arrives. Owned by the handlers pending on it.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, OpenAiServer::Impl& server) : stream_(std::move(stream)), server_(server) {
    ++server_.active;
  }
  ~Session() { --server_.active; }

  void Start() {
    if constexpr (std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>) {
      beast::get_lowest_layer(stream_).expires_after(Timeout());
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->Read();
                              });
    } else {
      Read();
    }
  }

 private:
  std::chrono::milliseconds Timeout() const {
    return std::chrono::milliseconds(server_.options.request_timeout_ms);
  }

  void Read() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(static_cast<uint64_t>(server_.options.max_body_bytes));
    beast::get_lowest_layer(stream_).expires_after(Timeout());
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       if (ec == http::error::body_limit) {
                         return self->SendError(absl::InvalidArgumentError(
                             absl::StrCat("the request body: expected at most ",
                                          self->server_.options.max_body_bytes, " bytes")));
                       }
                       if (!ec) self->Handle(self->parser_->release());
                     });
  }

  void Handle(http::request<http::string_body> request) {
    request_ = std::move(request);
    keep_alive_ = request_.keep_alive();
    beast::get_lowest_layer(stream_).expires_never();  // generating: bounded by the episode
    const std::string target(request_.target());
    const std::string path = target.substr(0, target.find('?'));
    const bool models = path == "/v1/models";
    const bool chat = path == "/v1/chat/completions", completions = path == "/v1/completions";
    if (!models && !chat && !completions) {
      return SendError(absl::NotFoundError(
          absl::StrCat("no route ", path.substr(0, 128),
                       ": the paths are /v1/models, /v1/chat/completions and /v1/completions")));
    }
    if ((models && request_.method() != http::verb::get) ||
        (!models && request_.method() != http::verb::post)) {
      return Send(http::status::method_not_allowed,
                  ErrorJson(absl::StrCat(models ? "GET" : "POST", " only"), "not_found_error"));
    }
    const std::string key = BearerKey(request_);
    if (key.empty() || !server_.backend->KnowsKey(key)) {
      return SendError(absl::UnauthenticatedError(
          key.empty() ? "no key: send the episode's key as Authorization: Bearer <key>"
                      : "unknown key: it belongs to no episode this actor runs (it ended?)"));
    }
    if (models) {
      return Send(http::status::ok, ModelsJson(server_.backend->model(), server_.started));
    }
    const Json body = Json::parse(request_.body(), nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) {
      return SendError(absl::InvalidArgumentError("the request body: expected JSON"));
    }
    absl::StatusOr<ChatCall> call = chat ? ParseChatRequest(body, server_.options.limits)
                                         : ParseCompletionRequest(body, server_.options.limits);
    if (!call.ok()) return SendError(call.status());
    streaming_ = call->stream;
    include_usage_ = call->include_usage;
    meta_ = Completion();  // what the server says of every answer: id, model, time
    meta_.chat = chat;
    meta_.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", ++server_.calls, "-", server_.started);
    meta_.model = server_.backend->model();
    meta_.created = absl::ToUnixSeconds(absl::Now());
    auto self = this->shared_from_this();
    auto on_ioc = [self](auto f) { asio::post(self->server_.ioc, std::move(f)); };
    CompletionBackend::Progress progress;
    if (streaming_) {
      progress = [self, on_ioc](const std::string& text) {
        on_ioc([self, text] { self->OnProgress(text); });
      };
    }
    server_.backend->Generate(
        key, *std::move(call), std::move(progress),
        [self, on_ioc](absl::StatusOr<Completion> done) {
          on_ioc([self, done = std::move(done)]() mutable { self->OnDone(std::move(done)); });
        });
  }

  // ---- Streams: headers on the first event, then one chunk per event ----
  void OnProgress(const std::string& text) {
    if (finished_) return;
    if (!stream_open_) OpenStream();
    if (text.size() > sent_text_) {
      Queue(Event(TextChunkJson(meta_, text.substr(sent_text_))));
      sent_text_ = text.size();
    }
  }

  void OnDone(absl::StatusOr<Completion> done) {
    if (done.ok()) {
      done->chat = meta_.chat;
      done->id = meta_.id;
      done->model = meta_.model;
      done->created = meta_.created;
    }
    if (!streaming_) {
      if (!done.ok()) return SendError(done.status());
      return Send(http::status::ok, CompletionJson(*done));
    }
    if (!done.ok() && !stream_open_) return SendError(done.status());
    if (!stream_open_) OpenStream();
    if (!done.ok()) {  // mid-stream: the error as an event, then the end
      Queue(Event(ErrorJson(std::string(done.status().message()), "server_error")));
    } else {
      if (done->content.size() > sent_text_) {
        Queue(Event(TextChunkJson(*done, done->content.substr(sent_text_))));
      }
      Queue(Event(LastChunkJson(*done)));
      if (include_usage_) Queue(Event(UsageChunkJson(*done)));
    }
    Queue(Done());
    finished_ = true;
    Flush();
  }

  void OpenStream() {
    stream_open_ = true;
    stream_response_.emplace(http::status::ok, request_.version());
    stream_response_->set(http::field::content_type, "text/event-stream");
    stream_response_->set(http::field::cache_control, "no-cache");
    stream_response_->chunked(true);
    stream_response_->keep_alive(keep_alive_);
    serializer_.emplace(*stream_response_);
    Queue(Event(FirstChunkJson(meta_)));
  }

  void Queue(std::string data) {
    pending_.push_back(std::move(data));
    Flush();
  }

  void Flush() {
    if (writing_ || !serializer_.has_value()) return;
    writing_ = true;
    auto self = this->shared_from_this();
    if (!headers_sent_) {
      headers_sent_ = true;
      return http::async_write_header(stream_, *serializer_, [self](beast::error_code ec, size_t) {
        self->writing_ = false;
        if (!ec) self->Flush();
      });
    }
    if (pending_.empty()) {
      writing_ = false;
      if (!finished_) return;
      return asio::async_write(stream_, http::make_chunk_last(),
                               [self](beast::error_code ec, size_t) {
                                 if (!ec) self->Next();
                               });
    }
    chunk_ = std::move(pending_.front());
    pending_.pop_front();
    asio::async_write(stream_, http::make_chunk(asio::buffer(chunk_)),
                      [self](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        if (!ec) self->Flush();
                      });
  }

  // ---- Whole answers ----
  void SendError(const absl::Status& error) {
    const http::status status = StatusOf(error.code());
    Send(status,
         ErrorJson(
             std::string(error.message()), ErrorType(status),
             status == http::status::bad_request ? ParamOf(std::string(error.message())) : ""));
  }

  void Send(http::status status, const Json& body) {
    response_.emplace(status, request_.version() == 0 ? 11 : request_.version());
    response_->set(http::field::content_type, "application/json");
    if (status == http::status::unauthorized) {
      response_->set(http::field::www_authenticate, "Bearer");
    }
    response_->keep_alive(keep_alive_ && status != http::status::bad_request);
    response_->body() = Dump(body);
    response_->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(Timeout());
    http::async_write(stream_, *response_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (!ec) self->Next();
                      });
  }

  // The answer is out: the next request on this connection, or close.
  void Next() {
    const bool again = response_.has_value() ? response_->keep_alive() : keep_alive_;
    response_.reset();
    serializer_.reset();
    stream_response_.reset();
    stream_open_ = headers_sent_ = finished_ = false;
    sent_text_ = 0;
    if (again) return Read();
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  Stream stream_;
  OpenAiServer::Impl& server_;
  beast::flat_buffer buffer_{8192};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  bool keep_alive_ = true;
  std::optional<http::response<http::string_body>> response_;
  // A stream: its header, serializer, the events not yet written.
  bool streaming_ = false, include_usage_ = false;
  Completion meta_;  // the answer's id, model and time
  bool stream_open_ = false, headers_sent_ = false, writing_ = false, finished_ = false;
  size_t sent_text_ = 0;
  std::optional<http::response<http::empty_body>> stream_response_;
  std::optional<http::response_serializer<http::empty_body>> serializer_;
  std::deque<std::string> pending_;
  std::string chunk_;
};

}  // namespace

void OpenAiServer::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this](beast::error_code wait) {
        if (!wait) Accept();
      });
      return;
    }
    if (active >= options.max_connections) {
      const std::string body = Dump(ErrorJson("too many connections", "server_error"));
      const std::string busy = absl::StrCat(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          "Content-Length: ",
          body.size(), "\r\nConnection: close\r\n\r\n", body);
      beast::error_code ignored;
      asio::write(socket, asio::buffer(busy), ignored);
      socket.close(ignored);
    } else if (tls.has_value()) {
      std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
          beast::ssl_stream<beast::tcp_stream>(beast::tcp_stream(std::move(socket)), *tls), *this)
          ->Start();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), *this)
          ->Start();
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(
    const OpenAiServerOptions& options, CompletionBackend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("OpenAiServer: no backend");
  const size_t colon = options.address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("actors.openai_listen: expected host:port, found '", options.address, "'"));
  }
  const bool tls = !options.tls_cert_file.empty();
  if (!tls && !options.insecure && !IsLoopbackEndpoint(options.address)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "serving the OpenAI endpoint on ", options.address,
        " (not loopback) needs TLS: set security.tls_cert_file and security.tls_key_file, or "
        "security.insecure = true to serve plaintext on purpose"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->backend = backend;
  impl->host = options.address.substr(0, colon);
  impl->started = absl::ToUnixSeconds(absl::Now());
  if (tls) {
    impl->tls.emplace(ssl::context::tls_server);
    beast::error_code ec;
    impl->tls->use_certificate_chain_file(options.tls_cert_file, ec);
    if (!ec) impl->tls->use_private_key_file(options.tls_key_file, ssl::context::pem, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "security.tls_cert_file / tls_key_file: cannot load for the OpenAI endpoint: ",
          ec.message()));
    }
  }
  beast::error_code ec;
  const asio::ip::address ip =
      asio::ip::make_address(impl->host == "localhost" ? std::string("127.0.0.1") : impl->host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("actors.openai_listen: expected an IP address, found '", impl->host, "'"));
  }
  const tcp::endpoint endpoint(ip, static_cast<uint16_t>(port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the OpenAI endpoint on ", options.address, ": ", ec.message()));
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->ioc.run(); });
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiServer::~OpenAiServer() {
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int OpenAiServer::port() const { return impl_->port; }

std::string OpenAiServer::base_url() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return absl::StrCat(impl_->tls.has_value() ? "https://" : "http://",
                      v6 ? "[" + impl_->host + "]" : impl_->host, ":", impl_->port, "/v1");
}

}  // namespace prl::openai
