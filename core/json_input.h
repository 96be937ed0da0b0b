// JSON from outside a role: the one entry point for JSON bytes that a client, a tenant, an
// agent, an environment or a reward server sends (the OpenAI endpoint's bodies, prompt sets and
// prompt files, tools_json and template_kwargs_json, tool-call arguments, replies).
//
// A bounded parse: at most `max_bytes` of text and arrays/objects nested at most `max_depth`
// deep (kMaxJsonDepth = 64: a chat request, a tool schema or template kwargs nest a handful of
// levels; nothing real comes near it). The depth is checked by a SAX pass that stops at the
// first level too deep, before any value is built, so that no later recursive walk of the
// value (a copy, dump(), the template renderer's conversion) can exhaust the stack. Errors are
// InvalidArgument naming the field, e.g.
//   "messages[0].tool_calls[0].function.arguments: expected JSON nested at most 64 deep,
//    found deeper at byte 65".
//
// Member reads (`Member*`) check the member's type, where nlohmann's `value(key, default)`
// would throw type_error: absent or null gives the default; another type is InvalidArgument
// "<field>.<key>: expected a string, found a number".
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace prl {

inline constexpr int kMaxJsonDepth = 64;
inline constexpr size_t kMaxJsonBytes = size_t{16} << 20;

struct JsonLimits {
  int max_depth = kMaxJsonDepth;     // arrays and objects within each other; a scalar is 0
  size_t max_bytes = kMaxJsonBytes;  // of the text
};

// One JSON value (any type) from `text`, within `limits`; errors name `field`.
absl::StatusOr<nlohmann::ordered_json> ParseJsonInput(absl::string_view text,
                                                      absl::string_view field,
                                                      const JsonLimits& limits = {});
absl::StatusOr<nlohmann::json> ParseJsonInputUnordered(absl::string_view text,
                                                       absl::string_view field,
                                                       const JsonLimits& limits = {});

// How deep `value` nests (a scalar 0, `[]` 1, `[[1]]` 2), without recursion.
int JsonDepth(const nlohmann::ordered_json& value);
int JsonDepth(const nlohmann::json& value);

// "null", "a boolean", "a number", "a string", "an array", "an object" (for errors).
const char* JsonTypeName(const nlohmann::ordered_json& value);
const char* JsonTypeName(const nlohmann::json& value);

// A value in an error: its JSON, cut at 80 bytes.
std::string JsonExcerpt(const nlohmann::ordered_json& value);

// Typed reads of `object[key]` (`object` must be an object). Absent or null: `fallback`.
// `field` names the object ("messages[2]"; "" for the top level).
absl::StatusOr<std::string> MemberString(const nlohmann::ordered_json& object,
                                         absl::string_view key, absl::string_view field,
                                         std::string fallback = "");
absl::StatusOr<bool> MemberBool(const nlohmann::ordered_json& object, absl::string_view key,
                                absl::string_view field, bool fallback);
// An integer in [min, max]; a float, or a number out of the range (also beyond 64 bits), is
// refused naming the range.
absl::StatusOr<int64_t> MemberInt(const nlohmann::ordered_json& object, absl::string_view key,
                                  absl::string_view field, int64_t min, int64_t max,
                                  int64_t fallback);

// "field.key" (or "key" when `field` is empty).
std::string MemberField(absl::string_view field, absl::string_view key);

}  // namespace prl
