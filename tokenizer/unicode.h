// UTF-8 and Unicode helpers shared by the tokenizer's components: code point iteration,
// lossy decoding of byte strings, Unicode normalisation forms (utf8proc) and the whitespace
// and word-character classes that added tokens and chat-template filters use.
//
// Every function is pure and thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prl::tokenizer {

// Decodes the code point starting at text[pos] into *cp and returns its length in bytes
// (1..4). An invalid or truncated sequence yields U+FFFD and length 1.
int DecodeUtf8(absl::string_view text, size_t pos, char32_t* cp);

// Appends the UTF-8 encoding of `cp` (which must be a Unicode scalar value).
void AppendUtf8(char32_t cp, std::string* out);

// The byte offset of the first invalid UTF-8 sequence in `text`, or npos if it is valid.
size_t FindInvalidUtf8(absl::string_view text);

// `bytes` as valid UTF-8: each maximal invalid subpart becomes U+FFFD (the WHATWG rule, also
// Python's errors="replace").
std::string Utf8Lossy(absl::string_view bytes);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

// `text` (valid UTF-8) in normalisation form `form`. ASCII text is returned unchanged without
// calling into utf8proc.
absl::StatusOr<std::string> NormalizeUnicode(absl::string_view text, NormalForm form);

// Unicode White_Space (Rust's char::is_whitespace; Python's str.isspace agrees on all but
// U+001C..U+001F, which it also counts).
bool IsUnicodeWhitespace(char32_t cp);

// Python's str.isspace(): White_Space plus U+001C..U+001F (the separators Python counts).
bool IsPythonWhitespace(char32_t cp);

// A letter, digit or other number (general categories L* and N*), or '_'.
bool IsWordCharacter(char32_t cp);

// The number of code points in valid UTF-8 `text`.
size_t CountCodePoints(absl::string_view text);

}  // namespace prl::tokenizer
