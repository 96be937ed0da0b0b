#include "weight_broadcast/version_file.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/mapped_file.h"
#include "weight_broadcast/versioning.h"

namespace prl {

absl::StatusOr<int64_t> ReadPublishedVersion(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return int64_t{-1};
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  int64_t version = -1;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &version) || version < 0 ||
      version >= kVersionLimit) {
    return absl::DataLossError(absl::StrCat("weight version file ", path,
                                            ": expected a version in [0, 2^62), found '",
                                            absl::StripAsciiWhitespace(*text), "'"));
  }
  return version;
}

absl::Status WritePublishedVersion(const std::string& path, int64_t version) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    std::filesystem::create_directories(parent, ec);
  }
  return WriteFileAtomically(path, absl::StrCat(version, "\n"));
}

}  // namespace prl
