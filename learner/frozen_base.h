// FrozenBase: the base model a LoRA learner trains adapters on (learner/fsdp.h's LoRA mode),
// read once per node and mapped read-only by every rank of the node, so that the node holds
// one copy (the page cache's) instead of one per rank.
//
// The file is the base's fp32 parameters in ParameterLayout order (model/parameters.h),
// nothing else, mode 0600, written atomically by the node's first rank (LOCAL_RANK 0) at each
// start into a node-local directory (PrivateTempDirectory by default) and removed
// as soon as every rank has mapped it: the pages live while mapped, no file outlives the
// learner, and a learner that restarts maps the weights it loaded, never a stale file. The
// pages are mapped PROT_READ: a write into the base faults instead of changing the model.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collective/communicator.h"
#include "core/buffer.h"
#include "core/mapped_file.h"
#include "model/config.h"
#include "model/parameters.h"

namespace prl::learner {

class FrozenBase {
 public:
  // Writes `weights` to `path` (a temporary file, fsync, rename).
  static absl::Status Write(const std::string& path, const ParameterSet& weights);
  // Maps `path`, which must hold `config`'s parameters (its size is checked).
  static absl::StatusOr<std::unique_ptr<FrozenBase>> Map(const std::string& path,
                                                         const ModelConfig& config);
  // A collective over `comm`: the ranks given `weights` (the node's first; `config`'s) write
  // them to `base_path` with a suffix rank 0 draws for the group (two learners never share a
  // file); after every rank knows the writes succeeded, every rank maps it. A rank
  // that failed before (`failed_before`, e.g. reading the checkpoint) passes its error, which
  // fails every rank: an error on any rank is an error on all of them.
  static absl::StatusOr<std::unique_ptr<FrozenBase>> Share(const std::string& base_path,
                                                           const ModelConfig& config,
                                                           const ParameterSet* weights,
                                                           const absl::Status& failed_before,
                                                           collective::Communicator& comm);

  const ModelConfig& config() const { return config_; }
  const float* data() const { return reinterpret_cast<const float*>(file_.bytes().data()); }
  int64_t num_elements() const { return layout_.num_elements(); }
  // Views of the mapped weights (read-only memory behind non-const pointers: never write).
  ModelParams Bind() const;
  // Views of the base on `device` in `dtype`: the mapping's (Bind) on the CPU; on CUDA a copy
  // in `dtype` (F32 or BF16), uploaded at the first call and shared by the later ones, so that
  // a run of adapters' trainers hold one copy on the GPU, not one each. Thread-safe. The
  // CUDA path is written, not yet run on a GPU (learner.cuda_lora).
  absl::StatusOr<ModelParams> BindOn(Device device, DType dtype) const;
  // Bytes of the copies BindOn made on GPUs.
  int64_t device_bytes() const;
  int64_t bytes() const { return static_cast<int64_t>(file_.size()); }

 private:
  FrozenBase(const ModelConfig& config, MappedFile file)
      : config_(config), layout_(config), file_(std::move(file)) {}

  ModelConfig config_;
  ParameterLayout layout_;
  MappedFile file_;
  struct DeviceCopy {
    Device device;
    DType dtype;
    Buffer buffer;
  };
  mutable std::mutex device_mutex_;
  mutable std::vector<DeviceCopy> device_copies_;  // guarded by device_mutex_
};

// The file name of `config`'s frozen base in `dir` (its fingerprint in the name, so that two
// models never share one).
std::string FrozenBasePath(const std::string& dir, const ModelConfig& config);

// The default directory: prl-<uid> in `parent` (empty: the system's temporary directory),
// created mode 0700 and checked to be this user's alone (a shared /tmp must not let another
// user place or read the file). Errors name the directory and what is wrong with it.
absl::StatusOr<std::string> PrivateTempDirectory(const std::string& parent = "");

}  // namespace prl::learner
