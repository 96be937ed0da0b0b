#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace prl {

namespace {
absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int err = errno;
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};
}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ == 0) return file;
  void* addr = mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (addr == MAP_FAILED) return ErrnoError("cannot mmap", path);
  file.data_ = static_cast<const uint8_t*>(addr);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const auto bytes = file->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path, int mode) {
  AtomicFileWriter writer;
  writer.path_ = path;
  writer.tmp_path_ = absl::StrCat(path, ".tmp.", getpid());
  writer.fd_ = open(writer.tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                    static_cast<mode_t>(mode));
  if (writer.fd_ < 0) return ErrnoError("cannot create", writer.tmp_path_);
  return writer;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(tmp_path_.c_str());
  }
}

absl::Status AtomicFileWriter::Append(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  size_t written = 0;
  while (written < bytes) {
    const ssize_t n = write(fd_, p + written, bytes - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", tmp_path_);
    }
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fsync(fd_) != 0) return ErrnoError("cannot fsync", tmp_path_);
  const int closed = close(fd_);
  fd_ = -1;
  if (closed != 0) {
    const absl::Status status = ErrnoError("cannot close", tmp_path_);
    unlink(tmp_path_.c_str());
    return status;
  }
  if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const absl::Status status = ErrnoError("cannot rename into place", path_);
    unlink(tmp_path_.c_str());
    return status;
  }
  return FsyncDirectory(ParentDirectory(path_));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = writer->Append(contents.data(), contents.size()); !s.ok()) return s;
  return writer->Commit();
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open the directory", dir);
  const int synced = fsync(fd);
  const absl::Status status = synced == 0 ? absl::OkStatus() : ErrnoError("cannot fsync", dir);
  close(fd);
  return status;
}

std::string ParentDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace prl
