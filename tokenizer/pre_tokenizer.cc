#include "tokenizer/pre_tokenizer.h"

#include <array>

#include "absl/strings/match.h"
#include "core/status_macros.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {

namespace {

constexpr absl::string_view kSupported = "Split, ByteLevel, Sequence, Metaspace";
constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteTables {
  std::array<char32_t, 256> to_unicode;
  ByteTables() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_unicode[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

char32_t ByteToUnicode(unsigned char byte) { return Tables().to_unicode[byte]; }

int UnicodeToByte(char32_t cp) {
  if (cp < 256) return Tables().to_unicode[cp] == cp ? static_cast<int>(cp) : -1;
  if (cp >= 256 + 68) return -1;  // 68 bytes are remapped
  for (int b = 0; b < 256; ++b) {
    if (Tables().to_unicode[b] == cp) return b;
  }
  return -1;
}

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& config,
                                                    const JsonPath& path) {
  PreTokenizer pre;
  if (!config.is_null()) PRL_RETURN_IF_ERROR(Append(config, path, &pre.steps_));
  for (const Step& step : pre.steps_) pre.byte_level_ |= step.kind == Step::Kind::kByteLevel;
  return pre;
}

absl::Status PreTokenizer::Append(const nlohmann::json& config, const JsonPath& path,
                                  std::vector<Step>* steps) {
  if (!config.is_object()) return TypeError(path, "a pre-tokenizer object", config);
  std::string type;
  PRL_RETURN_IF_ERROR(GetType(config, path, &type));
  if (type == "Sequence") {
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* list, GetArray(config, "pretokenizers", path));
    for (size_t i = 0; i < list->size(); ++i) {
      PRL_RETURN_IF_ERROR(Append((*list)[i], path.Key("pretokenizers").Index(i), steps));
    }
    return absl::OkStatus();
  }
  if (type == "Metaspace") return AppendMetaspace(config, path, steps);
  Step step;
  if (type == "Split") {
    step.kind = Step::Kind::kSplit;
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* pattern, GetObject(config, "pattern", path));
    PRL_ASSIGN_OR_RETURN(Regex regex, PatternFromJson(*pattern, path.Key("pattern")));
    step.pattern.push_back(std::move(regex));
    PRL_ASSIGN_OR_RETURN(const std::string behavior, GetString(config, "behavior", path));
    if (behavior != "Isolated" && behavior != "Removed") {
      return Unsupported(path.Key("behavior"), behavior, "Isolated, Removed");
    }
    step.removed = behavior == "Removed";
    PRL_ASSIGN_OR_RETURN(step.invert, GetBoolOr(config, "invert", path, false));
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    PRL_ASSIGN_OR_RETURN(step.add_prefix_space, GetBoolOr(config, "add_prefix_space", path, true));
    PRL_ASSIGN_OR_RETURN(const bool use_regex, GetBoolOr(config, "use_regex", path, true));
    if (use_regex) {
      PRL_ASSIGN_OR_RETURN(Regex regex, Regex::Compile(kGpt2Pattern, "GPT-2 pattern"));
      step.pattern.push_back(std::move(regex));
    }
  } else {
    return Unsupported(path.Key("type"), type, kSupported);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status PreTokenizer::AppendMetaspace(const nlohmann::json& config, const JsonPath& path,
                                           std::vector<Step>* steps) {
  Step step;
  step.kind = Step::Kind::kMetaspace;
  PRL_ASSIGN_OR_RETURN(step.replacement, GetString(config, "replacement", path));
  if (CountCodePoints(step.replacement) != 1) {
    return TypeError(path.Key("replacement"), "one character", config["replacement"]);
  }
  PRL_ASSIGN_OR_RETURN(step.split, GetBoolOr(config, "split", path, true));
  // Older files have add_prefix_space instead of prepend_scheme.
  PRL_ASSIGN_OR_RETURN(const bool add_prefix_space,
                       GetBoolOr(config, "add_prefix_space", path, true));
  PRL_ASSIGN_OR_RETURN(
      const std::string scheme,
      GetStringOr(config, "prepend_scheme", path, add_prefix_space ? "always" : "never"));
  if (scheme == "always") {
    step.prepend = Step::Prepend::kAlways;
  } else if (scheme == "first") {
    step.prepend = Step::Prepend::kFirst;
  } else if (scheme == "never") {
    step.prepend = Step::Prepend::kNever;
  } else {
    return Unsupported(path.Key("prepend_scheme"), scheme, "always, first, never");
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

void PreTokenizer::Apply(const Step& step, bool first_section, const std::string& word,
                         std::vector<std::string>* out) {
  switch (step.kind) {
    case Step::Kind::kSplit: {
      size_t last = 0;
      const bool keep_matches = !step.removed || step.invert;
      const bool keep_gaps = !step.removed || !step.invert;
      step.pattern[0].ForEachMatch(word, [&](size_t begin, size_t end) {
        if (begin > last && keep_gaps) out->push_back(word.substr(last, begin - last));
        if (end > begin && keep_matches) out->push_back(word.substr(begin, end - begin));
        last = end;
      });
      if (last < word.size() && keep_gaps) out->push_back(word.substr(last));
      return;
    }
    case Step::Kind::kByteLevel: {
      const bool prefix = step.add_prefix_space && (word.empty() || word[0] != ' ');
      std::string text = prefix ? " " + word : word;
      std::vector<std::string> pieces;
      if (step.pattern.empty()) {
        pieces.push_back(std::move(text));
      } else {
        step.pattern[0].ForEachMatch(text, [&](size_t begin, size_t end) {
          if (end > begin) pieces.push_back(text.substr(begin, end - begin));
        });
      }
      for (const std::string& piece : pieces) {
        std::string mapped;
        mapped.reserve(piece.size() * 2);
        for (unsigned char b : piece) AppendUtf8(ByteToUnicode(b), &mapped);
        out->push_back(std::move(mapped));
      }
      return;
    }
    case Step::Kind::kMetaspace: {
      std::string text;
      for (char c : word) {
        if (c == ' ') {
          text += step.replacement;
        } else {
          text += c;
        }
      }
      const bool prepend = step.prepend == Step::Prepend::kAlways ||
                           (step.prepend == Step::Prepend::kFirst && first_section);
      if (prepend && !absl::StartsWith(text, step.replacement)) {
        text.insert(0, step.replacement);
      }
      if (!step.split) {
        out->push_back(std::move(text));
        return;
      }
      // Split before every replacement character (it stays with the word that follows).
      size_t start = 0;
      for (size_t pos = text.find(step.replacement, 1); pos != std::string::npos;
           pos = text.find(step.replacement, pos + 1)) {
        out->push_back(text.substr(start, pos - start));
        start = pos;
      }
      if (start < text.size()) out->push_back(text.substr(start));
      return;
    }
  }
}

void PreTokenizer::PreTokenize(absl::string_view text, bool first_section,
                               std::vector<std::string>* words) const {
  std::vector<std::string> current{std::string(text)};
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string& word : current) Apply(step, first_section, word, &next);
    current.swap(next);
  }
  for (std::string& word : current) {
    if (!word.empty()) words->push_back(std::move(word));
  }
}

}  // namespace prl::tokenizer
