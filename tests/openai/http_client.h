// A plain HTTP/1.1 client for the tests of the OpenAI-compatible endpoint (Boost.Beast on
// loopback): requests sent one after another on one connection, answers read whole (a stream's
// server-sent events arrive as the body).
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <string>
#include <vector>

namespace prl::openai::testing {

namespace http = boost::beast::http;

struct HttpAnswer {
  int status = 0;
  std::string body;
};

inline std::vector<HttpAnswer> Exchange(
    int port, const std::vector<http::request<http::string_body>>& requests) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  using tcp = boost::asio::ip::tcp;
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)));
  std::vector<HttpAnswer> out;
  for (const auto& request : requests) {
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(stream, buffer, parser);
    out.push_back({static_cast<int>(parser.get().result_int()), parser.get().body()});
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return out;
}

inline http::request<http::string_body> Request(http::verb verb, const std::string& target,
                                                const std::string& key,
                                                const std::string& body = "") {
  http::request<http::string_body> r(verb, target, 11);
  r.set(http::field::host, "127.0.0.1");
  if (!key.empty()) r.set(http::field::authorization, "Bearer " + key);
  r.set(http::field::content_type, "application/json");
  r.body() = body;
  r.prepare_payload();
  return r;
}

inline HttpAnswer Call(int port, http::verb verb, const std::string& target,
                       const std::string& key, const std::string& body = "") {
  return Exchange(port, {Request(verb, target, key, body)})[0];
}

}  // namespace prl::openai::testing
