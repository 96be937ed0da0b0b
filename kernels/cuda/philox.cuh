// Philox4x32-10 on the device: the same function as core/philox.h (which the CPU sampler
// uses), written without std::array so that kernels can call it. tests/kernels/
// sampling_cut_test.cc pins the two together on the host.
#pragma once

#include <cstdint>

#include "kernels/cuda/host_device.h"

namespace prl::kernels::cuda {

PRL_HOST_DEVICE void Philox4x32(uint32_t k0, uint32_t k1, uint32_t c[4]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c[0] = n0;
    c[1] = n1;
    c[2] = n2;
    c[3] = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

// A uniform double in [0, 1) with 53 random bits, for (seed, stream, index): core/philox.h's
// PhiloxUniform.
PRL_HOST_DEVICE double PhiloxUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t c[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                   static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  Philox4x32(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), c);
  const uint64_t bits = (static_cast<uint64_t>(c[0]) << 21) ^ (c[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

}  // namespace prl::kernels::cuda
