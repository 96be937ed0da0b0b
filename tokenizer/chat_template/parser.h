// The chat-template parser: tokens -> statements. Supports text, {{ expressions }}, if / elif /
// else, for (several targets, an "if" filter, else, loop.*), set (name, ns.attribute, block
// set), macro, break, continue, and the expression grammar of Jinja2 (ternaries, and / or /
// not, comparisons, in, is tests, filters, ~, arithmetic, literals, attributes, subscripts,
// slices, calls). Anything else, and a filter or test the interpreter does not have, is an
// error naming the construct and its line.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/chat_template/ast.h"
#include "tokenizer/chat_template/lexer.h"

namespace prl::tokenizer::jinja {

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace prl::tokenizer::jinja
