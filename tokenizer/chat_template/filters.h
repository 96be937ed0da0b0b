// The filters, tests and methods that chat templates call, with Python's (Jinja2's) semantics:
//   filters  length count trim tojson string default d first last join upper lower capitalize
//            title int float abs reverse list items replace map select reject selectattr
//            rejectattr safe
//   tests    defined undefined none string number integer float boolean mapping iterable
//            sequence callable true false odd even divisibleby eq equalto ne lower upper in
//   methods  of strings: strip lstrip rstrip split startswith endswith upper lower replace
//            title capitalize find count join; of dicts: items get keys values
// Errors name the filter/test/method and what it expected and found; the interpreter adds the
// template line. Stateless and thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tokenizer/chat_template/value.h"

namespace prl::tokenizer::jinja {

bool HasFilter(const std::string& name);
bool HasTest(const std::string& name);

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& input,
                                  const CallArgs& args);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& input, const CallArgs& args);
// object.method(args); NotFound when `object` has no such method.
absl::StatusOr<Value> CallMethod(const Value& object, const std::string& method,
                                 const CallArgs& args);

// Python's `needle in haystack` (substring, list element, dict key).
absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle);
// The items of a list, the keys of a dict, the characters of a string (for loops, |list).
absl::StatusOr<Value::List> Iterate(const Value& value);
// Python str(x)[start:stop:step] / list slicing; a null bound is absent.
absl::StatusOr<Value> Slice(const Value& value, const Value* start, const Value* stop,
                            const Value* step);

}  // namespace prl::tokenizer::jinja
