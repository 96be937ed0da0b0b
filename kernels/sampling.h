// Token sampling with behaviour log-probabilities (docs/architecture.md, "behaviour log-prob").
//
// For each row of logits: z = logits / temperature; keep the top_k largest (0: all), then the
// smallest set of the most likely tokens whose probability reaches top_p (1: all); draw from
// the kept tokens renormalised, by inverse CDF with u = Philox(seed, stream, index). The
// returned log-probability is that of the drawn token under exactly that distribution, so the
// learner's importance ratio pi/mu is exact when it applies the same transform.
//
// temperature = 0 is greedy: the argmax (lowest id on ties) and, by choice, its log-probability
// under the untransformed softmax(logits), which is what a learner scoring at temperature 1
// would compare against. A row's result depends only on its logits and its SamplingRow.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/tensor.h"
#include "kernels/sampling_row.h"

namespace prl::kernels {

// tokens (R, I32) =, logprobs (R) =, from logits (R, V) and one SamplingRow per row: rows is
// (R, kSamplingRowWords) I32 holding SamplingRow structs, on the logits' device. Asynchronous
// on CUDA (no host round-trip: the rows come from device memory).
//
// split_vocabulary (CUDA): a row without top-k/top-p is drawn by many blocks, each over a split
// of the vocabulary, instead of one block per row — the same distribution and the same token
// for the same u up to rounding, a log-prob within rounding of the learner's rather than equal
// to it bit for bit. Greedy and filtered rows are unchanged. The batch-invariant engine keeps
// it off.
void SampleTokens(const Tensor& tokens, const Tensor& logprobs, const Tensor& logits,
                  const Tensor& rows, bool split_vocabulary = false);

// The same with the rows in host memory (CPU tensors only).
void SampleTokens(const Tensor& tokens, const Tensor& logprobs, const Tensor& logits,
                  absl::Span<const SamplingRow> rows);

// The k most likely tokens of the distribution a row of host logits (V) draws from, with their
// log-probs, most likely first (ties: lower id): under the transform above (temperature, top-k,
// top-p renormalised; tokens outside the kept set are not listed, so fewer than k may come
// back), and for temperature 0 under softmax(logits), as the drawn token's is. The drawn token's
// log-prob equals its entry when it is listed. What the OpenAI endpoint's top_logprobs shows.
std::vector<std::pair<int32_t, float>> TopLogprobs(absl::Span<const float> logits,
                                                   const SamplingRow& row, int32_t k);

// Host SamplingRows viewed as the (R, kSamplingRowWords) I32 rows tensor.
Tensor SamplingRowsTensor(absl::Span<const SamplingRow> rows);

}  // namespace prl::kernels
