#include "learner/frozen_base.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "kernels/convert.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::learner {

std::string FrozenBasePath(const std::string& dir, const ModelConfig& config) {
  const std::string fingerprint = ModelFingerprint(config);
  return absl::StrCat(
      dir, "/frozen_base-",
      absl::Hex(XXH3_64bits(fingerprint.data(), fingerprint.size()), absl::kZeroPad16), ".f32");
}

absl::StatusOr<std::string> PrivateTempDirectory(const std::string& parent) {
  const std::string dir = absl::StrCat(
      parent.empty() ? std::filesystem::temp_directory_path().string() : parent, "/prl-", getuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 0077) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        dir, ": expected a directory of this user (uid ", getuid(), ") with mode 0700, found ",
        S_ISDIR(st.st_mode) ? "" : "no directory, ", "uid ", st.st_uid, " mode ",
        absl::StrFormat("%o", st.st_mode & 07777), " (remove it, or set another directory)"));
  }
  return dir;
}

absl::Status FrozenBase::Write(const std::string& path, const ParameterSet& weights) {
  std::error_code ec;
  std::filesystem::create_directories(ParentDirectory(path), ec);
  PRL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path, 0600));
  PRL_RETURN_IF_ERROR(writer.Append(
      weights.data(), static_cast<size_t>(weights.layout.num_elements()) * sizeof(float)));
  return writer.Commit();
}

absl::StatusOr<std::unique_ptr<FrozenBase>> FrozenBase::Map(const std::string& path,
                                                            const ModelConfig& config) {
  PRL_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const ParameterLayout layout(config);
  const size_t expected = static_cast<size_t>(layout.num_elements()) * sizeof(float);
  if (file.size() != expected) {
    return absl::DataLossError(absl::StrCat("frozen base ", path, ": expected ", expected,
                                            " bytes (the model's fp32 parameters), found ",
                                            file.size()));
  }
  return std::unique_ptr<FrozenBase>(new FrozenBase(config, std::move(file)));
}

absl::StatusOr<std::unique_ptr<FrozenBase>> FrozenBase::Share(const std::string& base_path,
                                                              const ModelConfig& config,
                                                              const ParameterSet* weights,
                                                              const absl::Status& failed_before,
                                                              collective::Communicator& comm) {
  // One name per learner: rank 0 draws it for the group, so that two learners of one model on a
  // node (two runs) never map each other's file.
  uint64_t nonce = 0;
  if (comm.rank() == 0) nonce = std::random_device{}() * 0x100000000ull + std::random_device{}();
  PRL_RETURN_IF_ERROR(comm.BroadcastHost({reinterpret_cast<uint8_t*>(&nonce), sizeof(nonce)}, 0));
  const std::string path = absl::StrCat(base_path, ".", absl::Hex(nonce, absl::kZeroPad16));
  const bool writer = weights != nullptr;
  absl::Status wrote = failed_before;
  if (wrote.ok() && writer) wrote = Write(path, *weights);
  double failed = wrote.ok() ? 0 : 1;
  PRL_RETURN_IF_ERROR(comm.AllReduceHost({&failed, 1}, collective::ReduceOp::kMax));
  PRL_RETURN_IF_ERROR(wrote);
  if (failed > 0) {
    return absl::AbortedError(
        absl::StrCat("frozen base ", path, ": another rank failed to write it (see its error)"));
  }
  absl::StatusOr<std::unique_ptr<FrozenBase>> mapped = Map(path, config);
  // Once every rank holds its mapping the name is dropped: the pages live while mapped, and no
  // file outlives the learner.
  failed = mapped.ok() ? 0 : 1;
  PRL_RETURN_IF_ERROR(comm.AllReduceHost({&failed, 1}, collective::ReduceOp::kMax));
  if (writer) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  if (!mapped.ok() && absl::IsNotFound(mapped.status())) {
    return absl::NotFoundError(absl::StrCat(
        mapped.status().message(),
        " (the node's first rank, LOCAL_RANK 0, writes it: set LOCAL_RANK on every rank)"));
  }
  if (mapped.ok() && failed > 0) {
    return absl::AbortedError(
        absl::StrCat("frozen base ", path, ": another rank failed to map it (see its error)"));
  }
  return mapped;
}

ModelParams FrozenBase::Bind() const {
  return layout_.Bind(const_cast<float*>(data()), Device::Cpu());
}

absl::StatusOr<ModelParams> FrozenBase::BindOn(Device device, DType dtype) const {
  if (device.is_cpu()) {
    if (dtype != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("frozen base on the CPU: expected F32, found ", DTypeName(dtype)));
    }
    return Bind();
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frozen base on ", device.ToString(), ": expected F32 or BF16, found ", DTypeName(dtype)));
  }
  std::lock_guard<std::mutex> lock(device_mutex_);
  for (const DeviceCopy& c : device_copies_) {
    if (c.device == device && c.dtype == dtype) return layout_.Bind(c.buffer.data(), dtype, device);
  }
  const int64_t n = num_elements();
  PRL_ASSIGN_OR_RETURN(Buffer buffer,
                       Buffer::Allocate(device, static_cast<size_t>(n) * DTypeSize(dtype)));
  if (dtype == DType::kF32) {
    PRL_RETURN_IF_ERROR(CopyBytes(buffer.data(), device, data(), Device::Cpu(),
                                  static_cast<size_t>(n) * sizeof(float)));
  } else {  // through an F32 staging buffer, a piece at a time (each copy waits for the
            // conversion before it on this thread's stream; freeing the staging waits too)
    const int64_t piece = std::min<int64_t>(n, int64_t{16} << 20);
    PRL_ASSIGN_OR_RETURN(Buffer staging,
                         Buffer::Allocate(device, static_cast<size_t>(piece) * sizeof(float)));
    for (int64_t begin = 0; begin < n; begin += piece) {
      const int64_t m = std::min(piece, n - begin);
      PRL_RETURN_IF_ERROR(cuda::MemcpyOnCurrentStream(device.index, staging.data(), data() + begin,
                                                      static_cast<size_t>(m) * sizeof(float)));
      kernels::ConvertDType(
          Tensor(static_cast<char*>(buffer.data()) + begin * static_cast<int64_t>(DTypeSize(dtype)),
                 dtype, device, {m}),
          Tensor(staging.data(), DType::kF32, device, {m}));
    }
    PRL_RETURN_IF_ERROR(cuda::SynchronizeCurrentStream(device.index));  // the copy is whole
  }
  device_copies_.push_back({device, dtype, std::move(buffer)});
  return layout_.Bind(device_copies_.back().buffer.data(), dtype, device);
}

int64_t FrozenBase::device_bytes() const {
  std::lock_guard<std::mutex> lock(device_mutex_);
  int64_t bytes = 0;
  for (const DeviceCopy& c : device_copies_) bytes += static_cast<int64_t>(c.buffer.bytes());
  return bytes;
}

}  // namespace prl::learner
