// A Hugging Face tokenizer loaded from a model directory: tokenizer.json (byte-level BPE as in
// Qwen2/2.5/3 and Llama 3, SentencePiece-style BPE with byte fallback as in Llama 2 / Mistral),
// tokenizer_config.json (BOS/EOS, special tokens, chat template, decode clean-up) and
// generation_config.json (stop ids). The coordinator encodes prompts with it, actors decode
// completions (docs/architecture.md, "The repository by folder").
//
// Encode: the input is cut at added tokens (added_tokens.h); every other stretch is normalised
// (normalizer.h), pre-tokenised into words (pre_tokenizer.h) and each word BPE-encoded
// (bpe_model.h). With add_special_tokens the BOS/EOS frame is put around the ids: the
// post_processor's TemplateProcessing, overridden by tokenizer_config.json's add_bos_token /
// add_eos_token where those are set (as transformers' Llama tokenizers rebuild it from them).
// Decode: ids -> token strings -> decoder.h, then tokenizer_config.json's
// clean_up_tokenization_spaces (default true, as in transformers) removes spaces before
// punctuation and English contractions.
//
// Every unsupported component is an error naming its JSON path; nothing is approximated.
// Thread-safety: immutable after Load (the BPE cache is internally locked); Encode and Decode
// may be called concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace prl::tokenizer {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json (required), DIR/tokenizer_config.json and
  // DIR/generation_config.json (both optional).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);
  // The same from parsed documents; `config` and `generation_config` may be null.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      const nlohmann::json& tokenizer_json, const nlohmann::json& config,
      const nlohmann::json& generation_config);

  // The ids of `text` (UTF-8; invalid UTF-8 is an InvalidArgument error naming the offset).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = true) const;
  // The text of `ids`; an id that names no token is an InvalidArgument error naming it and its
  // position. skip_special_tokens drops added tokens marked special.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // The id of a vocabulary or added token, or -1.
  int32_t TokenToId(absl::string_view token) const;
  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const { return vocab_size_; }

  // tokenizer_config.json's tokens ("" and -1 when unset).
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // generation_config.json's eos_token_id (one id or a list), else {eos_id()} (or {}).
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  // tokenizer_config.json's chat_template (the "default" one when it is a list), if any.
  const std::optional<std::string>& chat_template() const { return chat_template_; }

 private:
  Tokenizer() = default;
  absl::Status LoadAddedTokens(const nlohmann::json& tokenizer_json);
  absl::Status LoadConfig(const nlohmann::json& config);
  absl::Status LoadGenerationConfig(const nlohmann::json& generation_config);
  // Encodes one stretch of text between added tokens (raw, not yet normalised).
  absl::Status EncodeText(absl::string_view text, bool first_section,
                          std::vector<int32_t>* ids) const;
  absl::Status EncodeWords(absl::string_view normalized, bool first_section,
                           std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  SpecialTokenFrame frame_;
  AddedTokenMatcher raw_added_, normalized_added_;
  absl::flat_hash_map<int32_t, AddedToken> added_by_id_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  absl::flat_hash_set<int32_t> special_ids_;  // skipped by skip_special_tokens
  int32_t vocab_size_ = 0;
  std::string bos_token_, eos_token_;
  int32_t bos_id_ = -1, eos_id_ = -1;
  std::vector<int32_t> stop_ids_;
  std::optional<std::string> chat_template_;
  bool clean_up_tokenization_spaces_ = true;
};

// transformers' clean_up_tokenization: " ." -> "." and likewise for ? ! , and English
// contractions (" n't", " 'm", " 's", " 've", " 're", " ' ").
std::string CleanUpTokenizationSpaces(absl::string_view text);

}  // namespace prl::tokenizer
