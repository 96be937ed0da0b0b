#include "coordinator/prompt_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"

namespace prl::coordinator {

namespace {

constexpr char kMagic[8] = {'P', 'R', 'L', 'L', 'O', 'G', '1', '\n'};
constexpr size_t kRecordHeader = 12;  // u32 length + u64 checksum
constexpr uint32_t kMaxRecordBytes = 1u << 30;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write the prompt log", path);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PromptLog::Opened> PromptLog::Open(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot open the prompt log", path);
  Opened out;
  const off_t size = lseek(fd, 0, SEEK_END);
  std::string contents(static_cast<size_t>(size), '\0');
  if (size > 0 && pread(fd, contents.data(), contents.size(), 0) != size) {
    close(fd);
    return Errno("cannot read the prompt log", path);
  }
  if (size == 0) {
    if (absl::Status s = WriteAll(fd, kMagic, sizeof(kMagic), path); !s.ok()) {
      close(fd);
      return s;
    }
    fsync(fd);
    out.log.reset(new PromptLog(path, fd, sizeof(kMagic)));
    return out;
  }
  if (contents.size() < sizeof(kMagic) || std::memcmp(contents.data(), kMagic, 8) != 0) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, " is not a prl prompt log (bad magic)"));
  }
  size_t at = sizeof(kMagic);
  while (at < contents.size()) {
    const size_t remaining = contents.size() - at;
    uint32_t length = 0;
    uint64_t checksum = 0;
    bool torn = remaining < kRecordHeader;
    if (!torn) {
      std::memcpy(&length, contents.data() + at, 4);
      std::memcpy(&checksum, contents.data() + at + 4, 8);
      torn = length > kMaxRecordBytes || kRecordHeader + length > remaining;
    }
    const bool last = torn || kRecordHeader + length == remaining;
    if (!torn && XXH3_64bits(contents.data() + at + kRecordHeader, length) != checksum) {
      if (!last) {
        close(fd);
        return absl::DataLossError(absl::StrCat(path, ": record at byte ", at,
                                                " fails its checksum and is followed by more "
                                                "records: the log is corrupted"));
      }
      torn = true;
    }
    if (torn) {
      out.torn_bytes = static_cast<int64_t>(remaining);
      if (ftruncate(fd, static_cast<off_t>(at)) != 0) {
        close(fd);
        return Errno("cannot cut the torn tail of the prompt log", path);
      }
      fsync(fd);
      break;
    }
    prl::v1::LogRecord record;
    if (!record.ParseFromArray(contents.data() + at + kRecordHeader, static_cast<int>(length))) {
      close(fd);
      return absl::DataLossError(
          absl::StrCat(path, ": record at byte ", at, " has a valid checksum but does not parse"));
    }
    out.records.push_back(std::move(record));
    at += kRecordHeader + length;
  }
  lseek(fd, static_cast<off_t>(at), SEEK_SET);
  out.log.reset(new PromptLog(path, fd, static_cast<int64_t>(at)));
  return out;
}

PromptLog::~PromptLog() { close(fd_); }

absl::Status PromptLog::Append(const prl::v1::LogRecord& record) {
  std::string payload;
  if (!record.SerializeToString(&payload) || payload.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt log record of ", payload.size(), " bytes: the limit is 1 GiB"));
  }
  std::string buffer(kRecordHeader + payload.size(), '\0');
  const uint32_t length = static_cast<uint32_t>(payload.size());
  const uint64_t checksum = XXH3_64bits(payload.data(), payload.size());
  std::memcpy(buffer.data(), &length, 4);
  std::memcpy(buffer.data() + 4, &checksum, 8);
  std::memcpy(buffer.data() + kRecordHeader, payload.data(), payload.size());
  absl::Status wrote = WriteAll(fd_, buffer.data(), buffer.size(), path_);
  if (wrote.ok() && fdatasync(fd_) != 0) wrote = Errno("cannot fsync the prompt log", path_);
  if (!wrote.ok()) {
    // Nothing half-written may stay in front of later records.
    if (ftruncate(fd_, static_cast<off_t>(bytes_)) == 0) lseek(fd_, bytes_, SEEK_SET);
    return wrote;
  }
  bytes_ += static_cast<int64_t>(buffer.size());
  return absl::OkStatus();
}

}  // namespace prl::coordinator
