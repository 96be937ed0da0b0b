// The values a chat template computes with: Jinja's (Python's) undefined, none, booleans,
// integers, floats, strings, lists, dicts (insertion-ordered, as the JSON they come from),
// namespaces and callables (macros, globals such as raise_exception).
//
// Lists, dicts and namespaces are shared by reference, as in Python: `set ns.x = 1` is seen
// through every copy of `ns`. A Value is not thread-safe; each Render builds its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace prl::tokenizer::jinja {

class Value;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(const CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  using List = std::vector<Value>;
  using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order

  Value() = default;  // undefined
  static Value None();
  Value(bool b);                                   // NOLINT: literals convert implicitly
  Value(int64_t i);                                // NOLINT
  Value(double d);                                 // NOLINT
  Value(std::string s);                            // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  static Value MakeList(List items);
  static Value MakeDict(Dict items);
  static Value MakeNamespace(Dict items);
  static Value MakeFunction(Function f);
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_list() const { return kind_ == Kind::kList; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& as_string() const { return *s_; }
  List& list() const { return *list_; }
  Dict& dict() const { return *dict_; }  // also a namespace's attributes
  const Function& function() const { return *fn_; }

  // Python's truthiness: undefined, none, false, 0, "", [] and {} are false.
  bool Truthy() const;
  // What {{ value }} prints: "" for undefined, None / True / False / Python float repr for
  // scalars, JSON for lists and dicts (as @huggingface/jinja prints them).
  std::string ToString() const;
  // The dict entry `key`, or nullptr.
  const Value* Find(const std::string& key) const;
  // A short type name for errors ("string", "list", ...).
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0.0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

// Python's == for template values (1 == 1.0, lists and dicts element-wise).
bool Equal(const Value& a, const Value& b);

// Python float repr: shortest round-trip digits, "1.0" for integral values, "inf", "nan".
std::string FormatFloat(double d);

// json.dumps(value, ensure_ascii=False, indent=indent, separators=(", ", ": ") or (",", ": ")
// with an indent), as transformers' tojson filter; undefined becomes null. `indent` < 0: none.
absl::StatusOr<std::string> ToJson(const Value& value, int indent);

}  // namespace prl::tokenizer::jinja
