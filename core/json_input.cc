#include "core/json_input.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace prl {

namespace {

// Counts the nesting as the parser meets it; returning false at the first level too deep
// stops the parse there (nothing is built: this pass only counts).
template <class Json>
struct DepthCheck {
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  int max_depth = 0;
  int depth = 0;
  bool too_deep = false;
  size_t error_at = 0;  // the byte where parsing stopped
  std::string error;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(std::size_t) { return Enter(); }
  bool key(string_t&) { return true; }
  bool end_object() { return Leave(); }
  bool start_array(std::size_t) { return Enter(); }
  bool end_array() { return Leave(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    error_at = position;
    return false;
  }

  bool Enter() {
    too_deep = ++depth > max_depth;
    return !too_deep;
  }
  bool Leave() {
    --depth;
    return true;
  }
};

template <class Json>
absl::StatusOr<Json> Parse(absl::string_view text, absl::string_view field,
                           const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected JSON of at most ",
                                                   limits.max_bytes, " bytes, found ", text.size(),
                                                   " bytes"));
  }
  DepthCheck<Json> check;
  check.max_depth = limits.max_depth;
  const bool parsed = Json::sax_parse(text.begin(), text.end(), &check,
                                      nlohmann::detail::input_format_t::json, /*strict=*/true);
  if (check.too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected JSON nested at most ",
                                                   limits.max_depth, " deep, found deeper"));
  }
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected JSON, found ", text.empty() ? "nothing" : "a syntax error at byte ",
        text.empty() ? "" : absl::StrCat(check.error_at)));
  }
  Json value = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {  // the SAX pass accepted it: cannot happen, but never throw
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected JSON"));
  }
  return value;
}

template <class Json>
int Depth(const Json& value) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> stack = {{&value, 0}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) {
      deepest = std::max(deepest, depth);
      continue;
    }
    deepest = std::max(deepest, depth + 1);
    for (const Json& item : *v) stack.emplace_back(&item, depth + 1);
  }
  return deepest;
}

template <class Json>
const char* TypeName(const Json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::binary:
      return "binary";
    case nlohmann::json::value_t::discarded:
      return "nothing";
    default:
      return "a number";
  }
}

using OrderedJson = nlohmann::ordered_json;

// object[key], or null when absent (or `object` is no object).
const OrderedJson& MemberOrNull(const OrderedJson& object, absl::string_view key) {
  static const OrderedJson* const kNull = new OrderedJson();
  if (!object.is_object()) return *kNull;
  const auto it = object.find(std::string(key));
  return it == object.end() ? *kNull : *it;
}

absl::Status WrongType(absl::string_view field, absl::string_view key, absl::string_view expected,
                       const OrderedJson& found) {
  return absl::InvalidArgumentError(absl::StrCat(MemberField(field, key), ": expected ", expected,
                                                 ", found ", JsonTypeName(found), " (",
                                                 JsonExcerpt(found), ")"));
}

}  // namespace

absl::StatusOr<nlohmann::ordered_json> ParseJsonInput(absl::string_view text,
                                                      absl::string_view field,
                                                      const JsonLimits& limits) {
  return Parse<nlohmann::ordered_json>(text, field, limits);
}

absl::StatusOr<nlohmann::json> ParseJsonInputUnordered(absl::string_view text,
                                                       absl::string_view field,
                                                       const JsonLimits& limits) {
  return Parse<nlohmann::json>(text, field, limits);
}

int JsonDepth(const nlohmann::ordered_json& value) { return Depth(value); }
int JsonDepth(const nlohmann::json& value) { return Depth(value); }

const char* JsonTypeName(const nlohmann::ordered_json& value) { return TypeName(value); }
const char* JsonTypeName(const nlohmann::json& value) { return TypeName(value); }

std::string JsonExcerpt(const nlohmann::ordered_json& value) {
  // A shallow value only: dump() recurses, and values reaching here may come from anywhere.
  if (JsonDepth(value) > kMaxJsonDepth) return "(too deep to show)";
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

std::string MemberField(absl::string_view field, absl::string_view key) {
  return field.empty() ? std::string(key) : absl::StrCat(field, ".", key);
}

absl::StatusOr<std::string> MemberString(const nlohmann::ordered_json& object,
                                         absl::string_view key, absl::string_view field,
                                         std::string fallback) {
  const OrderedJson& v = MemberOrNull(object, key);
  if (v.is_null()) return fallback;
  if (!v.is_string()) return WrongType(field, key, "a string", v);
  return v.get<std::string>();
}

absl::StatusOr<bool> MemberBool(const nlohmann::ordered_json& object, absl::string_view key,
                                absl::string_view field, bool fallback) {
  const OrderedJson& v = MemberOrNull(object, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) return WrongType(field, key, "true or false", v);
  return v.get<bool>();
}

absl::StatusOr<int64_t> MemberInt(const nlohmann::ordered_json& object, absl::string_view key,
                                  absl::string_view field, int64_t min, int64_t max,
                                  int64_t fallback) {
  const OrderedJson& v = MemberOrNull(object, key);
  if (v.is_null()) return fallback;
  const std::string range = absl::StrCat("an integer from ", min, " to ", max);
  // An unsigned beyond int64's range, or a negative below `min`, is out of range; so is a
  // float, even an integral one (JSON from a client says 3, not 3.0, for a count).
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (max < 0 || u > static_cast<uint64_t>(max) || (min > 0 && u < static_cast<uint64_t>(min))) {
      return WrongType(field, key, range, v);
    }
    return static_cast<int64_t>(u);
  }
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > max) {
    return WrongType(field, key, range, v);
  }
  return v.get<int64_t>();
}

}  // namespace prl
