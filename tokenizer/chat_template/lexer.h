// The chat-template lexer: template source -> tokens, each with its 1-based source line.
//
// Whitespace handling is that of transformers' Jinja environment (and @huggingface/jinja):
// trim_blocks (the newline after a block or comment tag is dropped), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line are dropped), one trailing newline
// of the template dropped, and "-" on a tag strips the whitespace on that side.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prl::tokenizer::jinja {

struct Token {
  enum class Kind {
    kText,             // literal output
    kOpenStatement,    // {%
    kCloseStatement,   // %}
    kOpenExpression,   // {{
    kCloseExpression,  // }}
    kName,             // identifier or keyword
    kString,           // string literal (escapes resolved)
    kInteger,
    kFloat,
    kOperator,  // ( ) [ ] { } , . : | = == != < <= > >= + - ~ * / // % **
    kEnd,
  };
  Kind kind;
  std::string text;
  int line = 1;
};

// The tokens of `source`, ending with kEnd. A character that cannot start a token is an
// InvalidArgument error naming it and its line.
absl::StatusOr<std::vector<Token>> Lex(absl::string_view source);

}  // namespace prl::tokenizer::jinja
