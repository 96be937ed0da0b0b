#include "tokenizer/chat_template/parser.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "tokenizer/chat_template/filters.h"

namespace prl::tokenizer::jinja {

namespace {

using K = Token::Kind;

ExprPtr MakeExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  absl::StatusOr<Body> Program() {
    Body body;
    std::string end;
    PRL_RETURN_IF_ERROR(ParseBody({}, &body, &end));
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kOperator && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kName && Peek(ahead).text == name;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", Peek().line, ": ", what));
  }
  absl::Status Expect(K kind, const char* text, const char* what) {
    if (Peek().kind != kind || (text != nullptr && Peek().text != text)) {
      return Error(absl::StrCat("expected ", what, ", found '", Peek().text, "'"));
    }
    ++pos_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != K::kName)
      return Error(absl::StrCat("expected a name, found '", Peek().text, "'"));
    return t_[pos_++].text;
  }

  absl::Status ParseBody(const std::vector<std::string>& ends, Body* body, std::string* end);
  absl::Status ParseStatement(const std::vector<std::string>& ends, Body* body, std::string* end);
  absl::Status ParseIf(Stmt* s);
  absl::Status ParseFor(Stmt* s);
  absl::Status ParseSet(Stmt* s);
  absl::Status ParseMacro(Stmt* s);

  absl::StatusOr<ExprPtr> Expression(bool allow_ternary = true);
  absl::StatusOr<ExprPtr> Or();
  absl::StatusOr<ExprPtr> And();
  absl::StatusOr<ExprPtr> Not();
  absl::StatusOr<ExprPtr> Compare();
  absl::StatusOr<ExprPtr> Math1();
  absl::StatusOr<ExprPtr> Concat();
  absl::StatusOr<ExprPtr> Math2();
  absl::StatusOr<ExprPtr> Pow();
  absl::StatusOr<ExprPtr> Unary();
  absl::StatusOr<ExprPtr> Primary();
  absl::StatusOr<ExprPtr> Postfix(ExprPtr e);
  absl::StatusOr<ExprPtr> Subscript(ExprPtr e);
  absl::Status CallArguments(Expr* call);
  absl::StatusOr<ExprPtr> Binary(ExprPtr left, std::string op, ExprPtr right, int line) {
    auto e = MakeExpr(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
};

absl::Status Parser::ParseBody(const std::vector<std::string>& ends, Body* body, std::string* end) {
  while (true) {
    const Token& tok = Peek();
    if (tok.kind == K::kEnd) {
      if (ends.empty()) return absl::OkStatus();
      return Error(
          absl::StrCat("the template ends inside a block (expected {% ", ends.back(), " %})"));
    }
    if (tok.kind == K::kText) {
      Stmt s;
      s.kind = Stmt::Kind::kText;
      s.line = tok.line;
      s.text = tok.text;
      body->push_back(std::move(s));
      ++pos_;
    } else if (tok.kind == K::kOpenExpression) {
      ++pos_;
      Stmt s;
      s.kind = Stmt::Kind::kOutput;
      s.line = tok.line;
      PRL_ASSIGN_OR_RETURN(s.expr, Expression());
      PRL_RETURN_IF_ERROR(Expect(K::kCloseExpression, nullptr, "}}"));
      body->push_back(std::move(s));
    } else if (tok.kind == K::kOpenStatement) {
      ++pos_;
      for (const std::string& e : ends) {
        if (IsName(e.c_str())) {
          *end = e;
          ++pos_;
          return absl::OkStatus();
        }
      }
      PRL_RETURN_IF_ERROR(ParseStatement(ends, body, end));
    } else {
      return Error(absl::StrCat("unexpected '", tok.text, "'"));
    }
  }
}

absl::Status Parser::ParseStatement(const std::vector<std::string>& ends, Body* body,
                                    std::string* end) {
  (void)ends;
  (void)end;
  PRL_ASSIGN_OR_RETURN(const std::string keyword, ExpectName());
  Stmt s;
  s.kind = Stmt::Kind::kText;
  s.line = Peek().line;
  if (keyword == "if") {
    s.kind = Stmt::Kind::kIf;
    PRL_RETURN_IF_ERROR(ParseIf(&s));
  } else if (keyword == "for") {
    s.kind = Stmt::Kind::kFor;
    PRL_RETURN_IF_ERROR(ParseFor(&s));
  } else if (keyword == "set") {
    s.kind = Stmt::Kind::kSet;
    PRL_RETURN_IF_ERROR(ParseSet(&s));
  } else if (keyword == "macro") {
    s.kind = Stmt::Kind::kMacro;
    PRL_RETURN_IF_ERROR(ParseMacro(&s));
  } else if (keyword == "break" || keyword == "continue") {
    s.kind = keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "%}"));
  } else {
    --pos_;
    return Error(absl::StrCat("unsupported statement {% ", keyword,
                              " %} (supported: if, for, set, macro, break, continue)"));
  }
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseIf(Stmt* s) {
  while (true) {
    PRL_ASSIGN_OR_RETURN(ExprPtr condition, Expression());
    PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "%}"));
    Body body;
    std::string end;
    PRL_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &end));
    s->branches.emplace_back(std::move(condition), std::move(body));
    if (end == "elif") continue;
    if (end == "else") {
      PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "%}"));
      PRL_RETURN_IF_ERROR(ParseBody({"endif"}, &s->body, &end));
    }
    return Expect(K::kCloseStatement, nullptr, "%}");
  }
}

absl::Status Parser::ParseFor(Stmt* s) {
  const bool parenthesized = IsOp("(");
  if (parenthesized) ++pos_;
  while (true) {
    PRL_ASSIGN_OR_RETURN(std::string target, ExpectName());
    s->targets.push_back(std::move(target));
    if (!IsOp(",")) break;
    ++pos_;
  }
  if (parenthesized) PRL_RETURN_IF_ERROR(Expect(K::kOperator, ")", "')'"));
  PRL_RETURN_IF_ERROR(Expect(K::kName, "in", "'in'"));
  PRL_ASSIGN_OR_RETURN(s->expr, Expression(/*allow_ternary=*/false));
  if (IsName("if")) {
    ++pos_;
    PRL_ASSIGN_OR_RETURN(s->condition, Expression(false));
  }
  if (IsName("recursive")) return Error("unsupported construct: recursive for loops");
  PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "%}"));
  std::string end;
  PRL_RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &s->body, &end));
  if (end == "else") {
    PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "%}"));
    PRL_RETURN_IF_ERROR(ParseBody({"endfor"}, &s->else_body, &end));
  }
  return Expect(K::kCloseStatement, nullptr, "%}");
}

absl::Status Parser::ParseSet(Stmt* s) {
  PRL_ASSIGN_OR_RETURN(std::string name, ExpectName());
  s->targets.push_back(std::move(name));
  if (IsOp(".")) {
    ++pos_;
    PRL_ASSIGN_OR_RETURN(std::string attribute, ExpectName());
    s->targets.push_back(std::move(attribute));
  }
  if (IsOp(",")) return Error("unsupported construct: set with several targets");
  if (IsOp("=")) {
    ++pos_;
    PRL_ASSIGN_OR_RETURN(s->expr, Expression());
    return Expect(K::kCloseStatement, nullptr, "%}");
  }
  if (IsOp("|")) return Error("unsupported construct: filtered block set");
  PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "'=' or %}"));
  std::string end;
  PRL_RETURN_IF_ERROR(ParseBody({"endset"}, &s->body, &end));
  return Expect(K::kCloseStatement, nullptr, "%}");
}

absl::Status Parser::ParseMacro(Stmt* s) {
  PRL_ASSIGN_OR_RETURN(s->name, ExpectName());
  PRL_RETURN_IF_ERROR(Expect(K::kOperator, "(", "'('"));
  while (!IsOp(")")) {
    PRL_ASSIGN_OR_RETURN(std::string param, ExpectName());
    ExprPtr fallback;
    if (IsOp("=")) {
      ++pos_;
      PRL_ASSIGN_OR_RETURN(fallback, Expression());
    }
    s->params.emplace_back(std::move(param), std::move(fallback));
    if (!IsOp(",")) break;
    ++pos_;
  }
  PRL_RETURN_IF_ERROR(Expect(K::kOperator, ")", "')'"));
  PRL_RETURN_IF_ERROR(Expect(K::kCloseStatement, nullptr, "%}"));
  std::string end;
  PRL_RETURN_IF_ERROR(ParseBody({"endmacro"}, &s->body, &end));
  return Expect(K::kCloseStatement, nullptr, "%}");
}

absl::StatusOr<ExprPtr> Parser::Expression(bool allow_ternary) {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Or());
  if (!allow_ternary || !IsName("if")) return e;
  const int line = Peek().line;
  ++pos_;
  auto ternary = MakeExpr(Expr::Kind::kTernary, line);
  ternary->args.push_back(std::move(e));
  PRL_ASSIGN_OR_RETURN(ExprPtr condition, Or());
  ternary->args.push_back(std::move(condition));
  ExprPtr otherwise;
  if (IsName("else")) {
    ++pos_;
    PRL_ASSIGN_OR_RETURN(otherwise, Expression());
  }
  ternary->args.push_back(std::move(otherwise));
  return ternary;
}

absl::StatusOr<ExprPtr> Parser::Or() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, And());
  while (IsName("or")) {
    const int line = t_[pos_++].line;
    PRL_ASSIGN_OR_RETURN(ExprPtr right, And());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), "or", std::move(right), line));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::And() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Not());
  while (IsName("and")) {
    const int line = t_[pos_++].line;
    PRL_ASSIGN_OR_RETURN(ExprPtr right, Not());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), "and", std::move(right), line));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Not() {
  if (!IsName("not")) return Compare();
  auto e = MakeExpr(Expr::Kind::kUnary, t_[pos_++].line);
  e->name = "not";
  PRL_ASSIGN_OR_RETURN(ExprPtr operand, Not());
  e->args.push_back(std::move(operand));
  return e;
}

absl::StatusOr<ExprPtr> Parser::Compare() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Math1());
  while (true) {
    std::string op;
    const int line = Peek().line;
    if (Peek().kind == K::kOperator &&
        (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == "<=" ||
         Peek().text == ">" || Peek().text == ">=")) {
      op = t_[pos_++].text;
    } else if (IsName("in")) {
      ++pos_;
      op = "in";
    } else if (IsName("not") && IsName("in", 1)) {
      pos_ += 2;
      op = "not in";
    } else {
      return e;
    }
    PRL_ASSIGN_OR_RETURN(ExprPtr right, Math1());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), op, std::move(right), line));
  }
}

absl::StatusOr<ExprPtr> Parser::Math1() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Concat());
  while (IsOp("+") || IsOp("-")) {
    const Token& op = t_[pos_++];
    PRL_ASSIGN_OR_RETURN(ExprPtr right, Concat());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), op.text, std::move(right), op.line));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Concat() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Math2());
  while (IsOp("~")) {
    const int line = t_[pos_++].line;
    PRL_ASSIGN_OR_RETURN(ExprPtr right, Math2());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), "~", std::move(right), line));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Math2() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Pow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const Token& op = t_[pos_++];
    PRL_ASSIGN_OR_RETURN(ExprPtr right, Pow());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), op.text, std::move(right), op.line));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Pow() {
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Unary());
  while (IsOp("**")) {
    const int line = t_[pos_++].line;
    PRL_ASSIGN_OR_RETURN(ExprPtr right, Unary());
    PRL_ASSIGN_OR_RETURN(e, Binary(std::move(e), "**", std::move(right), line));
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::Unary() {
  if (IsOp("-") || IsOp("+")) {
    auto e = MakeExpr(Expr::Kind::kUnary, Peek().line);
    e->name = t_[pos_++].text;
    PRL_ASSIGN_OR_RETURN(ExprPtr operand, Unary());
    e->args.push_back(std::move(operand));
    return e;
  }
  PRL_ASSIGN_OR_RETURN(ExprPtr e, Primary());
  return Postfix(std::move(e));
}

absl::StatusOr<ExprPtr> Parser::Primary() {
  const Token tok = Peek();
  ++pos_;
  switch (tok.kind) {
    case K::kString: {
      auto e = MakeExpr(Expr::Kind::kLiteral, tok.line);
      std::string text = tok.text;
      while (Peek().kind == K::kString) text += t_[pos_++].text;  // "a" "b" is "ab"
      e->value = Value(std::move(text));
      return e;
    }
    case K::kInteger:
    case K::kFloat: {
      auto e = MakeExpr(Expr::Kind::kLiteral, tok.line);
      e->value = tok.kind == K::kInteger
                     ? Value(static_cast<int64_t>(std::strtoll(tok.text.c_str(), nullptr, 10)))
                     : Value(std::strtod(tok.text.c_str(), nullptr));
      return e;
    }
    case K::kName: {
      auto e = MakeExpr(Expr::Kind::kLiteral, tok.line);
      if (tok.text == "true" || tok.text == "True") {
        e->value = Value(true);
      } else if (tok.text == "false" || tok.text == "False") {
        e->value = Value(false);
      } else if (tok.text == "none" || tok.text == "None") {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = tok.text;
      }
      return e;
    }
    case K::kOperator:
      if (tok.text == "(") {
        if (IsOp(")")) {
          ++pos_;
          return MakeExpr(Expr::Kind::kTuple, tok.line);
        }
        PRL_ASSIGN_OR_RETURN(ExprPtr first, Expression());
        if (IsOp(")")) {
          ++pos_;
          return first;
        }
        auto tuple = MakeExpr(Expr::Kind::kTuple, tok.line);
        tuple->args.push_back(std::move(first));
        while (IsOp(",")) {
          ++pos_;
          if (IsOp(")")) break;
          PRL_ASSIGN_OR_RETURN(ExprPtr item, Expression());
          tuple->args.push_back(std::move(item));
        }
        PRL_RETURN_IF_ERROR(Expect(K::kOperator, ")", "')'"));
        return tuple;
      }
      if (tok.text == "[" || tok.text == "{") {
        const bool dict = tok.text == "{";
        auto e = MakeExpr(dict ? Expr::Kind::kDict : Expr::Kind::kList, tok.line);
        const char* close = dict ? "}" : "]";
        while (!IsOp(close)) {
          PRL_ASSIGN_OR_RETURN(ExprPtr item, Expression());
          e->args.push_back(std::move(item));
          if (dict) {
            PRL_RETURN_IF_ERROR(Expect(K::kOperator, ":", "':'"));
            PRL_ASSIGN_OR_RETURN(ExprPtr value, Expression());
            e->args.push_back(std::move(value));
          }
          if (!IsOp(",")) break;
          ++pos_;
        }
        PRL_RETURN_IF_ERROR(Expect(K::kOperator, close, dict ? "'}'" : "']'"));
        return e;
      }
      break;
    default:
      break;
  }
  --pos_;
  return Error(absl::StrCat("unexpected '", tok.text, "' in an expression"));
}

absl::Status Parser::CallArguments(Expr* call) {
  while (!IsOp(")")) {
    if (Peek().kind == K::kName && IsOp("=", 1)) {
      std::string key = t_[pos_].text;
      pos_ += 2;
      PRL_ASSIGN_OR_RETURN(ExprPtr value, Expression());
      call->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (IsOp("*") || IsOp("**"))
        return Error("unsupported construct: *args / **kwargs in a call");
      PRL_ASSIGN_OR_RETURN(ExprPtr value, Expression());
      call->args.push_back(std::move(value));
    }
    if (!IsOp(",")) break;
    ++pos_;
  }
  return Expect(K::kOperator, ")", "')'");
}

absl::StatusOr<ExprPtr> Parser::Subscript(ExprPtr e) {
  const int line = t_[pos_++].line;  // [
  ExprPtr bounds[3];
  int colons = 0;
  while (!IsOp("]")) {
    if (IsOp(":")) {
      if (++colons > 2) return Error("a slice has at most two ':'");
      ++pos_;
      continue;
    }
    PRL_ASSIGN_OR_RETURN(bounds[colons], Expression());
    if (!IsOp(":") && !IsOp("]"))
      return Error(absl::StrCat("expected ']', found '", Peek().text, "'"));
  }
  ++pos_;
  auto out = MakeExpr(colons == 0 ? Expr::Kind::kSubscript : Expr::Kind::kSlice, line);
  out->args.push_back(std::move(e));
  if (colons == 0) {
    if (!bounds[0]) return Error("empty subscript []");
    out->args.push_back(std::move(bounds[0]));
  } else {
    for (ExprPtr& b : bounds) out->args.push_back(std::move(b));
  }
  return out;
}

absl::StatusOr<ExprPtr> Parser::Postfix(ExprPtr e) {
  while (true) {
    const int line = Peek().line;
    if (IsOp(".")) {
      ++pos_;
      auto attr = MakeExpr(Expr::Kind::kAttribute, line);
      if (Peek().kind == K::kInteger) {
        attr->kind = Expr::Kind::kSubscript;  // x.0 is x[0]
        attr->args.push_back(std::move(e));
        auto index = MakeExpr(Expr::Kind::kLiteral, line);
        index->value =
            Value(static_cast<int64_t>(std::strtoll(t_[pos_++].text.c_str(), nullptr, 10)));
        attr->args.push_back(std::move(index));
      } else {
        PRL_ASSIGN_OR_RETURN(attr->name, ExpectName());
        attr->args.push_back(std::move(e));
      }
      e = std::move(attr);
    } else if (IsOp("[")) {
      PRL_ASSIGN_OR_RETURN(e, Subscript(std::move(e)));
    } else if (IsOp("(")) {
      ++pos_;
      auto call = MakeExpr(Expr::Kind::kCall, line);
      call->args.push_back(std::move(e));
      PRL_RETURN_IF_ERROR(CallArguments(call.get()));
      e = std::move(call);
    } else if (IsOp("|") || IsName("is")) {
      const bool filter = IsOp("|");
      ++pos_;
      auto f = MakeExpr(filter ? Expr::Kind::kFilter : Expr::Kind::kTest, line);
      if (!filter && IsName("not")) {
        ++pos_;
        f->negated = true;
      }
      PRL_ASSIGN_OR_RETURN(f->name, ExpectName());
      if (filter ? !HasFilter(f->name) : !HasTest(f->name)) {
        --pos_;
        return Error(absl::StrCat("unsupported ", filter ? "filter '" : "test '", f->name, "'"));
      }
      f->args.push_back(std::move(e));
      if (IsOp("(")) {
        ++pos_;
        PRL_RETURN_IF_ERROR(CallArguments(f.get()));
      } else if (!filter && (Peek().kind == K::kString || Peek().kind == K::kInteger ||
                             Peek().kind == K::kFloat)) {
        PRL_ASSIGN_OR_RETURN(ExprPtr arg, Primary());  // "x is divisibleby 3"
        f->args.push_back(std::move(arg));
      }
      e = std::move(f);
    } else {
      return e;
    }
  }
}

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens) { return Parser(tokens).Program(); }

}  // namespace prl::tokenizer::jinja
