#include "tokenizer/chat_template/interpreter.h"

#include <cmath>
#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "tokenizer/chat_template/filters.h"

namespace prl::tokenizer::jinja {

namespace {

using Kind = Value::Kind;

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
  if (op == "+" && a.is_list() && b.is_list()) {
    Value::List items = a.list();
    items.insert(items.end(), b.list().begin(), b.list().end());
    return Value::MakeList(std::move(items));
  }
  if (op == "*" && a.is_string() && b.kind() == Kind::kInt) {
    std::string out;
    for (int64_t i = 0; i < b.as_int(); ++i) out += a.as_string();
    return Value(out);
  }
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Kind::kBool; };
  if (!numeric(a) || !numeric(b)) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported operand types for ", op, ": ",
                                                   a.TypeName(), " and ", b.TypeName()));
  }
  const auto as_int = [](const Value& v) {
    return v.kind() == Kind::kBool ? static_cast<int64_t>(v.as_bool()) : v.as_int();
  };
  const auto as_double = [&](const Value& v) {
    return v.kind() == Kind::kBool ? static_cast<double>(v.as_bool()) : v.as_double();
  };
  const bool ints = a.kind() != Kind::kFloat && b.kind() != Kind::kFloat;
  if (op == "/") {
    if (as_double(b) == 0.0) return absl::InvalidArgumentError("division by zero");
    return Value(as_double(a) / as_double(b));
  }
  if (ints) {
    const int64_t x = as_int(a), y = as_int(b);
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "**" && y >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < y; ++i) r *= x;
      return Value(r);
    }
    if (op == "//" || op == "%") {
      if (y == 0) return absl::InvalidArgumentError("division by zero");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python floors
      return Value(op == "//" ? q : r);
    }
  }
  const double x = as_double(a), y = as_double(b);
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0.0) return absl::InvalidArgumentError("division by zero");
  if (op == "//") return Value(std::floor(x / y));
  return Value(x - std::floor(x / y) * y);
}

absl::StatusOr<Value> Compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value(Equal(a, b));
  if (op == "!=") return Value(!Equal(a, b));
  int order;
  if (a.is_number() && b.is_number()) {
    order = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  } else if (a.is_string() && b.is_string()) {
    order = a.as_string().compare(b.as_string());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", op, "' is not supported between ", a.TypeName(), " and ", b.TypeName()));
  }
  if (op == "<") return Value(order < 0);
  if (op == "<=") return Value(order <= 0);
  if (op == ">") return Value(order > 0);
  return Value(order >= 0);
}

Value Globals(const std::string& name) {
  if (name == "raise_exception") {
    return Value::MakeFunction([](const CallArgs& a) -> absl::StatusOr<Value> {
      return absl::InvalidArgumentError(absl::StrCat(
          "raise_exception: ", a.positional.empty() ? "" : a.positional[0].ToString()));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::MakeFunction([ns](const CallArgs& a) -> absl::StatusOr<Value> {
      Value::Dict items;
      for (const Value& p : a.positional) {
        if (!p.is_mapping()) return absl::InvalidArgumentError("namespace/dict: expected a dict");
        items.insert(items.end(), p.dict().begin(), p.dict().end());
      }
      items.insert(items.end(), a.keyword.begin(), a.keyword.end());
      return ns ? Value::MakeNamespace(std::move(items)) : Value::MakeDict(std::move(items));
    });
  }
  if (name == "range") {
    return Value::MakeFunction([](const CallArgs& a) -> absl::StatusOr<Value> {
      int64_t bounds[3] = {0, 0, 1};
      const size_t n = a.positional.size();
      if (n < 1 || n > 3) return absl::InvalidArgumentError("range: expected 1 to 3 integers");
      for (size_t i = 0; i < n; ++i) {
        if (a.positional[i].kind() != Kind::kInt) {
          return absl::InvalidArgumentError("range: expected integers");
        }
        bounds[n == 1 ? 1 : i] = a.positional[i].as_int();
      }
      if (bounds[2] == 0) return absl::InvalidArgumentError("range: step cannot be zero");
      Value::List items;
      for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1]; i += bounds[2]) {
        items.push_back(Value(i));
      }
      return Value::MakeList(std::move(items));
    });
  }
  if (name == "strftime_now") {
    return Value::MakeFunction([](const CallArgs& a) -> absl::StatusOr<Value> {
      if (a.positional.empty() || !a.positional[0].is_string()) {
        return absl::InvalidArgumentError("strftime_now: expected a format string");
      }
      const std::time_t now = std::time(nullptr);
      std::tm local;
      localtime_r(&now, &local);
      char buffer[256];
      const size_t n =
          std::strftime(buffer, sizeof(buffer), a.positional[0].as_string().c_str(), &local);
      return Value(std::string(buffer, n));
    });
  }
  return Value();
}

}  // namespace

Interpreter::Interpreter(Value::Dict globals) { scopes_.push_back(std::move(globals)); }

absl::Status Interpreter::AtLine(int line, const absl::Status& status) {
  if (status.ok() || absl::StartsWith(status.message(), "chat template line")) return status;
  return absl::Status(status.code(),
                      absl::StrCat("chat template line ", line, ": ", status.message()));
}

absl::Status Interpreter::Run(const Body& body, std::string* out) {
  return Exec(body, out).status();
}

Value Interpreter::Lookup(const std::string& name) const {
  for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
    for (const auto& [k, v] : *scope) {
      if (k == name) return v;
    }
  }
  return Globals(name);
}

void Interpreter::Assign(const std::string& name, Value value) {
  for (auto& [k, v] : scopes_.back()) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  scopes_.back().emplace_back(name, std::move(value));
}

absl::StatusOr<Interpreter::Flow> Interpreter::Exec(const Body& body, std::string* out) {
  for (const Stmt& s : body) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out += s.text;
        break;
      case Stmt::Kind::kOutput: {
        absl::StatusOr<Value> v = Eval(*s.expr);
        if (!v.ok()) return AtLine(s.line, v.status());
        *out += v->ToString();
        break;
      }
      case Stmt::Kind::kIf: {
        const Body* chosen = &s.body;
        for (const auto& [condition, branch] : s.branches) {
          absl::StatusOr<Value> c = Eval(*condition);
          if (!c.ok()) return AtLine(condition->line, c.status());
          if (c->Truthy()) {
            chosen = &branch;
            break;
          }
        }
        PRL_ASSIGN_OR_RETURN(const Flow flow, Exec(*chosen, out));
        if (flow != Flow::kNormal) return flow;
        break;
      }
      case Stmt::Kind::kFor: {
        PRL_ASSIGN_OR_RETURN(const Flow flow, ExecFor(s, out));
        (void)flow;
        break;
      }
      case Stmt::Kind::kSet:
        PRL_RETURN_IF_ERROR(AtLine(s.line, ExecSet(s, out)));
        break;
      case Stmt::Kind::kMacro:
        Assign(s.name, MakeMacro(s));
        break;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s, std::string* out) {
  absl::StatusOr<Value> iterable = Eval(*s.expr);
  if (!iterable.ok()) return AtLine(s.line, iterable.status());
  absl::StatusOr<Value::List> all = Iterate(*iterable);
  if (!all.ok()) return AtLine(s.line, all.status());
  // Binds the loop targets of one item in the innermost scope.
  const auto bind = [&](const Value& item) -> absl::Status {
    if (s.targets.size() == 1) {
      Assign(s.targets[0], item);
      return absl::OkStatus();
    }
    if (!item.is_list() || item.list().size() != s.targets.size()) {
      return AtLine(s.line, absl::InvalidArgumentError(
                                absl::StrCat("cannot unpack ", item.TypeName(), " into ",
                                             s.targets.size(), " loop variables")));
    }
    for (size_t t = 0; t < s.targets.size(); ++t) Assign(s.targets[t], item.list()[t]);
    return absl::OkStatus();
  };
  Value::List items;
  for (const Value& item : *all) {
    if (s.condition) {
      scopes_.emplace_back();
      absl::Status bound = bind(item);
      absl::StatusOr<Value> keep = bound.ok() ? Eval(*s.condition) : bound;
      scopes_.pop_back();
      if (!keep.ok()) return AtLine(s.line, keep.status());
      if (!keep->Truthy()) continue;
    }
    items.push_back(item);
  }
  if (items.empty()) return Exec(s.else_body, out);
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    scopes_.emplace_back();
    Value::Dict loop = {{"index", Value(i + 1)},
                        {"index0", Value(i)},
                        {"revindex", Value(n - i)},
                        {"revindex0", Value(n - i - 1)},
                        {"first", Value(i == 0)},
                        {"last", Value(i == n - 1)},
                        {"length", Value(n)},
                        {"previtem", i > 0 ? items[i - 1] : Value()},
                        {"nextitem", i + 1 < n ? items[i + 1] : Value()}};
    Assign("loop", Value::MakeDict(std::move(loop)));
    absl::Status bound = bind(items[i]);
    absl::StatusOr<Flow> flow = bound.ok() ? Exec(s.body, out) : bound;
    scopes_.pop_back();
    if (!flow.ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

absl::Status Interpreter::ExecSet(const Stmt& s, std::string* out) {
  (void)out;
  Value value;
  if (s.expr) {
    PRL_ASSIGN_OR_RETURN(value, Eval(*s.expr));
  } else {
    std::string captured;
    PRL_RETURN_IF_ERROR(Exec(s.body, &captured).status());
    value = Value(std::move(captured));
  }
  if (s.targets.size() == 1) {
    Assign(s.targets[0], std::move(value));
    return absl::OkStatus();
  }
  const Value target = Lookup(s.targets[0]);
  if (target.kind() != Kind::kNamespace) {
    return absl::InvalidArgumentError(absl::StrCat("set ", s.targets[0], ".", s.targets[1],
                                                   ": expected a namespace, found ",
                                                   target.TypeName()));
  }
  for (auto& [k, v] : target.dict()) {
    if (k == s.targets[1]) {
      v = std::move(value);
      return absl::OkStatus();
    }
  }
  target.dict().emplace_back(s.targets[1], std::move(value));
  return absl::OkStatus();
}

Value Interpreter::MakeMacro(const Stmt& s) {
  return Value::MakeFunction([this, &s](const CallArgs& a) -> absl::StatusOr<Value> {
    Value::Dict params;
    for (size_t i = 0; i < s.params.size(); ++i) {
      const auto& [name, fallback] = s.params[i];
      Value v;
      if (i < a.positional.size()) {
        v = a.positional[i];
      } else {
        bool found = false;
        for (const auto& [k, kv] : a.keyword) {
          if (k == name) v = kv, found = true;
        }
        if (!found && fallback) {
          PRL_ASSIGN_OR_RETURN(v, Eval(*fallback));
        }
      }
      params.emplace_back(name, std::move(v));
    }
    // The macro sees the globals and its parameters, not its caller's locals.
    std::vector<Value::Dict> saved(scopes_.begin() + 1, scopes_.end());
    scopes_.resize(1);
    scopes_.push_back(std::move(params));
    std::string out;
    absl::StatusOr<Flow> flow = Exec(s.body, &out);
    scopes_.resize(1);
    scopes_.insert(scopes_.end(), saved.begin(), saved.end());
    if (!flow.ok()) return flow.status();
    return Value(std::move(out));
  });
}

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    PRL_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    PRL_ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args.keyword.emplace_back(key, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Interpreter::EvalBinary(const Expr& e) {
  PRL_ASSIGN_OR_RETURN(const Value a, Eval(*e.args[0]));
  const std::string& op = e.name;
  if (op == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
  if (op == "or") return a.Truthy() ? a : Eval(*e.args[1]);
  PRL_ASSIGN_OR_RETURN(const Value b, Eval(*e.args[1]));
  if (op == "~") return Value(a.ToString() + b.ToString());
  if (op == "in" || op == "not in") {
    PRL_ASSIGN_OR_RETURN(const bool in, Contains(b, a));
    return Value(in == (op == "in"));
  }
  if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=") {
    return Compare(op, a, b);
  }
  return Arithmetic(op, a, b);
}

absl::StatusOr<Value> Interpreter::EvalAttribute(const Expr& e) {
  PRL_ASSIGN_OR_RETURN(const Value object, Eval(*e.args[0]));
  if (object.is_mapping()) {
    const Value* found = object.Find(e.name);
    return found != nullptr ? *found : Value();
  }
  if (object.is_undefined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", e.name, "' of an undefined value (expected a dict)"));
  }
  return Value();
}

absl::StatusOr<Value> Interpreter::EvalSubscript(const Expr& e) {
  PRL_ASSIGN_OR_RETURN(const Value object, Eval(*e.args[0]));
  if (e.kind == Expr::Kind::kSlice) {
    Value bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (e.args[i + 1]) {
        PRL_ASSIGN_OR_RETURN(bounds[i], Eval(*e.args[i + 1]));
      }
    }
    const auto ptr = [&](int i) { return e.args[i + 1] ? &bounds[i] : nullptr; };
    return Slice(object, ptr(0), ptr(1), ptr(2));
  }
  PRL_ASSIGN_OR_RETURN(const Value key, Eval(*e.args[1]));
  if (object.is_mapping()) {
    const Value* found = key.is_string() ? object.Find(key.as_string()) : nullptr;
    return found != nullptr ? *found : Value();
  }
  if ((object.is_list() || object.is_string()) && key.kind() == Kind::kInt) {
    // x[i] is x[i:i+1] (x[-1] is x[-1:]) taken apart; out of range is undefined.
    const int64_t i = key.as_int();
    const Value one(int64_t{1});
    const Value stop = i == -1 ? Value::None() : Value(i + 1);
    PRL_ASSIGN_OR_RETURN(const Value picked, Slice(object, &key, &stop, &one));
    if (object.is_list()) return picked.list().empty() ? Value() : picked.list()[0];
    return picked.as_string().empty() ? Value() : picked;
  }
  if (object.is_undefined()) {
    return absl::InvalidArgumentError("subscript of an undefined value (expected a list or dict)");
  }
  return Value();
}

absl::StatusOr<Value> Interpreter::EvalCall(const Expr& e) {
  const Expr& callee = *e.args[0];
  PRL_ASSIGN_OR_RETURN(const CallArgs args, EvalArgs(e, 1));
  if (callee.kind == Expr::Kind::kAttribute) {
    PRL_ASSIGN_OR_RETURN(const Value object, Eval(*callee.args[0]));
    const Value* member = object.is_mapping() ? object.Find(callee.name) : nullptr;
    if (member != nullptr && member->kind() == Kind::kFunction) return member->function()(args);
    absl::StatusOr<Value> result = CallMethod(object, callee.name, args);
    if (absl::IsNotFound(result.status())) {
      return absl::UnimplementedError(
          absl::StrCat("unsupported method '", callee.name, "' of a ", object.TypeName()));
    }
    return result;
  }
  PRL_ASSIGN_OR_RETURN(const Value f, Eval(callee));
  if (f.kind() != Kind::kFunction) {
    return absl::UnimplementedError(absl::StrCat(
        callee.kind == Expr::Kind::kName ? absl::StrCat("unsupported function '", callee.name, "'")
                                         : "call of a value that is not a function",
        " (found ", f.TypeName(), ")"));
  }
  return f.function()(args);
}

absl::StatusOr<Value> Interpreter::Eval(const Expr& e) {
  absl::StatusOr<Value> result;
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      Value::List items;
      for (const ExprPtr& item : e.args) {
        PRL_ASSIGN_OR_RETURN(Value v, Eval(*item));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items));
    }
    case Expr::Kind::kDict: {
      Value::Dict items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        PRL_ASSIGN_OR_RETURN(const Value key, Eval(*e.args[i]));
        PRL_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
        items.emplace_back(key.ToString(), std::move(v));
      }
      return Value::MakeDict(std::move(items));
    }
    case Expr::Kind::kUnary: {
      PRL_ASSIGN_OR_RETURN(const Value v, Eval(*e.args[0]));
      if (e.name == "not") return Value(!v.Truthy());
      result = Arithmetic(e.name == "-" ? "-" : "+", Value(int64_t{0}), v);
      break;
    }
    case Expr::Kind::kBinary:
      result = EvalBinary(e);
      break;
    case Expr::Kind::kTernary: {
      PRL_ASSIGN_OR_RETURN(const Value c, Eval(*e.args[1]));
      if (c.Truthy()) return Eval(*e.args[0]);
      return e.args[2] ? Eval(*e.args[2]) : Value();
    }
    case Expr::Kind::kAttribute:
      result = EvalAttribute(e);
      break;
    case Expr::Kind::kSubscript:
    case Expr::Kind::kSlice:
      result = EvalSubscript(e);
      break;
    case Expr::Kind::kCall:
      result = EvalCall(e);
      break;
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest: {
      PRL_ASSIGN_OR_RETURN(const Value input, Eval(*e.args[0]));
      PRL_ASSIGN_OR_RETURN(const CallArgs args, EvalArgs(e, 1));
      if (e.kind == Expr::Kind::kFilter) {
        result = ApplyFilter(e.name, input, args);
      } else {
        absl::StatusOr<bool> pass = ApplyTest(e.name, input, args);
        result = pass.ok() ? absl::StatusOr<Value>(Value(*pass != e.negated)) : pass.status();
      }
      break;
    }
  }
  return result.ok() ? result : AtLine(e.line, result.status());
}

}  // namespace prl::tokenizer::jinja
