// Element-wise dtype conversion (F32 <-> BF16, round to nearest even): the bf16 mode's compute
// weights from the fp32 master weights, and BF16 results back to F32; and the strided copy of
// a block of columns between two row-major matrices (the query or key heads out of, and back
// into, the packed qkv activation).
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// dst = src converted; same element count, same device; F32 or BF16 on either side. Equal
// dtypes make it a copy; on CUDA it is queued on the current stream (capturable in a graph).
void ConvertDType(const Tensor& dst, const Tensor& src);

// dst[t, dst_col + j] = src[t, src_col + j] for t < T, j < width: dst (T, Wd) and src (T, Ws)
// of one dtype (F32 or BF16) on one device; the column blocks must fit their rows and must not
// overlap in memory. On CUDA one 2-D copy on the current stream (capturable in a graph).
void CopyColumns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                 int64_t width);

// dst[t, dst_col + j] = (accumulate ? dst[t, dst_col + j] : 0) + alpha * src[t, src_col + j]
// for t < T, j < width (a LoRA adapter's output added into its columns of a fused projection,
// model/lora.h). F32 on the CPU; on CUDA dst and src each F32 or BF16, of one dtype or not (an
// F32 adapter's output into a BF16 activation): fp32 arithmetic, one rounding to dst's dtype
// (kernels/cuda/lora_columns.cu, not yet run on a GPU).
void AddColumns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                int64_t width, float alpha, bool accumulate);

// dst[rows[i], dst_col + j] += alpha * src[i, j] for i < n, j < src's width (a LoRA adapter's
// output added into the rows of its requests, model/lora_layer.h); rows (n) I32, distinct. The
// dtypes of AddColumns.
void AddColumnsAtRows(const Tensor& dst, const Tensor& rows, int64_t dst_col, const Tensor& src,
                      float alpha);

}  // namespace prl::kernels
