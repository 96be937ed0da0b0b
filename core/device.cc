#include "core/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_runtime.h"

namespace prl {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", index);
}

bool CudaCompiled() { return cuda::Compiled(); }

int CudaDeviceCount() { return cuda::DeviceCount(); }

bool KernelBackendAvailable(DeviceType type) {
  if (type == DeviceType::kCpu) return true;
  return cuda::KernelsCompiled() && CudaDeviceCount() > 0;
}

absl::StatusOr<Device> ResolveDevice(absl::string_view spec, absl::string_view field) {
  if (spec == "cpu") return Device::Cpu();
  if (spec == "auto") {
    return KernelBackendAvailable(DeviceType::kCuda) ? Device::Cuda(0) : Device::Cpu();
  }
  int ordinal = 0;
  if (spec == "cuda") {
    ordinal = 0;
  } else if (spec.substr(0, 5) == "cuda:" && absl::SimpleAtoi(spec.substr(5), &ordinal) &&
             ordinal >= 0) {
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected cpu, cuda, cuda:N or auto; found '", spec, "'"));
  }
  if (!CudaCompiled()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, " = ", spec,
        ": this prl was built without CUDA; rebuild with the CUDA toolkit installed and "
        "-DPRL_CUDA=ON (cmake -S . -B build -DPRL_CUDA=ON), or set ",
        field, " = cpu"));
  }
  if (!cuda::KernelsCompiled()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " = ", spec,
                     ": this build has the CUDA runtime but no CUDA model kernels; use cpu"));
  }
  const int count = CudaDeviceCount();
  if (ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " = ", spec, ": found ", count,
                     " usable CUDA GPU(s) (a driver and a GPU visible through "
                     "CUDA_VISIBLE_DEVICES are needed)"));
  }
  return Device::Cuda(ordinal);
}

std::string DescribeBackends() {
  if (!CudaCompiled()) return "cpu (built without CUDA)";
  const int count = CudaDeviceCount();
  if (count == 0) return "cpu (CUDA compiled in, no GPU found)";
  if (!cuda::KernelsCompiled()) {
    return absl::StrCat("cpu (", count, " GPU(s) found, CUDA model kernels not in this build)");
  }
  return absl::StrCat("cuda (", count, " GPU(s))");
}

}  // namespace prl
