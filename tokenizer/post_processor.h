// The `post_processor` of tokenizer.json, reduced to what it does to a single sequence: the
// special-token ids put before and after it. Supported: TemplateProcessing (its "single"
// template: SpecialToken items and the sequence "A"), ByteLevel (adds nothing; it only moves
// offsets), and Sequence of these. Anything else is an error naming its JSON path.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"

namespace prl::tokenizer {

struct SpecialTokenFrame {
  std::vector<int32_t> prefix;  // ids before the sequence
  std::vector<int32_t> suffix;  // ids after it
  bool from_template = false;   // a TemplateProcessing defined them
};

// `config` is tokenizer.json's "post_processor" (may be null).
absl::StatusOr<SpecialTokenFrame> PostProcessorFromJson(const nlohmann::json& config,
                                                        const JsonPath& path);

}  // namespace prl::tokenizer
