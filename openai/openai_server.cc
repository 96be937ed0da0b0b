#include "openai/openai_server.h"

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/net_address.h"
#include "openai/connection_table.h"
#include "openai/request_parser.h"

namespace prl::openai {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using Json = nlohmann::ordered_json;

// Posts jobs onto the server's loop while it runs. The backend's callbacks hold it (never the
// server): the destructor closes it first, and a job posted after that is dropped.
class LoopLink {
 public:
  explicit LoopLink(asio::io_context* ioc) : ioc_(ioc) {}
  void Post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ioc_ != nullptr) asio::post(*ioc_, std::move(job));
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    ioc_ = nullptr;
  }

 private:
  std::mutex mu_;
  asio::io_context* ioc_;
};

struct OpenAiServer::Impl {
  // Destroyed in reverse: the loop (and the handlers it holds) and the generating connections
  // go before the table that their destructors update.
  OpenAiServerOptions options;
  CompletionBackend* backend = nullptr;
  std::string host;
  int port = 0;
  int64_t started = 0;  // unix seconds: /v1/models' "created"
  // The server's loop only:
  ConnectionTable connections{0, 0};
  int64_t calls = 0;     // calls answered, for their ids
  int64_t requests = 0;  // requests read, for the log
  std::optional<ssl::context> tls;
  asio::io_context ioc{1};
  std::shared_ptr<LoopLink> link = std::make_shared<LoopLink>(&ioc);
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};
  std::thread thread;
  // Connections whose call the backend holds: their owner until the answer is written.
  std::map<uint64_t, std::shared_ptr<void>> generating;

  void Accept();
  void Run();
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
    case absl::StatusCode::kUnimplemented:
      return http::status::method_not_allowed;
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

// One connection: requests one after another (keep-alive); a streamed answer is written chunk
// by chunk as the backend's progress arrives. Owned by the handlers pending on it, and while the
// backend generates for it by the server's `generating`; the backend's callbacks hold a weak
// reference. Every method runs on the server's loop.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, OpenAiServer::Impl& server)
      : stream_(std::move(stream)), server_(server) {}
  ~Session() { server_.connections.Remove(id_); }

  void Start(const std::string& peer) {
    std::weak_ptr<Session> weak = this->shared_from_this();
    id_ = server_.connections.Add(peer, [weak] {
      if (auto self = weak.lock()) self->Close();
    });
    beast::get_lowest_layer(stream_).expires_after(HeaderTimeout());
    if constexpr (std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>) {
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->Guard([&] { self->ReadHead(); });
                              });
    } else {
      ReadHead();
    }
  }

 private:
  std::chrono::milliseconds HeaderTimeout() const {
    return std::chrono::milliseconds(server_.options.header_timeout_ms);
  }
  std::chrono::milliseconds BodyTimeout() const {
    return std::chrono::milliseconds(server_.options.request_timeout_ms);
  }

  // Runs `f`; an exception is the request's 500 (or, once answering, the connection's end),
  // logged with the request's id: no request takes the endpoint down.
  template <class F>
  void Guard(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      Failed(e.what());
    } catch (...) {
      Failed("an exception of unknown type");
    }
  }

  void Failed(const std::string& what) {
    std::fprintf(stderr, "openai endpoint: request %lld: internal error: %s\n",
                 static_cast<long long>(request_id_), what.c_str());
    server_.generating.erase(id_);
    if (answering_) return Close();
    keep_alive_ = false;
    SendError(absl::InternalError(absl::StrCat("internal error (request ", request_id_,
                                               "): the actor's log has the details")));
  }

  void Close() {
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(stream_).close();
  }

  // ---- Reading: the head, the key, then the body ----
  void ReadHead() {
    server_.connections.SetWaiting(id_, true);
    answering_ = false;
    parser_.emplace();
    ConfigureParser(*parser_, server_.options.max_body_bytes);
    beast::get_lowest_layer(stream_).expires_after(HeaderTimeout());
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->Guard([&] { self->OnHead(ec); });
                            });
  }

  void OnHead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted) {
      return;  // closed, idle past the deadline, or shed
    }
    request_id_ = ++server_.requests;
    server_.connections.SetWaiting(id_, false);
    keep_alive_ = false;  // until the body is read: an answer before it closes the connection
    version_ = parser_->get().version() == 0 ? 11 : parser_->get().version();
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      return Close();  // unanswered: nothing to trust in it
    }
    if (ec) return SendError(ParseError(ec, server_.options.max_body_bytes));
    absl::StatusOr<RequestHead> head = CheckParsedHead(*parser_);
    if (head.ok() && !server_.backend->KnowsKey(head->key)) {
      head = absl::UnauthenticatedError(
          "unknown key: it belongs to no episode this actor runs (it ended?)");
    }
    if (!head.ok()) return SendError(head.status());
    server_.connections.SetAuthenticated(id_);
    head_ = *std::move(head);
    beast::get_lowest_layer(stream_).expires_after(BodyTimeout());
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->Guard([&] { self->OnBody(ec); });
                     });
  }

  void OnBody(beast::error_code ec) {
    if (ec == beast::error::timeout || ec == asio::error::operation_aborted) return;
    if (ec) return SendError(ParseError(ec, server_.options.max_body_bytes));
    keep_alive_ = head_.keep_alive;
    beast::get_lowest_layer(stream_).expires_never();  // generating: bounded by the episode
    const std::string body = parser_->release().body();
    if (head_.route == Route::kModels) {
      return Send(http::status::ok, ModelsJson(server_.backend->model(), server_.started));
    }
    const bool chat = head_.route == Route::kChat;
    absl::StatusOr<ChatCall> call = chat ? ParseChatRequestBody(body, server_.options.limits)
                                         : ParseCompletionRequestBody(body, server_.options.limits);
    if (!call.ok()) return SendError(call.status());
    streaming_ = call->stream;
    include_usage_ = call->include_usage;
    meta_ = Completion();  // what the server says of every answer: id, model, time
    meta_.chat = chat;
    meta_.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", ++server_.calls, "-", server_.started);
    meta_.model = server_.backend->model();
    meta_.created = absl::ToUnixSeconds(absl::Now());
    Generate(*std::move(call));
  }

  // The backend holds only a weak reference and the loop's link: a callback after the
  // connection or the server ended does nothing.
  void Generate(ChatCall call) {
    server_.generating[id_] = this->shared_from_this();
    std::weak_ptr<Session> weak = this->shared_from_this();
    std::shared_ptr<LoopLink> link = server_.link;
    CompletionBackend::Progress progress;
    if (streaming_) {
      progress = [weak, link](const std::string& text) {
        link->Post([weak, text] {
          if (auto self = weak.lock()) self->Guard([&] { self->OnProgress(text); });
        });
      };
    }
    server_.backend->Generate(head_.key, std::move(call), std::move(progress),
                              [weak, link](absl::StatusOr<Completion> done) {
                                link->Post([weak, done = std::move(done)]() mutable {
                                  if (auto self = weak.lock())
                                    self->Guard([&] { self->OnDone(std::move(done)); });
                                });
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
    // The pending writes own the connection from here.
    const std::shared_ptr<void> owner = std::move(server_.generating[id_]);
    server_.generating.erase(id_);
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
    answering_ = stream_open_ = true;
    stream_response_.emplace(http::status::ok, version_);
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
        if (!ec) self->Guard([&] { self->Flush(); });
      });
    }
    if (pending_.empty()) {
      writing_ = false;
      if (!finished_) return;
      return asio::async_write(stream_, http::make_chunk_last(),
                               [self](beast::error_code ec, size_t) {
                                 if (!ec) self->Guard([&] { self->Next(); });
                               });
    }
    chunk_ = std::move(pending_.front());
    pending_.pop_front();
    asio::async_write(stream_, http::make_chunk(asio::buffer(chunk_)),
                      [self](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        if (!ec) self->Guard([&] { self->Flush(); });
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
    answering_ = true;
    response_.emplace(status, version_);
    response_->set(http::field::content_type, "application/json");
    if (status == http::status::unauthorized) {
      response_->set(http::field::www_authenticate, "Bearer");
    }
    response_->keep_alive(keep_alive_ && status != http::status::bad_request);
    response_->body() = Dump(body);
    response_->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(BodyTimeout());
    http::async_write(stream_, *response_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (!ec) self->Guard([&] { self->Next(); });
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
    if (again) return ReadHead();
    Linger();
  }

  // Closing after an answer: the send side first, then what the client still sends (a body
  // never read) is discarded until it closes or the header deadline passes, so that it reads
  // the answer instead of a reset. Nothing of it is kept.
  void Linger() {
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
    beast::get_lowest_layer(stream_).expires_after(HeaderTimeout());
    DiscardSome();
  }

  void DiscardSome() {
    beast::get_lowest_layer(stream_).async_read_some(
        asio::buffer(discard_), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
          self->discarded_ += n;
          if (!ec && self->discarded_ <= self->server_.options.max_body_bytes) self->DiscardSome();
        });
  }

  Stream stream_;
  OpenAiServer::Impl& server_;
  uint64_t id_ = 0;         // in server_.connections
  int64_t request_id_ = 0;  // the request being answered (the log's)
  beast::flat_buffer buffer_{kMaxHeaderBytes + 8192};  // a whole head, and the body's start
  std::optional<RequestParser> parser_;
  RequestHead head_;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  bool answering_ = false;  // an answer (or a stream) has begun
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
  std::array<char, 4096> discard_;
  int64_t discarded_ = 0;
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
    beast::error_code peer_error;
    const std::string peer = socket.remote_endpoint(peer_error).address().to_string();
    if (peer_error || !connections.Admit(peer)) {
      const std::string body = Dump(ErrorJson("too many connections", "server_error"));
      const std::string busy = absl::StrCat(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          "Content-Length: ",
          body.size(), "\r\nConnection: close\r\n\r\n", body);
      beast::error_code ignored;
      // Non-blocking: a peer that does not read gets nothing rather than stalling the loop.
      socket.non_blocking(true, ignored);
      socket.write_some(asio::buffer(busy), ignored);
      socket.close(ignored);
    } else if (tls.has_value()) {
      std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
          beast::ssl_stream<beast::tcp_stream>(beast::tcp_stream(std::move(socket)), *tls), *this)
          ->Start(peer);
    } else {
      std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), *this)
          ->Start(peer);
    }
    Accept();
  });
}

void OpenAiServer::Impl::Run() {
  for (;;) {  // the sessions guard their handlers; this is the last resort
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "openai endpoint: internal error outside a request: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "openai endpoint: internal error outside a request\n");
    }
  }
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
  impl->connections =
      ConnectionTable(options.max_connections, options.max_unauthenticated_per_peer);
  if (options.require_client_cert && (!tls || options.tls_ca_file.empty())) {
    return absl::FailedPreconditionError(
        "security.require_client_cert needs security.tls_cert_file, tls_key_file and "
        "tls_ca_file for the OpenAI endpoint too");
  }
  if (tls) {
    impl->tls.emplace(ssl::context::tls_server);
    // TLS 1.2 at least, as gRPC's servers.
    SSL_CTX_set_min_proto_version(impl->tls->native_handle(), TLS1_2_VERSION);
    beast::error_code ec;
    impl->tls->use_certificate_chain_file(options.tls_cert_file, ec);
    if (!ec) impl->tls->use_private_key_file(options.tls_key_file, ssl::context::pem, ec);
    if (!ec && options.require_client_cert) {
      impl->tls->load_verify_file(options.tls_ca_file, ec);
      if (!ec) {
        impl->tls->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, ec);
      }
    }
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("security.tls_cert_file / tls_key_file",
                       options.require_client_cert ? " / tls_ca_file" : "",
                       ": cannot load for the OpenAI endpoint: ", ec.message()));
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
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiServer::~OpenAiServer() {
  impl_->link->Close();  // the backend's callbacks from now on post nothing
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->generating.clear();  // then the loop's handlers go with the loop, in ~Impl
}

int OpenAiServer::port() const { return impl_->port; }

int OpenAiServer::connections() const {
  std::promise<int> open;
  std::future<int> answer = open.get_future();
  asio::post(impl_->ioc, [&] { open.set_value(impl_->connections.open()); });
  return answer.get();
}

std::string OpenAiServer::base_url() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return absl::StrCat(impl_->tls.has_value() ? "https://" : "http://",
                      v6 ? "[" + impl_->host + "]" : impl_->host, ":", impl_->port, "/v1");
}

}  // namespace prl::openai
