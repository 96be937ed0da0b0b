// SwiGLU, the Llama/Qwen2 MLP activation: act = silu(gate) * up, silu(x) = x * sigmoid(x).
//
// Dtypes: the CPU takes F32; on CUDA all tensors of a call share F32 or BF16 (fp32 arithmetic).
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// gate_up (T, 2 I): the fused gate_proj | up_proj output, gate in columns [0, I).
// act (T, I) =.
void SwiGluForward(const Tensor& act, const Tensor& gate_up);
// dgate_up (T, 2 I) = gradient given dact (T, I) and the forward's gate_up.
void SwiGluBackward(const Tensor& dgate_up, const Tensor& dact, const Tensor& gate_up);

}  // namespace prl::kernels
