#include "openai/http_request.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "openai/request_parser.h"

namespace prl::openai {

namespace http = boost::beast::http;

absl::StatusOr<RequestHead> CheckHead(absl::string_view method, absl::string_view target,
                                      absl::string_view authorization, bool keep_alive) {
  RequestHead head;
  head.keep_alive = keep_alive;
  const absl::string_view path = target.substr(0, target.find('?'));
  if (path == "/v1/models") {
    head.route = Route::kModels;
  } else if (path == "/v1/chat/completions") {
    head.route = Route::kChat;
  } else if (path == "/v1/completions") {
    head.route = Route::kCompletions;
  } else {
    return absl::NotFoundError(
        absl::StrCat("no route ", path.substr(0, 128),
                     ": the paths are /v1/models, /v1/chat/completions and /v1/completions"));
  }
  const absl::string_view wanted = head.route == Route::kModels ? "GET" : "POST";
  if (method != wanted) return absl::UnimplementedError(absl::StrCat(wanted, " only"));
  if (absl::StartsWith(authorization, "Bearer ")) head.key = std::string(authorization.substr(7));
  if (head.key.empty()) {
    return absl::UnauthenticatedError(
        "no key: send the episode's key as Authorization: Bearer <key>");
  }
  return head;
}

absl::StatusOr<RequestHead> CheckParsedHead(const RequestParser& parser) {
  const auto& request = parser.get();
  const auto authorization = request.find(http::field::authorization);
  return CheckHead(
      std::string(request.method_string()), std::string(request.target()),
      authorization == request.end() ? absl::string_view() : std::string(authorization->value()),
      request.keep_alive());
}

absl::Status ParseError(const boost::beast::error_code& ec, int64_t max_body_bytes) {
  if (ec == http::error::body_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body: expected at most ", max_body_bytes, " bytes"));
  }
  if (ec == http::error::header_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request's headers: expected at most ", kMaxHeaderBytes, " bytes"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request: expected HTTP/1.1, found ", ec.message()));
}

absl::StatusOr<ReadRequestResult> ReadRequest(absl::string_view bytes, int64_t max_body_bytes,
                                              absl::string_view known_key,
                                              const ChatLimits& limits) {
  RequestParser parser;
  ConfigureParser(parser, max_body_bytes);
  parser.eager(false);  // stop after the head, as the server does
  boost::beast::error_code ec;
  size_t used = 0;
  while (!parser.is_header_done()) {
    const size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      return absl::InvalidArgumentError("the request: ends before its headers do");
    }
    if (ec) return ParseError(ec, max_body_bytes);
    if (n == 0 && !parser.is_header_done()) {
      return absl::InvalidArgumentError("the request: ends before its headers do");
    }
  }
  ReadRequestResult out;
  PRL_ASSIGN_OR_RETURN(out.head, CheckParsedHead(parser));
  if (out.head.key != known_key) {
    return absl::UnauthenticatedError("unknown key: it belongs to no episode this actor runs");
  }
  parser.eager(true);
  while (!parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more || (!ec && n == 0 && !parser.is_done())) {
      if (!parser.need_eof())
        return absl::InvalidArgumentError("the request: ends before its body");
      parser.put_eof(ec);
    }
    if (ec) return ParseError(ec, max_body_bytes);
  }
  if (out.head.route == Route::kModels) return out;
  const std::string& body = parser.get().body();
  PRL_ASSIGN_OR_RETURN(out.call, out.head.route == Route::kChat
                                     ? ParseChatRequestBody(body, limits)
                                     : ParseCompletionRequestBody(body, limits));
  return out;
}

}  // namespace prl::openai
