// The endpoint's Beast request parser with its limits (openai/http_request.h): one setting for
// the server's socket reads and for ReadRequest. Internal to openai/ (Beast stays out of the
// public headers).
#pragma once

#include <boost/beast/http.hpp>
#include <cstdint>

#include "absl/status/statusor.h"
#include "openai/http_request.h"

namespace prl::openai {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// Headers at most kMaxHeaderBytes; the body at most `max_body_bytes` (a declared length past
// it fails while the head is read, a chunked one as it arrives).
inline void ConfigureParser(RequestParser& parser, int64_t max_body_bytes) {
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(static_cast<uint64_t>(max_body_bytes));
}

// CheckHead of a parsed head.
absl::StatusOr<RequestHead> CheckParsedHead(const RequestParser& parser);

// The error a parse error becomes (400 naming the part; the body cap with its size).
absl::Status ParseError(const boost::beast::error_code& ec, int64_t max_body_bytes);

}  // namespace prl::openai
