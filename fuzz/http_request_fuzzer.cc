// libFuzzer target for the OpenAI endpoint's request reader (openai/http_request.h): the bytes
// are what a client sends on a connection, read as the server reads them — the head (at most
// 16 KiB), the route, method and key checked from the head alone, then the body (at most
// 64 KiB here) and the call.
//
// Beyond "no crash, no sanitizer report, no hang": an error has a message and a code the
// endpoint maps to an HTTP status (400, 401, 404, 405); a request without the key never gets as
// far as its body (its error is Unauthenticated or came from the head); an accepted chat or
// completion carries a parsed call of its kind. The same entry point replays
// fuzz/corpus/http_request in ctest.
#include <cstdint>
#include <cstdlib>

#include "openai/http_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<prl::openai::ReadRequestResult> read =
      prl::openai::ReadRequest(bytes, /*max_body_bytes=*/64 << 10, "fuzz-key");
  if (!read.ok()) {
    const absl::StatusCode code = read.status().code();
    if (read.status().message().empty()) std::abort();  // errors must explain themselves
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kUnauthenticated &&
        code != absl::StatusCode::kNotFound && code != absl::StatusCode::kUnimplemented) {
      std::abort();  // every error is one the endpoint answers with a 4xx
    }
    return 0;
  }
  if (read->head.key != "fuzz-key") std::abort();  // only the key gets past the head
  switch (read->head.route) {
    case prl::openai::Route::kChat:
      if (!read->call.chat || read->call.messages.empty()) std::abort();
      break;
    case prl::openai::Route::kCompletions:
      if (read->call.chat) std::abort();
      break;
    case prl::openai::Route::kModels:
      break;
  }
  return 0;
}
