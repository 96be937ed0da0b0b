#include "tokenizer/json_path.h"

#include "absl/strings/str_cat.h"

namespace prl::tokenizer {

JsonPath JsonPath::Key(absl::string_view key) const {
  return JsonPath(file_, path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key));
}

JsonPath JsonPath::Index(size_t i) const {
  return JsonPath(file_, absl::StrCat(path_, "[", i, "]"));
}

std::string JsonPath::ToString() const {
  return path_.empty() ? file_ : absl::StrCat(file_, ": ", path_);
}

std::string Describe(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

absl::Status TypeError(const JsonPath& path, absl::string_view expected,
                       const nlohmann::json& found) {
  return absl::InvalidArgumentError(
      absl::StrCat(path.ToString(), ": expected ", expected, ", found ", Describe(found)));
}

absl::Status Unsupported(const JsonPath& path, absl::string_view found,
                         absl::string_view supported) {
  return absl::UnimplementedError(
      absl::StrCat(path.ToString(), ": unsupported \"", found, "\" (supported: ", supported, ")"));
}

namespace {

const nlohmann::json* Find(const nlohmann::json& obj, absl::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

}  // namespace

absl::StatusOr<std::string> GetString(const nlohmann::json& obj, absl::string_view key,
                                      const JsonPath& path) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr || !v->is_string()) {
    return TypeError(path.Key(key), "a string", v == nullptr ? nlohmann::json() : *v);
  }
  return v->get<std::string>();
}

absl::Status GetType(const nlohmann::json& obj, const JsonPath& path, std::string* type) {
  const nlohmann::json* v = Find(obj, "type");
  if (v == nullptr || !v->is_string()) {
    return TypeError(path.Key("type"), "a string", v == nullptr ? nlohmann::json() : *v);
  }
  *type = v->get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<std::string> GetStringOr(const nlohmann::json& obj, absl::string_view key,
                                        const JsonPath& path, absl::string_view fallback) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return std::string(fallback);
  if (!v->is_string()) return TypeError(path.Key(key), "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<bool> GetBoolOr(const nlohmann::json& obj, absl::string_view key,
                               const JsonPath& path, bool fallback) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_boolean()) return TypeError(path.Key(key), "true or false", *v);
  return v->get<bool>();
}

absl::StatusOr<int64_t> GetIntOr(const nlohmann::json& obj, absl::string_view key,
                                 const JsonPath& path, int64_t fallback) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_number_integer()) return TypeError(path.Key(key), "an integer", *v);
  return v->get<int64_t>();
}

absl::StatusOr<const nlohmann::json*> GetObject(const nlohmann::json& obj, absl::string_view key,
                                                const JsonPath& path) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr || !v->is_object()) {
    return TypeError(path.Key(key), "an object", v == nullptr ? nlohmann::json() : *v);
  }
  return v;
}

absl::StatusOr<const nlohmann::json*> GetArray(const nlohmann::json& obj, absl::string_view key,
                                               const JsonPath& path) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr || !v->is_array()) {
    return TypeError(path.Key(key), "a list", v == nullptr ? nlohmann::json() : *v);
  }
  return v;
}

}  // namespace prl::tokenizer
