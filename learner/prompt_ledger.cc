#include "learner/prompt_ledger.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"

namespace prl::learner {

std::string PromptLedger::Key(const std::string& prompt_set_id, uint64_t prompt_index) {
  if (prompt_set_id.empty() || prompt_set_id.find_first_of("\t\r\n") != std::string::npos) {
    return "";
  }
  return absl::StrCat(prompt_set_id, "\t", prompt_index);
}

void PromptLedger::Add(int64_t step, const std::string& key) {
  if (key.empty()) return;
  order_.emplace_back(step, key);
  keys_.insert(key);
}

int64_t PromptLedger::ForgetSet(const std::string& prompt_set_id) {
  const std::string prefix = prompt_set_id + "\t";
  const size_t before = order_.size();
  std::erase_if(order_, [&](const std::pair<int64_t, std::string>& entry) {
    return absl::StartsWith(entry.second, prefix);
  });
  for (auto it = keys_.begin(); it != keys_.end();) {
    if (absl::StartsWith(*it, prefix)) {
      keys_.erase(it++);
    } else {
      ++it;
    }
  }
  return static_cast<int64_t>(before - order_.size());
}

absl::Status PromptLedger::Write(const std::string& path) const {
  std::string text;
  for (const auto& [step, key] : order_) absl::StrAppend(&text, step, "\t", key, "\n");
  return WriteFileAtomically(path, text);
}

absl::StatusOr<PromptLedger> PromptLedger::Read(const std::string& path) {
  PromptLedger ledger;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return ledger;
  PRL_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_number;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
    int64_t step = 0;
    uint64_t index = 0;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[0], &step) || fields[1].empty() ||
        !absl::SimpleAtoi(fields[2], &index)) {
      return absl::DataLossError(absl::StrCat(path, ": line ", line_number,
                                              ": expected <step>\\t<prompt_set_id>\\t<index>, "
                                              "found '",
                                              line.substr(0, 200), "'"));
    }
    ledger.Add(step, Key(std::string(fields[1]), index));
  }
  return ledger;
}

}  // namespace prl::learner
