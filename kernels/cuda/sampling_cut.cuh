// The kept set of top-k / top-p sampling on the GPU, found without sorting (kernels/cuda/
// sampling.cu). The CPU sorts a row by (z descending, id ascending) and keeps a prefix; here the
// same prefix is described by a cut: every token whose key is above tau, plus the tokens whose
// key equals tau with id <= id_cut. Key is an order-preserving map of z to uint32, so "key
// above" is "z above" and ties between equal z go to the lower id, exactly the CPU's order.
//
// FindCut finds the cut by bisection over the 2^32 keys and then over the ids of the tied key,
// each probe asking `measure` for the total (count or probability mass) of the tokens a
// predicate accepts. The device passes a block-wide sum; a host test passes a serial sum and
// compares the kept set with the CPU's definition (tests/kernels/sampling_cut_test.cc).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/host_device.h"

namespace prl::kernels::cuda {

// Order-preserving map of a float to uint32 (larger float, larger key). -0 maps to +0's key:
// the CPU compares floats, for which the two zeros tie (and ties go to the lower id).
PRL_HOST_DEVICE uint32_t OrderKey(float z) {
#if defined(__CUDA_ARCH__)
  uint32_t b = __float_as_uint(z);
#else
  uint32_t b;
  std::memcpy(&b, &z, sizeof(b));
#endif
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Kept-set membership: key > tau, or key == tau and id <= id_cut (all ids when id_cut >= V).
struct Cut {
  uint32_t tau = 0;
  int64_t id_cut = 0;
  PRL_HOST_DEVICE bool In(uint32_t key, int64_t v) const {
    return key > tau || (key == tau && v <= id_cut);
  }
};

// The smallest prefix (in key-descending, id-ascending order) of a row of V tokens whose
// measure reaches `need`: the largest tau with measure(key >= tau) >= need, then the smallest
// id_cut among the ties at tau with measure(key > tau) + measure(key == tau, id <= id_cut) >=
// need. measure(pred) is the total over the tokens v with pred(key_v, v) (callers restrict it
// to an inner kept set); need must be <= measure(everything), so tau = 0 always qualifies.
template <class Measure>
PRL_HOST_DEVICE Cut FindCut(const Measure& measure, int64_t V, double need) {
  uint32_t lo = 0, hi = 0xffffffffu;
  while (lo < hi) {
    // In 64 bits: hi - lo + 1 is 2^32 on the first probe.
    const uint32_t mid = lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
    if (measure([mid](uint32_t k, int64_t) { return k >= mid; }) >= need) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const uint32_t tau = lo;
  const double above = measure([tau](uint32_t k, int64_t) { return k > tau; });
  int64_t a = 0, b = V - 1;
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    if (above + measure([tau, mid](uint32_t k, int64_t v) { return k == tau && v <= mid; }) >=
        need) {
      b = mid;
    } else {
      a = mid + 1;
    }
  }
  return Cut{tau, a};
}

}  // namespace prl::kernels::cuda
