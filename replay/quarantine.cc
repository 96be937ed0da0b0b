#include "replay/quarantine.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace prl {

namespace {

constexpr size_t kMaxFieldBytes = 256;

std::string Capped(const std::string& s) {
  if (s.size() <= kMaxFieldBytes) return s;
  return s.substr(0, kMaxFieldBytes - 3) + "...";
}

}  // namespace

int64_t QuarantineCounts::total() const {
  int64_t n = 0;
  for (int64_t c : by_reason) n += c;
  return n;
}

Quarantine::Quarantine(const ModelLimits& limits, std::string path, std::string source)
    : limits_(limits), path_(std::move(path)), source_(std::move(source)) {}

Quarantine::~Quarantine() {
  if (fd_ >= 0) close(fd_);
}

std::optional<std::vector<RolloutRecord>> Quarantine::Admit(const LeasedGroup& group,
                                                            int64_t learner_version,
                                                            std::optional<RefusedPrompt>* refused) {
  if (refused != nullptr) refused->reset();
  absl::StatusOr<std::vector<RolloutRecord>> records = group.Decode();
  if (!records.ok()) {
    DeadLetter({}, &group,
               GroupProblem{DeadLetterReason::kCorrupt, "group bytes",
                            "bytes that match their checksum and decode",
                            std::string(records.status().message())});
    return std::nullopt;
  }
  if (const std::optional<GroupProblem> problem =
          ValidateGroup(*records, limits_, learner_version)) {
    DeadLetter(*records, nullptr, *problem);
    if (refused != nullptr && !records->empty()) {
      *refused = RefusedPrompt{
          records->front().prompt_set_id, records->front().prompt_index,
          absl::StrCat(DeadLetterReasonName(problem->reason), ": ", problem->Describe())};
    }
    return std::nullopt;
  }
  return std::move(records).value();
}

absl::Status Quarantine::Check(absl::Span<const RolloutRecord> group, int64_t learner_version) {
  const std::optional<GroupProblem> problem = ValidateGroup(group, limits_, learner_version);
  if (!problem.has_value()) return absl::OkStatus();
  return Refuse(group, *problem);
}

absl::Status Quarantine::Refuse(absl::Span<const RolloutRecord> group,
                                const GroupProblem& problem) {
  DeadLetter(group, nullptr, problem);
  return absl::InvalidArgumentError(absl::StrCat(
      "group quarantined (", DeadLetterReasonName(problem.reason), "): ", problem.Describe(),
      path_.empty() ? "" : absl::StrCat("; recorded in ", path_)));
}

void Quarantine::DeadLetter(absl::Span<const RolloutRecord> group, const LeasedGroup* leased,
                            const GroupProblem& problem) {
  nlohmann::ordered_json line;
  line["unix_time"] = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  line["source"] = source_;
  if (!group.empty()) {
    const RolloutRecord& r = group.front();
    line["run_id"] = Capped(r.run_id);
    line["prompt_set_id"] = Capped(r.prompt_set_id);
    line["prompt_index"] = r.prompt_index;
    line["group_id"] = r.group_id;
    line["actor_id"] = Capped(r.actor_id);
    line["records"] = group.size();
  } else if (leased != nullptr) {
    line["group_key"] = absl::StrCat(absl::Hex(leased->group_key, absl::kZeroPad16));
    line["records"] = leased->num_records;
  }
  line["reason"] = std::string(DeadLetterReasonName(problem.reason));
  line["field"] = Capped(problem.field);
  line["expected"] = Capped(problem.expected);
  line["found"] = Capped(problem.found);
  // Ids are UTF-8 by the record's invariants, but a malformed group may break them.
  const std::string text =
      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  const bool first_of_reason = counts_.by_reason[static_cast<int>(problem.reason)]++ == 0;
  if (!path_.empty()) WriteLine(text);
  if (first_of_reason) {
    // Once per reason on stderr (a role's log, prl run's console): a run whose every group
    // is refused, say one too long for learner.activation_budget_mb, must not look idle.
    std::fprintf(stderr,
                 "%s: dead-lettered a group (reason %s): %s: expected %s, found %s; every such "
                 "group is in %s and counted by prl_replay_groups_dead_lettered_total\n",
                 source_.c_str(), std::string(DeadLetterReasonName(problem.reason)).c_str(),
                 Capped(problem.field).c_str(), Capped(problem.expected).c_str(),
                 Capped(problem.found).c_str(), path_.empty() ? "no file" : path_.c_str());
  }
}

void Quarantine::WriteLine(const std::string& line) {
  if (fd_ < 0) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  }
  const bool ok = fd_ >= 0 &&
                  write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  fdatasync(fd_) == 0;
  if (!ok) {
    ++counts_.write_errors;
    std::fprintf(stderr,
                 "quarantine: cannot write the dead-letter file %s (%s); the group is "
                 "dropped all the same: %s",
                 path_.c_str(), std::strerror(errno), line.c_str());
  }
}

QuarantineCounts Quarantine::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace prl
