#include "bench/gpu_peak.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace prl::bench {

namespace {

struct Entry {
  const char* match;  // substring of the device name; the first matching entry wins
  const char* label;
  double bf16_tflops;  // dense bf16 tensor core, fp32 accumulate
  double f32_tflops;   // fp32 without tensor cores
};

// More specific names first ("GH200" contains "H200", "H100 PCIe" contains "H100").
constexpr Entry kTable[] = {
    {"GH200", "GH200", 989.0, 67.0},
    {"H200 NVL", "H200 NVL", 835.0, 60.0},
    {"H200", "H200 SXM", 989.0, 67.0},
    {"H100 PCIe", "H100 PCIe", 756.0, 51.0},
    {"H100 NVL", "H100 NVL", 835.0, 60.0},
    {"H100", "H100 SXM", 989.0, 67.0},  // "NVIDIA H100 80GB HBM3" is the SXM5 board
    {"A100", "A100", 312.0, 19.5},
    {"L40S", "L40S", 362.0, 91.6},
};

}  // namespace

std::optional<GpuPeak> LookupGpuPeak(absl::string_view gpu_name, DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kF32) return std::nullopt;
  for (const Entry& e : kTable) {
    if (!absl::StrContains(gpu_name, e.match)) continue;
    const bool bf16 = dtype == DType::kBF16;
    return GpuPeak{absl::StrCat(e.label, bf16 ? " bf16 dense" : " fp32 non-tensor"),
                   bf16 ? e.bf16_tflops : e.f32_tflops};
  }
  return std::nullopt;
}

}  // namespace prl::bench
