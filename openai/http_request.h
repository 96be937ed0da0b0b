// How the OpenAI endpoint reads a request (openai/openai_server.h), in two steps so that nothing
// large is read for a caller that has no key:
//   1. the request line and headers (at most kMaxHeaderBytes, within the header deadline), then
//      CheckHead: the route, the method and the key's presence, from the head alone;
//   2. only for a head that passed and a key the backend knows: the body (at most
//      max_body_bytes, within the request deadline), then ParseChatRequestBody /
//      ParseCompletionRequestBody (openai/chat_request.h).
// ReadRequest runs both steps over bytes already at hand, with the server's parser settings: the
// fuzz target (fuzz/http_request_fuzzer.cc) and the tests use it; the server reads with the same
// settings (ConfigureParser in http_request.cc) from its socket.
//
// Errors are what the endpoint answers: NotFound (404: no such path), Unimplemented (405: the
// path's other method), Unauthenticated (401: no bearer key), InvalidArgument (400: the
// request's bytes, naming the part).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "openai/chat_request.h"

namespace prl::openai {

inline constexpr size_t kMaxHeaderBytes = 16 * 1024;  // the request line and all headers

enum class Route { kModels, kChat, kCompletions };

struct RequestHead {
  Route route = Route::kModels;
  std::string key;          // the bearer key (not yet checked against the backend)
  bool keep_alive = false;  // what the client asked for
};

// The head's route, method and key. `target` may carry a query ("?..."), which is ignored.
absl::StatusOr<RequestHead> CheckHead(absl::string_view method, absl::string_view target,
                                      absl::string_view authorization, bool keep_alive);

struct ReadRequestResult {
  RequestHead head;
  ChatCall call;  // for kChat and kCompletions
};

// One request from `bytes` (which must hold it whole): head, key (`known_key` stands in for the
// backend), body within `max_body_bytes`, and the call.
absl::StatusOr<ReadRequestResult> ReadRequest(absl::string_view bytes, int64_t max_body_bytes,
                                              absl::string_view known_key,
                                              const ChatLimits& limits = {});

}  // namespace prl::openai
