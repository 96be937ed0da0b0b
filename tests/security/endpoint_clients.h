// Clients for the security tests of the actors' OpenAI-compatible endpoint
// (tests/security/agent_endpoint_test.cc) beside tests/openai/http_client.h: raw bytes to a port
// (requests no HTTP client would send, plaintext to a TLS port), HTTPS as an agent's SDK speaks it,
// and a self-signed certificate for 127.0.0.1 made by openssl.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/openai/http_client.h"

namespace prl::security::testing {

// What came back for bytes sent as they are, until the server closed. `closed` is false when the
// connection was still open after 60 s (a fail-safe, never waited for when the server behaves).
struct RawAnswer {
  std::string bytes;
  bool closed = false;
  int status() const {  // 0: no HTTP answer
    int code = 0;
    const bool http = absl::StartsWith(bytes, "HTTP/1.1 ");
    return http && absl::SimpleAtoi(bytes.substr(9, 3), &code) ? code : 0;
  }
  std::string body() const {
    const size_t end = bytes.find("\r\n\r\n");
    return end == std::string::npos ? "" : bytes.substr(end + 4);
  }
};

// `bytes` as they are to 127.0.0.1:port.
inline RawAnswer SendRaw(int port, const std::string& bytes) {
  RawAnswer out;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    // (A server that closes early may cut the write short: what it answered is still read.)
    send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.bytes.append(buffer, n);
    out.closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
  close(fd);
  return out;
}

// A request's head as bytes (with `key` as its bearer unless empty, `more` header lines after
// it): the server closes the connection after its answer.
inline std::string Head(const std::string& request_line, const std::string& key,
                        const std::string& more = "") {
  return absl::StrCat(request_line, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
                      key.empty() ? "" : absl::StrCat("Authorization: Bearer ", key, "\r\n"), more,
                      "\r\n");
}

// A self-signed certificate for 127.0.0.1 made by openssl, and its key, in `dir`.
inline void MakeCertificate(const std::filesystem::path& dir) {
  const std::string command = absl::StrCat(
      "cd ", dir.string(),
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
      "endpoint.key -out endpoint.crt -days 2 -subj /CN=prl-agent-endpoint-test -addext "
      "subjectAltName=IP:127.0.0.1 2>/dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// HTTPS as an agent's SDK speaks it: the server's certificate verified against `ca_file`, for
// the address 127.0.0.1; with `client_cert` (and its `client_key`), presented to the server
// (mutual TLS). status 0 when the TLS connection failed (the body says why).
inline openai::testing::HttpAnswer HttpsCall(
    int port, const std::string& ca_file,
    const boost::beast::http::request<boost::beast::http::string_body>& request,
    const std::string& client_cert = "", const std::string& client_key = "") {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  asio::io_context ioc;
  asio::ssl::context tls(asio::ssl::context::tls_client);
  tls.load_verify_file(ca_file);
  if (!client_cert.empty()) {
    tls.use_certificate_chain_file(client_cert);
    tls.use_private_key_file(client_key, asio::ssl::context::pem);
  }
  beast::ssl_stream<beast::tcp_stream> stream(ioc, tls);
  stream.set_verify_mode(asio::ssl::verify_peer);
  stream.set_verify_callback(asio::ssl::host_name_verification("127.0.0.1"));
  beast::error_code ec;
  beast::get_lowest_layer(stream).socket().connect(
      {asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)}, ec);
  if (!ec) stream.handshake(asio::ssl::stream_base::client, ec);
  if (!ec) beast::http::write(stream, request, ec);
  beast::flat_buffer buffer;
  beast::http::response<beast::http::string_body> response;
  if (!ec) beast::http::read(stream, buffer, response, ec);
  if (ec) return {0, ec.message()};
  return {static_cast<int>(response.result_int()), response.body()};
}

}  // namespace prl::security::testing
