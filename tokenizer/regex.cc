#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace prl::tokenizer {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// One JIT stack per thread, large enough for long runs of a repeated class (the default 32 KiB
// stack overflows on megabyte-long whitespace runs).
struct ThreadJit {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadJit() {
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 << 10, 8 << 20, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadJit() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
};

pcre2_match_context* ThreadContext() {
  thread_local ThreadJit jit;
  return jit.context;
}

}  // namespace

absl::StatusOr<Regex> Regex::Compile(absl::string_view pattern, absl::string_view where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(where, ": invalid regular expression at offset ",
                                                   offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  auto compiled = std::make_shared<Code>();
  compiled->code = code;
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(compiled));
}

absl::StatusOr<Regex> Regex::Literal(absl::string_view literal, absl::string_view where) {
  std::string quoted = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    // \E inside \Q...\E ends the quote: split it as "\E\\E\Q".
    if (literal.substr(i, 2) == "\\E") {
      quoted += "\\E\\\\E\\Q";
      ++i;
    } else {
      quoted += literal[i];
    }
  }
  quoted += "\\E";
  return Compile(quoted, where);
}

void Regex::ForEachMatch(absl::string_view text,
                         absl::FunctionRef<void(size_t begin, size_t end)> fn) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  pcre2_match_context* context = ThreadContext();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = code_->jit
                       ? pcre2_jit_match(code_->code, subject, text.size(), start, 0, data, context)
                       : pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                     data, context);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    fn(begin, end);
    if (end > begin) {
      start = end;
    } else {
      if (end >= text.size()) break;
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  pcre2_match_data_free(data);
}

std::string Regex::ReplaceAll(absl::string_view text, absl::string_view replacement) const {
  std::string out;
  size_t last = 0;
  ForEachMatch(text, [&](size_t begin, size_t end) {
    out.append(text.data() + last, begin - last);
    out.append(replacement.data(), replacement.size());
    last = end;
  });
  out.append(text.data() + last, text.size() - last);
  return out;
}

absl::StatusOr<Regex> PatternFromJson(const nlohmann::json& pattern, const JsonPath& path) {
  if (pattern.is_object() && pattern.size() == 1) {
    if (auto it = pattern.find("String"); it != pattern.end() && it->is_string()) {
      return Regex::Literal(it->get<std::string>(), path.Key("String").ToString());
    }
    if (auto it = pattern.find("Regex"); it != pattern.end() && it->is_string()) {
      return Regex::Compile(it->get<std::string>(), path.Key("Regex").ToString());
    }
  }
  return TypeError(path, "{\"String\": ...} or {\"Regex\": ...}", pattern);
}

}  // namespace prl::tokenizer
