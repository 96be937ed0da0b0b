#include "learner/step_journal.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"

namespace prl::learner {

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMagic = 0x324c4e524a4c5250;  // "PRLJRNL2"

struct Header {
  uint64_t magic = kMagic;
  int64_t step = 0, groups = 0, samples = 0;
  double mean_reward = 0;
  uint64_t keys = 0, prompt_key_bytes = 0, payload_bytes = 0;
  uint64_t xxh3 = 0;  // of everything after the header
};

}  // namespace

absl::StatusOr<StepJournal> StepJournal::Open(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create the step journal ", dir, ": ", error.message()));
  }
  return StepJournal(dir);
}

std::string StepJournal::PathOf(int64_t step) const {
  return absl::StrFormat("%s/step-%012d.bin", dir_, step);
}

absl::Status StepJournal::Append(const JournaledStep& step) const {
  Header h;
  h.step = step.step;
  h.groups = step.groups;
  h.samples = step.samples;
  h.mean_reward = step.mean_reward;
  h.keys = step.group_keys.size();
  h.payload_bytes = step.payload.size();
  std::string body(h.keys * sizeof(uint64_t), '\0');
  if (!body.empty()) std::memcpy(body.data(), step.group_keys.data(), body.size());
  for (const std::string& key : step.prompt_keys) absl::StrAppend(&body, key, "\n");
  h.prompt_key_bytes = body.size() - h.keys * sizeof(uint64_t);
  body.append(reinterpret_cast<const char*>(step.payload.data()), step.payload.size());
  h.xxh3 = XXH3_64bits(body.data(), body.size());
  PRL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(PathOf(step.step)));
  PRL_RETURN_IF_ERROR(writer.Append(&h, sizeof(h)));
  PRL_RETURN_IF_ERROR(writer.Append(body.data(), body.size()));
  return writer.Commit();
}

absl::StatusOr<JournaledStep> StepJournal::Read(const std::string& path) const {
  PRL_ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(path));
  Header h;
  if (bytes.size() < sizeof(h)) {
    return absl::DataLossError(absl::StrCat("step journal ", path, ": expected a ", sizeof(h),
                                            "-byte header, found ", bytes.size(), " bytes"));
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  const uint64_t body = bytes.size() - sizeof(h);
  if (h.magic != kMagic || h.keys > body / sizeof(uint64_t) || h.prompt_key_bytes > body ||
      h.payload_bytes > body ||
      h.keys * sizeof(uint64_t) + h.prompt_key_bytes + h.payload_bytes != body ||
      h.xxh3 != XXH3_64bits(bytes.data() + sizeof(h), body)) {
    return absl::DataLossError(absl::StrCat(
        "step journal ", path, ": damaged (expected the magic, ", h.keys, " keys, ",
        h.prompt_key_bytes, " bytes of prompt keys, ", h.payload_bytes, " payload bytes and their checksum; found ", body,
        " bytes that do not match)"));
  }
  JournaledStep step{h.step, h.groups, h.samples, h.mean_reward, {}, {}, {}};
  step.group_keys.resize(h.keys);
  std::memcpy(step.group_keys.data(), bytes.data() + sizeof(h), h.keys * sizeof(uint64_t));
  const size_t keys_end = sizeof(h) + h.keys * sizeof(uint64_t);
  for (absl::string_view key : absl::StrSplit(
           absl::string_view(bytes).substr(keys_end, h.prompt_key_bytes), '\n',
           absl::SkipEmpty())) {
    step.prompt_keys.emplace_back(key);
  }
  step.payload.assign(bytes.begin() + static_cast<std::ptrdiff_t>(keys_end + h.prompt_key_bytes),
                      bytes.end());
  return step;
}

absl::StatusOr<std::vector<int64_t>> StepJournal::Steps() const {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") || !absl::EndsWith(name, ".bin") ||
        !absl::SimpleAtoi(name.substr(5, name.size() - 9), &step)) {
      continue;  // temporary files of an interrupted Append, or not ours
    }
    steps.push_back(step);
  }
  if (error) {
    return absl::InternalError(absl::StrCat("cannot list ", dir_, ": ", error.message()));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::vector<JournaledStep>> StepJournal::StepsAfter(int64_t step) const {
  PRL_RETURN_IF_ERROR(DropThrough(step));
  PRL_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, Steps());
  std::vector<JournaledStep> out;
  for (const int64_t s : steps) {
    if (s != step + 1 + static_cast<int64_t>(out.size())) {
      return absl::DataLossError(absl::StrCat(
          "step journal ", dir_, ": expected step ", step + 1 + out.size(),
          " after the checkpoint's step ", step, ", found ", PathOf(s),
          " (a gap: the journal does not match the checkpoint)"));
    }
    PRL_ASSIGN_OR_RETURN(JournaledStep read, Read(PathOf(s)));
    out.push_back(std::move(read));
  }
  return out;
}

absl::Status StepJournal::DropThrough(int64_t step) const {
  PRL_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, Steps());
  for (const int64_t s : steps) {
    if (s > step) break;
    std::error_code error;
    fs::remove(PathOf(s), error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot remove ", PathOf(s), ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace prl::learner
