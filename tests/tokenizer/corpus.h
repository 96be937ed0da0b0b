// Texts that the tokenizer tests encode with prl and with the JavaScript reference: many
// scripts, emoji sequences, combining marks and NFC/NFD pairs, code, digit and whitespace runs,
// text that looks like special tokens, empty strings. Deliberately absent: U+0085 and U+FEFF
// (JavaScript's \s disagrees with Unicode White_Space, which Hugging Face's Rust regex and
// PCRE2 follow) and U+017F / U+212A (case-folding in (?i:'s) that JavaScript's rewrite lacks).
#pragma once

#include <string>
#include <vector>

namespace prl::tokenizer::testing {

std::vector<std::string> Corpus();

}  // namespace prl::tokenizer::testing
