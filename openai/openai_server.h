// OpenAiServer: an actor's OpenAI-compatible endpoint (docs/agents.md), over HTTP/1.1 with
// Boost.Beast:
//
//   GET  /v1/models             the actor's one model
//   POST /v1/chat/completions   openai/chat_request.h; answered in OpenAI's schema
//                               (openai/chat_response.h), or as server-sent events with
//                               "stream": true
//   POST /v1/completions        the same for a text prompt
//
// Every request carries `Authorization: Bearer <key>`: a per-episode key the actor handed to an
// agent (CompletionBackend::KnowsKey). It is a capability for that episode only — it generates
// for that episode and nothing else — and never a role's token. A missing or unknown key is 401;
// a malformed request 400 naming the field; a path or method it does not serve 404 / 405; the
// backend's errors map to 409 (the episode is not in a state to take the call), 429
// (limits), 503 (stopping) or 500.
//
// Listening: loopback by default; a non-loopback address needs TLS (security.tls_cert_file and
// tls_key_file: HTTPS with the process's certificate, TLS 1.2 at least; with
// require_client_cert, a client certificate signed by tls_ca_file, as on the gRPC servers) or
// security.insecure, like every prl listener (rpc/security.h).
//
// Before authentication (docs/security.md, "Boundaries"): a request's line and headers
// (at most 16 KiB) must arrive within header_timeout_ms of the connection or of the previous
// answer, and the key is checked before any of the body is read (openai/http_request.h): a
// caller without a key is answered 401 and its connection closed, its body never buffered. The
// body (at most max_body_bytes) must then arrive within request_timeout_ms. At most
// max_connections are open: a connection past the cap sheds one that is not generating — the
// longest-waiting one whose key was not accepted, of the peer (IP address) holding the most
// such connections, else the longest-idle one between requests — and gets 503 only when every
// connection is generating (openai/connection_table.h).
// A generation itself is bounded by its episode's limits, not here.
//
// No request takes the endpoint down: a handler's exception (the backend's included) is a 500
// naming the request's id, logged with it; the server goes on.
//
// Lifetimes: the backend's callbacks hold only weak references to their connection and post to
// the server's loop through a link that the destructor closes first: a callback that comes (or
// is destroyed) after the server stopped does nothing. Connections are counted and destroyed on
// the server's loop only.
//
// Thread-safety: the server runs on its own thread; the backend's callbacks may come from any
// thread (they are posted to it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "openai/chat_request.h"
#include "openai/chat_response.h"

namespace prl::openai {

// What the endpoint asks of the actor.
class CompletionBackend {
 public:
  using Progress = std::function<void(const std::string& text)>;
  using Done = std::function<void(absl::StatusOr<Completion> completion)>;

  virtual ~CompletionBackend() = default;
  // The served model's name (/v1/models, and every answer's "model").
  virtual std::string model() const = 0;
  // Whether `key` belongs to an episode the actor runs now.
  virtual bool KnowsKey(const std::string& key) const = 0;
  // Generates for `call` in `key`'s episode. `progress` (for streams; may be null) gets the
  // text so far each time it grew — always an extension of the text before; `done` gets the
  // completion or the reason there is none (Unauthenticated: the key's episode ended;
  // InvalidArgument: the call does not fit the episode, naming the field; ResourceExhausted:
  // the episode's limits; FailedPrecondition: a call of the episode is still generating;
  // Unavailable: the actor is stopping). Both may be called from any thread; `done` once.
  virtual void Generate(const std::string& key, ChatCall call, Progress progress, Done done) = 0;
};

struct OpenAiServerOptions {
  std::string address = "127.0.0.1:0";  // port 0: any free one
  int max_connections = 256;            // actors.openai_max_connections
  // Connections of one IP whose key is not yet accepted; 0: no bound of its own (at the cap, the
  // peer holding the most is shed first). Agents on one host open many at once.
  int max_unauthenticated_per_peer = 0;
  int64_t max_body_bytes = int64_t{16} << 20;
  int header_timeout_ms = 10'000;   // the request line and headers, from connect or last answer
  int request_timeout_ms = 30'000;  // the body, once the key is accepted
  ChatLimits limits;
  // TLS (HTTPS): the certificate chain and key (PEM); both empty: plain HTTP, which a
  // non-loopback address refuses unless `insecure`. With require_client_cert, clients present a
  // certificate that tls_ca_file verifies (mutual TLS).
  std::string tls_cert_file, tls_key_file, tls_ca_file;
  bool require_client_cert = false;
  bool insecure = false;
};

class OpenAiServer {
 public:
  // `backend` must outlive the server.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(const OpenAiServerOptions& options,
                                                             CompletionBackend* backend);
  ~OpenAiServer();  // stops serving; calls still generating get no answer
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  int port() const;
  // Open connections (for tests; read on the server's loop).
  int connections() const;
  // "http://127.0.0.1:PORT/v1" (https with TLS): what an agent's client is given.
  std::string base_url() const;

  struct Impl;

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace prl::openai
