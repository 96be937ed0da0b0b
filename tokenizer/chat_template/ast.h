// The syntax tree of a chat template: expressions and statements, each with its source line
// for errors. Built by the parser, walked by the interpreter; immutable once built.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat_template/value.h"

namespace prl::tokenizer::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // args
    kTuple,      // args
    kDict,       // args: key, value, key, value, ...
    kUnary,      // name: "not", "-", "+"; args[0]
    kBinary,     // name: the operator ("+", "==", "in", "and", ...); args[0], args[1]
    kTernary,    // args: value, condition, else-value (may be null)
    kAttribute,  // args[0].name
    kSubscript,  // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (each bound may be null)
    kCall,       // args[0](args[1:], kwargs)
    kFilter,     // args[0] | name(args[1:], kwargs)
    kTest,       // args[0] is [not] name(args[1:])
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kMacro, kBreak, kContinue };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;  // kText
  ExprPtr expr;      // kOutput; kFor: the iterable; kSet: the value (or null)
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: condition and body, in order
  Body body;                         // kFor / kMacro / kSet (block set); kIf: the else body
  Body else_body;                    // kFor: run when the iterable is empty
  ExprPtr condition;                 // kFor: "for x in xs if condition"
  std::vector<std::string> targets;  // kFor: loop variables; kSet: name (and attribute)
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name and default (or null)
  std::string name;                                     // kMacro
};

}  // namespace prl::tokenizer::jinja
