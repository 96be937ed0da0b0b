#include "tokenizer/normalizer.h"

#include "core/status_macros.h"

namespace prl::tokenizer {

namespace {

constexpr absl::string_view kSupported = "NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence";

// `text` without leading / trailing Unicode whitespace.
std::string Strip(absl::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  char32_t cp;
  while (left && begin < end) {
    const int len = DecodeUtf8(text, begin, &cp);
    if (!IsUnicodeWhitespace(cp)) break;
    begin += len;
  }
  while (right && end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    DecodeUtf8(text, start, &cp);
    if (!IsUnicodeWhitespace(cp)) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::FromJson(const nlohmann::json& config,
                                                const JsonPath& path) {
  Normalizer normalizer;
  if (!config.is_null()) PRL_RETURN_IF_ERROR(Append(config, path, &normalizer.steps_));
  return normalizer;
}

absl::Status Normalizer::Append(const nlohmann::json& config, const JsonPath& path,
                                std::vector<Step>* steps) {
  if (!config.is_object()) return TypeError(path, "a normalizer object", config);
  std::string type;
  PRL_RETURN_IF_ERROR(GetType(config, path, &type));
  Step step;
  if (type == "Sequence") {
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* list, GetArray(config, "normalizers", path));
    for (size_t i = 0; i < list->size(); ++i) {
      PRL_RETURN_IF_ERROR(Append((*list)[i], path.Key("normalizers").Index(i), steps));
    }
    return absl::OkStatus();
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Step::Kind::kUnicode;
    step.form = type == "NFC"    ? NormalForm::kNFC
                : type == "NFD"  ? NormalForm::kNFD
                : type == "NFKC" ? NormalForm::kNFKC
                                 : NormalForm::kNFKD;
  } else if (type == "Prepend") {
    step.kind = Step::Kind::kPrepend;
    PRL_ASSIGN_OR_RETURN(step.content, GetString(config, "prepend", path));
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* pattern, GetObject(config, "pattern", path));
    PRL_ASSIGN_OR_RETURN(Regex regex, PatternFromJson(*pattern, path.Key("pattern")));
    step.pattern.push_back(std::move(regex));
    PRL_ASSIGN_OR_RETURN(step.content, GetString(config, "content", path));
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    PRL_ASSIGN_OR_RETURN(step.strip_left, GetBoolOr(config, "strip_left", path, true));
    PRL_ASSIGN_OR_RETURN(step.strip_right, GetBoolOr(config, "strip_right", path, true));
  } else {
    return Unsupported(path.Key("type"), type, kSupported);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Normalizer::Normalize(absl::string_view text) const {
  std::string out(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kUnicode: {
        PRL_ASSIGN_OR_RETURN(out, NormalizeUnicode(out, step.form));
        break;
      }
      case Step::Kind::kPrepend:
        // As in Hugging Face tokenizers: nothing is prepended to empty text.
        if (!out.empty()) out.insert(0, step.content);
        break;
      case Step::Kind::kReplace:
        out = step.pattern[0].ReplaceAll(out, step.content);
        break;
      case Step::Kind::kStrip:
        out = Strip(out, step.strip_left, step.strip_right);
        break;
    }
  }
  return out;
}

}  // namespace prl::tokenizer
