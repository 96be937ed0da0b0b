// Where a buffer lives and which kernel backend runs on it.
//
// The CPU backend exists everywhere. A CUDA device is usable when this binary was built with
// PRL_CUDA, a GPU and driver are present, and the CUDA kernel backend is compiled in; "auto"
// resolves to it only then and otherwise falls back to the CPU, so one binary runs on
// laptops, CI and GPU nodes alike.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/enum_names.h"

namespace prl {

enum class DeviceType : uint8_t { kCpu, kCuda };
// The spellings of a role's device in the run config (`learner.device`, `actors.device`).
inline constexpr NamedValue<DeviceType> kDeviceTypeNames[] = {{"cpu", DeviceType::kCpu},
                                                              {"cuda", DeviceType::kCuda}};

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int ordinal) { return {DeviceType::kCuda, ordinal}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device&) const = default;
  std::string ToString() const;  // "cpu", "cuda:0"
};

// True when this binary was built with PRL_CUDA (the CUDA runtime is linked in).
bool CudaCompiled();
// Number of usable CUDA GPUs: 0 when not compiled with CUDA, or no driver/GPU is present.
int CudaDeviceCount();
// True when the model kernels have an implementation for `type` in this build.
bool KernelBackendAvailable(DeviceType type);

// Resolves a device setting: "cpu", "cuda", "cuda:N" or "auto" (CUDA when usable, else CPU).
// An explicit CUDA request that cannot be honoured is FailedPrecondition naming `field` (the
// flag or config key) and why: a build without CUDA names the build option that enables it
// (-DPRL_CUDA=ON), a machine without a usable GPU says how many it found.
absl::StatusOr<Device> ResolveDevice(absl::string_view spec, absl::string_view field = "--device");

// One line describing the backend situation, e.g. for `prl bench` headers.
std::string DescribeBackends();

}  // namespace prl
