// Reading the fields of tokenizer.json and tokenizer_config.json with errors that name the
// file and JSON path of the offending value, e.g.
//   tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported "Digits" (supported: ...)
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace prl::tokenizer {

// Where a JSON value sits: its file and the path from the document root ("" is the root).
class JsonPath {
 public:
  explicit JsonPath(std::string file) : file_(std::move(file)) {}
  JsonPath Key(absl::string_view key) const;
  JsonPath Index(size_t i) const;
  // "file: path" (or "file" at the root).
  std::string ToString() const;

 private:
  JsonPath(std::string file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}
  std::string file_, path_;
};

// A short rendering of a JSON value for messages (long values are cut).
std::string Describe(const nlohmann::json& value);

// "<path>: expected <expected>, found <value>".
absl::Status TypeError(const JsonPath& path, absl::string_view expected,
                       const nlohmann::json& found);
// "<path>: unsupported "<found>" (supported: <supported>)".
absl::Status Unsupported(const JsonPath& path, absl::string_view found,
                         absl::string_view supported);

// obj[key] as a string / bool / integer. A missing or null field gives `fallback` when one is
// allowed (the *Or forms); any other type is a TypeError naming path.key.
absl::StatusOr<std::string> GetString(const nlohmann::json& obj, absl::string_view key,
                                      const JsonPath& path);
absl::StatusOr<std::string> GetStringOr(const nlohmann::json& obj, absl::string_view key,
                                        const JsonPath& path, absl::string_view fallback);
absl::StatusOr<bool> GetBoolOr(const nlohmann::json& obj, absl::string_view key,
                               const JsonPath& path, bool fallback);
absl::StatusOr<int64_t> GetIntOr(const nlohmann::json& obj, absl::string_view key,
                                 const JsonPath& path, int64_t fallback);
// obj["type"] into *type (a string), as the components of tokenizer.json name their kind.
absl::Status GetType(const nlohmann::json& obj, const JsonPath& path, std::string* type);
// obj[key] that must be present and an object or array.
absl::StatusOr<const nlohmann::json*> GetObject(const nlohmann::json& obj, absl::string_view key,
                                                const JsonPath& path);
absl::StatusOr<const nlohmann::json*> GetArray(const nlohmann::json& obj, absl::string_view key,
                                               const JsonPath& path);

}  // namespace prl::tokenizer
