// A read-only memory map of a whole file (checkpoints are read through this: tensors are
// converted straight from the page cache into parameter buffers, without a staging copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prl {

class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) text file, e.g. config.json.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes a file atomically: bytes go to a temporary file in the same directory, and Commit()
// fsyncs it, renames it over `path` and fsyncs the directory, so that once Commit returns the
// new file survives a crash. A crash before (or destruction without Commit) leaves either the
// old file or none, never a torn one. Not thread-safe.
class AtomicFileWriter {
 public:
  // mode: the new file's permission bits (0600 for run data only this user may read).
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path, int mode = 0644);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, size_t bytes);
  absl::Status Commit();

 private:
  AtomicFileWriter() = default;
  int fd_ = -1;
  std::string path_;
  std::string tmp_path_;
};

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// fsyncs a directory, so that the entries created, renamed or removed in it are durable
// (a file's own fsync does not cover its name). Errors name the directory.
absl::Status FsyncDirectory(const std::string& dir);
// The directory holding `path` ("." for a bare name).
std::string ParentDirectory(const std::string& path);

}  // namespace prl
