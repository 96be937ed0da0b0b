// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The random numbers for (key, counter) are a pure function of both,
// so a sampled token depends only on its request's seed and its own (sample, position)
// counter — never on batch order, step boundaries or preemption — and a GPU kernel computing
// the same function draws the same tokens (cuRAND's Philox4_32_10 uses this round function).
#pragma once

#include <array>
#include <cstdint>

namespace prl {

struct PhiloxKey {
  uint32_t k0, k1;
};

// Four 32-bit random words for the 128-bit counter (c0, c1, c2, c3).
inline std::array<uint32_t, 4> Philox4x32(PhiloxKey key, std::array<uint32_t, 4> c) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ key.k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ key.k1, static_cast<uint32_t>(p0)};
    key.k0 += kWeyl0;
    key.k1 += kWeyl1;
  }
  return c;
}

// A uniform double in [0, 1) with 53 random bits, for (seed, stream, index).
inline double PhiloxUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const auto r = Philox4x32({static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
                            {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                             static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (r[1] >> 11);  // 53 bits
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

}  // namespace prl
