#include "tokenizer/chat_template/lexer.h"

#include "absl/strings/str_cat.h"

namespace prl::tokenizer::jinja {

namespace {

// The source after trim_blocks / lstrip_blocks, with the source line of every character.
struct Source {
  std::string text;
  std::vector<int> line;
};

bool IsBlockOpen(absl::string_view s, size_t i) {
  return i + 1 < s.size() && s[i] == '{' && (s[i + 1] == '%' || s[i + 1] == '#' || s[i + 1] == '-');
}

Source Preprocess(absl::string_view raw) {
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  Source src;
  int line = 1;
  size_t line_start = 0;  // index in src.text where the current source line starts
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    // lstrip_blocks: drop the spaces / tabs between a line start and a block or comment tag.
    if (IsBlockOpen(raw, i)) {
      bool blank = true;
      for (size_t j = line_start; j < src.text.size() && blank; ++j) {
        blank = src.text[j] == ' ' || src.text[j] == '\t';
      }
      if (blank) {
        src.text.resize(line_start);
        src.line.resize(line_start);
      }
    }
    src.text.push_back(c);
    src.line.push_back(line);
    if (c == '\n') {
      ++line;
      line_start = src.text.size();
    }
    // trim_blocks: drop the newline after %} or #} (and -}).
    if (c == '}' && i > 0 && (raw[i - 1] == '%' || raw[i - 1] == '#' || raw[i - 1] == '-') &&
        i + 1 < raw.size() && raw[i + 1] == '\n') {
      ++i;
      ++line;
      line_start = src.text.size();
    }
  }
  return src;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsWordChar(char c) {
  return IsDigit(c) || c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

class Lexer {
 public:
  explicit Lexer(Source src) : src_(std::move(src)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    const std::string& s = src_.text;
    while (pos_ < s.size()) {
      if (!inside_) {
        const size_t start = pos_;
        while (pos_ < s.size() &&
               !(s[pos_] == '{' && pos_ + 1 < s.size() &&
                 (s[pos_ + 1] == '%' || s[pos_ + 1] == '{' || s[pos_ + 1] == '#'))) {
          ++pos_;
        }
        if (pos_ > start) Push(Token::Kind::kText, s.substr(start, pos_ - start), start);
        if (pos_ >= s.size()) break;
        if (At("{#")) {
          if (auto status = Comment(); !status.ok()) return status;
          continue;
        }
        const bool strip = pos_ + 2 < s.size() && s[pos_ + 2] == '-';
        if (strip) StripTrailingWhitespace();
        const bool statement = At("{%");
        Push(statement ? Token::Kind::kOpenStatement : Token::Kind::kOpenExpression,
             statement ? "{%" : "{{", pos_);
        pos_ += strip ? 3 : 2;
        inside_ = true;
        braces_ = 0;
        continue;
      }
      if (auto status = Step(); !status.ok()) return status;
    }
    if (inside_) return Error("a tag is never closed (expected %} or }})");
    tokens_.push_back({Token::Kind::kEnd, "", src_.line.empty() ? 1 : src_.line.back()});
    return tokens_;
  }

 private:
  int LineAt(size_t at) const {
    return src_.line.empty() ? 1 : src_.line[std::min(at, src_.line.size() - 1)];
  }
  void Push(Token::Kind kind, std::string text, size_t at) {
    tokens_.push_back({kind, std::move(text), LineAt(at)});
  }
  // "{%-" / "{{-": the text before loses its trailing whitespace (not across a comment).
  void StripTrailingWhitespace() {
    if (tokens_.size() <= barrier_ || tokens_.back().kind != Token::Kind::kText) return;
    std::string& text = tokens_.back().text;
    while (!text.empty() && IsSpace(text.back())) text.pop_back();
    if (text.empty()) tokens_.pop_back();
  }
  void SkipWhitespace() {
    while (pos_ < src_.text.size() && IsSpace(src_.text[pos_])) ++pos_;
  }
  bool At(absl::string_view what) const {
    return absl::string_view(src_.text).substr(pos_, what.size()) == what;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", LineAt(pos_), ": ", what));
  }
  absl::Status Comment();
  absl::Status Step();
  absl::Status StringLiteral(char quote);
  void Number();

  Source src_;
  size_t pos_ = 0;
  bool inside_ = false;  // between {% / {{ and their closing tag
  int braces_ = 0;       // open { inside an expression (so that }} may close dict literals)
  size_t barrier_ = 0;   // tokens_ before a comment: "-" does not strip across it
  std::vector<Token> tokens_;
};

absl::Status Lexer::Comment() {
  const size_t start = pos_;
  pos_ += 2;
  const bool strip_before = At("-");
  const size_t end = src_.text.find("#}", pos_);
  if (end == std::string::npos) {
    pos_ = start;
    return Error("a comment {# is never closed with #}");
  }
  const bool strip_after = end > pos_ && src_.text[end - 1] == '-';
  if (strip_before) StripTrailingWhitespace();
  pos_ = end + 2;
  if (strip_after) SkipWhitespace();
  barrier_ = tokens_.size();
  return absl::OkStatus();
}

absl::Status Lexer::StringLiteral(char quote) {
  const size_t start = pos_++;
  std::string value;
  const std::string& s = src_.text;
  while (pos_ < s.size() && s[pos_] != quote) {
    if (s[pos_] != '\\') {
      value.push_back(s[pos_++]);
      continue;
    }
    if (++pos_ >= s.size()) break;
    const char e = s[pos_++];
    switch (e) {
      case 'n':
        value += '\n';
        break;
      case 't':
        value += '\t';
        break;
      case 'r':
        value += '\r';
        break;
      case 'b':
        value += '\b';
        break;
      case 'f':
        value += '\f';
        break;
      case 'v':
        value += '\v';
        break;
      case '\'':
      case '"':
      case '\\':
        value += e;
        break;
      default:
        return Error(absl::StrCat("unsupported escape \\", std::string(1, e), " in a string"));
    }
  }
  if (pos_ >= s.size()) {
    pos_ = start;
    return Error("a string literal is never closed");
  }
  ++pos_;
  Push(Token::Kind::kString, std::move(value), start);
  return absl::OkStatus();
}

void Lexer::Number() {
  const size_t start = pos_;
  const std::string& s = src_.text;
  while (pos_ < s.size() && IsDigit(s[pos_])) ++pos_;
  // "1.5" is a float, but "x.0" (an attribute) and "1." are not.
  const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator &&
                         tokens_.back().text == ".";
  if (!after_dot && pos_ + 1 < s.size() && s[pos_] == '.' && IsDigit(s[pos_ + 1])) {
    ++pos_;
    while (pos_ < s.size() && IsDigit(s[pos_])) ++pos_;
    Push(Token::Kind::kFloat, s.substr(start, pos_ - start), start);
    return;
  }
  Push(Token::Kind::kInteger, s.substr(start, pos_ - start), start);
}

absl::Status Lexer::Step() {
  SkipWhitespace();
  if (pos_ >= src_.text.size()) return absl::OkStatus();
  for (const auto& [close, kind] : {std::pair{"%}", Token::Kind::kCloseStatement},
                                    std::pair{"}}", Token::Kind::kCloseExpression}}) {
    const bool strip = At(std::string("-") + close);
    if (!strip && !At(close)) continue;
    if (kind == Token::Kind::kCloseExpression && braces_ > 0) break;
    Push(kind, close, pos_);
    pos_ += strip ? 3 : 2;
    inside_ = false;
    if (strip) SkipWhitespace();
    return absl::OkStatus();
  }
  const char c = src_.text[pos_];
  if (c == '\'' || c == '"') return StringLiteral(c);
  if (IsDigit(c)) {
    Number();
    return absl::OkStatus();
  }
  if (IsWordChar(c)) {
    const size_t start = pos_;
    while (pos_ < src_.text.size() && IsWordChar(src_.text[pos_])) ++pos_;
    Push(Token::Kind::kName, src_.text.substr(start, pos_ - start), start);
    return absl::OkStatus();
  }
  for (const char* op : {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",",
                         ".",  ":",  "|",  "<",  ">",  "+",  "-", "~", "*", "/", "%", "="}) {
    if (!At(op)) continue;
    if (op[0] == '{' && op[1] == 0) ++braces_;
    if (op[0] == '}' && op[1] == 0) --braces_;
    Push(Token::Kind::kOperator, op, pos_);
    pos_ += std::char_traits<char>::length(op);
    return absl::OkStatus();
  }
  return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
}

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(absl::string_view source) {
  return Lexer(Preprocess(source)).Run();
}

}  // namespace prl::tokenizer::jinja
