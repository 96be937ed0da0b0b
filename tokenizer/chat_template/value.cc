#include "tokenizer/chat_template/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace prl::tokenizer::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s)
    : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::MakeDict(Dict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}

Value Value::MakeNamespace(Dict items) {
  Value v = MakeDict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::MakeFunction(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [key, item] : json.items()) items.emplace_back(key, FromJson(item));
      return MakeDict(std::move(items));
    }
    default:
      return Value();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0.0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), d);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return FormatFloat(d_);
    case Kind::kString:
      return *s_;
    case Kind::kFunction:
      return "<function>";
    default: {
      absl::StatusOr<std::string> json = ToJson(*this, -1);
      return json.ok() ? *json : "";
    }
  }
}

const Value* Value::Find(const std::string& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) {
      return a.as_int() == b.as_int();
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.as_bool() == b.as_bool();
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [key, value] : a.dict()) {
        const Value* other = b.Find(key);
        if (other == nullptr || !Equal(value, *other)) return false;
      }
      return true;
    }
    default:
      return &a == &b;
  }
}

namespace {

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          *out += buffer;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// A newline and indent * depth spaces; nothing without an indent.
std::string Pad(int indent, int depth) {
  if (indent < 0) return std::string();
  std::string pad(1 + static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
  pad[0] = '\n';
  return pad;
}

absl::Status AppendJson(const Value& v, int indent, int depth, std::string* out) {
  const std::string pad = Pad(indent, depth);
  const std::string child_pad = Pad(indent, depth + 1);
  const std::string item_separator = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      if (!std::isfinite(v.as_double())) {
        *out += std::isnan(v.as_double()) ? "NaN" : v.as_double() > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FormatFloat(v.as_double());
      }
      return absl::OkStatus();
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      out->push_back('[');
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_separator;
        *out += child_pad;
        if (auto s = AppendJson(v.list()[i], indent, depth + 1, out); !s.ok()) return s;
      }
      if (!v.list().empty()) *out += pad;
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.dict()) {
        if (!first) *out += item_separator;
        first = false;
        *out += child_pad;
        AppendJsonString(key, out);
        *out += ": ";
        if (auto s = AppendJson(item, indent, depth + 1, out); !s.ok()) return s;
      }
      if (!v.dict().empty()) *out += pad;
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("tojson: a function is not JSON serializable");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, int indent) {
  std::string out;
  if (auto s = AppendJson(value, indent, 0, &out); !s.ok()) return s;
  return out;
}

}  // namespace prl::tokenizer::jinja
