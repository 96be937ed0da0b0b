// Runs a parsed chat template: Jinja2's scoping (a loop body or macro call has its own scope;
// `set` inside it does not leak out, which is why templates use namespace()), the loop object
// (index, index0, revindex, revindex0, first, last, length, previtem, nextitem), macros, and
// the globals raise_exception, namespace, range, dict and strftime_now. Errors name the
// template line.
//
// Not thread-safe: one Interpreter per render.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tokenizer/chat_template/ast.h"
#include "tokenizer/chat_template/value.h"

namespace prl::tokenizer::jinja {

class Interpreter {
 public:
  // `globals`: the render's variables (messages, tools, add_generation_prompt, ...).
  explicit Interpreter(Value::Dict globals);

  // Appends the output of `body` to *out.
  absl::Status Run(const Body& body, std::string* out);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  absl::StatusOr<Flow> Exec(const Body& body, std::string* out);
  absl::StatusOr<Flow> ExecFor(const Stmt& s, std::string* out);
  absl::Status ExecSet(const Stmt& s, std::string* out);
  Value MakeMacro(const Stmt& s);
  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> EvalBinary(const Expr& e);
  absl::StatusOr<Value> EvalCall(const Expr& e);
  absl::StatusOr<Value> EvalAttribute(const Expr& e);
  absl::StatusOr<Value> EvalSubscript(const Expr& e);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first);
  Value Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value value);
  static absl::Status AtLine(int line, const absl::Status& status);

  std::vector<Value::Dict> scopes_;  // scopes_[0]: globals; back(): innermost
};

}  // namespace prl::tokenizer::jinja
