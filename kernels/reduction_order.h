// How a kernel may order its floating-point reductions.
//
// kFast lets each backend pick its fastest summation order (OpenBLAS blocking, edge kernels,
// query blocks), so a row's result can change in the last bits with the number of rows in the
// call. kBatchInvariant fixes the order per output element: a token's values are then
// bit-identical whatever else is in the batch, however a prefill is chunked, and between the
// engine (paged, incremental) and the learner (packed, full-sequence). It costs speed (about
// 3x on the CPU's GEMMs).
#pragma once

namespace prl::kernels {

enum class ReductionOrder { kFast, kBatchInvariant };

}  // namespace prl::kernels
