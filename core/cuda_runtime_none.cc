// CUDA runtime stand-in for builds without PRL_CUDA: CUDA is reported absent, and the
// allocation and copy entry points (unreachable, since no CUDA Device resolves) say so.
#include <utility>

#include "core/cuda_runtime.h"

namespace prl::cuda {

namespace {
absl::Status NotBuilt() {
  return absl::FailedPreconditionError("this binary was built without CUDA (PRL_CUDA=OFF)");
}
}  // namespace

bool Compiled() { return false; }
bool KernelsCompiled() { return false; }
int DeviceCount() { return 0; }
absl::StatusOr<std::string> DeviceName(int) { return NotBuilt(); }
absl::StatusOr<DeviceMemory> MemoryInfo(int) { return NotBuilt(); }
absl::StatusOr<void*> Malloc(int, size_t) { return NotBuilt(); }
void Free(int, void*) {}
absl::Status Memcpy(void*, const void*, size_t) { return NotBuilt(); }
absl::Status Synchronize(int) { return NotBuilt(); }
absl::Status FillF32(int, float*, size_t, float) { return NotBuilt(); }
absl::Status SynchronizeCurrentStream(int) { return NotBuilt(); }
absl::Status MemcpyOnCurrentStream(int, void*, const void*, size_t) { return NotBuilt(); }
absl::Status Memcpy2DOnCurrentStream(int, void*, size_t, const void*, size_t, size_t, size_t) {
  return NotBuilt();
}
absl::Status ProfilerStart() { return NotBuilt(); }
absl::Status ProfilerStop() { return NotBuilt(); }

absl::StatusOr<StreamMarker> StreamMarker::Record(int) { return NotBuilt(); }
StreamMarker& StreamMarker::operator=(StreamMarker&& other) noexcept {
  std::swap(event_, other.event_);
  return *this;
}
StreamMarker::~StreamMarker() = default;
absl::Status StreamMarker::Wait() const { return absl::OkStatus(); }

}  // namespace prl::cuda
