#include "tokenizer/added_tokens.h"

#include "tokenizer/unicode.h"

namespace prl::tokenizer {

namespace {

// The code point that ends at text[end) (end > 0).
char32_t CodePointBefore(absl::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  char32_t cp;
  DecodeUtf8(text, start, &cp);
  return cp;
}

size_t SkipWhitespaceLeft(absl::string_view text, size_t pos, size_t limit) {
  while (pos > limit) {
    size_t start = pos - 1;
    while (start > limit && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    char32_t cp;
    DecodeUtf8(text, start, &cp);
    if (!IsUnicodeWhitespace(cp)) break;
    pos = start;
  }
  return pos;
}

size_t SkipWhitespaceRight(absl::string_view text, size_t pos) {
  char32_t cp;
  while (pos < text.size()) {
    const int len = DecodeUtf8(text, pos, &cp);
    if (!IsUnicodeWhitespace(cp)) break;
    pos += len;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  trie_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    int node = 0;
    for (unsigned char c : content) {
      auto it = trie_[node].children.find(c);
      if (it == trie_[node].children.end()) {
        trie_.emplace_back();
        it = trie_[node].children.emplace(c, static_cast<int>(trie_.size()) - 1).first;
      }
      node = it->second;
    }
    trie_[node].token = static_cast<int>(t);
  }
}

int AddedTokenMatcher::LongestMatch(absl::string_view text, size_t pos) const {
  int best = -1;
  int node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = trie_[node].children.find(static_cast<unsigned char>(text[i]));
    if (it == trie_[node].children.end()) break;
    node = it->second;
    const int t = trie_[node].token;
    if (t < 0) continue;
    if (tokens_[t].single_word) {
      char32_t after = 0;
      if (i + 1 < text.size()) DecodeUtf8(text, i + 1, &after);
      const bool word_before = pos > 0 && IsWordCharacter(CodePointBefore(text, pos));
      const bool word_after = i + 1 < text.size() && IsWordCharacter(after);
      if (word_before || word_after) continue;
    }
    best = t;
  }
  return best;
}

std::vector<Segment> AddedTokenMatcher::Split(absl::string_view text) const {
  std::vector<Segment> segments;
  size_t text_start = 0;  // start of the pending text segment
  for (size_t pos = 0; pos < text.size();) {
    const int t = first_byte_[static_cast<unsigned char>(text[pos])] ? LongestMatch(text, pos) : -1;
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[t];
    const size_t begin = token.lstrip ? SkipWhitespaceLeft(text, pos, text_start) : pos;
    size_t end = pos + token.content.size();
    if (begin > text_start) segments.push_back({text_start, begin, -1});
    if (token.rstrip) end = SkipWhitespaceRight(text, end);
    segments.push_back({begin, end, token.id});
    pos = text_start = end;
  }
  if (text_start < text.size()) segments.push_back({text_start, text.size(), -1});
  return segments;
}

}  // namespace prl::tokenizer
