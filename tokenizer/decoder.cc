#include "tokenizer/decoder.h"

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {

namespace {

constexpr absl::string_view kSupported =
    "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence";

// The byte of a "<0xXX>" token, or -1.
int FallbackByte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

std::string ByteLevelToBytes(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    // A token with a character outside GPT-2's alphabet is taken as it is (as tokenizers does).
    std::string mapped;
    bool all_mapped = true;
    char32_t cp;
    for (size_t pos = 0; pos < token.size() && all_mapped;) {
      pos += DecodeUtf8(token, pos, &cp);
      const int b = UnicodeToByte(cp);
      all_mapped = b >= 0;
      mapped.push_back(static_cast<char>(b));
    }
    bytes += all_mapped ? mapped : token;
  }
  return bytes;
}

void StripToken(const std::string& content, int start, int stop, std::string* token) {
  for (int i = 0; i < start && absl::StartsWith(*token, content); ++i) {
    token->erase(0, content.size());
  }
  for (int i = 0; i < stop && absl::EndsWith(*token, content); ++i) {
    token->resize(token->size() - content.size());
  }
}

}  // namespace

absl::StatusOr<Decoder> Decoder::FromJson(const nlohmann::json& config, const JsonPath& path) {
  Decoder decoder;
  if (config.is_null()) {
    decoder.join_with_spaces_ = true;
  } else {
    PRL_RETURN_IF_ERROR(Append(config, path, &decoder.steps_));
  }
  return decoder;
}

absl::Status Decoder::Append(const nlohmann::json& config, const JsonPath& path,
                             std::vector<Step>* steps) {
  if (!config.is_object()) return TypeError(path, "a decoder object", config);
  std::string type;
  PRL_RETURN_IF_ERROR(GetType(config, path, &type));
  Step step;
  if (type == "Sequence") {
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* list, GetArray(config, "decoders", path));
    for (size_t i = 0; i < list->size(); ++i) {
      PRL_RETURN_IF_ERROR(Append((*list)[i], path.Key("decoders").Index(i), steps));
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    PRL_ASSIGN_OR_RETURN(const nlohmann::json* pattern, GetObject(config, "pattern", path));
    PRL_ASSIGN_OR_RETURN(Regex regex, PatternFromJson(*pattern, path.Key("pattern")));
    step.pattern.push_back(std::move(regex));
    PRL_ASSIGN_OR_RETURN(step.content, GetString(config, "content", path));
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Step::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    PRL_ASSIGN_OR_RETURN(step.content, GetString(config, "content", path));
    PRL_ASSIGN_OR_RETURN(const int64_t start, GetIntOr(config, "start", path, 0));
    PRL_ASSIGN_OR_RETURN(const int64_t stop, GetIntOr(config, "stop", path, 0));
    step.start = static_cast<int>(start);
    step.stop = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    PRL_ASSIGN_OR_RETURN(step.content, GetString(config, "replacement", path));
    PRL_ASSIGN_OR_RETURN(const bool add_prefix_space,
                         GetBoolOr(config, "add_prefix_space", path, true));
    PRL_ASSIGN_OR_RETURN(
        const std::string scheme,
        GetStringOr(config, "prepend_scheme", path, add_prefix_space ? "always" : "never"));
    step.strip_first_space = scheme != "never";
  } else {
    return Unsupported(path.Key("type"), type, kSupported);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

void Decoder::Apply(const Step& step, std::vector<std::string>* tokens) {
  switch (step.kind) {
    case Step::Kind::kByteLevel:
      *tokens = {Utf8Lossy(ByteLevelToBytes(*tokens))};
      return;
    case Step::Kind::kReplace:
      for (std::string& token : *tokens) token = step.pattern[0].ReplaceAll(token, step.content);
      return;
    case Step::Kind::kByteFallback: {
      std::vector<std::string> out;
      std::string bytes;
      const auto flush = [&] {
        if (bytes.empty()) return;
        if (FindInvalidUtf8(bytes) == absl::string_view::npos) {
          out.push_back(bytes);
        } else {
          for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
        }
        bytes.clear();
      };
      for (std::string& token : *tokens) {
        const int b = FallbackByte(token);
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
        } else {
          flush();
          out.push_back(std::move(token));
        }
      }
      flush();
      tokens->swap(out);
      return;
    }
    case Step::Kind::kFuse:
      *tokens = {absl::StrJoin(*tokens, "")};
      return;
    case Step::Kind::kStrip:
      for (std::string& token : *tokens) StripToken(step.content, step.start, step.stop, &token);
      return;
    case Step::Kind::kMetaspace:
      for (size_t i = 0; i < tokens->size(); ++i) {
        std::string text;
        const std::string& token = (*tokens)[i];
        for (size_t pos = 0; pos < token.size();) {
          if (token.compare(pos, step.content.size(), step.content) == 0) {
            text += ' ';
            pos += step.content.size();
          } else {
            text += token[pos++];
          }
        }
        if (i == 0 && step.strip_first_space && !text.empty() && text[0] == ' ') text.erase(0, 1);
        (*tokens)[i] = std::move(text);
      }
      return;
  }
}

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  if (join_with_spaces_) return absl::StrJoin(tokens, " ");
  for (const Step& step : steps_) Apply(step, &tokens);
  return absl::StrJoin(tokens, "");
}

}  // namespace prl::tokenizer
