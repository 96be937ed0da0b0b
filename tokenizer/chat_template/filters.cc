#include "tokenizer/chat_template/filters.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer::jinja {

namespace {

using Kind = Value::Kind;

std::u32string Decode(const std::string& s) {
  std::u32string out;
  char32_t cp;
  for (size_t pos = 0; pos < s.size();) {
    pos += DecodeUtf8(s, pos, &cp);
    out.push_back(cp);
  }
  return out;
}

std::string Encode(const std::u32string& s) {
  std::string out;
  for (char32_t cp : s) AppendUtf8(cp, &out);
  return out;
}

absl::Status Expected(absl::string_view what, absl::string_view expected, const Value& found) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", expected, ", found ",
                                                 found.TypeName(), " ", found.ToString()));
}

// Positional argument i or keyword `key`, else `fallback`.
Value Arg(const CallArgs& args, size_t i, const std::string& key, Value fallback = Value()) {
  if (i < args.positional.size()) return args.positional[i];
  for (const auto& [k, v] : args.keyword) {
    if (k == key) return v;
  }
  return fallback;
}

// Python str.strip / lstrip / rstrip: `chars` (a string) or whitespace when none/undefined.
absl::StatusOr<Value> Strip(const Value& s, const Value& chars, bool left, bool right) {
  if (!chars.is_undefined() && !chars.is_none() && !chars.is_string()) {
    return Expected("strip", "a string of characters", chars);
  }
  const std::u32string text = Decode(s.as_string());
  const std::u32string set = chars.is_string() ? Decode(chars.as_string()) : U"";
  const auto strip = [&](char32_t c) {
    return chars.is_string() ? set.find(c) != std::u32string::npos : IsPythonWhitespace(c);
  };
  size_t begin = 0, end = text.size();
  while (left && begin < end && strip(text[begin])) ++begin;
  while (right && end > begin && strip(text[end - 1])) --end;
  return Value(Encode(text.substr(begin, end - begin)));
}

absl::StatusOr<Value> Split(const Value& s, const Value& sep, const Value& max) {
  const std::string& text = s.as_string();
  int64_t limit = max.kind() == Kind::kInt ? max.as_int() : -1;
  Value::List parts;
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace, no empty parts
    const std::u32string t = Decode(text);
    size_t i = 0;
    while (true) {
      while (i < t.size() && IsPythonWhitespace(t[i])) ++i;
      if (i >= t.size()) break;
      if (limit == 0) {
        size_t end = t.size();
        while (end > i && IsPythonWhitespace(t[end - 1])) --end;
        parts.push_back(Value(Encode(t.substr(i, end - i))));
        break;
      }
      size_t j = i;
      while (j < t.size() && !IsPythonWhitespace(t[j])) ++j;
      parts.push_back(Value(Encode(t.substr(i, j - i))));
      --limit;
      i = j;
    }
    return Value::MakeList(std::move(parts));
  }
  if (!sep.is_string() || sep.as_string().empty())
    return Expected("split", "a non-empty separator", sep);
  const std::string& d = sep.as_string();
  size_t start = 0;
  for (size_t pos; limit != 0 && (pos = text.find(d, start)) != std::string::npos; --limit) {
    parts.push_back(Value(text.substr(start, pos - start)));
    start = pos + d.size();
  }
  parts.push_back(Value(text.substr(start)));
  return Value::MakeList(std::move(parts));
}

std::string MapCase(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 capitalize, 3 title
  std::u32string t = Decode(s);
  bool word_start = true;
  for (size_t i = 0; i < t.size(); ++i) {
    const auto cp = static_cast<utf8proc_int32_t>(t[i]);
    bool upper = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && word_start);
    t[i] = static_cast<char32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
    word_start = !IsWordCharacter(t[i]) || t[i] == '_';
  }
  return Encode(t);
}

absl::StatusOr<Value> Replace(const Value& s, const Value& from, const Value& to,
                              const Value& count) {
  if (!from.is_string() || !to.is_string())
    return Expected("replace", "two strings", from.is_string() ? to : from);
  const std::string& text = s.as_string();
  const std::string& a = from.as_string();
  int64_t limit = count.kind() == Kind::kInt ? count.as_int() : -1;
  std::string out;
  if (a.empty()) {  // Python inserts `to` between characters
    const std::u32string t = Decode(text);
    for (size_t i = 0; i <= t.size(); ++i) {
      if (limit != 0) out += to.as_string(), --limit;
      if (i < t.size()) AppendUtf8(t[i], &out);
    }
    return Value(out);
  }
  size_t start = 0;
  for (size_t pos; limit != 0 && (pos = text.find(a, start)) != std::string::npos; --limit) {
    out.append(text, start, pos - start);
    out += to.as_string();
    start = pos + a.size();
  }
  out.append(text, start, std::string::npos);
  return Value(out);
}

absl::StatusOr<Value> StringMethod(const Value& s, const std::string& m, const CallArgs& a) {
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    return Strip(s, Arg(a, 0, "chars"), m != "rstrip", m != "lstrip");
  }
  if (m == "split") return Split(s, Arg(a, 0, "sep"), Arg(a, 1, "maxsplit"));
  if (m == "startswith" || m == "endswith") {
    const Value arg = Arg(a, 0, "prefix");
    Value::List options = arg.is_list() ? arg.list() : Value::List{arg};
    for (const Value& o : options) {
      if (!o.is_string()) return Expected(m, "a string or a tuple of strings", o);
      const std::string& t = s.as_string();
      const std::string& x = o.as_string();
      if (x.size() <= t.size() &&
          (m == "startswith" ? t.compare(0, x.size(), x) == 0
                             : t.compare(t.size() - x.size(), x.size(), x) == 0)) {
        return Value(true);
      }
    }
    return Value(false);
  }
  if (m == "upper") return Value(MapCase(s.as_string(), 1));
  if (m == "lower") return Value(MapCase(s.as_string(), 0));
  if (m == "capitalize") return Value(MapCase(MapCase(s.as_string(), 0), 2));
  if (m == "title") return Value(MapCase(s.as_string(), 3));
  if (m == "replace") return Replace(s, Arg(a, 0, "old"), Arg(a, 1, "new"), Arg(a, 2, "count"));
  if (m == "find" || m == "count") {
    const Value sub = Arg(a, 0, "sub");
    if (!sub.is_string()) return Expected(m, "a string", sub);
    const std::string& t = s.as_string();
    if (m == "find") {
      const size_t pos = t.find(sub.as_string());
      return Value(pos == std::string::npos
                       ? int64_t{-1}
                       : static_cast<int64_t>(CountCodePoints(t.substr(0, pos))));
    }
    int64_t n = 0;
    for (size_t pos = 0; (pos = t.find(sub.as_string(), pos)) != std::string::npos; ++n) {
      pos += std::max<size_t>(1, sub.as_string().size());
    }
    return Value(n);
  }
  if (m == "join") {
    PRL_ASSIGN_OR_RETURN(const Value::List items, Iterate(Arg(a, 0, "iterable")));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? s.as_string() : "") + items[i].ToString();
    return Value(out);
  }
  return absl::NotFoundError(absl::StrCat("strings have no method '", m, "'"));
}

absl::StatusOr<Value> Length(const Value& v) {
  if (v.is_string()) return Value(static_cast<int64_t>(CountCodePoints(v.as_string())));
  if (v.is_list()) return Value(static_cast<int64_t>(v.list().size()));
  if (v.is_mapping()) return Value(static_cast<int64_t>(v.dict().size()));
  return Expected("length", "a string, list or dict", v);
}

absl::StatusOr<Value> ToInt(const Value& v, const Value& fallback) {
  if (v.kind() == Kind::kInt) return v;
  if (v.kind() == Kind::kBool) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.kind() == Kind::kFloat) return Value(static_cast<int64_t>(std::trunc(v.as_double())));
  if (v.is_string()) {
    const std::string& t = v.as_string();
    char* end = nullptr;
    const long long i = std::strtoll(t.c_str(), &end, 10);
    if (!t.empty() && *end == 0) return Value(static_cast<int64_t>(i));
    const double d = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == 0) return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return fallback.is_undefined() ? Value(int64_t{0}) : fallback;
}

// The attribute `path` ("a.b") of v, or undefined.
Value Attribute(const Value& v, const std::string& path) {
  Value current = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const Value* next = current.Find(path.substr(start, dot - start));
    if (next == nullptr) return Value();
    current = *next;
    start = dot + 1;
  }
  return current;
}

absl::StatusOr<Value> Select(const Value& input, const CallArgs& a, bool by_attribute, bool keep) {
  PRL_ASSIGN_OR_RETURN(const Value::List items, Iterate(input));
  const size_t first = by_attribute ? 1 : 0;
  const Value attribute = by_attribute ? Arg(a, 0, "attribute") : Value();
  const Value test = Arg(a, first, "test");
  CallArgs test_args;
  for (size_t i = first + 1; i < a.positional.size(); ++i)
    test_args.positional.push_back(a.positional[i]);
  Value::List out;
  for (const Value& item : items) {
    const Value subject = by_attribute ? Attribute(item, attribute.ToString()) : item;
    bool pass = subject.Truthy();
    if (test.is_string()) {
      PRL_ASSIGN_OR_RETURN(pass, ApplyTest(test.as_string(), subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Items(const Value& v) {
  if (!v.is_mapping()) return Expected("items", "a dict", v);
  Value::List out;
  for (const auto& [k, item] : v.dict()) out.push_back(Value::MakeList({Value(k), item}));
  return Value::MakeList(std::move(out));
}

const absl::flat_hash_set<std::string>& FilterNames() {
  static const auto* names = new absl::flat_hash_set<std::string>{
      "length", "count",  "trim",   "tojson",     "string",     "default",    "d",
      "first",  "last",   "join",   "upper",      "lower",      "capitalize", "title",
      "int",    "float",  "abs",    "reverse",    "list",       "items",      "replace",
      "map",    "select", "reject", "selectattr", "rejectattr", "safe"};
  return *names;
}

const absl::flat_hash_set<std::string>& TestNames() {
  static const auto* names = new absl::flat_hash_set<std::string>{
      "defined",     "undefined", "none",     "string",   "number", "integer", "float", "boolean",
      "mapping",     "iterable",  "sequence", "callable", "true",   "false",   "odd",   "even",
      "divisibleby", "eq",        "equalto",  "ne",       "lower",  "upper",   "in"};
  return *names;
}

// map(attribute="x") or map("filter", args...).
absl::StatusOr<Value> Map(const Value& input, const CallArgs& a) {
  PRL_ASSIGN_OR_RETURN(const Value::List items, Iterate(input));
  const Value attribute = Arg(a, 99, "attribute");
  const Value filter = a.positional.empty() ? Value() : a.positional[0];
  CallArgs rest;
  for (size_t i = 1; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
  Value::List out;
  for (const Value& item : items) {
    if (!attribute.is_undefined()) {
      Value v = Attribute(item, attribute.ToString());
      out.push_back(v.is_undefined() ? Arg(a, 99, "default") : v);
    } else if (filter.is_string() && HasFilter(filter.as_string())) {
      PRL_ASSIGN_OR_RETURN(Value v, ApplyFilter(filter.as_string(), item, rest));
      out.push_back(std::move(v));
    } else {
      return Expected("map", "attribute= or the name of a filter", filter);
    }
  }
  return Value::MakeList(std::move(out));
}

// float(default) and abs.
absl::StatusOr<Value> Numeric(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "float") {
    if (input.is_number()) return Value(input.as_double());
    if (input.is_string()) {
      char* end = nullptr;
      const double d = std::strtod(input.as_string().c_str(), &end);
      if (!input.as_string().empty() && *end == 0) return Value(d);
    }
    const Value fallback = Arg(a, 0, "default");
    return fallback.is_undefined() ? Value(0.0) : fallback;
  }
  if (name == "abs") {
    if (input.kind() == Kind::kInt)
      return Value(input.as_int() < 0 ? -input.as_int() : input.as_int());
    if (input.kind() == Kind::kFloat) return Value(std::fabs(input.as_double()));
    return Expected("abs", "a number", input);
  }
  return Expected(name, "a number", input);
}

}  // namespace

bool HasFilter(const std::string& name) { return FilterNames().contains(name); }
bool HasTest(const std::string& name) { return TestNames().contains(name); }

absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string()) return Expected("in", "a string on the left of 'in <string>'", needle);
    return haystack.as_string().find(needle.as_string()) != std::string::npos;
  }
  if (haystack.is_list()) {
    for (const Value& item : haystack.list()) {
      if (Equal(item, needle)) return true;
    }
    return false;
  }
  if (haystack.is_mapping())
    return needle.is_string() && haystack.Find(needle.as_string()) != nullptr;
  if (haystack.is_undefined()) return absl::InvalidArgumentError("'in' an undefined value");
  return Expected("in", "a string, list or dict on the right", haystack);
}

absl::StatusOr<Value::List> Iterate(const Value& value) {
  if (value.is_list()) return value.list();
  if (value.is_mapping()) {
    Value::List keys;
    for (const auto& [k, v] : value.dict()) keys.push_back(Value(k));
    return keys;
  }
  if (value.is_string()) {
    Value::List chars;
    for (char32_t cp : Decode(value.as_string()))
      chars.push_back(Value(Encode(std::u32string(1, cp))));
    return chars;
  }
  if (value.is_undefined() || value.is_none()) return Value::List{};
  return Expected("iteration", "a list, dict or string", value);
}

absl::StatusOr<Value> Slice(const Value& value, const Value* start, const Value* stop,
                            const Value* step) {
  const int64_t n = value.is_string() ? static_cast<int64_t>(CountCodePoints(value.as_string()))
                    : value.is_list() ? static_cast<int64_t>(value.list().size())
                                      : -1;
  if (n < 0) return Expected("slice", "a string or list", value);
  for (const Value* b : {start, stop, step}) {
    if (b != nullptr && !b->is_none() && b->kind() != Kind::kInt)
      return Expected("slice", "integer bounds", *b);
  }
  const int64_t s = step && !step->is_none() ? step->as_int() : 1;
  if (s == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  const auto bound = [&](const Value* b, int64_t fallback) {
    if (b == nullptr || b->is_none()) return fallback;
    int64_t i = b->as_int();
    if (i < 0) i += n;
    return s > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t lo = bound(start, s > 0 ? 0 : n - 1), hi = bound(stop, s > 0 ? n : -1);
  std::vector<int64_t> picks;
  for (int64_t i = lo; s > 0 ? i < hi : i > hi; i += s) picks.push_back(i);
  if (value.is_list()) {
    Value::List out;
    for (int64_t i : picks) out.push_back(value.list()[i]);
    return Value::MakeList(std::move(out));
  }
  const std::u32string text = Decode(value.as_string());
  std::u32string out;
  for (int64_t i : picks) out.push_back(text[i]);
  return Value(Encode(out));
}

absl::StatusOr<Value> CallMethod(const Value& object, const std::string& method,
                                 const CallArgs& args) {
  if (object.is_string()) return StringMethod(object, method, args);
  if (object.kind() == Kind::kDict) {
    if (method == "items") return Items(object);
    if (method == "keys" || method == "values") {
      Value::List out;
      for (const auto& [k, v] : object.dict()) out.push_back(method == "keys" ? Value(k) : v);
      return Value::MakeList(std::move(out));
    }
    if (method == "get") {
      const Value key = Arg(args, 0, "key");
      const Value* found = key.is_string() ? object.Find(key.as_string()) : nullptr;
      return found != nullptr ? *found : Arg(args, 1, "default", Value::None());
    }
  }
  return absl::NotFoundError(absl::StrCat(object.TypeName(), " has no method '", method, "'"));
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "length" || name == "count") return Length(input);
  if (name == "trim") {
    if (!input.is_string()) return Expected("trim", "a string", input);
    return Strip(input, Arg(a, 0, "chars"), true, true);
  }
  if (name == "tojson") {
    const Value indent = Arg(a, 0, "indent");
    PRL_ASSIGN_OR_RETURN(
        std::string json,
        ToJson(input, indent.kind() == Kind::kInt ? static_cast<int>(indent.as_int()) : -1));
    return Value(std::move(json));
  }
  if (name == "string") return input.is_string() ? input : Value(input.ToString());
  if (name == "safe") return input;
  if (name == "default" || name == "d") {
    const bool boolean = Arg(a, 1, "boolean", Value(false)).Truthy();
    const bool use_default = boolean ? !input.Truthy() : input.is_undefined();
    return use_default ? Arg(a, 0, "default_value", Value("")) : input;
  }
  if (name == "first" || name == "last") {
    PRL_ASSIGN_OR_RETURN(const Value::List items, Iterate(input));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    PRL_ASSIGN_OR_RETURN(const Value::List items, Iterate(input));
    const Value sep = Arg(a, 0, "d", Value(""));
    const Value attribute = Arg(a, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += sep.ToString();
      out += (attribute.is_undefined() ? items[i] : Attribute(items[i], attribute.ToString()))
                 .ToString();
    }
    return Value(out);
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    if (!input.is_string()) return Expected(name, "a string", input);
    return StringMethod(input, name, CallArgs{});
  }
  if (name == "int") return ToInt(input, Arg(a, 0, "default"));
  if (name == "float" || name == "abs") return Numeric(name, input, a);
  if (name == "reverse") {
    if (input.is_string()) {
      const Value step(int64_t{-1});
      return Slice(input, nullptr, nullptr, &step);
    }
    PRL_ASSIGN_OR_RETURN(Value::List items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "list") {
    PRL_ASSIGN_OR_RETURN(Value::List items, Iterate(input));
    return Value::MakeList(std::move(items));
  }
  if (name == "items") return Items(input);
  if (name == "replace") {
    if (!input.is_string()) return Expected("replace", "a string", input);
    return Replace(input, Arg(a, 0, "old"), Arg(a, 1, "new"), Arg(a, 2, "count"));
  }
  if (name == "map") return Map(input, a);
  if (name == "select" || name == "reject") return Select(input, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return Select(input, a, true, name == "selectattr");
  return absl::UnimplementedError(absl::StrCat("unsupported filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& a) {
  const Kind k = v.kind();
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return k == Kind::kInt;
  if (name == "float") return k == Kind::kFloat;
  if (name == "boolean") return k == Kind::kBool;
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_list() || v.is_mapping() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_mapping() || v.is_string();
  if (name == "callable") return k == Kind::kFunction;
  if (name == "true") return k == Kind::kBool && v.as_bool();
  if (name == "false") return k == Kind::kBool && !v.as_bool();
  if (name == "lower" || name == "upper") {
    return v.is_string() && MapCase(v.as_string(), name == "upper" ? 1 : 0) == v.as_string();
  }
  const Value arg = Arg(a, 0, "value");
  if (name == "eq" || name == "equalto") return Equal(v, arg);
  if (name == "ne") return !Equal(v, arg);
  if (name == "in") return Contains(arg, v);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (k != Kind::kInt) return Expected(name, "an integer", v);
    if (name == "divisibleby") {
      if (arg.kind() != Kind::kInt || arg.as_int() == 0)
        return Expected(name, "a non-zero integer", arg);
      return v.as_int() % arg.as_int() == 0;
    }
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  return absl::UnimplementedError(absl::StrCat("unsupported test '", name, "'"));
}

}  // namespace prl::tokenizer::jinja
