// The device side of the cuda_ipc transport (internal to weight_broadcast/): device buffers a
// publisher exports and their mappings in a subscriber. Copies between them are CopyBytes
// (core/buffer.h): synchronous, and ordered after the work the calling process queued on its
// blocking streams (the learner's kernels that wrote the weights).
// Compiled against the CUDA runtime in CUDA builds (cuda_ipc_memory.cc); elsewhere every
// factory says that this build has no CUDA (cuda_ipc_memory_none.cc), so the transport needs
// no #ifdefs.
//
// Thread-safety: each object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "weight_broadcast/cuda_ipc_control.h"

namespace prl::weight_broadcast_internal {

// True in builds with the CUDA runtime.
bool CudaIpcCompiled();

// One cudaMalloc allocation on a device, with its IPC handle. Not from the caching allocator:
// a handle names a whole allocation and an importer maps it from its base.
class ExportedBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<ExportedBuffer>> Allocate(Device device, size_t bytes);
  ~ExportedBuffer();  // cudaFree: every importer must have stopped reading (CudaIpcControl)
  ExportedBuffer(const ExportedBuffer&) = delete;
  ExportedBuffer& operator=(const ExportedBuffer&) = delete;

  void* data() const { return data_; }
  const IpcHandle& handle() const { return handle_; }

 private:
  ExportedBuffer(Device device, void* data, const IpcHandle& handle)
      : device_(device), data_(data), handle_(handle) {}
  Device device_;
  void* data_;
  IpcHandle handle_;
};

// Another process's exported buffer mapped into this one (for `device`'s context); unmapped on
// destruction.
class ImportedBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<ImportedBuffer>> Open(const IpcHandle& handle,
                                                              Device device);
  ~ImportedBuffer();  // cudaIpcCloseMemHandle
  ImportedBuffer(const ImportedBuffer&) = delete;
  ImportedBuffer& operator=(const ImportedBuffer&) = delete;

  const void* data() const { return data_; }
  const IpcHandle& handle() const { return handle_; }

 private:
  ImportedBuffer(Device device, void* data, const IpcHandle& handle)
      : device_(device), data_(data), handle_(handle) {}
  Device device_;
  void* data_;
  IpcHandle handle_;
};

}  // namespace prl::weight_broadcast_internal
