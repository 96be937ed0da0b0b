// cuda_ipc_memory.h in builds without CUDA: nothing can be allocated, mapped or copied, and
// every factory says why (the transport reports it before it gets here).
#include "weight_broadcast/cuda_ipc_memory.h"

namespace prl::weight_broadcast_internal {

namespace {
absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "prl was built without CUDA (PRL_CUDA=OFF or no toolkit): the cuda_ipc weight transport "
      "is unavailable (use shm on one node)");
}
}  // namespace

bool CudaIpcCompiled() { return false; }

absl::StatusOr<std::unique_ptr<ExportedBuffer>> ExportedBuffer::Allocate(Device, size_t) {
  return NotBuilt();
}
ExportedBuffer::~ExportedBuffer() = default;

absl::StatusOr<std::unique_ptr<ImportedBuffer>> ImportedBuffer::Open(const IpcHandle&, Device) {
  return NotBuilt();
}
ImportedBuffer::~ImportedBuffer() = default;

}  // namespace prl::weight_broadcast_internal
