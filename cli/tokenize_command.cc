// `prl tokenize`: text <-> token ids with a model directory's Hugging Face tokenizer, and chat
// templates (tokenizer/).
//
//   default   {"text": str}                      -> {"tokens": [int, ...]}   (BOS/EOS as the
//             tokenizer adds them; --no-special-tokens leaves them out)
//   --decode  {"tokens": [int, ...]}             -> {"text": str}  (--skip-special-tokens)
//   --chat    {"messages": [...], "tools"?: [...], "chat_template_kwargs"?: {...}}
//                                                -> {"text": str, "tokens": [int, ...]}
//             the chat template rendered (--add-generation-prompt) and encoded without adding
//             special tokens, as transformers' apply_chat_template(tokenize=True) does.
// One output line per input line. A malformed line is an error naming its line number and
// field, and then nothing is written.
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/hf_text_codec.h"
#include "tokenizer/tokenizer.h"

namespace prl::cli {

namespace {

using json = nlohmann::ordered_json;

struct TokenizeFlags {
  std::string model, input, output;
  bool decode = false, skip_special_tokens = false, chat = false, add_generation_prompt = false;
  bool no_special_tokens = false;
};

absl::Status CheckKeys(const json& line, std::initializer_list<const char*> allowed,
                       const std::string& where) {
  for (const auto& [key, unused] : line.items()) {
    bool known = false;
    for (const char* a : allowed) known |= key == a;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown field \"", key, "\" (expected ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> EncodeLine(const tokenizer::Tokenizer& t, const json& line,
                                const TokenizeFlags& f, const std::string& where) {
  PRL_RETURN_IF_ERROR(CheckKeys(line, {"text"}, where));
  if (!line.contains("text") || !line["text"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"text\" must be a string"));
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      t.Encode(line["text"].get<std::string>(), !f.no_special_tokens);
  if (!ids.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"text\": ", ids.status().message()));
  return json{{"tokens", *ids}};
}

absl::StatusOr<json> DecodeLine(const tokenizer::Tokenizer& t, const json& line,
                                const TokenizeFlags& f, const std::string& where) {
  PRL_RETURN_IF_ERROR(CheckKeys(line, {"tokens"}, where));
  if (!line.contains("tokens") || !line["tokens"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"tokens\" must be a list of ints"));
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < line["tokens"].size(); ++i) {
    const json& id = line["tokens"][i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= t.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tokens[", i, "] = ", id.dump(),
                                                     " is not a token id in [0, ", t.vocab_size(),
                                                     ")"));
    }
    ids.push_back(id.get<int32_t>());
  }
  absl::StatusOr<std::string> text = t.Decode(ids, f.skip_special_tokens);
  if (!text.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", text.status().message()));
  return json{{"text", *text}};
}

absl::StatusOr<json> ChatLine(const tokenizer::HfTextCodec& codec, const json& line,
                              const TokenizeFlags& f, const std::string& where) {
  PRL_RETURN_IF_ERROR(CheckKeys(line, {"messages", "tools", "chat_template_kwargs"}, where));
  if (!line.contains("messages") || !line["messages"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"messages\" must be a list"));
  }
  for (size_t i = 0; i < line["messages"].size(); ++i) {
    const json& m = line["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": messages[", i, "] must be an object with a string \"role\""));
    }
  }
  tokenizer::ChatPrompt chat;
  chat.messages = line["messages"];
  if (line.contains("tools") && !line["tools"].is_null()) {
    if (!line["tools"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"tools\" must be a list"));
    }
    chat.tools = line["tools"];
  }
  if (line.contains("chat_template_kwargs")) {
    if (!line["chat_template_kwargs"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"chat_template_kwargs\" must be an object"));
    }
    chat.kwargs = line["chat_template_kwargs"];
  }
  chat.add_generation_prompt = f.add_generation_prompt;
  absl::StatusOr<std::string> text = codec.RenderChat(chat);
  if (!text.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", text.status().message()));
  absl::StatusOr<std::vector<int32_t>> ids = codec.EncodeContinuation(*text);
  if (!ids.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", ids.status().message()));
  return json{{"text", *text}, {"tokens", *ids}};
}

absl::Status RunTokenize(const TokenizeFlags& f) {
  if (f.decode && f.chat)
    return absl::InvalidArgumentError("--decode and --chat exclude each other");
  PRL_ASSIGN_OR_RETURN(const std::unique_ptr<tokenizer::HfTextCodec> codec,
                       tokenizer::HfTextCodec::Load(f.model));
  const tokenizer::Tokenizer* t = &codec->tokenizer();
  std::ifstream in(f.input);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --input '", f.input, "'"));
  std::string output, text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    const std::string where = absl::StrCat(f.input, " line ", number);
    json line;
    try {
      line = json::parse(text);
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON: ", e.what()));
    }
    if (!line.is_object())
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
    absl::StatusOr<json> result = f.decode ? DecodeLine(*t, line, f, where)
                                  : f.chat ? ChatLine(*codec, line, f, where)
                                           : EncodeLine(*t, line, f, where);
    if (!result.ok()) return result.status();
    absl::StrAppend(&output, result->dump(), "\n");
  }
  return WriteFileAtomically(f.output, output);
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app, CommandRegistry& registry) {
  auto f = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Text -> token ids ({\"text\"} -> {\"tokens\"}), --decode the reverse, --chat renders the "
      "chat template ({\"messages\", \"tools\"?} -> {\"text\", \"tokens\"})");
  cmd->add_option("--model", f->model, "Model directory (tokenizer.json, tokenizer_config.json)")
      ->required();
  cmd->add_option("--input", f->input, "Input JSONL")->required();
  cmd->add_option("--output", f->output, "Output JSONL (written only when every line is valid)")
      ->required();
  cmd->add_flag("--decode", f->decode, "Token ids -> text");
  cmd->add_flag("--skip-special-tokens", f->skip_special_tokens, "--decode: drop special tokens");
  cmd->add_flag("--no-special-tokens", f->no_special_tokens, "Encode without BOS/EOS");
  cmd->add_flag("--chat", f->chat, "Render the model's chat template, then encode it");
  cmd->add_flag("--add-generation-prompt", f->add_generation_prompt,
                "--chat: end with the assistant's generation prompt");
  registry.Add(cmd, [f] { return RunTokenize(*f); });
}

}  // namespace prl::cli
