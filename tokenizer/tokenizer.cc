#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/status_macros.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {

namespace {

// The parsed JSON file at `path`; null when it does not exist and is optional.
absl::StatusOr<nlohmann::json> ReadJson(const std::string& path, bool required) {
  std::ifstream in(path);
  if (!in) {
    if (!required) return nlohmann::json();
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
}

// A token field of tokenizer_config.json: a string, {"content": ...} or null ("").
absl::StatusOr<std::string> ConfigToken(const nlohmann::json& config, const char* key) {
  const JsonPath path("tokenizer_config.json");
  if (!config.contains(key) || config[key].is_null()) return std::string();
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) return GetString(v, "content", path.Key(key));
  return TypeError(path.Key(key), "a token string or {\"content\": ...}", v);
}

}  // namespace

std::string CleanUpTokenizationSpaces(absl::string_view text) {
  std::string out(text);
  for (const auto& [from, to] :
       std::initializer_list<std::pair<const char*, const char*>>{{" .", "."},
                                                                  {" ?", "?"},
                                                                  {" !", "!"},
                                                                  {" ,", ","},
                                                                  {" ' ", "'"},
                                                                  {" n't", "n't"},
                                                                  {" 'm", "'m"},
                                                                  {" 's", "'s"},
                                                                  {" 've", "'ve"},
                                                                  {" 're", "'re"}}) {
    absl::StrReplaceAll({{from, to}}, &out);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  PRL_ASSIGN_OR_RETURN(const nlohmann::json tokenizer_json,
                       ReadJson(model_dir + "/tokenizer.json", true));
  PRL_ASSIGN_OR_RETURN(const nlohmann::json config,
                       ReadJson(model_dir + "/tokenizer_config.json", false));
  PRL_ASSIGN_OR_RETURN(const nlohmann::json generation,
                       ReadJson(model_dir + "/generation_config.json", false));
  return FromJson(tokenizer_json, config, generation);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    const nlohmann::json& tokenizer_json, const nlohmann::json& config,
    const nlohmann::json& generation_config) {
  const JsonPath root("tokenizer.json");
  if (!tokenizer_json.is_object()) return TypeError(root, "an object", tokenizer_json);
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  PRL_ASSIGN_OR_RETURN(const nlohmann::json* model, GetObject(tokenizer_json, "model", root));
  PRL_ASSIGN_OR_RETURN(t->model_, BpeModel::FromJson(*model, root.Key("model")));
  const auto field = [&](const char* key) {
    return tokenizer_json.contains(key) ? tokenizer_json[key] : nlohmann::json();
  };
  PRL_ASSIGN_OR_RETURN(t->normalizer_,
                       Normalizer::FromJson(field("normalizer"), root.Key("normalizer")));
  PRL_ASSIGN_OR_RETURN(t->pre_tokenizer_,
                       PreTokenizer::FromJson(field("pre_tokenizer"), root.Key("pre_tokenizer")));
  PRL_ASSIGN_OR_RETURN(t->decoder_, Decoder::FromJson(field("decoder"), root.Key("decoder")));
  PRL_ASSIGN_OR_RETURN(t->frame_,
                       PostProcessorFromJson(field("post_processor"), root.Key("post_processor")));
  PRL_RETURN_IF_ERROR(t->LoadAddedTokens(tokenizer_json));
  PRL_RETURN_IF_ERROR(t->LoadConfig(config.is_null() ? nlohmann::json::object() : config));
  PRL_RETURN_IF_ERROR(t->LoadGenerationConfig(generation_config));
  return t;
}

absl::Status Tokenizer::LoadAddedTokens(const nlohmann::json& tokenizer_json) {
  const JsonPath path = JsonPath("tokenizer.json").Key("added_tokens");
  vocab_size_ = model_->vocab_size();
  if (!tokenizer_json.contains("added_tokens")) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const nlohmann::json* list,
                       GetArray(tokenizer_json, "added_tokens", JsonPath("tokenizer.json")));
  std::vector<AddedToken> raw, normalized;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& j = (*list)[i];
    const JsonPath where = path.Index(i);
    AddedToken token;
    PRL_ASSIGN_OR_RETURN(const int64_t id, GetIntOr(j, "id", where, -1));
    if (id < 0 || id > (1 << 30))
      return TypeError(where.Key("id"), "a token id", j.value("id", nlohmann::json()));
    token.id = static_cast<int32_t>(id);
    PRL_ASSIGN_OR_RETURN(token.content, GetString(j, "content", where));
    if (token.content.empty())
      return TypeError(where.Key("content"), "a non-empty string", j["content"]);
    PRL_ASSIGN_OR_RETURN(token.special, GetBoolOr(j, "special", where, false));
    PRL_ASSIGN_OR_RETURN(token.lstrip, GetBoolOr(j, "lstrip", where, false));
    PRL_ASSIGN_OR_RETURN(token.rstrip, GetBoolOr(j, "rstrip", where, false));
    PRL_ASSIGN_OR_RETURN(token.single_word, GetBoolOr(j, "single_word", where, false));
    PRL_ASSIGN_OR_RETURN(token.normalized, GetBoolOr(j, "normalized", where, !token.special));
    vocab_size_ = std::max(vocab_size_, token.id + 1);
    added_by_content_[token.content] = token.id;
    if (token.special) special_ids_.insert(token.id);
    if (token.normalized && !normalizer_.empty()) {
      AddedToken matched = token;
      PRL_ASSIGN_OR_RETURN(matched.content, normalizer_.Normalize(token.content));
      normalized.push_back(std::move(matched));
    } else {
      raw.push_back(token);
    }
    added_by_id_[token.id] = std::move(token);
  }
  raw_added_ = AddedTokenMatcher(std::move(raw));
  normalized_added_ = AddedTokenMatcher(std::move(normalized));
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadConfig(const nlohmann::json& config) {
  const JsonPath path("tokenizer_config.json");
  PRL_ASSIGN_OR_RETURN(bos_token_, ConfigToken(config, "bos_token"));
  PRL_ASSIGN_OR_RETURN(eos_token_, ConfigToken(config, "eos_token"));
  bos_id_ = bos_token_.empty() ? -1 : TokenToId(bos_token_);
  eos_id_ = eos_token_.empty() ? -1 : TokenToId(eos_token_);
  for (const char* key : {"bos_token", "eos_token"}) {
    const std::string& token = key[0] == 'b' ? bos_token_ : eos_token_;
    if (!token.empty() && TokenToId(token) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path.Key(key).ToString(), ": \"", token,
                                                     "\" is not a token of tokenizer.json"));
    }
  }
  if (config.contains("add_bos_token") && !config["add_bos_token"].is_null()) {
    PRL_ASSIGN_OR_RETURN(const bool add, GetBoolOr(config, "add_bos_token", path, false));
    if (add && bos_id_ < 0) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: add_bos_token is true but bos_token is not set");
    }
    frame_.prefix = add ? std::vector<int32_t>{bos_id_} : std::vector<int32_t>{};
  }
  if (config.contains("add_eos_token") && !config["add_eos_token"].is_null()) {
    PRL_ASSIGN_OR_RETURN(const bool add, GetBoolOr(config, "add_eos_token", path, false));
    if (add && eos_id_ < 0) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: add_eos_token is true but eos_token is not set");
    }
    frame_.suffix = add ? std::vector<int32_t>{eos_id_} : std::vector<int32_t>{};
  }
  PRL_ASSIGN_OR_RETURN(clean_up_tokenization_spaces_,
                       GetBoolOr(config, "clean_up_tokenization_spaces", path, true));
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    for (const nlohmann::json& token : config["additional_special_tokens"]) {
      const int32_t id = token.is_string() ? TokenToId(token.get<std::string>()) : -1;
      if (id >= 0) special_ids_.insert(id);
    }
  }
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const nlohmann::json& ct = config["chat_template"];
    if (ct.is_string()) {
      chat_template_ = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const nlohmann::json& named : ct) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          chat_template_ = named["template"].get<std::string>();
        }
      }
      if (!chat_template_) {
        return TypeError(path.Key("chat_template"), "a list with a \"default\" template", ct);
      }
    } else {
      return TypeError(path.Key("chat_template"), "a template string", ct);
    }
  }
  if (eos_id_ >= 0) stop_ids_ = {eos_id_};
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadGenerationConfig(const nlohmann::json& generation_config) {
  const JsonPath path = JsonPath("generation_config.json").Key("eos_token_id");
  if (!generation_config.is_object() || !generation_config.contains("eos_token_id") ||
      generation_config["eos_token_id"].is_null()) {
    return absl::OkStatus();
  }
  const nlohmann::json& eos = generation_config["eos_token_id"];
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size_) {
      return TypeError(path, absl::StrCat("a token id in [0, ", vocab_size_, ") or a list of them"),
                       eos);
    }
    ids.push_back(id.get<int32_t>());
  }
  stop_ids_ = std::move(ids);
  return absl::OkStatus();
}

int32_t Tokenizer::TokenToId(absl::string_view token) const {
  auto it = added_by_content_.find(token);
  return it != added_by_content_.end() ? it->second : model_->TokenToId(token);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 at byte ", bad, " (expected UTF-8 text)"));
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = frame_.prefix;
  for (const Segment& s : raw_added_.Split(text)) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      PRL_RETURN_IF_ERROR(EncodeText(text.substr(s.begin, s.end - s.begin), s.begin == 0, &ids));
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), frame_.suffix.begin(), frame_.suffix.end());
  return ids;
}

absl::Status Tokenizer::EncodeText(absl::string_view text, bool first_section,
                                   std::vector<int32_t>* ids) const {
  PRL_ASSIGN_OR_RETURN(const std::string normalized, normalizer_.Normalize(text));
  if (normalized_added_.empty()) return EncodeWords(normalized, first_section, ids);
  for (const Segment& s : normalized_added_.Split(normalized)) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      PRL_RETURN_IF_ERROR(
          EncodeWords(absl::string_view(normalized).substr(s.begin, s.end - s.begin),
                      first_section && s.begin == 0, ids));
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeWords(absl::string_view normalized, bool first_section,
                                    std::vector<int32_t>* ids) const {
  if (normalized.empty()) return absl::OkStatus();
  std::vector<std::string> words;
  pre_tokenizer_.PreTokenize(normalized, first_section, &words);
  for (const std::string& word : words) PRL_RETURN_IF_ERROR(model_->Encode(word, ids));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (skip_special_tokens && special_ids_.contains(id)) continue;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      tokens.push_back(it->second.content);
    } else if (const std::string* token = model_->IdToToken(id)) {
      tokens.push_back(*token);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("ids[", i, "] = ", id,
                                                     " is not a token id (expected one of the ",
                                                     vocab_size_, " ids of the tokenizer)"));
    }
  }
  std::string text = decoder_.Decode(std::move(tokens));
  if (clean_up_tokenization_spaces_) text = CleanUpTokenizationSpaces(text);
  return text;
}

}  // namespace prl::tokenizer
